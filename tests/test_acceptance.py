"""Acceptance rules on hand-made distributions, and sampling that follows the cloud."""

from __future__ import annotations

import torch

from specdec_cli.decoding.acceptance import greedy_verdict, rejection_verdict

# chi-square critical values at alpha = 0.001 (df -> value), from standard tables
CHI2_999 = {3: 16.27, 4: 18.47, 5: 20.52, 7: 24.32}


def one_hot_scores(choices: list[int], v: int = 8) -> torch.Tensor:
    scores = torch.zeros(len(choices), v)
    for row, c in enumerate(choices):
        scores[row, c] = 5.0
    return scores


def test_greedy_perfect_match_gives_the_bonus():
    v = greedy_verdict([3, 1, 4], one_hot_scores([3, 1, 4, 6]))
    assert (v.accepted, v.token, v.kind) == (3, 6, "bonus")


def test_greedy_early_mismatch_recovers_the_targets_token():
    v = greedy_verdict([3, 1, 4], one_hot_scores([3, 2, 4, 6]))
    assert (v.accepted, v.token, v.kind) == (1, 2, "recovered")


def test_greedy_first_token_rejected():
    v = greedy_verdict([5], one_hot_scores([0, 7]))
    assert (v.accepted, v.token, v.kind) == (0, 0, "recovered")


def chi2(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def test_rejection_sampling_output_follows_the_target():
    """Draft from q, verify against p: the emitted first token is distributed as p, even though q
    is far from p (a lossy rule — e.g. keeping every draft — fails this test)."""
    p = torch.tensor([0.05, 0.40, 0.25, 0.20, 0.10, 0.0])
    q = torch.tensor([0.30, 0.10, 0.10, 0.10, 0.20, 0.20])
    g = torch.Generator().manual_seed(0)
    n = 20000
    counts = torch.zeros(6)
    for _ in range(n):
        d = int(torch.multinomial(q, 1, generator=g))
        v = rejection_verdict([d], q[None], torch.stack([p, p]), g)
        counts[d if v.accepted == 1 else v.token] += 1
    assert counts[5] == 0  # never emits what the target gives probability zero
    assert chi2(counts[:5], p[:5]) < CHI2_999[4]


def test_rejection_keeps_everything_when_draft_equals_target():
    p = torch.tensor([0.5, 0.3, 0.2])
    g = torch.Generator().manual_seed(1)
    for _ in range(200):
        d = [int(torch.multinomial(p, 1, generator=g)) for _ in range(3)]
        v = rejection_verdict(d, p.expand(3, 3), p.expand(4, 3), g)
        assert v.accepted == 3 and v.kind == "bonus"


# -- distributions of different widths (Qwen2.5-Omni-3B: 151,936 rows, -7B: 152,064) -------------

def _first_token_counts(q: torch.Tensor, p: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    """Counts of the first emitted token over the union of both widths: draft from q, verify
    against p (each as wide as its own model)."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(max(len(p), len(q)))
    for _ in range(n):
        d = int(torch.multinomial(q, 1, generator=g))
        v = rejection_verdict([d], q[None], torch.stack([p, p]), g)
        counts[d if v.accepted == 1 else v.token] += 1
    return counts


def test_narrow_draft_wide_target_reaches_the_rows_the_draft_lacks():
    """A 4-wide draft against a 6-wide target with mass on rows 4 and 5, which the draft can never
    propose: those tokens must still come out at the target's rate (through the residual)."""
    q = torch.tensor([0.40, 0.30, 0.20, 0.10])
    p = torch.tensor([0.10, 0.30, 0.10, 0.15, 0.20, 0.15])
    counts = _first_token_counts(q, p, 20000, seed=2)
    assert counts[4] > 0 and counts[5] > 0
    assert chi2(counts, p) < CHI2_999[5]


def test_wide_draft_narrow_target_never_keeps_what_the_target_lacks():
    """The reverse: a 6-wide draft puts mass on rows 4 and 5, which the 4-wide target gives
    probability zero; they are always rejected and the output follows the target."""
    q = torch.tensor([0.10, 0.10, 0.10, 0.10, 0.30, 0.30])
    p = torch.tensor([0.40, 0.30, 0.20, 0.10])
    counts = _first_token_counts(q, p, 20000, seed=3)
    assert counts[4] == 0 and counts[5] == 0
    assert chi2(counts[:4], p) < CHI2_999[3]


def test_widths_differ_over_a_whole_block():
    """k = 3 drafts and the bonus row, 4-wide draft vs 6-wide target: the verdict's tokens are
    always in the target's range, and a draft the target fully agrees with is kept with the bonus."""
    g = torch.Generator().manual_seed(4)
    q = torch.tensor([0.25, 0.25, 0.25, 0.25]).expand(3, 4)
    same = torch.tensor([0.25, 0.25, 0.25, 0.25, 0.0, 0.0]).expand(4, 6)
    for _ in range(100):
        v = rejection_verdict([0, 1, 2], q, same, g)
        assert (v.accepted, v.kind) == (3, "bonus") and v.token < 4
    only_new = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.5, 0.5]).expand(4, 6)
    for _ in range(100):
        v = rejection_verdict([0, 1, 2], q, only_new, g)
        assert (v.accepted, v.kind) == (0, "recovered") and v.token in (4, 5)


def test_greedy_verdict_breaks_ties_and_nans_as_torch_argmax():
    """The verdict's argmax (NumPy on CPU float rows, for speed at 152k) picks what HF greedy
    search's torch.argmax picks: the first maximum, NaN counted as the maximum, -inf ignored."""
    from specdec_cli.decoding.acceptance import first_argmax

    g = torch.Generator().manual_seed(0)
    for trial in range(300):
        v = int(torch.randint(2, 40, (1,), generator=g))
        x = torch.randint(-3, 3, (4, v), generator=g).float()  # small integers: many ties
        if trial % 3 == 0:
            x[torch.rand(4, v, generator=g) < 0.3] = -float("inf")
        if trial % 5 == 0:
            x[0, int(torch.randint(0, v, (1,), generator=g))] = float("nan")
        assert first_argmax(x) == x.argmax(dim=-1).tolist()
        assert first_argmax(x.double()) == first_argmax(x.bfloat16()) == x.argmax(dim=-1).tolist()


def test_draw_follows_the_distribution_and_never_draws_zero_mass():
    """The inverse-CDF sampler: chi-square against the distribution (unnormalised input, zeros at
    the ends and in the middle), and across a 152k-wide row no zero-probability index is ever drawn
    (the rows past the tokenizer are zeros in the real pair)."""
    from specdec_cli.decoding.acceptance import draw

    g = torch.Generator().manual_seed(3)
    weights = torch.tensor([0.0, 2.0, 0.0, 1.0, 4.0, 0.5, 0.5, 0.0])  # total 8
    counts = torch.zeros(8)
    for _ in range(8000):
        counts[draw(weights, g)] += 1
    assert counts[weights == 0].sum() == 0
    nz = weights > 0
    assert chi2(counts[nz], weights[nz] / weights.sum()) < CHI2_999[4]

    wide = torch.zeros(152064)
    wide[151000:151665] = torch.rand(665, generator=g)  # mass only below the tokenizer's length
    wide[5] = 1e-30  # tiny but positive: allowed, never required
    got = {draw(wide, g) for _ in range(300)}
    assert all(wide[i] > 0 for i in got) and max(got) < 151665
