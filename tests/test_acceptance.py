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
