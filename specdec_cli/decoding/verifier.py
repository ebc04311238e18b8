"""The cloud's side: score a draft in one forward pass, with lazy catch-up (and, on the first
escalation of a clip, the lazy prefill)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .processors import DecodingRules
from .state import ModelState


class TargetScores:
    """The cloud's processed scores for one verification block: row j scores draft[j] with its own
    prefix (sequence + draft[:j]); the last row is the bonus position.

    The forward computes every row's logits at once, but the rules process a row only when an
    acceptance rule first reads it. A verdict reads rows up to the first rejection and no further,
    so a block whose first draft token is rejected costs one processed row, not k+1 (at a 152k
    vocabulary a processed row is ~0.06 ms of rules plus a float32 copy). Indexing returns the same
    numbers as `DecodingRules.process_block` row by row (a test checks)."""

    def __init__(self, rules: DecodingRules, sequence: Sequence[int], draft: Sequence[int], rows: torch.Tensor) -> None:
        assert rows.shape[0] == len(draft) + 1, "one row per draft token plus the bonus row"
        self.rules, self.sequence, self.draft, self.raw = rules, list(sequence), list(draft), rows
        self._done: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return self.raw.shape[0]

    @property
    def shape(self) -> torch.Size:
        return self.raw.shape

    def __getitem__(self, j: int) -> torch.Tensor:
        got = self._done.get(j)
        if got is None:
            got = self._done[j] = self.rules.process_ids(self.sequence + self.draft[:j], self.raw[j])
        return got

    @property
    def processed_rows(self) -> int:
        """Rows the rules have processed so far (the bench reports it)."""
        return len(self._done)

    def dense(self) -> torch.Tensor:
        """Every row processed: [k+1, V]."""
        return torch.stack([self[j] for j in range(len(self))])


def score_draft(cloud: ModelState, sequence: list[int], draft: list[int],
                rules: DecodingRules) -> tuple[TargetScores, int]:
    """Processed cloud scores for every draft position plus the bonus position (k+1 rows, each
    processed when first read).

    Lazy catch-up: tokens accepted without the cloud since its last call are fed in the same
    forward as the draft, so they cost nothing until an escalation needs them. A cloud that has
    not run yet for this clip has the whole prompt pending: the prompt, the audio, the accepted
    answer and the draft then go in this one forward (lazy prefill). Only the k+1 logits rows the
    verdict may read are computed. Returns the scores and the number of tokens this forward fed to
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
    return TargetScores(rules, sequence, draft, rows), cloud.tokens_fed - fed_before
