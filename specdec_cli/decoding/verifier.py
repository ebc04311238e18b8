"""The cloud's side: score a draft in one forward pass, with lazy catch-up."""

from __future__ import annotations

import torch

from .processors import DecodingRules
from .state import ModelState


def score_draft(cloud: ModelState, sequence: list[int], draft: list[int],
                rules: DecodingRules) -> tuple[torch.Tensor, int]:
    """Processed cloud scores for every draft position plus the bonus position: [k+1, V].

    Lazy catch-up: tokens accepted without the cloud since its last call are fed in the same
    forward as the draft, so they cost nothing until an escalation needs them. Returns the scores
    and the number of tokens this forward fed to the cloud."""
    pending = cloud.pending(sequence)
    before = cloud.last_logits  # predicts draft[0] when nothing is pending
    fed = pending + draft
    logits = cloud.advance(fed)  # [P+k, V], row i predicts the token after fed[i]
    if pending:
        rows = logits[len(pending) - 1:]
    else:
        assert before is not None, "cloud has no logits for the first draft position"
        rows = torch.cat([before[None], logits])
    # rows: [k+1, V]; row j scores draft[j] (row k: bonus), each with its own prefix.
    scores = [rules.process(torch.tensor([sequence + draft[:j]]), rows[j]) for j in range(len(draft) + 1)]
    return torch.stack(scores), len(fed)
