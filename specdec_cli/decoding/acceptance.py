"""Acceptance rules: pure functions of the draft and the target's (processed) distributions.

Vocabulary (vLLM's): the *accepted* prefix of the draft; the *recovered* token, the target's choice
at the first rejected position; the *bonus* token, the target's extra token when every draft token
was accepted. Exactly one of recovered/bonus follows every verification.

Edge and cloud may score vocabularies of different widths (Qwen2.5-Omni-3B has 151,936 rows,
-7B 152,064): a row one model lacks is a token it gives probability 0. Rejection sampling is
exact over the union, so the narrower distribution is zero-padded to the wider one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch


@dataclass(frozen=True)
class Verdict:
    accepted: int                          # draft tokens kept
    token: int                             # the recovered or bonus token
    kind: Literal["recovered", "bonus"]


def first_argmax(scores: torch.Tensor) -> Any:
    """Per row (a list; an int for one 1-D row), the index of the first maximum: what HF greedy search's torch.argmax returns (first
    occurrence on ties, NaN counted as the maximum), computed by NumPy for CPU float rows, where it is
    ~15x faster at V≈152k (torch's CPU argmax: ~0.35 ms per row on one thread, NumPy's ~0.02 ms)."""
    if scores.device.type == "cpu" and scores.dtype in (torch.float32, torch.float64):
        return scores.numpy().argmax(axis=-1).tolist()
    return scores.argmax(dim=-1).tolist()


# k+1 rows of scores or probabilities: a [k+1, V] tensor, or anything indexable by row with a
# length (verifier.TargetScores processes a row when it is first read).
Rows = Any


def greedy_verdict(draft: list[int], target_scores: Rows) -> Verdict:
    """Keep the longest prefix the target's argmax agrees with.
    target_scores: k+1 rows ([k+1, V] tensor or verifier.TargetScores), row j scoring the position
    of draft[j] (row k: the bonus position). Rows after the first disagreement are never read (a
    TargetScores then never processes them)."""
    k = len(draft)
    assert len(target_scores) == k + 1
    for j in range(k + 1):
        choice = first_argmax(target_scores[j])
        if j == k:
            return Verdict(k, choice, "bonus")
        if choice != draft[j]:
            return Verdict(j, choice, "recovered")
    raise AssertionError("unreachable")


def draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One index drawn from the 1-D distribution `probs` (non-negative, any positive total), with
    u ~ U[0, 1) from `generator` (see `draw_at`)."""
    return draw_at(probs, uniform(generator))


def uniform(generator: torch.Generator) -> float:
    """The float64 u ~ U[0, 1) one `draw` consumes from `generator`."""
    return float(torch.rand((), generator=generator, dtype=torch.float64))


def draw_at(probs: torch.Tensor, u: float) -> int:
    """The index the inverse CDF of `probs` gives at u in [0, 1): the first index whose cumulative
    sum exceeds u · total. Exact up to float64 rounding, and an index with probability 0 is never
    drawn (its interval is empty). Hand-written because torch.multinomial costs ~3.5 ms per draw at
    V≈152k on one CPU thread (this: ~0.2 ms), and a sampled block draws up to k+1 times; and because
    u is explicit, the draw can happen on another machine than the one holding the generator (the
    remote cloud draws the bonus token with the client's u)."""
    cdf = torch.cumsum(probs, 0, dtype=torch.float64)
    x = u * float(cdf[-1])
    i = int(torch.searchsorted(cdf, torch.tensor([x], dtype=torch.float64), right=True))
    if i >= probs.shape[0]:  # u rounded up to the total: the last index with mass
        i = int(torch.nonzero(probs > 0)[-1])
    return i


def pad_to(probs: torch.Tensor, width: int) -> torch.Tensor:
    """`probs` [..., V] zero-padded on the right to [..., width] (unchanged when V >= width): the
    rows a model lacks are tokens it can never produce."""
    missing = width - probs.shape[-1]
    return torch.nn.functional.pad(probs, (0, missing)) if missing > 0 else probs


def rejection_verdict(
    draft: list[int],
    draft_probs: torch.Tensor,
    target_probs: Rows,
    generator: torch.Generator,
) -> Verdict:
    """Standard speculative sampling (Leviathan et al. 2023; Chen et al. 2023): accept draft[j]
    with probability min(1, p_target / p_draft); at the first rejection sample from the normalised
    positive part of (target - draft). The output then follows the target's distribution exactly.
    draft_probs: [k, V_draft], the distributions draft[j] was actually sampled from (HF #47932
    trap); target_probs: [k+1, V_target]. The widths may differ: both are zero-padded to the wider,
    so a draft token the target lacks is always rejected (p_target = 0) and a target token the
    draft lacks is reached through the residual (p_draft = 0 there).

    Written as its two halves, so that the half needing the target's rows can run where they are
    (the remote cloud): `sampling_uniforms` draws every random number the block needs up front, in
    this order, so the stream does not depend on laziness or on where each half runs;
    `first_rejection` is the accept test; `recovered_token` the residual draw."""
    k = len(draft)
    assert draft_probs.shape[0] == k and len(target_probs) == k + 1
    u, u_last = sampling_uniforms(k, generator)
    p_draft = [float(draft_probs[j, t]) for j, t in enumerate(draft)]
    j = first_rejection(draft, p_draft, target_probs, u)
    if j < k:
        return Verdict(j, recovered_token(target_probs[j], draft_probs[j], u_last), "recovered")
    return Verdict(k, draw_at(target_probs[k], u_last), "bonus")


def sampling_uniforms(k: int, generator: torch.Generator) -> tuple[list[float], float]:
    """The k accept-test uniforms (float32) and the one for the final draw (float64), in the order
    `rejection_verdict` has always drawn them."""
    u = torch.rand(k, generator=generator).tolist()
    return u, uniform(generator)


def first_rejection(draft: list[int], p_draft: list[float], target_probs: Rows, u: list[float]) -> int:
    """The index of the first rejected draft token (k when all are accepted). p_draft[j]: the
    probability the drafter gave draft[j]; target_probs row j: the target's distribution there
    (rows after the first rejection are never read). Reject when u·p_draft >= p_target, i.e. not
    (u < p_target / p_draft), written without dividing; a token outside the target's width has
    p_target = 0. The `>=` matters: torch.rand can return exactly 0, and with `>` a token the
    target gives probability 0 would then be kept."""
    for j, token in enumerate(draft):
        row = target_probs[j]
        p_t = float(row[token]) if token < row.shape[-1] else 0.0
        if u[j] * p_draft[j] >= p_t:
            return j
    return len(draft)


def recovered_token(target: torch.Tensor, draft: torch.Tensor, u: float) -> int:
    """The token drawn at u from the normalised positive part of target - draft (1-D rows, zero-
    padded to one width). A zero residual happens only when the rows are equal, where rejection
    has probability 0; guard against rounding anyway by falling back to the target."""
    width = max(target.shape[-1], draft.shape[-1])
    target, draft = pad_to(target, width), pad_to(draft, width)
    residual = (target - draft).clamp(min=0)
    return draw_at(residual if residual.sum() > 0 else target, u)
