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
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from . import wire
from .fairness import RoundRobin


@dataclass
class Job:
    """One verification: the session (server.CloudSession), the sequence to verify after
    (its tokens + pending) and the request."""

    session: Any
    sequence: list[int]
    request: wire.VerifyRequest


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
    verdict, fed = cloud.verify(job.sequence, Proposal(list(req.draft), [], None), job.session.rules, None,
                                _acceptance(req, rejected_row))
    cloud.rollback(len(job.sequence) + verdict.accepted)
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
    scored = score_drafts(batch, {key: (states[key].prompt, job.sequence, list(job.request.draft))
                                  for key, job in zip(keys, jobs, strict=True)})
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
    when a batch of n failed (the server logs it once)."""
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
    answer (or exception) per job."""

    def __init__(self, run: Callable[[list[Job]], Awaitable[list[Any]]], window_s: float, max_batch: int,
                 senders: Callable[[], int] | None = None, on_cancel: Callable[[], None] | None = None) -> None:
        assert window_s > 0 and max_batch > 1, "a batcher batches: window > 0 and max_batch > 1"
        self.run, self.window_s, self.max_batch = run, window_s, max_batch
        # Who could send a job (an upper bound: the jobs queued or running included); None: always wait.
        self.senders = senders
        self.on_cancel = on_cancel
        self._running = 0
        self._queue: RoundRobin[tuple[Job, asyncio.Future, float]] = RoundRobin()
        self._consumer: asyncio.Task | None = None
        self._arrived = asyncio.Event()

    def __len__(self) -> int:
        return len(self._queue)

    async def submit(self, job: Job) -> wire.VerifyResponse:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._queue.push(job.session.owner, (job, future, loop.time()))
        if self._consumer is None or self._consumer.done():
            self._arrived = asyncio.Event()  # bound to this loop
            self._consumer = loop.create_task(self._consume())
        self._arrived.set()
        return await future

    def _others(self) -> int:
        """Senders that could still add a job to the batch being formed."""
        if self.senders is None:
            return 1
        return self.senders() - len(self._queue) - self._running

    async def _consume(self) -> None:
        loop = asyncio.get_running_loop()
        while self._queue:
            # The window counts from the first job's arrival: jobs that queued behind a running
            # batch have waited long enough and go at once. No wait either when nobody else could
            # send one (a lone client's verification never waits).
            deadline = min(arrived for _, _, arrived in self._queue) + self.window_s
            while (len(self._queue) < self.max_batch and self._others() > 0
                   and (left := deadline - loop.time()) > 0):
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), left)
                except TimeoutError:
                    break
            for _ in range(self._queue.drop(lambda item: item[1].done())):  # their clients have gone
                if self.on_cancel is not None:
                    self.on_cancel()
            batch = [item for _ in range(min(self.max_batch, len(self._queue))) if (item := self._queue.pop())]
            if not batch:
                continue
            self._running = len(batch)
            try:
                answers = await self.run([job for job, _, _ in batch])
            except Exception as exc:  # noqa: BLE001 - each request gets it and reports it as it would alone
                answers = [exc] * len(batch)
            finally:
                self._running = 0
            for (_, future, _), answer in zip(batch, answers, strict=True):
                if future.done():  # the request was cancelled (client gone): nobody to tell
                    continue
                if isinstance(answer, BaseException):
                    future.set_exception(answer)
                else:
                    future.set_result(answer)
