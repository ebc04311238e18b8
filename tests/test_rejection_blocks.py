"""Rejection sampling over whole blocks: what speculative sampling emits, block after block, must be
distributed as the target's own sampling, jointly over positions, for every k (chi-square against
the exact distribution computed by hand from the target chain). Plus the two fallbacks of the
sampler, each exercised directly: the zero residual and the draw that rounds up to the total.

The target and the draft are Markov chains over 4 tokens (each position's distribution depends on
the token before it), unlike each other, and the draft proposes a token the target never emits.
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chi2 as chi2_dist

from specdec_cli.decoding import acceptance
from specdec_cli.decoding.acceptance import draw, draw_at, first_rejection, recovered_token, rejection_verdict

V = 4
START = 0  # the token before the first position
# TARGET[a] = p(next | previous a); token 3 is never emitted after 1 (and rarely otherwise)
TARGET = torch.tensor([
    [0.10, 0.50, 0.30, 0.10],
    [0.45, 0.05, 0.50, 0.00],
    [0.30, 0.30, 0.20, 0.20],
    [0.60, 0.20, 0.10, 0.10],
], dtype=torch.float64)
# a draft that disagrees: more mass on 3 (also where the target has none), little on 1
DRAFT = torch.tensor([
    [0.40, 0.10, 0.20, 0.30],
    [0.20, 0.20, 0.20, 0.40],
    [0.25, 0.25, 0.25, 0.25],
    [0.10, 0.10, 0.40, 0.40],
], dtype=torch.float64)
LENGTH = 4  # positions checked per run


def speculative_sample(k: int, n: int, seed: int) -> torch.Tensor:
    """n sequences of LENGTH tokens from speculative sampling with blocks of k: draft k tokens from
    DRAFT, score k+1 target rows, keep the verdict's tokens, repeat. [n, LENGTH]."""
    g = torch.Generator().manual_seed(seed)
    out = torch.empty(n, LENGTH, dtype=torch.long)
    for i in range(n):
        seq: list[int] = []
        while len(seq) < LENGTH:
            prev = seq[-1] if seq else START
            draft, q_rows = [], []
            for _ in range(k):
                q = DRAFT[prev]
                token = draw(q, g)
                draft.append(token)
                q_rows.append(q)
                prev = token
            contexts = [seq[-1] if seq else START, *draft]  # row j: after seq + draft[:j]
            p_rows = TARGET[contexts]
            verdict = rejection_verdict(draft, torch.stack(q_rows), p_rows, g)
            seq.extend(draft[:verdict.accepted] + [verdict.token])
        out[i] = torch.tensor(seq[:LENGTH])
    return out


def marginal(position: int) -> torch.Tensor:
    """p(token at `position`), by hand: the start row times the chain `position` times."""
    dist = TARGET[START]
    for _ in range(position):
        dist = dist @ TARGET
    return dist


def joint_first_two() -> torch.Tensor:
    """p(x0, x1) flattened [V * V]: p(x0 | start) p(x1 | x0)."""
    return (TARGET[START][:, None] * TARGET).reshape(-1)


def chi2_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square p-value of `counts` against `probs`; cells of probability 0 must be empty."""
    zero = probs == 0
    assert counts[zero].sum() == 0, "emitted a token the target never emits"
    counts, probs = counts[~zero].double(), probs[~zero]
    expected = probs * counts.sum()
    stat = float(((counts - expected) ** 2 / expected).sum())
    return float(chi2_dist.sf(stat, df=len(counts) - 1))


def block_p_values(samples: torch.Tensor) -> dict[str, float]:
    values = {f"position {t}": chi2_p_value(torch.bincount(samples[:, t], minlength=V), marginal(t))
              for t in range(LENGTH)}
    pairs = samples[:, 0] * V + samples[:, 1]
    values["joint 0,1"] = chi2_p_value(torch.bincount(pairs, minlength=V * V), joint_first_two())
    return values


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_whole_blocks_follow_the_target_jointly(k):
    """Every position of the emitted sequence (within a block, at its end, and across blocks) and
    the joint of the first two follow the target chain. Seeded, so deterministic; a true rule
    passes each check at alpha 0.001 with probability 0.999."""
    samples = speculative_sample(k, 4000, seed=k)
    values = block_p_values(samples)
    assert min(values.values()) > 1e-3, values


def test_the_block_check_catches_a_lossy_rule(monkeypatch):
    """The harness has power: recovering from the target instead of the residual (a classic bug:
    it double counts the tokens the draft already proposed) fails the same checks."""
    monkeypatch.setattr(acceptance, "recovered_token", lambda target, draft, u: draw_at(target, u))
    values = block_p_values(speculative_sample(3, 4000, seed=3))
    assert min(values.values()) < 1e-6, values


# -- the fallbacks, directly -----------------------------------------------------------------------

def test_zero_residual_falls_back_to_the_target():
    """target == draft: the residual is all zeros (rejection had probability 0 there); the token
    is drawn from the target instead, at the same u (inverse CDF of [0.2, 0.5, 0.3])."""
    target = torch.tensor([0.2, 0.5, 0.3])
    for u, expected in ((0.0, 0), (0.1999, 0), (0.2, 1), (0.69, 1), (0.7, 2), (0.999, 2)):
        assert recovered_token(target, target.clone(), u) == expected
    # the draft above the target everywhere (rounding, an unnormalised row): zero residual too
    assert recovered_token(target, target * 1.5, 0.75) == 2
    # where the residual has mass it, not the target, is drawn from: only row 2 exceeds the draft
    assert recovered_token(target, torch.tensor([0.3, 0.6, 0.1]), 0.0) == 2


def test_residual_across_widths_reaches_rows_the_draft_lacks():
    """A 2-wide draft row against a 4-wide target: the residual is the target's rows 2 and 3 plus
    what row 0 exceeds the draft by; normalised [0.1, 0, 0.3, 0.2] / 0.6."""
    target = torch.tensor([0.4, 0.1, 0.3, 0.2])
    draft = torch.tensor([0.3, 0.7])
    cuts = [(0.0, 0), (0.16, 0), (0.17, 2), (0.66, 2), (0.67, 3), (0.99, 3)]
    assert [recovered_token(target, draft, u) for u, _ in cuts] == [t for _, t in cuts]


def test_draw_rounding_up_to_the_total_takes_the_last_index_with_mass():
    """u · total can reach the cumulative total by rounding; the inverse CDF then runs off the end
    and the draw takes the last index with mass, never a trailing zero."""
    probs = torch.tensor([0.25, 0.75, 0.0, 0.0])
    assert draw_at(probs, 1.0) == 1
    assert draw_at(probs, 0.0) == 0 and draw_at(probs, 0.25) == 1
    assert draw_at(torch.tensor([0.0, 0.0, 1.0]), 0.0) == 2  # leading zeros are never drawn
    # the first index whose cumulative sum exceeds u · total, for an unnormalised row
    assert draw_at(torch.tensor([2.0, 0.0, 6.0]), 0.2499) == 0
    assert draw_at(torch.tensor([2.0, 0.0, 6.0]), 0.25) == 2


def test_a_token_the_target_never_emits_is_rejected_even_at_u_zero():
    """Accept draft[j] iff u < p_target / p_draft: with p_target = 0 never, not even when the
    uniform is exactly 0 (torch.rand can return 0); likewise past the target's width."""
    target = torch.tensor([[0.5, 0.5, 0.0], [0.5, 0.5, 0.0]])
    assert first_rejection([2], [0.4], target, [0.0]) == 0
    assert first_rejection([3], [0.4], target, [0.0]) == 0  # row 3 is past the target's width
    assert first_rejection([1], [0.5], target, [0.999]) == 1  # p_t = p_d: always kept
    assert first_rejection([0, 1], [0.6, 0.5], target, [0.5, 0.2]) == 2  # 0.5 * 0.6 < 0.5: kept
    assert first_rejection([0, 1], [0.6, 1.0], target, [0.5, 0.5]) == 1  # 0.5 * 1.0 == 0.5: rejected
    assert first_rejection([0], [1.0], target, [0.5]) == 0  # u * p_d == p_t: u < p_t / p_d fails


def test_first_argmax_of_a_single_row_off_the_numpy_path():
    """A 1-D bfloat16 row takes torch's argmax (NumPy has no bfloat16): first maximum, as an int."""
    from specdec_cli.decoding.acceptance import first_argmax

    assert first_argmax(torch.tensor([1.0, 3.0, 3.0, -2.0], dtype=torch.bfloat16)) == 1
    assert first_argmax(torch.tensor([[1.0, 3.0], [4.0, 0.0]], dtype=torch.bfloat16)) == [1, 0]


def test_a_seeded_generator_makes_the_block_reproducible():
    """Every random number comes from the caller's generator: the same seed, the same verdicts and
    draws (the global RNG moved in between must not matter)."""
    def run(seed: int) -> list:
        g = torch.Generator().manual_seed(seed)
        out = []
        for _ in range(50):
            # accept chances 0.25, 0.8, ...: the accept-test uniforms decide
            out.append(rejection_verdict([0, 2, 1], DRAFT[[0, 0, 2]].float(), TARGET[[0, 0, 2, 1]].float(), g))
            out.append(draw(TARGET[2], g))
        return out

    first = run(5)
    torch.rand(100)  # the global generator moves
    assert run(5) == first and run(6) != first


def test_rounding_fallback_takes_the_last_index_with_mass_of_several():
    assert draw_at(torch.tensor([0.2, 0.3, 0.5, 0.0]), 1.0) == 2


def test_widths_one_apart_and_a_misshapen_block():
    """A draft row one narrower than the target: padded, so the last row is reached by the residual."""
    assert recovered_token(torch.tensor([0.2, 0.3, 0.5]), torch.tensor([0.4, 0.6]), 0.0) == 2
    with pytest.raises(AssertionError):
        rejection_verdict([1, 2], torch.full((3, 4), 0.25), torch.full((3, 4), 0.25), torch.Generator())
    with pytest.raises(AssertionError):
        rejection_verdict([1, 2], torch.full((2, 4), 0.25), torch.full((2, 4), 0.25), torch.Generator())
