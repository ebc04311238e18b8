"""The session table of `specdec serve`: one session per clip in flight, each owned by the token
that opened it, capped in total (--max-sessions) and per token (--max-sessions-per-token), idle ones
closed after --session-ttl; and the memory a closed session leaves given back to the system.

Fair share: room for a new session is made from its own token's least recently used idle session
first; only when that token has none idle, from the token holding the most sessions. One token
can therefore never evict everyone else's sessions, and never holds more than its cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from anyio import to_thread

from .http_errors import ApiError

RETRY_AFTER_S = 1


@dataclass
class CloudSession:
    id: str
    owner: int
    cloud: Any            # decoding.verifier.LocalCloud
    rules: Any            # decoding.processors.DecodingRules
    prompt_len: int
    last_used: float = field(default_factory=time.monotonic)
    busy: bool = False
    # Protocol 3 (issue 43): the token the last verdict gave, which the next verification must
    # start its pending with (None: no verdict yet, or a sampled rejection, whose token the client
    # draws); the session's verifications take turns in arrival order (`turn`, FIFO), at most
    # MAX_QUEUED waiting behind the one running (`queued`).
    owed: int | None = None
    turn: asyncio.Lock = field(default_factory=asyncio.Lock)
    queued: int = 0
    # Issue 55, finding 5: a verification sent ahead that reached the server before the verdict it
    # assumes (the client's blocks travel on different connections) waits for it instead of being
    # refused. `length`: the tokens the session holds as its last verdict left them (the event
    # loop's copy: while it verifies, its cache is a worker thread's); `moved`: set, and replaced,
    # whenever that may have changed (`wake`); `breaks`: how often the chain of blocks sent ahead
    # broke (a verdict that did not keep its whole draft, a block in turn refused as out of sync,
    # the session dropped), after which no block still waiting can be the next; `ahead`: how many
    # wait, at most MAX_AHEAD.
    length: int = 0
    moved: asyncio.Event = field(default_factory=asyncio.Event)
    breaks: int = 0
    ahead: int = 0

    def wake(self, length: int | None = None, broke: bool = False) -> None:
        """Tell the blocks waiting ahead that the session moved (to `length` tokens, if given)."""
        if length is not None:
            self.length = length
        self.breaks += broke
        self.moved = pulse(self.moved)


def pulse(event: asyncio.Event) -> asyncio.Event:
    """Wake whoever waits on `event` and give the next waiters a fresh one. Why not an
    asyncio.Condition: it is notified only with its lock held, and the notifiers here are plain
    functions (a verdict's bookkeeping, a session dropped), not coroutines."""
    event.set()
    return asyncio.Event()


async def wait_until(done: Callable[[], bool], changed: Callable[[], asyncio.Event], seconds: float) -> bool:
    """Wait, without polling, until `done()` holds, checking again each time the event `changed()`
    returns is pulsed; False when `seconds` pass first."""
    try:
        async with asyncio.timeout(seconds):
            while not done():
                await changed().wait()
        return True
    except TimeoutError:
        return False


MAX_QUEUED = 4  # verifications of one session waiting for its turn (beyond that: 409 session_busy)
MAX_AHEAD = 4   # verifications of one session waiting for the verdict they assume (the client's
                # deepest pipeline, decoding/block_length.MAX_DEPTH; beyond that refused as before)


class Sessions:
    """Open sessions, least recently used first. Only the event loop's thread touches this map;
    a session marked busy is in a worker thread and is never evicted."""

    def __init__(self, limit: int, ttl_s: float, metrics: Any, per_token: int | None = None,
                 on_drop: Any = None) -> None:
        self.limit, self.ttl_s, self.metrics = limit, ttl_s, metrics
        self.per_token = limit if per_token is None else per_token
        self.on_drop = on_drop  # called after a session is dropped (its memory can go back)
        self._open: OrderedDict[str, CloudSession] = OrderedDict()
        self._opening: dict[str, int] = {}  # client-named ids being opened -> the token opening each
        self.settled = asyncio.Event()  # set, and replaced, when an id being opened is added or released

    def __len__(self) -> int:
        return len(self._open)

    def expire(self) -> None:
        now = time.monotonic()
        for sid in [s.id for s in self._open.values() if not s.busy and now - s.last_used > self.ttl_s]:
            self._drop(sid, "ttl")

    def get(self, sid: str, owner: int, queue: bool = False) -> CloudSession:
        """The caller's session; unknown, expired or another token's are all 'unknown' (a session
        id of another token is not confirmed to exist). A busy one is 409 session_busy, unless
        `queue` (a verification, which waits for its turn: at most MAX_QUEUED waiting)."""
        self.expire()
        session = self._open.get(sid)
        if session is None or session.owner != owner:
            raise _unknown(sid)
        if queue:
            if session.queued >= MAX_QUEUED:
                raise ApiError(409, "session_busy", f"{MAX_QUEUED} verifications of this session are waiting "
                                                    "already; wait for a verdict")
        elif session.busy:
            raise ApiError(409, "session_busy", "this session is already verifying; send one request at a time")
        self._open.move_to_end(sid)
        return session

    def idle(self, of: Any = None) -> int:
        """Open sessions not verifying now (those that could send a verification); `of(token)`:
        only those of the tokens it accepts."""
        return sum(1 for s in self._open.values() if not s.busy and (of is None or of(s.owner)))

    def claim(self, sid: str, owner: int) -> None:
        """Reserve the client-named id `sid` for a session `owner` opens, in one step of the event
        loop (no await between the check and the reservation: issue 42, two tokens opening one id at
        once both got 200 and the later replaced the other's session). Another token's id, open or
        being opened, is answered as an unknown session is (404: nothing said of whose, and the
        same answer a verification or a close of it gets); this token's own open session under it
        is closed (a rebuild; 409 while it verifies); its own id being opened already: 409. The
        reservation ends when the session is added, or with `release`."""
        opening = self._opening.get(sid)
        if opening is not None:
            if opening != owner:
                raise _unknown(sid)
            raise ApiError(409, "session_busy", "this session is being opened; send one request at a time")
        session = self._open.get(sid)
        if session is not None:
            if session.owner != owner:
                raise _unknown(sid)
            self.close(sid, owner)  # 409 session_busy while it verifies
        self._opening[sid] = owner

    def release(self, sid: str, owner: int) -> None:
        """The open that claimed `sid` ended without adding its session (refused, failed, abandoned)."""
        if self._opening.get(sid) == owner:
            del self._opening[sid]
            self._settle()

    def opening(self, sid: str, owner: int) -> bool:
        """Whether `owner` is opening a session under `sid` now (claimed, not added yet)."""
        return self._opening.get(sid) == owner

    def _settle(self) -> None:
        self.settled = pulse(self.settled)

    def count_by_token(self) -> dict[int, int]:
        """Open sessions per token."""
        return dict(Counter(s.owner for s in self._open.values()))

    def held_by(self, owner: int) -> int:
        return sum(1 for s in self._open.values() if s.owner == owner)

    def reserve(self, owner: int) -> None:
        """Make room for one new session of `owner`: at its own cap, its least recently used idle
        session goes; at the total cap, its own first, else one of the largest holder's. 503 when
        the sessions that would have to go are all busy."""
        self.expire()
        retry = {"Retry-After": str(RETRY_AFTER_S)}
        if self.held_by(owner) >= self.per_token:
            own = next((s for s in self._open.values() if s.owner == owner and not s.busy), None)
            if own is None:
                raise ApiError(503, "full", f"this token's {self.per_token} sessions are all busy; retry shortly", retry)
            self._drop(own.id, "lru")
        while len(self._open) >= self.limit:
            victim = self._victim(owner)
            if victim is None:
                raise ApiError(503, "full", f"all {self.limit} sessions are busy; retry shortly", retry)
            self._drop(victim.id, "lru")

    def _victim(self, owner: int) -> CloudSession | None:
        idle = [s for s in self._open.values() if not s.busy]  # least recently used first
        if not idle:
            return None
        own = next((s for s in idle if s.owner == owner), None)
        if own is not None:
            return own
        held = Counter(s.owner for s in self._open.values())
        most = max(held[s.owner] for s in idle)
        return next(s for s in idle if held[s.owner] == most)

    def add(self, session: CloudSession) -> None:
        opening = self._opening.get(session.id)
        assert opening in (None, session.owner), "a session is added under an id another token claimed"
        assert session.id not in self._open or opening is None, "a claimed id is open already"
        self.reserve(session.owner)
        self._open[session.id] = session
        if self._opening.pop(session.id, None) is not None:
            self._settle()
        self.metrics.sessions.set(len(self._open))
        self.metrics.opened.inc()

    def close(self, sid: str, owner: int) -> bool:
        session = self._open.get(sid)
        if session is None or session.owner != owner:
            return False
        if session.busy:
            raise ApiError(409, "session_busy", "this session is verifying; close it when the answer is back")
        self._drop(sid, "closed")
        return True

    def end(self, sid: str) -> None:
        """The clip is over (its last verdict said so)."""
        if sid in self._open:
            self._drop(sid, "ended")

    def abandon(self, sid: str, owner: int) -> bool:
        """The client of a request on this session went before its answer (issue 33): the session
        is not kept, whatever it is doing (a batch may still hold its cache: the batch's copy goes
        with the batch)."""
        session = self._open.get(sid)
        if session is None or session.owner != owner:
            return False
        self._drop(sid, "abandoned")
        return True

    def _drop(self, sid: str, why: str) -> None:
        self._open.pop(sid).wake(broke=True)  # (the blocks waiting ahead of it: unknown session now)
        self.metrics.sessions.set(len(self._open))
        self.metrics.ended.labels(why).inc()
        if self.on_drop is not None:
            self.on_drop()


def _unknown(sid: str) -> ApiError:
    return ApiError(404, "unknown_session", f"no session {sid[:12]}…: it ended, was evicted or the "
                                            "server restarted; open a new one")


class MemoryReturn:
    """Gives the memory of ended sessions back to the system: glibc's malloc_trim, once, a moment
    after the last session ended (coalesced), in a worker thread.

    Why: measured (bench/server_memory.py, issue 25), a closed session's tensors are all freed
    (none is kept: the tensor count returns to where it started), but glibc keeps the freed pages
    in the arenas of the worker threads that allocated them, fragmented between live ones, so the
    resident set grew round after round of sessions (+294 MB over four rounds of 64) and never came
    back; malloc_trim(0) returns the free pages of every arena. A no-op where the C library has no
    malloc_trim (not glibc)."""

    def __init__(self, delay_s: float = 1.0) -> None:
        self.delay_s = delay_s
        self._trim = _malloc_trim()
        self._pending: asyncio.TimerHandle | None = None
        self._task: asyncio.Task | None = None
        self.trims = 0

    def soon(self) -> None:
        if self._trim is None or self._pending is not None:
            return
        with contextlib.suppress(RuntimeError):  # no running loop (a unit test): nothing to schedule
            loop = asyncio.get_running_loop()
            self._pending = loop.call_later(self.delay_s, self._start)

    def _start(self) -> None:
        self._pending = None
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        await to_thread.run_sync(self._trim, 0)
        self.trims += 1

    def cancel(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None


def _malloc_trim() -> Any:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim
