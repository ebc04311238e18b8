"""Fair share between tokens on `specdec serve`, and no work for clients that have gone (issue 33).

What a production server promises here, and what this module gives the server:

* **Work nobody waits for is not done** (gRPC/Envoy cancellation, vLLM's abort on disconnect).
  `watch_disconnect` runs a handler, once its body is read, against the ASGI receive channel: when
  `http.disconnect` arrives first, the handler's task is cancelled. Waiting for a model turn or in
  a batcher's queue, it leaves at once; a forward already running in a worker thread finishes
  (threads cannot be interrupted; a forward is bounded) and its result is dropped; a cloud-only
  generation's row leaves its batch at the next step (generations.py). The server counts both
  (`specdec_abandoned_requests`, `specdec_cancelled_work`).
* **Bounded queues per token** (Triton's max queue size, Ray Serve's `max_ongoing_requests`):
  `InFlight` caps the requests one token has in flight (being read, waiting or running), checked
  from the head alone, before the body is read: beyond it a 503 with Retry-After, and the
  connection is closed, so one token's slow bodies cannot hold the server's connection cap. `Turns`
  caps the requests one token has waiting for the model.
* **Fair model time** (fair queuing across tenants by service received, as VTC does for LLM
  serving): `Turns` replaces a plain lock around the model; the next turn goes to the owner that
  has had the least model time (its docstring says how, and why a slot is kept a moment for a
  light owner). `RoundRobin` is the order of the batchers' queues (batching.py, generations.py): a
  batch is filled one request per token in turn.

* **Refusals paced per token** (issue 55; nginx's `limit_req`, a leaky bucket per key): a request
  the server refuses has cost its reading, decoding and checking, and nothing bounded how many a
  token could send. `Pacer` counts each token's refusals (and those of requests without a valid
  token, together); a token over its rate waits, before its next request is read, until it is back
  within it (gate.py applies it to every request, before routing).

Written by hand (asyncio futures and deques): anyio's CapacityLimiter and asyncio's Lock/Semaphore
grant in arrival order, which is exactly the first-come-first-served this replaces.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Iterator
from typing import Any, Generic, TypeVar

from .http_errors import ApiError

RETRY_AFTER_S = 1
T = TypeVar("T")


def busy(message: str) -> ApiError:
    """The 503 every fair-share limit answers (as a full server does): retry after a moment."""
    return ApiError(503, "busy", message, {"Retry-After": str(RETRY_AFTER_S), "Connection": "close"})


class RoundRobin(Generic[T]):
    """Items queued per owner; `pop()` takes the oldest item of the owner whose turn it is, and the
    turns go round the owners with items waiting (an owner that comes back joins at the end)."""

    def __init__(self) -> None:
        self._queues: collections.OrderedDict[Hashable, collections.deque[T]] = collections.OrderedDict()

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def __bool__(self) -> bool:
        return bool(self._queues)

    def __iter__(self) -> Iterator[T]:
        for queue in self._queues.values():
            yield from queue

    def waiting(self, owner: Hashable) -> int:
        queue = self._queues.get(owner)
        return 0 if queue is None else len(queue)

    def owners(self) -> list[Hashable]:
        """The owners with items waiting, in turn order."""
        return list(self._queues)

    def peek(self, owner: Hashable) -> T | None:
        """The item `pop` would take from `owner` (None: it has none)."""
        queue = self._queues.get(owner)
        return queue[0] if queue else None

    def push(self, owner: Hashable, item: T) -> None:
        self._queues.setdefault(owner, collections.deque()).append(item)

    def pop(self, eligible: Callable[[Hashable], bool] = lambda owner: True) -> T | None:
        """The next item in turn among the owners `eligible` says may take one now (None: none)."""
        for owner in list(self._queues):
            if not eligible(owner):
                continue
            queue = self._queues.pop(owner)
            item = queue.popleft()
            if queue:
                self._queues[owner] = queue  # back at the end of the round
            return item
        return None

    def remove(self, owner: Hashable, item: T) -> bool:
        queue = self._queues.get(owner)
        if queue is None or item not in queue:
            return False
        queue.remove(item)
        if not queue:
            del self._queues[owner]
        return True

    def drop(self, gone: Callable[[T], bool]) -> int:
        """Drop every item `gone` says nobody waits for any more; how many went."""
        dropped = 0
        for owner in list(self._queues):
            queue = self._queues[owner]
            kept = collections.deque(item for item in queue if not gone(item))
            dropped += len(queue) - len(kept)
            if kept:
                self._queues[owner] = kept
            else:
                del self._queues[owner]
        return dropped

    def clear(self) -> None:
        self._queues.clear()


class Turns:
    """The model's time, `slots` holders at once (1: the model and its rope_deltas are shared),
    shared fairly between owners. `async with turns.turn(owner): …` waits for a turn.

    Which waiter goes next: the owner that has had the least model time (seconds held; an owner
    that comes back after a pause starts level with the least served of those waiting, not with
    credit for its pause: VTC's counter lift), its requests in arrival order. A turn cannot be
    preempted (a forward runs to its end), so a light owner whose next request is a round trip away
    would otherwise always find the heavy owner's next prefill running: when the owner whose turn
    just ended has had less time than the next waiter, the slot is kept for it up to `hold_s`
    (anticipatory scheduling, as disk schedulers do for a process that will read again). So a
    flood of long prefills from one owner costs a light owner at most one of them per round in
    which the light one has used as much model time as the flood.

    What an owner is charged (issue 42): its own turns' time, and what `charge()` adds. A batcher's
    turn serves several tokens at once: it is taken under one of them (`charged=False`) and the
    batcher then charges each token the time of its own rows (a lazy prefill is its session's
    token's), so every second of the model is charged to the token it worked for (VTC's per-tenant
    counters), and the batchers can order their own queues by the same counters (`active`, `lift`).

    `max_waiting`: an owner's waiters beyond it get a 503 at once (`capped=False`: the batchers'
    own steps, which serve every token). `on_cancel()`: told when a waiter left before its turn."""

    def __init__(self, slots: int = 1, max_waiting: int | None = None,
                 on_cancel: Callable[[], None] | None = None, hold_s: float = 0.0, credit_s: float = 0.0) -> None:
        self.slots, self.max_waiting, self.on_cancel, self.hold_s = slots, max_waiting, on_cancel, hold_s
        self.credit_s = credit_s
        self._holders = 0
        self._queues: dict[Hashable, collections.deque[asyncio.Future]] = {}
        self.served: dict[Hashable, float] = {}  # model seconds each owner has held (lifted, see above)
        self._kept: tuple[Hashable, asyncio.TimerHandle] | None = None  # a free slot kept for an owner
        self._holding: collections.Counter[Hashable] = collections.Counter()
        self._level = 0.0  # the counter of the owner charged last: where the model's time stands

    def waiting(self, owner: Hashable) -> int:
        queue = self._queues.get(owner)
        return 0 if queue is None else len(queue)

    def active(self) -> set[Hashable]:
        """The owners waiting for a turn, holding one, or for whom a free slot is kept."""
        return set(self._queues) | set(self._holding) | ({self._kept[0]} if self._kept else set())

    def charge(self, owner: Hashable, seconds: float) -> None:
        """`seconds` of model time worked for `owner` in a turn taken with `charged=False`."""
        self.served[owner] = self._level = self.served.get(owner, 0.0) + seconds

    @contextlib.asynccontextmanager
    async def turn(self, owner: Hashable, capped: bool = True, charged: bool = True) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        kept_for = self._kept[0] if self._kept is not None else None
        if kept_for is not None and kept_for == owner:
            self._unkeep()  # the slot kept for this owner: it takes it
        elif self._holders < self.slots and not self._queues and self._kept is None:
            if charged:
                self.lift(owner)
            self._holders += 1
        else:
            if capped and self.max_waiting is not None and self.waiting(owner) >= self.max_waiting:
                raise busy(f"this token has {self.max_waiting} requests waiting for the model already; "
                           "retry when one is answered")
            if owner not in self._queues and charged:  # (a batch's token was lifted by its batcher)
                self.lift(owner)
            granted = loop.create_future()
            self._queues.setdefault(owner, collections.deque()).append(granted)
            try:
                await granted
            except asyncio.CancelledError:
                if granted.done() and not granted.cancelled():
                    self._next(None)  # granted as it was cancelled: the turn goes on to the next
                else:
                    self._remove(owner, granted)
                    if self.on_cancel is not None:
                        self.on_cancel()
                raise
        started = loop.time()
        self._holding[owner] += 1
        try:
            yield
        finally:
            self._holding[owner] -= 1
            if not self._holding[owner]:
                del self._holding[owner]
            if charged:
                self.charge(owner, loop.time() - started)
            self._next(owner)

    def lift(self, owner: Hashable, also: set[Hashable] | frozenset[Hashable] = frozenset()) -> None:
        """An owner starting to wait: level with the least served of the active owners (waiting,
        holding, or kept for; and `also`, those a batcher has queued, running or served a moment
        ago), never more than `credit_s` behind them: a pause earns no lasting credit, and an owner
        that comes back every round trip keeps the lead it has (up to credit_s) instead of being
        levelled up to a flood's each time."""
        active = self.active() | set(also)
        active.discard(owner)
        # Nobody else active: level with the owner served last (a newcomer after the others paused
        # is not owed all the time they had, as WFQ's virtual time stands still while it idles).
        floor = min((self.served.get(o, 0.0) for o in active), default=self._level)
        self.served[owner] = max(self.served.get(owner, 0.0), floor - self.credit_s)

    def _remove(self, owner: Hashable, granted: asyncio.Future) -> None:
        queue = self._queues.get(owner)
        if queue is not None and granted in queue:
            queue.remove(granted)
            if not queue:
                del self._queues[owner]

    def _next(self, last: Hashable | None) -> None:
        """A slot is free (its holder `last` is done): to the least served waiter, or kept for
        `last` a moment when it has had less time than every waiter, or freed."""
        while self._queues:
            owner = min(self._queues, key=lambda o: self.served.get(o, 0.0))
            if (last is not None and self.hold_s > 0 and last not in self._queues
                    and self.served.get(last, 0.0) < self.served.get(owner, 0.0)):
                handle = asyncio.get_running_loop().call_later(self.hold_s, self._expire)
                self._kept = (last, handle)
                return
            queue = self._queues[owner]
            granted = queue.popleft()
            if not queue:
                del self._queues[owner]
            if not granted.done():
                granted.set_result(None)
                return
        self._holders -= 1

    def _unkeep(self) -> None:
        assert self._kept is not None
        self._kept[1].cancel()
        self._kept = None

    def _expire(self) -> None:
        """The owner the slot was kept for did not come back in time: the next waiter goes."""
        self._kept = None
        self._next(None)


class InFlight:
    """Requests in flight per token (from the head to the answer), at most `cap` each."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._count: collections.Counter[Hashable] = collections.Counter()

    def __call__(self, owner: Hashable) -> contextlib.AbstractContextManager[None]:
        return self._held(owner)

    @contextlib.contextmanager
    def _held(self, owner: Hashable) -> Iterator[None]:
        if self._count[owner] >= self.cap:
            raise busy(f"this token has {self.cap} requests in flight already (--max-requests-per-token); "
                       "retry when one is answered")
        self._count[owner] += 1
        try:
            yield
        finally:
            self._count[owner] -= 1
            if not self._count[owner]:
                del self._count[owner]


class Pacer:
    """At most `rate` events a second per key, `burst` of them at once (nginx's `limit_req` with a
    burst, by the generic cell rate algorithm: one time per key, the "theoretical arrival time"
    of its next event, pushed 1/rate ahead by each). The events are refusals, known only once a
    request has been refused: `charge(key)` counts one, and `wait(key)` (called before a request
    is read) waits while the key is over its rate. At most `max_waiting(key)` requests of a key
    wait; beyond that `Overdue` at once. rate 0: no limit."""

    def __init__(self, rate: float, burst: int, max_waiting: Callable[[Hashable], int],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self.max_waiting, self.clock = rate, burst, max_waiting, clock
        self._due: dict[Hashable, float] = {}  # key -> the theoretical arrival time of its next event
        self._waiting: collections.Counter[Hashable] = collections.Counter()

    def charge(self, key: Hashable) -> None:
        if self.rate <= 0:
            return
        now = self.clock()
        self._due[key] = max(self._due.get(key, now), now) + 1 / self.rate

    def delay(self, key: Hashable) -> float:
        """Seconds until the key is within its rate again (0: it is)."""
        due = self._due.get(key)
        if due is None:
            return 0.0
        now = self.clock()
        if due <= now:
            del self._due[key]  # (the table holds only keys refused a moment ago)
            return 0.0
        return max(0.0, due - now - self.burst / self.rate)

    async def wait(self, key: Hashable) -> bool:
        """Whether the key had to wait (it was over its rate)."""
        delay = self.delay(key)
        if delay <= 0:
            return False
        if self._waiting[key] >= self.max_waiting(key):
            raise Overdue(delay)
        self._waiting[key] += 1
        try:
            await asyncio.sleep(delay)
            return True
        finally:
            self._waiting[key] -= 1
            if not self._waiting[key]:
                del self._waiting[key]


class Overdue(Exception):
    """A key over its rate with as many requests waiting as it may have: refuse this one now."""

    def __init__(self, delay: float) -> None:
        super().__init__(f"over the rate for {delay:.1f} s more")
        self.retry_after = max(1, math.ceil(delay))


class Gone(Exception):
    """The client closed its connection before its answer: nobody is waiting for one."""


async def watch_disconnect(receive: Callable[[], Awaitable[dict[str, Any]]], work: Awaitable[T],
                           on_gone: Callable[[], None] | None = None) -> T:
    """`work`'s result, or `Gone` as soon as the client disconnects (`on_gone()` is called, then
    `work` is cancelled and awaited: a forward it runs in a worker thread finishes first, so
    `on_gone` is how such work learns to stop early). Call once the request's body has been read:
    from then on the ASGI receive channel carries nothing but `http.disconnect`."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(receive())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the server stopping: both go
        task.cancel()
        watcher.cancel()
        raise
    if task.done():
        watcher.cancel()
        return task.result()
    message = watcher.result()
    if message.get("type") != "http.disconnect":  # (a pipelined request's bytes: not ours to read)
        return await task
    if on_gone is not None:
        on_gone()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    raise Gone
