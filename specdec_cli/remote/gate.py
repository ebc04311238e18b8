"""Who is asking, before anything else (issue 55): every request of `specdec serve` passes this
ASGI middleware before Starlette routes it.

* **The request head within 64 KiB** (MAX_HEAD, as docs/security.md says): uvicorn's h11 refuses a
  head over its limit only while it arrives in pieces; one that came in a single read (a 70 KB
  head did) was handled. Answered 431 here, the connection closed.
* **Authentication before routing.** With tokens, a request without a valid one is answered 401
  whatever its method and path: an unknown route or a wrong method tells a stranger nothing, and
  costs no routing (before, a 404 or 405 came before the token was looked at).
* **Refusals paced per token** (fairness.Pacer, nginx's `limit_req`): each answer in 4xx (but 429,
  and 499 for a client that left) counts against the token that asked, and the requests without a
  valid token count together under one key. A key over `--max-refusals-per-s` (a burst of twice
  that) waits here, before its request's body is read, until it is back within its rate; with as
  many requests waiting as it may have in flight, the next is answered 429 at once (Retry-After,
  connection closed). Why: a refusal costs the server reading, decoding and checking the request,
  and a client that is refused costs itself almost nothing; issue 55 measured one connection of
  refused verifications take another token from 1,219 to 112 answers in 30 s. A client that is
  answered (200) is never paced, whatever its rate.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from .fairness import Overdue, Pacer
from .http_errors import error_response

ANONYMOUS = "anonymous"  # the key of every request without a valid token (on a server with tokens)
ANONYMOUS_WAITING = 16   # requests without a valid token waiting at once (each holds a connection)
MAX_HEAD = 64 * 1024     # bytes of a request head (the request line and the headers)
UNAUTHORIZED = "missing or wrong token: send Authorization: Bearer <token>"


def head_bytes(scope: dict[str, Any]) -> int:
    """The size of the request's head as it came: request line, headers, and their separators."""
    line = len(scope.get("method", "")) + len(scope.get("raw_path") or scope.get("path", "").encode())
    line += len(scope.get("query_string", b"")) + 1 + len("HTTP/1.1") + 4
    return line + sum(len(name) + len(value) + 4 for name, value in scope.get("headers", ())) + 2


def refused(status: int) -> bool:
    """An answer that counts against its token's rate of refusals."""
    return 400 <= status < 500 and status not in (429, 499)


class Gate:
    """`identify(scope)`: the token's key, or None for no valid token; `answered(status)`: told of
    each answer the gate gives itself (401, 429, 431); `paced()`: told of each request that waited."""

    def __init__(self, app: Any, identify: Callable[[dict[str, Any]], Hashable | None], pacer: Pacer,
                 answered: Callable[[int], None], paced: Callable[[], None]) -> None:
        self.app, self.identify, self.pacer, self.answered, self.paced = app, identify, pacer, answered, paced

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        oversized = head_bytes(scope) > MAX_HEAD
        key = None if oversized else self.identify(scope)  # (an oversized head counts as a stranger's)
        who = ANONYMOUS if key is None else key
        try:
            if await self.pacer.wait(who):
                self.paced()
        except Overdue as late:
            self.answered(429)
            await error_response(429, "too_many_refusals", "too many of this token's requests were refused "
                                 "(over --max-refusals-per-s); retry after Retry-After",
                                 {"Retry-After": str(late.retry_after), "Connection": "close"})(scope, receive, send)
            return
        if oversized:
            self.pacer.charge(ANONYMOUS)
            self.answered(431)
            await error_response(431, "head_too_large", f"the request head is over {MAX_HEAD // 1024} KiB",
                                 {"Connection": "close"})(scope, receive, send)
            return
        if key is None:
            self.pacer.charge(ANONYMOUS)
            self.answered(401)
            await error_response(401, "unauthorized", UNAUTHORIZED, {"WWW-Authenticate": "Bearer"})(
                scope, receive, send)
            return
        status = [0]

        async def sending(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)
        try:
            await self.app(scope, receive, sending)
        finally:
            if refused(status[0]):
                self.pacer.charge(key)
