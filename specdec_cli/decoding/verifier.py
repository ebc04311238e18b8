"""The cloud's side: score a draft in one forward pass, with lazy catch-up (and, on the first
escalation of a clip, the lazy prefill)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import TypeVar

import torch
from transformers import PreTrainedModel

from .acceptance import Verdict, greedy_verdict, rejection_verdict
from .drafter import Proposal
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


T = TypeVar("T")


def completed(work: Callable[[], T]) -> Future[T]:
    """`work()` run now, as a future that is already done (its result, or the exception it raised):
    what a cloud that answers at once gives the loop's `submit`."""
    future: Future[T] = Future()
    try:
        future.set_result(work())
    except Exception as exc:  # handed to whoever reads the result, as a blocking call would raise it
        future.set_exception(exc)
    return future


# (draft tokens, processed target scores: k+1 rows, indexable) -> Verdict: a greedy acceptance rule.
AcceptanceRule = Callable[[list[int], TargetScores], Verdict]


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


class LocalCloud:
    """The cloud in this process: its ModelState, scored and judged here.

    This is the interface the loop asks of "the cloud" — start a clip lazily, verify a draft
    (score it and return the verdict), roll back — and the work counters a record reports. The
    remote cloud (`specdec_cli.remote.client.RemoteCloud`) offers the same, over HTTP, so the loop
    never learns where the cloud runs. The verdict is part of `verify` because a remote cloud must
    decide where the target's rows are: its answer is then a few bytes, not k+1 vocabulary rows."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.state = ModelState(model, "cloud")

    def __len__(self) -> int:
        return len(self.state)

    def start(self, inputs: Mapping[str, torch.Tensor]) -> None:
        self.state.start(inputs)

    def prefill(self, inputs: Mapping[str, torch.Tensor]) -> None:
        self.state.prefill(inputs)

    def verify(self, sequence: list[int], proposal: Proposal, rules: DecodingRules,
               generator: torch.Generator | None, acceptance: AcceptanceRule | None = None) -> tuple[Verdict, int]:
        """Score `proposal` after `sequence` (lazy catch-up, lazy prefill) and judge it: greedy match,
        or rejection sampling when `generator` is given, or the caller's `acceptance` rule. Returns
        the verdict and the tokens this forward fed after the prompt. The cache still holds the
        whole draft: `rollback` cuts it to what the verdict kept."""
        scores, fed = score_draft(self.state, sequence, proposal.tokens, rules)
        return judge(proposal, scores, generator, acceptance), fed

    def submit(self, sequence: list[int], proposal: Proposal, rules: DecodingRules,
               generator: torch.Generator | None, acceptance: AcceptanceRule | None = None,
               ) -> Future[tuple[Verdict, int]]:
        """`verify`, computed now: in this process the verdict is never in flight, so the loop
        never drafts ahead (nothing would overlap: the edge and the cloud share the CPU)."""
        return completed(lambda: self.verify(sequence, proposal, rules, generator, acceptance))

    def rollback(self, length: int) -> None:
        self.state.rollback(min(len(self.state), length))  # it may hold less: nothing to cut then

    # Work counters for the record (see ModelState).
    @property
    def prefill_tokens(self) -> int:
        return self.state.prefill_tokens

    @property
    def forwards(self) -> int:
        return self.state.forwards

    @property
    def tokens_fed(self) -> int:
        return self.state.tokens_fed

    @property
    def all_forwards(self) -> int:
        return self.state.all_forwards


class _Softmaxed:
    """Row j: softmax of the target's processed row j, computed when the rule first reads it."""

    def __init__(self, scores: TargetScores) -> None:
        self.scores = scores

    def __len__(self) -> int:
        return len(self.scores)

    def __getitem__(self, j: int) -> torch.Tensor:
        return torch.softmax(self.scores[j], dim=-1)


def target_probs(scores: TargetScores) -> _Softmaxed:
    """The target's distributions, row by row as a rule reads them."""
    return _Softmaxed(scores)


def judge(proposal: Proposal, scores: TargetScores, generator: torch.Generator | None,
          acceptance: AcceptanceRule | None = None) -> Verdict:
    """The verdict on a draft: the caller's rule if given, else greedy match, or rejection
    sampling against the distributions the draft was sampled from when `generator` is given."""
    if acceptance is not None:
        return acceptance(proposal.tokens, scores)
    if generator is None:
        return greedy_verdict(proposal.tokens, scores)
    return rejection_verdict(proposal.tokens, proposal.draft_probs, _Softmaxed(scores), generator)
