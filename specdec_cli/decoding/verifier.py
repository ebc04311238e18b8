"""The cloud's side: score a draft in one forward pass, with lazy catch-up (and, on the first
escalation of a clip, the lazy prefill)."""

from __future__ import annotations

import torch

from .processors import DecodingRules
from .state import ModelState


def score_draft(cloud: ModelState, sequence: list[int], draft: list[int],
                rules: DecodingRules) -> tuple[torch.Tensor, int]:
    """Processed cloud scores for every draft position plus the bonus position: [k+1, V].

    Lazy catch-up: tokens accepted without the cloud since its last call are fed in the same
    forward as the draft, so they cost nothing until an escalation needs them. A cloud that has
    not run yet for this clip has the whole prompt pending: the prompt, the audio, the accepted
    answer and the draft then go in this one forward (lazy prefill). Only the k+1 logits rows the
    verdict reads are computed. Returns the scores and the number of tokens this forward fed to
    the cloud after the prompt (prompt tokens are counted as the cloud's prefill)."""
    pending = cloud.pending(sequence)
    before = cloud.last_logits  # predicts draft[0] when nothing is pending
    fed_before = cloud.tokens_fed
    if pending:
        # The last k+1 rows: row j predicts the token after pending[-1] + draft[:j].
        rows = cloud.advance(pending + draft, keep=len(draft) + 1)
    else:
        assert before is not None, "cloud has no logits for the first draft position"
        rows = torch.cat([before[None], cloud.advance(draft)])
    # rows: [k+1, V]; row j scores draft[j] (row k: bonus), each with its own prefix.
    return rules.process_block(sequence, draft, rows), cloud.tokens_fed - fed_before
