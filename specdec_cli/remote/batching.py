"""Verification for `specdec serve`: one request at a time, or the requests of concurrent sessions
batched into one forward of the cloud thinker.

What a verification is (both ways): score the draft after the session's tokens plus the pending
ones (lazy catch-up; on a session's first request the lazy prefill with its audio), judge it with
the request's rule (greedy match, or the client's uniforms for rejection sampling), cut the cache
back to what the verdict kept, and answer the verdict, the counters (`fed`, `prefilled`,
`forwards`, `all_forwards`), `held` and whether the verdict ends the clip. `verify_one` does it
with the session's own `LocalCloud`, exactly as the in-process loop does; `verify_together` does it
for several sessions with the cloud forward shared, through `BatchState` and
`batch_loop.score_drafts` (the batched loop's own scoring), and then the very same judging and
answering per session. The answers are equal up to float rounding of the batched forward
(a greedy verdict can only flip at a near-tie; tests/test_remote_batching.py compares them).

Who owns a session's cache. A session keeps its sequence in its own `ModelState` between
requests. A batch lends it: `BatchState.adopt` takes the caches of the sessions in this batch (one
copy each, into a fresh BatchState), a session the cloud has not heard yet joins with its lazy
prefill (a batch-1 forward of its own, as in the batched loop), one forward scores every draft,
each row is rolled back to its verdict, and `BatchState.release` gives each session its cache back
(one copy each). In between the batch owns those caches and the sessions hold nothing
(`ModelState.lend` / `take_back`), so a cache has one owner at any time. Why not keep every open
session as a row of one long-lived BatchState: every forward of a BatchState runs all its rows
(rows not fed get padding), so the sessions idle on the edge side (drafting, or waiting on a
confident block that needs no cloud) would be computed in every batch, and the cache would be as
wide as the longest session for all of them; with up to --max-sessions open sessions and a batch
of a handful, that is most of the work. The price of lending is two copies of each batched
session's cache per request (measured in bench/server_batching.py with the rest).

A request fails only itself (`verify_batch`). Before a batch borrows the sessions' caches, each
session's state is kept as it is (`ModelState.lend` + `take_back`: the same cache object, not a copy;
`adopt` copies from it and never writes it), until the batch has given the caches back. When
anything in the batch raises (the shared forward, one request's judging, one answer), every session
is put back to what it held before this request and each request is verified alone, exactly as the
one-at-a-time server verifies it (`verify_one`); only a request that also fails alone gets an error,
and the server drops that session (its client rebuilds it). The price: the batched sessions' caches
as they were before the request stay alive while the batch runs (one more copy of them, for the
duration of one forward); a backup taken after the forward could not help, since a failed forward
leaves the caches it was writing in an unknown state.

`Batcher` forms the batches: one consumer on the event loop. The first request to arrive waits up
to the window for others, up to `max_batch`, while anyone else could send one (an idle open
session, or a request still being read or opening its session; a lone client never waits); the batch then runs in a worker thread (under the
server's model lock) while new requests queue, and those form the next batch at once when it is
done (their window has passed while they waited). The queue is taken one request per token in
turn (fairness.RoundRobin, issue 33), so a token that floods verifications fills a batch only
with the room other tokens leave; a request whose client has gone (its future cancelled) is
dropped before its batch is formed (`on_cancel`).

Who pays for a batch (issue 42). A batch's forward serves several tokens, and a session's first
verification (the default client's `--upload lazy`) carries its lazy prefill, which costs as much
as many verifications (a 30 s clip: ~120 ms of the demo cloud against ~3 ms for a draft). Each
row's time is measured (`score_drafts(costs=...)`: a joining row's own prefill, plus its share of
the shared forward by the tokens it fed) and charged to the token whose row it is, on the same
counters the model's turns are granted by (fairness.Turns: VTC's per-tenant counters); what the
rows' own times leave of the batch (copies, judging) is split evenly, so every second is charged.
The batcher forms its batches by those counters: a token joins only while it is within
`quantum_s` of the least served token that is active (queued here, waiting for a turn of the
model, or answered within `hold_s` and so likely back in a round trip), and with at most one
new-session prefill per batch. When only tokens ahead are queued and a lighter one is expected
back, the model is kept idle up to `hold_s` for it (fairness.Turns' anticipatory hold, here).
A token that queues is levelled with the tokens active here (queued, in the running batch, or
answered within ACTIVE_S), up to the ledger's `credit_s` behind them (`Turns.lift`): a token that
pauses earns no lasting credit, a newcomer is not owed everything the others had, and one that
comes back every round trip is not levelled up to the flood each time. So a token flooding lazy
opens costs a light token at most one prefill per round in which the light token has had as much
model time (bench/server_fairness.py lazy measures it).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from . import wire
from .fairness import RoundRobin, Turns

QUANTUM_S = 0.05  # a token this much model time ahead of the least served active one still joins a batch
ACTIVE_S = 1.0    # a token answered this recently is active: a newcomer is levelled with it (Turns.lift)


@dataclass
class Job:
    """One verification: the session (server.CloudSession), the sequence to verify after
    (its tokens + pending) and the request; `cost`: the seconds of model time its row took
    (set when it is verified; the server charges them to the session's token)."""

    session: Any
    sequence: list[int]
    request: wire.VerifyRequest
    cost: float = 0.0

    @property
    def owner(self) -> Hashable:
        return self.session.owner

    @property
    def opens(self) -> bool:
        """Whether the session's lazy prefill runs with this verification (its first)."""
        return not self.session.cloud.state.started


def _counters(cloud: Any) -> tuple[int, int, int, int]:
    return cloud.prefill_tokens, cloud.tokens_fed, cloud.forwards, cloud.all_forwards


def _acceptance(req: wire.VerifyRequest, rejected_row: list[torch.Tensor]) -> Any:
    """The request's rule: None (greedy match) or rejection sampling with the client's uniforms.
    At a rejection the target's row is kept in `rejected_row`: the client draws the residual (it
    has the drafter's row)."""
    from ..decoding.acceptance import Verdict, draw_at, first_rejection
    from ..decoding.verifier import target_probs

    if req.sampling is None:
        return None
    s = req.sampling

    def acceptance(draft: list[int], scores: Any) -> Verdict:
        probs = target_probs(scores)
        j = first_rejection(draft, s.p_draft, probs, s.u)
        if j == len(draft):
            return Verdict(j, draw_at(probs[j], s.u_last), "bonus")
        rejected_row.append(probs[j])
        return Verdict(j, -1, "recovered")
    return acceptance


def _answer(job: Job, verdict: Any, fed: int, before: tuple[int, int, int, int],
            rejected_row: list[torch.Tensor]) -> wire.VerifyResponse:
    """The answer, once the session's cloud holds what the verdict kept."""
    from ..decoding.loop import extend

    session, sequence, req = job.session, job.sequence, job.request
    cloud = session.cloud
    # Does the verdict end the clip? The loop's own stop rule over the tokens it will append
    # (not knowable when the client draws the token). Then the session closes here and the
    # client need not spend a round trip on closing it.
    ended = verdict.token >= 0 and extend(list(sequence), list(req.draft[:verdict.accepted]) + [verdict.token],
                                          session.rules)
    after = _counters(cloud)
    return wire.VerifyResponse(
        session=session.id, accepted=verdict.accepted, token=verdict.token, kind=verdict.kind,
        held=len(cloud), fed=fed, prefilled=after[0] - before[0], forwards=after[2] - before[2],
        all_forwards=after[3] - before[3], target_row=wire.sparse_row(rejected_row[0]) if rejected_row else None,
        ended=ended)


def verify_one(job: Job) -> wire.VerifyResponse:
    """Score, judge, roll back: the in-process loop's steps 4-5 for one block, on the session's
    own LocalCloud (worker thread)."""
    from ..decoding.drafter import Proposal

    cloud, req = job.session.cloud, job.request
    before = _counters(cloud)
    rejected_row: list[torch.Tensor] = []
    started = time.perf_counter()
    try:
        verdict, fed = cloud.verify(job.sequence, Proposal(list(req.draft), [], None), job.session.rules, None,
                                    _acceptance(req, rejected_row))
        cloud.rollback(len(job.sequence) + verdict.accepted)
    finally:
        job.cost += time.perf_counter() - started
    return _answer(job, verdict, fed, before, rejected_row)


def verify_together(model: Any, jobs: Sequence[Job]) -> list[wire.VerifyResponse]:
    """`verify_one` for each job, the cloud's forward shared (one forward for the sessions it has
    heard, plus a batch-1 prefill for each session it has not); each job's verdict by its own rule
    (worker thread). Raises when the batch fails: then every session in it has lost its cache."""
    from ..decoding.batch_loop import score_drafts
    from ..decoding.batch_state import BatchState
    from ..decoding.drafter import Proposal
    from ..decoding.verifier import TargetScores, judge

    keys = [job.session.id for job in jobs]
    assert len(set(keys)) == len(keys), "a session can be in a batch once"
    states = {job.session.id: job.session.cloud.state for job in jobs}
    before = {key: _counters(job.session.cloud) for key, job in zip(keys, jobs, strict=True)}
    batch = BatchState(model, "cloud")
    batch.adopt({key: state for key, state in states.items() if state.started})
    costs: dict[Any, float] = {}
    scored = score_drafts(batch, {key: (states[key].prompt, job.sequence, list(job.request.draft))
                                  for key, job in zip(keys, jobs, strict=True)}, costs=costs)
    for key, job in zip(keys, jobs, strict=True):
        job.cost += costs[key]
    judged = []
    for key, job in zip(keys, jobs, strict=True):
        rows, fed, _ = scored[key]
        rejected_row: list[torch.Tensor] = []
        scores = TargetScores(job.session.rules, job.sequence, list(job.request.draft), rows)
        verdict = judge(Proposal(list(job.request.draft), [], None), scores, None,
                        _acceptance(job.request, rejected_row))
        batch.rollback(key, len(job.sequence) + verdict.accepted)
        judged.append((verdict, fed, rejected_row))
    batch.release(states)
    return [_answer(job, verdict, fed, before[key], rejected_row)
            for key, job, (verdict, fed, rejected_row) in zip(keys, jobs, judged, strict=True)]


def _kept(state: Any) -> Any:
    """What a session's state holds before a batch borrows it (None: its prompt has not run)."""
    if not state.started:
        return None
    kept = state.lend()
    state.take_back(kept)  # the state goes on with the same cache object; `kept` is only read on failure
    return kept


def _put_back(state: Any, kept: Any) -> None:
    """The state as it was before the batch: what a failed batch left in it is dropped."""
    if state.started:
        state.lend()
    if kept is None:
        state.start(state.prompt)  # lazily started, as it was: nothing run, counters at 0
    else:
        state.take_back(kept)


def verify_batch(model: Any, jobs: Sequence[Job], on_failure: Callable[[BaseException, int], None] | None = None
                 ) -> list[wire.VerifyResponse | Exception]:
    """`verify_together`, and when it raises, each job alone from what its session held before
    (`verify_one`): one answer or one exception per job, in order. `on_failure(exc, n)` is told
    when a batch of n failed (the server logs it once). Each job's `cost` is then its share of the
    time this took: its row's own, plus an even share of the rest (copies, judging, a failed batch)."""
    started = time.perf_counter()
    try:
        return _verify_batch(model, jobs, on_failure)
    finally:
        rest = time.perf_counter() - started - sum(job.cost for job in jobs)
        for job in jobs:
            job.cost += max(0.0, rest) / len(jobs)


def _verify_batch(model: Any, jobs: Sequence[Job], on_failure: Callable[[BaseException, int], None] | None
                  ) -> list[wire.VerifyResponse | Exception]:
    if len(jobs) == 1:
        try:
            return [verify_one(jobs[0])]
        except Exception as exc:  # noqa: BLE001 - the request's own failure, reported as its answer
            return [exc]
    kept = [_kept(job.session.cloud.state) for job in jobs]
    try:
        return list(verify_together(model, jobs))
    except Exception as exc:  # noqa: BLE001 - retried alone below
        if on_failure is not None:
            on_failure(exc, len(jobs))
        for job, backup in zip(jobs, kept, strict=True):
            _put_back(job.session.cloud.state, backup)
    finally:
        del kept
    answers: list[wire.VerifyResponse | Exception] = []
    for job in jobs:
        try:
            answers.append(verify_one(job))
        except Exception as exc:  # noqa: BLE001 - this request fails alone too: its error is its answer
            answers.append(exc)
    return answers


class Batcher:
    """Requests in, batches out: one consumer task on the event loop (started by the first request
    of a burst, gone when the queue is empty). `run` gets the jobs of one batch and returns one
    answer (or exception) per job, each job's `cost` set (`verify_batch` does).

    `ledger`: the model's turns, whose counters order the tokens here (the module docstring says
    how); None: one request per token in turn, whatever each has had. `senders(due)`: how many
    requests of the tokens `due(token)` accepts could still join the batch being formed (an upper
    bound: those queued or running included); None: always wait out the window."""

    POLL_S = 0.01  # how often a batch kept for a lighter token waiting for a turn elsewhere looks again

    def __init__(self, run: Callable[[list[Job]], Awaitable[list[Any]]], window_s: float, max_batch: int,
                 senders: Callable[[Callable[[Hashable], bool]], int] | None = None,
                 on_cancel: Callable[[], None] | None = None, ledger: Turns | None = None, hold_s: float = 0.0,
                 quantum_s: float = QUANTUM_S) -> None:
        assert window_s > 0 and max_batch > 1, "a batcher batches: window > 0 and max_batch > 1"
        self.run, self.window_s, self.max_batch = run, window_s, max_batch
        self.senders = senders
        self.on_cancel = on_cancel
        self.ledger, self.hold_s, self.quantum_s = ledger, hold_s, quantum_s
        self._running = 0
        self._batch: set[Hashable] = set()  # the tokens of the batch running now
        self._queue: RoundRobin[tuple[Job, asyncio.Future, float]] = RoundRobin()
        self._consumer: asyncio.Task | None = None
        self._arrived = asyncio.Event()
        self._answered: dict[Hashable, float] = {}  # token -> when its last job here was answered

    def __len__(self) -> int:
        return len(self._queue)

    async def submit(self, job: Job) -> wire.VerifyResponse:
        loop = asyncio.get_running_loop()
        if self.ledger is not None:
            now = loop.time()
            self.ledger.lift(job.owner, self._batch | set(self._queue.owners())
                             | {owner for owner, at in self._answered.items() if now - at < ACTIVE_S})
        future = loop.create_future()
        self._queue.push(job.owner, (job, future, loop.time()))
        if self._consumer is None or self._consumer.done():
            self._arrived = asyncio.Event()  # bound to this loop
            self._consumer = loop.create_task(self._consume())
        self._arrived.set()
        return await future

    def _expected(self, now: float) -> set[Hashable]:
        """Tokens with a job queued here, or answered within hold_s (likely back in a round trip)."""
        recent = {owner for owner, at in self._answered.items() if now - at < self.hold_s}
        return recent | set(self._queue.owners())

    def _due(self, now: float) -> tuple[Callable[[Hashable], bool], float]:
        """Which tokens may join a batch now; and, when none that is queued may, how long to keep
        the model for the lighter token expected back (0: at least one queued token may)."""
        if self.ledger is None:
            return (lambda owner: True), 0.0
        served = self.ledger.served
        waiting = self.ledger.active()
        expected = self._expected(now) | waiting
        floor = min((served.get(owner, 0.0) for owner in expected), default=0.0)

        def due(owner: Hashable) -> bool:
            return served.get(owner, 0.0) <= floor + self.quantum_s
        if any(due(owner) for owner in self._queue.owners()):
            return due, 0.0
        lighter = [owner for owner in expected if due(owner)]
        waits = [self._answered[owner] + self.hold_s - now for owner in lighter if owner not in waiting]
        hold = min([*waits, *([self.POLL_S] if len(waits) < len(lighter) else [])], default=0.0)
        return (due, hold) if hold > 0 else ((lambda owner: True), 0.0)

    def _take(self, due: Callable[[Hashable], bool]) -> list[tuple[Job, asyncio.Future, float]]:
        """The next batch: up to max_batch jobs of due tokens, one per token in turn, and at most
        one new-session prefill per token (its second waits for the next batch)."""
        prefills: collections.Counter[Hashable] = collections.Counter()

        def may_join(owner: Hashable) -> bool:
            head = self._queue.peek(owner)
            return due(owner) and not (head is not None and head[0].opens and prefills[owner])
        batch: list[tuple[Job, asyncio.Future, float]] = []
        while len(batch) < self.max_batch and (item := self._queue.pop(may_join)) is not None:
            batch.append(item)
            prefills[item[0].owner] += item[0].opens
        return batch

    def _others(self, due: Callable[[Hashable], bool]) -> int:
        """Senders of due tokens that could still add a job to the batch being formed."""
        if self.senders is None:
            return 1
        queued = sum(1 for job, _, _ in self._queue if due(job.owner))
        return self.senders(due) - queued - self._running

    async def _consume(self) -> None:
        loop = asyncio.get_running_loop()
        while self._queue:
            due, hold = self._due(loop.time())
            if hold > 0:  # only tokens ahead are queued: the model waits a moment for the lighter one
                self._arrived.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._arrived.wait(), hold)
                for _ in range(self._queue.drop(lambda item: item[1].done())):
                    if self.on_cancel is not None:
                        self.on_cancel()
                continue
            # The window counts from the first job's arrival: jobs that queued behind a running
            # batch have waited long enough and go at once. No wait either when nobody else could
            # send one (a lone client's verification never waits).
            deadline = min(arrived for job, _, arrived in self._queue if due(job.owner)) + self.window_s
            while (sum(1 for job, _, _ in self._queue if due(job.owner)) < self.max_batch and self._others(due) > 0
                   and (left := deadline - loop.time()) > 0):
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), left)
                except TimeoutError:
                    break
            for _ in range(self._queue.drop(lambda item: item[1].done())):  # their clients have gone
                if self.on_cancel is not None:
                    self.on_cancel()
            batch = self._take(due)
            if not batch:
                continue
            self._running, self._batch = len(batch), {job.owner for job, _, _ in batch}
            try:
                answers = await self.run([job for job, _, _ in batch])
            except Exception as exc:  # noqa: BLE001 - each request gets it and reports it as it would alone
                answers = [exc] * len(batch)
            finally:
                self._running, self._batch = 0, set()
            now = loop.time()
            for (job, future, _), answer in zip(batch, answers, strict=True):
                self._answered[job.owner] = now
                if future.done():  # the request was cancelled (client gone): nobody to tell
                    continue
                if isinstance(answer, BaseException):
                    future.set_exception(answer)
                else:
                    future.set_result(answer)
