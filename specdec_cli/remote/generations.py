"""Cloud-only descriptions (`/v1/generate`) for `specdec serve`, with continuous batching.

A cloud-only server that runs one request at a time is a weak baseline: any real one (vLLM,
SGLang) batches concurrent requests continuously. So do we, with the rows the batch command
decodes cloud-only clips in (`batch_loop.GenerateRows` over `BatchState`): a request's clip joins
the running batch between two steps (its prompt in a forward of its own, as every BatchState join
on a CPU), every step is one forward for all the rows still going, and a row that ends leaves at
once and is answered. Each row's tokens are what HF `generate` gives the clip alone (the
one-at-a-time server's answer), up to float rounding in the batched forward (tests/test_remote_generate.py
compares them through a real server).

One consumer task on the event loop runs the steps, each in a worker thread in a turn of the
server's model (`in_worker`, fairness.Turns), so verifications, opens and generations take turns
forward by forward. Each step's model time is charged to the tokens whose rows it ran (issue 42):
a joining row's prompt forward to its own token, the shared forward evenly per row. It exists while there are rows or requests waiting, up to `max_rows` rows at a
time.

Fair share between tokens (issue 33). Waiting requests join in turn, one per token
(fairness.RoundRobin), and a token takes a free row only while it holds fewer than its share of
the rows (`max_rows` over the tokens with rows or requests waiting, rounded up): one token's flood
fills the free rows, but a newcomer joins as soon as one of the flood's rows ends (rows are not
preempted). A token has at most `max_waiting` requests queued (beyond it: a 503). A request whose
client has gone (its future cancelled by the server's disconnect watch) leaves the queue, or its
row leaves the batch, at the next step; `on_cancel(where)` is told ("queued" or "row").

A request fails only itself, as with verification batching (batching.py): when a step raises,
the batch's cache is in an unknown state, so it is dropped and every request that was in it is
run again alone from its clip (`alone`: HF generate, the one-at-a-time server's path); only a
request that also fails alone gets an error. Sampled requests are never batched (HF draws from
torch's global generator, whose stream would depend on every row): the server runs them alone.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import time
from collections.abc import Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

from .fairness import RoundRobin, busy


@dataclass
class _Request:
    inputs: Mapping[str, Any]
    cfg: Any            # DecodingConfig (greedy, mode "cloud")
    future: asyncio.Future
    owner: Hashable = 0  # the token that sent it


class GenerateBatcher:
    """`submit(inputs, cfg)` -> the clip's DecodeResult, continuously batched with the others.

    `rows()`: a fresh `GenerateRows` for the hosted model; `in_worker(fn, owners, costs)`: run fn
    in a worker thread in a turn of the model for the tokens `owners`, then charge each token the
    seconds `costs()` lists for it; `alone(inputs, cfg)`: the one-at-a-time answer (HF generate);
    `on_failure(exc, n)`: told when a step of n rows failed (the server logs it once);
    `on_step(n)`: told the rows of each step (a metric); `max_waiting`: requests one token may
    have queued; `on_cancel(where)`: told of each request dropped because its client went."""

    def __init__(self, rows: Callable[[], Any],
                 in_worker: Callable[[Callable[[], Any], list[Hashable], Callable[[], list[tuple[Hashable, float]]]],
                                     Awaitable[Any]],
                 alone: Callable[[Mapping[str, Any], Any], Any], max_rows: int,
                 on_failure: Callable[[BaseException, int], None] | None = None,
                 on_step: Callable[[int], None] | None = None, max_waiting: int | None = None,
                 on_cancel: Callable[[str], None] | None = None) -> None:
        assert max_rows > 1, "a batcher batches: max_rows > 1"
        self.new_rows, self.in_worker, self.alone, self.max_rows = rows, in_worker, alone, max_rows
        self.on_failure, self.on_step, self.max_waiting, self.on_cancel = on_failure, on_step, max_waiting, on_cancel
        self._queue: RoundRobin[_Request] = RoundRobin()
        self._consumer: asyncio.Task | None = None
        self._keys = itertools.count()

    def __len__(self) -> int:
        return len(self._queue)

    async def submit(self, inputs: Mapping[str, Any], cfg: Any, owner: Hashable = 0) -> Any:
        assert not cfg.sample, "sampled generations run alone (see above)"
        if self.max_waiting is not None and self._queue.waiting(owner) >= self.max_waiting:
            raise busy(f"this token has {self.max_waiting} generations queued already; retry when one is answered")
        future = asyncio.get_running_loop().create_future()
        self._queue.push(owner, _Request(inputs, cfg, future, owner))
        if self._consumer is None or self._consumer.done():
            self._consumer = asyncio.get_running_loop().create_task(self._consume())
        return await future

    async def _consume(self) -> None:
        active: dict[int, _Request] = {}
        try:
            await self._steps(active)
        except BaseException as exc:  # a bug here, or the server stopping: nobody is left waiting forever
            for req in [*active.values(), *list(self._queue)]:
                if not req.future.done():
                    req.future.set_exception(exc if isinstance(exc, Exception) else RuntimeError("server stopping"))
            self._queue.clear()
            raise

    async def _steps(self, active: dict[int, _Request]) -> None:
        rows = self.new_rows()
        while self._queue or active:
            # Between two steps: rows whose requester has gone leave, waiting requests join.
            gone = [key for key, req in active.items() if req.future.done()]
            for key in gone:
                del active[key]
                self._cancelled("row")
            for _ in range(self._queue.drop(lambda req: req.future.done())):
                self._cancelled("queued")
            joining: dict[int, _Request] = {}
            held = collections.Counter(req.owner for req in active.values())
            tokens = len(set(held) | {req.owner for req in self._queue})
            share = -(-self.max_rows // max(1, tokens))  # rows per token, rounded up
            while self._queue and len(active) + len(joining) < self.max_rows:
                req = self._queue.pop(lambda owner, held=held, share=share: held[owner] < share)
                if req is None:
                    break
                held[req.owner] += 1
                joining[next(self._keys)] = req
            if not active and not joining:  # (with no row running, every token is under its share)
                continue

            costs: dict[int, float] = {}  # row -> seconds of this step's model time spent on it

            def step(rows: Any = rows, gone: list[int] = gone, joining: dict[int, _Request] = joining,
                     costs: dict[int, float] = costs) -> list:
                for key in gone:
                    if key in rows:
                        rows.leave(key)
                for key, req in joining.items():
                    started = time.perf_counter()
                    rows.join(key, req.inputs, req.cfg)
                    costs[key] = time.perf_counter() - started
                started, stepped = time.perf_counter(), list(rows.rows)
                try:
                    rows.advance()
                    return rows.pick()
                finally:
                    for key in stepped:
                        costs[key] = costs.get(key, 0.0) + (time.perf_counter() - started) / len(stepped)
            active.update(joining)
            if self.on_step is not None:
                self.on_step(len(active))
            owners = {key: req.owner for key, req in active.items()}
            try:
                finished = await self.in_worker(step, list(owners.values()),
                                                lambda owners=owners, costs=costs: [(owners[key], seconds)
                                                                                    for key, seconds in costs.items()
                                                                                    if key in owners])
            except Exception as exc:  # noqa: BLE001 - each request of the step is run again alone below
                if self.on_failure is not None:
                    self.on_failure(exc, len(active))
                retry, rows = list(active.values()), self.new_rows()
                active.clear()
                for req in retry:
                    await self._alone(req)
                continue
            for key, result in finished:
                req = active.pop(key)
                if not req.future.done():
                    req.future.set_result(result)

    def _cancelled(self, where: str) -> None:
        if self.on_cancel is not None:
            self.on_cancel(where)

    async def _alone(self, req: _Request) -> None:
        if req.future.done():
            return
        spent = [0.0]

        def alone() -> Any:
            started = time.perf_counter()
            try:
                return self.alone(req.inputs, req.cfg)
            finally:
                spent[0] = time.perf_counter() - started
        try:
            result = await self.in_worker(alone, [req.owner], lambda: [(req.owner, spent[0])])
        except Exception as exc:  # noqa: BLE001 - this request fails alone too: its error is its answer
            if not req.future.done():
                req.future.set_exception(exc)
            return
        if not req.future.done():
            req.future.set_result(result)
