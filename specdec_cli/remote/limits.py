"""Connection limits of `specdec serve`: what a socket may cost before it has shown a token.

From the server stack (uvicorn + h11), configured in server.serve(): the idle keep-alive timeout
(`timeout_keep_alive`, --keep-alive-timeout), the 503 beyond the connection cap
(`limit_concurrency`), the size of a request head (`h11_max_incomplete_event_size`) and the listen
backlog. Written here because none of them does it (uvicorn 0.54 / h11 0.16):

* a deadline for the request head (--header-timeout). uvicorn arms no timer on a fresh connection,
  and its keep-alive timer is cancelled by any byte that arrives, so a socket that never sends, or
  sends a byte every few seconds, was held forever. `GuardedH11Protocol` arms a timer when the
  connection opens and again when each response is complete; if it fires while no request is being
  handled, the connection is closed. (The deadline for the body is the app's: server.py reads the
  body under --body-timeout.)
* room at the connection cap (--max-connections, lowered to what the descriptor limit allows):
  uvicorn's `limit_concurrency` answers 503 to requests beyond it but keeps every idle socket open,
  so idle sockets alone could hold the cap and lock every real client out. At the cap a new
  connection closes the one that has been idle longest (waiting for a request head, trickling one,
  or idle between keep-alive requests); only when every connection is in a request does the new
  one get uvicorn's 503 (a few of them), and beyond that it is closed at once.
* accept() within the descriptors there are, counted when asyncio accepts (`GuardedListener`), and
  the descriptor limit raised to its hard limit at start (`raise_fd_limit`). Past the limit asyncio
  logs "socket.accept() out of system resource" with a traceback for every failed accept, up to the
  backlog (2048) per readiness event, and schedules a retry for each (issue 25 counted ~150,000
  tracebacks in 10 s; bench/server_connections.py 708,318 log lines in 14 s, and a loop too busy
  to close anything). Should it happen anyway (another part of the process holding descriptors),
  `quiet_accept_errors` logs one line per 10 s.
* repeated warnings from uvicorn ("Invalid HTTP request received." per bad connection): at most
  one line per message per 10 s, with a count (`RepeatFilter`).

The server therefore always runs uvicorn's h11 protocol (this subclass; httptools, were it
installed, would bypass these limits). Written against uvicorn 0.54's H11Protocol: it reads its
`cycle` (the request being handled) and hooks `connection_made`, `on_response_complete` and
`connection_lost`; tests/test_server_hardening.py checks the limits through a real server.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import resource
import socket
import time
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("specdec.serve")

FD_RESERVE = 64  # descriptors kept free beyond the connections: model files, logs, worker threads, accept()


def raise_fd_limit() -> int:
    """Raise this process's descriptor limit to its hard limit; the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 32  # not Linux: a guess at what a loaded model holds


def connection_cap(wanted: int, fd_limit: int, in_use: int) -> int:
    """The connections this process can hold: `wanted`, or fewer when the descriptor limit leaves
    less room (what is open already and a reserve kept free, so accept() never runs out)."""
    return max(1, min(wanted, fd_limit - in_use - FD_RESERVE))


class ConnectionGuard:
    """The connections of one server and the limits uvicorn lacks: a deadline for each request
    head, room made at the cap by closing the connection idle longest, and accept() kept within
    the descriptors there are.

    Counted at accept() (`GuardedListener`), not when uvicorn's protocol is made: asyncio accepts up
    to the listen backlog (2048) connections per readiness event before any protocol exists, so a
    guard that only counted protocols would see the limit after the descriptors were gone."""

    def __init__(self, cap: int, header_timeout_s: float, spare: int = 16, per_tick: int = 16) -> None:
        # cap + spare + 2 * per_tick must stay under FD_RESERVE: the spare ones get uvicorn's 503
        # (every connection busy), the per-tick ones are being accepted or being closed.
        self.cap, self.header_timeout_s, self.spare, self.per_tick = cap, header_timeout_s, spare, per_tick
        self.open: dict[GuardedH11Protocol, None] = {}  # until connection_lost, in opening order
        self.pending = 0      # accepted, protocol not made yet
        self.dropping = 0     # closed by us, connection_lost not run yet
        self._this_tick = 0
        self.evicted = self.timed_out = self.shed = 0

    @property
    def live(self) -> int:
        return len(self.open) + self.pending - self.dropping

    def admit(self) -> bool | None:
        """For one connection accept() is about to hand over: True keep it; False close it at once
        (every connection is in a request and the spare is used: shed load); None accept no more
        in this loop iteration (the ones just closed have not given their descriptors back yet)."""
        if self._this_tick >= self.per_tick:
            return None
        if self._this_tick == 0:
            asyncio.get_running_loop().call_soon(self._new_tick)
        self._this_tick += 1
        if self.live >= self.cap and not self._evict_idle() and self.live >= self.cap + self.spare:
            self.shed += 1
            return False
        self.pending += 1
        return True

    def _new_tick(self) -> None:
        self._this_tick = 0

    def _evict_idle(self) -> bool:
        idle = [c for c in self.open if c.idle and not c.dropped]
        if not idle:
            return False
        min(idle, key=lambda c: c.idle_since).drop()
        self.evicted += 1
        return True

    def opened(self, conn: GuardedH11Protocol) -> None:
        self.pending = max(0, self.pending - 1)
        self.open[conn] = None

    def closed(self, conn: GuardedH11Protocol) -> None:
        if conn in self.open:
            del self.open[conn]
            self.dropping -= conn.dropped


class GuardedListener(socket.socket):
    """The listening socket, its accept() asking the guard first (asyncio calls it in a loop until
    it raises BlockingIOError)."""

    guard: ConnectionGuard

    @classmethod
    def wrap(cls, sock: socket.socket, guard: ConnectionGuard) -> GuardedListener:
        listener = cls(sock.family, sock.type, sock.proto, fileno=sock.detach())
        listener.guard = guard
        return listener

    def accept(self) -> tuple[socket.socket, Any]:
        while True:
            verdict = self.guard.admit()
            if verdict is None:
                raise BlockingIOError(errno.EAGAIN, "enough for this loop iteration")
            try:
                conn, address = super().accept()
            except BaseException:
                if verdict:
                    self.guard.pending -= 1
                raise
            if verdict:
                return conn, address
            conn.close()  # shed: no room, no idle connection to make room from


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol plus the head deadline and the guard's bookkeeping. `guard` is set
    on the subclass `guarded_protocol` makes for one server."""

    guard: ConnectionGuard
    dropped = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        self.idle_since = time.monotonic()
        self._arm()
        self.guard.opened(self)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self.idle_since = time.monotonic()
        if not self.transport.is_closing():
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        self.guard.closed(self)

    @property
    def idle(self) -> bool:
        """No request is being handled: waiting for (or receiving) a request head, or for the
        rest of a body nobody will read."""
        return self.cycle is None or self.cycle.response_complete

    def _arm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._head_timer = self.loop.call_later(self.guard.header_timeout_s, self._head_deadline)

    def _head_deadline(self) -> None:
        self._head_timer = None
        if self.idle and not self.dropped:
            self.guard.timed_out += 1
            self.drop()

    def drop(self) -> None:
        """Close at once, unanswered (no request is being handled: nobody to answer), discarding
        anything still unsent (a client that does not read must not keep its descriptor)."""
        if self.dropped or self.transport.is_closing():
            return
        self.dropped = True
        self.guard.dropping += 1
        self.transport.abort()


def guarded_protocol(guard: ConnectionGuard) -> type[GuardedH11Protocol]:
    return type("GuardedH11", (GuardedH11Protocol,), {"guard": guard})


class RepeatFilter(logging.Filter):
    """At most one record per distinct message per `quiet_s`; the next one says how many were held back."""

    def __init__(self, quiet_s: float = 10.0) -> None:
        super().__init__()
        self.quiet_s = quiet_s
        self._last: dict[str, list[float]] = {}  # message -> [logged at, held back since]

    def filter(self, record: logging.LogRecord) -> bool:
        key = record.getMessage()
        now = time.monotonic()
        seen = self._last.get(key)
        if seen is not None and now - seen[0] < self.quiet_s:
            seen[1] += 1
            return False
        if seen is not None and seen[1]:
            record.msg, record.args = f"{key} (and {int(seen[1])} more like it in {self.quiet_s:g} s)", None
        self._last[key] = [now, 0]
        return True


def quiet_accept_errors(loop: asyncio.AbstractEventLoop, quiet_s: float = 10.0) -> None:
    """One line per `quiet_s` (no traceback) for accept() failing at the descriptor limit; every
    other loop error as asyncio reports it."""
    last = [-quiet_s, 0]

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if str(context.get("message", "")).startswith("socket.accept() out of system resource"):
            now = time.monotonic()
            last[1] += 1
            if now - last[0] >= quiet_s:
                limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
                log.warning("out of file descriptors (%d open, limit %d): new connections wait in the backlog "
                            "(%d accept() failures since the last such line); raise `ulimit -n` or lower "
                            "--max-connections", open_fds(), limit, last[1])
                last[0], last[1] = now, 0
            return
        loop.default_exception_handler(context)
    loop.set_exception_handler(handler)
