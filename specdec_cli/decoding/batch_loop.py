"""The speculative loop for many clips at once: continuous batching over `BatchState` rows.

Each row is one clip doing exactly what `loop.speculative_decode` does for it, and every step
below is that loop's step applied to all rows, with the models' forwards shared:

    1. join: free rows take the next clips; the edge hears them now (each clip's prefill in a
       forward of its own, inserted into the edge's batch), the cloud only remembers them (lazy prefill)
    2. every row drafts up to k tokens: one edge forward for all the rows' catch-ups, then one per
       draft position for the rows still drafting (a row's draft ends at k or at a stop)
    3. gate, per row
    4. the escalated rows' drafts are scored in one cloud forward (a row the cloud has not heard yet
       joins its batch with its lazy prefill: prompt, audio, answer and draft in a forward of its
       own); a rule decides, per row
    5. each row's caches are cut back to its accepted prefix, the other rows untouched
    6. each row's sequence is extended, its stop rules checked per token
    7. one BlockEvent per row and block goes to the caller; a row that is done leaves both batches
       and its result is yielded at once (so a short clip never waits for a long one)

`generate_batch` does the same for one model alone (edge-only / cloud-only, greedy): what HF
`generate` gives each clip. `score_drafts` is step 4's forward, for a server batching sessions.

The per-row logic is the single-clip loop's own: `Drafting` (the drafter), `escalation_reason`,
`TargetScores` + `judge` (the verifier), `extend`, `count_work`, the same `DecodingRules` per
clip. Only the forwards are batched. Each row's tokens equal its batch-1 run's up to float
rounding in the batched forwards (a near-tie can flip: tests/test_batch_loop.py); with sampling,
each row has its own generator seeded as a batch-1 run, drawn in the same order.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from .acceptance import Verdict, first_argmax
from .batch_state import BatchState
from .config import DecodingConfig
from .drafter import Drafting, Proposal
from .gate import MeaningGate, active
from .loop import (
    BlockEvent,
    DecodeResult,
    DecodeStats,
    count_work,
    escalation_reason,
    extend,
    new_event,
)
from .processors import DecodingRules, VocabMasks
from .verifier import AcceptanceRule, TargetScores, judge


@dataclass
class _Clip:
    """One row's clip in flight: what speculative_decode keeps in its locals."""

    key: Hashable
    inputs: Mapping[str, torch.Tensor]
    rules: DecodingRules
    sequence: list[int]                # prompt + accepted answer: the one sequence of record
    prompt_len: int
    generator: torch.Generator | None
    stats: DecodeStats = field(default_factory=DecodeStats)
    events: list[BlockEvent] = field(default_factory=list)

    @property
    def answer(self) -> list[int]:
        return self.sequence[self.prompt_len:]


def speculative_decode_batch(
    edge_model: PreTrainedModel,
    cloud_model: PreTrainedModel,
    clips: Iterable[tuple[Hashable, Mapping[str, torch.Tensor]]],
    cfg: DecodingConfig,
    masks: VocabMasks,
    eos_ids: list[int],
    batch_size: int = 8,
    lazy_prefill: bool = True,
    acceptance: AcceptanceRule | None = None,
    on_block: Callable[[Hashable, BlockEvent], None] | None = None,
    batch_prefill: bool = False,
    seeds: Callable[[Hashable], int] | None = None,
    gate: MeaningGate | None = None,
) -> Iterator[tuple[Hashable, DecodeResult]]:
    """Decode `clips` ((key, thinker inputs) pairs, keys distinct), up to `batch_size` in flight;
    yields (key, result) as each clip ends, in the order they end. A clip's inputs are read from
    `clips` only when a row is free for it.

    `batch_prefill`: the clips joining a model's batch at one step run their prefills in one
    padded forward (BatchState.join_many) instead of one forward each (the default). On 2 CPU
    cores the prefill is compute-bound (prompts of 100-450 tokens, the audio tower over ~1000 mel
    frames): 8 joins one by one cost the demo cloud 297 ms of CPU, together 399-578 ms (padding);
    on a GPU, where a forward's cost is mostly its launch, together should win: measure.

    `seeds`: with `cfg.sample`, the seed of each row's generator, by key (default: `cfg.seed` for
    every row, as each clip's batch-1 run has it).

    `gate`: the pair's meaning gate, as for `speculative_decode`."""
    assert batch_size >= 1, "batch_size must be at least 1"
    edge, cloud = BatchState(edge_model, "edge"), BatchState(cloud_model, "cloud")
    meaning = active(cfg, gate)
    incoming = iter(clips)
    rows: dict[Hashable, _Clip] = {}

    while True:
        # 1. Join: the edge hears each new clip now; the cloud keeps its inputs and hears it when first asked.
        joining = {}
        while len(rows) + len(joining) < batch_size and (nxt := next(incoming, None)) is not None:
            joining[nxt[0]] = (nxt[1], None, 1)
        if joining:
            _join(edge, joining, batch_prefill)
            if not lazy_prefill:
                _join(cloud, joining, batch_prefill)
        for key, (inputs, _, _) in joining.items():
            prompt_len = len(edge[key])
            rows[key] = _Clip(key, inputs, DecodingRules.build(cfg, masks, prompt_len, eos_ids),
                              list(edge[key].ids), prompt_len,
                              torch.Generator().manual_seed(seeds(key) if seeds else cfg.seed) if cfg.sample else None)
        if not rows:
            return

        # 2. Draft up to k tokens per row, never past max_new_tokens.
        proposals = _draft_all(edge, rows, cfg, meaning)

        # 3. Gate (for a row the cloud holds already, the meaning gate's verify threshold).
        held = {key: key in cloud for key in rows}
        reasons = {key: escalation_reason(cfg, proposals[key], row.answer, held[key]) for key, row in rows.items()}

        # 4. Verify the escalated rows: one cloud forward for the rows it holds, a lazy prefill for the others.
        verdicts = _verify_all(cloud, {key: rows[key] for key in rows if reasons[key]}, proposals, acceptance,
                               batch_prefill)

        finished = []
        for key, row in rows.items():
            proposal, reason = proposals[key], reasons[key]
            event = new_event(len(row.events), cfg, proposal, reason, held[key])
            new_tokens = list(proposal.tokens)
            if reason:
                verdict, fed, prefilled = verdicts[key]
                new_tokens = proposal.tokens[:verdict.accepted] + [verdict.token]
                event.accepted, event.correction, event.correction_kind = verdict.accepted, verdict.token, verdict.kind
                event.cloud_tokens, event.cloud_prefill_tokens = fed, prefilled

                # 5. Roll this row back to its accepted prefix in both batches (the edge may hold less already).
                keep = len(row.sequence) + verdict.accepted
                edge.rollback(key, min(len(edge[key]), keep))
                cloud.rollback(key, min(len(cloud[key]), keep))

            # 6. Extend the row's sequence; the first token that ends generation ends it.
            done = extend(row.sequence, new_tokens, row.rules)

            # 7. Report.
            event.answer, event.done = row.answer, done
            row.stats.observe(event)
            row.events.append(event)
            if on_block is not None:
                on_block(key, event)
            if done:
                finished.append(key)

        for key in finished:
            row = rows.pop(key)
            row.stats.tokens = len(row.answer)
            count_work(row.stats, edge.leave(key), cloud.leave(key) if key in cloud else None)
            yield key, DecodeResult(row.answer, row.stats, row.events)


def _join(state: BatchState, joining: dict[Hashable, tuple], together: bool) -> dict[Hashable, torch.Tensor]:
    """Rows join `state`: in one forward (`together`), or each in a forward of its own."""
    if together or len(joining) <= 1:
        return state.join_many(joining) if joining else {}
    return {key: state.join(key, *join) for key, join in joining.items()}


def _draft_all(edge: BatchState, rows: dict[Hashable, _Clip], cfg: DecodingConfig,
               gate: MeaningGate | None = None) -> dict[Hashable, Proposal]:
    """Every row's proposal (drafter.propose per row, the edge's forwards shared): first the
    catch-up (the tokens each row's edge has not consumed, in one forward; a row with none reads the
    logits it kept), then one forward per draft position for the rows still drafting."""
    drafts = {key: Drafting(row.sequence, min(cfg.k, row.prompt_len + cfg.max_new_tokens - len(row.sequence)),
                            row.rules, row.generator, gate) for key, row in rows.items()}
    catch_up = {key: edge[key].pending(row.sequence) for key, row in rows.items()}
    logits = {key: edge[key].last_logits for key, pending in catch_up.items() if not pending}
    assert all(v is not None for v in logits.values()), "edge has no logits for a row's first draft position"
    fed = edge.advance({key: pending for key, pending in catch_up.items() if pending},
                       keep={key: 1 for key in rows})
    logits.update({key: rows_[-1] for key, rows_ in fed.items()})
    while logits:
        feed = {}
        for key, row_logits in logits.items():
            token = drafts[key].step(row_logits)
            if token is not None:
                feed[key] = [token]
        logits = {key: rows_[-1] for key, rows_ in edge.advance(feed).items()}
    return {key: d.proposal() for key, d in drafts.items()}


def _verify_all(cloud: BatchState, rows: dict[Hashable, _Clip], proposals: dict[Hashable, Proposal],
                acceptance: AcceptanceRule | None, batch_prefill: bool) -> dict[Hashable, tuple[Verdict, int, int]]:
    """Per escalated row: (verdict, tokens fed after the prompt, prompt tokens run), as
    LocalCloud.verify (verifier.score_draft + judge) gives them for one clip."""
    scored = score_drafts(cloud, {key: (row.inputs, row.sequence, proposals[key].tokens) for key, row in rows.items()},
                          batch_prefill)
    verdicts = {}
    for key, row in rows.items():
        proposal = proposals[key]
        target_rows, fed, prefilled = scored[key]
        scores = TargetScores(row.rules, row.sequence, proposal.tokens, target_rows)
        verdicts[key] = (judge(proposal, scores, row.generator, acceptance), fed, prefilled)
    return verdicts


def score_drafts(cloud: BatchState, drafts: Mapping[Hashable, tuple[Mapping[str, torch.Tensor], list[int], list[int]]],
                 batch_prefill: bool = False, costs: dict[Hashable, float] | None = None
                 ) -> dict[Hashable, tuple[torch.Tensor, int, int]]:
    """verifier.score_draft for many rows in one cloud forward. `drafts`: key -> (thinker inputs,
    sequence = prompt + accepted answer, draft). Per key: the raw target rows [k+1, V] (row j
    scoring draft[j], row k the bonus position; wrap them in a TargetScores to judge), the tokens
    this forward fed after the prompt, and the prompt tokens it ran. Lazy catch-up as there: a
    row's tokens accepted without the cloud go in the same forward as its draft; a key the cloud
    does not hold joins with prompt + answer + draft (its lazy prefill, see `_join`). A server
    batching its sessions' verifications calls this with one entry per session; the cache still
    holds each whole draft afterwards, so each verdict is followed by `cloud.rollback(key, ...)`.

    `costs`: filled with the seconds of forward each key's row took: its own prefill's (a joining
    row), plus its share of the shared forward by the tokens it fed there (a server charges each
    row's time to the tenant whose row it is)."""
    scored: dict[Hashable, torch.Tensor] = {}
    before = {key: (cloud[key].tokens_fed, cloud[key].prefill_tokens) if key in cloud else (0, 0) for key in drafts}
    feed, keep, head, joining = {}, {}, {}, {}
    for key, (inputs, sequence, draft) in drafts.items():
        if key not in cloud:  # the lazy prefill (prompt, audio, answer, draft) as the row joins
            joining[key] = (inputs, list(sequence) + list(draft), len(draft) + 1)
            continue
        pending = cloud[key].pending(sequence)
        if pending:  # the last k+1 rows: row j predicts the token after pending[-1] + draft[:j]
            feed[key], keep[key] = pending + list(draft), len(draft) + 1
        else:        # the kept logits predict draft[0]
            assert cloud[key].last_logits is not None, "cloud has no logits for the first draft position"
            feed[key], keep[key], head[key] = list(draft), len(draft), cloud[key].last_logits[None]
    spent = dict.fromkeys(drafts, 0.0)
    if batch_prefill or len(joining) <= 1:
        started = time.perf_counter()
        scored.update(_join(cloud, joining, batch_prefill))
        _share(spent, time.perf_counter() - started, {key: len(join[1]) for key, join in joining.items()})
    else:  # each joining row in a forward of its own (as _join does), each timed
        for key, join in joining.items():
            started = time.perf_counter()
            scored[key] = cloud.join(key, *join)
            spent[key] += time.perf_counter() - started
    started = time.perf_counter()
    advanced = cloud.advance(feed, keep)
    _share(spent, time.perf_counter() - started, {key: len(tokens) for key, tokens in feed.items()})
    for key, got in advanced.items():
        scored[key] = torch.cat([head[key], got]) if key in head else got
    if costs is not None:
        costs.update(spent)
    return {key: (scored[key], cloud[key].tokens_fed - before[key][0], cloud[key].prefill_tokens - before[key][1])
            for key in drafts}


def _share(spent: dict[Hashable, float], seconds: float, weights: Mapping[Hashable, int]) -> None:
    """A shared forward's seconds, split between its rows by their tokens in it."""
    total = sum(weights.values())
    for key, weight in weights.items():
        spent[key] += seconds * weight / total if total else seconds / len(weights)


def generate_batch(
    model: PreTrainedModel,
    clips: Iterable[tuple[Hashable, Mapping[str, torch.Tensor]]],
    cfg: DecodingConfig,
    masks: VocabMasks,
    eos_ids: list[int],
    batch_size: int = 8,
) -> Iterator[tuple[Hashable, DecodeResult]]:
    """One model alone (cfg.mode "edge" or "cloud"), greedy, for many clips: what
    `baselines.generate_baseline` (HF `generate`) gives each clip, its counters included, with one
    forward per step for all rows (`GenerateRows`, up to `batch_size` of them)."""
    assert batch_size >= 1, "batch_size must be at least 1"
    rows = GenerateRows(model, masks, eos_ids, cfg.mode)
    incoming = iter(clips)
    while True:
        # 1. Join: each new clip's prompt runs now (its own forward); its logits give the first token.
        while len(rows) < batch_size and (nxt := next(incoming, None)) is not None:
            rows.join(nxt[0], nxt[1], cfg)
        if not rows:
            return
        # 2. Each row picks its token; a row whose token ends generation leaves (yielded at once).
        yield from rows.pick()
        # 3. One forward for every row still going.
        rows.advance()


class GenerateRows:
    """Continuous batching of greedy one-model generation: rows join (each prompt in a forward of
    its own), every step picks one token per row and feeds all the rows still going in one forward,
    a finished row leaves at once. `generate_batch` drives it from an iterable of clips; a server
    drives it from requests as they come (remote/generations.py). Each row has its own config (its
    rules, max_new_tokens); all are greedy.

    Per row: the rules process the logits (the same objects HF runs as logits processors), the
    first argmax is the token (HF's greedy choice), the rules' stop test ends the row: what
    `baselines.generate_baseline` gives the clip alone, up to float rounding in the batched
    forward. Sampling is not batched: HF draws from torch's global generator, whose stream
    depends on every row (callers decode sampled baselines one clip at a time)."""

    def __init__(self, model: PreTrainedModel, masks: VocabMasks, eos_ids: list[int], name: str = "cloud") -> None:
        self.state = BatchState(model, name)
        self.masks, self.eos_ids = masks, eos_ids
        self.rows: dict[Hashable, tuple[list[int], DecodingRules, str]] = {}  # key -> (prompt + answer, rules, mode)
        self.logits: dict[Hashable, torch.Tensor] = {}  # key -> (V,) for the row's next token
        self.feed: dict[Hashable, list[int]] = {}       # key -> the token the next forward feeds it

    def __len__(self) -> int:
        return len(self.rows)

    def __contains__(self, key: Hashable) -> bool:
        return key in self.rows

    def join(self, key: Hashable, inputs: Mapping[str, torch.Tensor], cfg: DecodingConfig) -> None:
        """A new row: its prompt runs now (a forward of its own); its logits give its first token."""
        assert not cfg.sample, "sampled baselines run one clip at a time (HF generate)"
        self.logits[key] = self.state.join(key, inputs)[-1]
        prompt_len = len(self.state[key])
        self.rows[key] = (list(self.state[key].ids), DecodingRules.build(cfg, self.masks, prompt_len, self.eos_ids),
                          cfg.mode)

    def leave(self, key: Hashable) -> None:
        """Drop a row before it ends (its requester is gone)."""
        self.rows.pop(key)
        self.logits.pop(key, None)
        self.feed.pop(key, None)
        self.state.leave(key)

    def pick(self) -> list[tuple[Hashable, DecodeResult]]:
        """Each row with logits picks its token; the rows whose token ends generation leave and are
        returned, the others are fed it by the next `advance`."""
        finished = []
        for key in [key for key in self.rows if key in self.logits]:
            sequence, rules, mode = self.rows[key]
            token = first_argmax(rules.process_ids(sequence, self.logits.pop(key)))
            if extend(sequence, [token], rules):
                self.rows.pop(key)
                row = self.state.leave(key)
                stats = DecodeStats(tokens=len(sequence) - rules.prompt_len)
                if mode == "cloud":
                    count_work(stats, _NoWork(), row)
                else:
                    count_work(stats, row, None)
                finished.append((key, DecodeResult(sequence[rules.prompt_len:], stats)))
            else:
                self.feed[key] = [token]
        return finished

    def advance(self) -> None:
        """One forward for every row fed a token by `pick`."""
        if self.feed:
            feed, self.feed = self.feed, {}
            self.logits.update({key: got[-1] for key, got in self.state.advance(feed).items()})


class _NoWork:
    """The edge's counters in a cloud-only run: it never ran."""

    forwards = 0
