"""How `specdec serve` answers what it will not or cannot do: every error one line of JSON
(`{"error": ..., "code": ...}`), and a crash (a specdec bug) logged once with its traceback,
answered with a generic 500 line, and never allowed to take the keep-alive connection down.

Why by hand: Starlette's ServerErrorMiddleware, which runs an `Exception` handler, sends that
handler's response and then re-raises the exception (so a test client or a server can see it);
uvicorn then logs it as "Exception in ASGI application" (the whole middleware stack, ~85 lines per
request) and, since the response has started, closes the connection: the client's next request on
its keep-alive connection fails with "connection reset". `CrashGuard` sits inside that middleware
and swallows the exception once it has answered, so the response goes out and the connection stays.
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Callable
from typing import Any

from starlette.responses import JSONResponse, Response

log = logging.getLogger("specdec.serve")


class ApiError(Exception):
    """An answer other than 200: status, a machine-readable code and one line for a person."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Response:
    return JSONResponse({"error": message.splitlines()[0] if message else code, "code": code},
                        status_code=status, headers=headers)


class OnceLog:
    """Logs an exception with its traceback the first time its place (type and innermost frame)
    is seen, and as one line after that (the logger's RepeatFilter keeps even those to one per
    message per 10 s): a client that can trigger a bug cannot flood the log with it."""

    def __init__(self, logger: logging.Logger = log) -> None:
        self.logger = logger
        self._seen: set[tuple[str, str, int]] = set()

    def __call__(self, what: str, exc: BaseException) -> None:
        frames = traceback.extract_tb(exc.__traceback__)
        place = (type(exc).__name__, frames[-1].filename if frames else "", (frames[-1].lineno or 0) if frames else 0)
        if place in self._seen:
            self.logger.error("%s: %s again (its traceback is above)", what, type(exc).__name__)
            return
        self._seen.add(place)
        self.logger.error("%s: %s", what, type(exc).__name__, exc_info=exc)


class CrashGuard:
    """ASGI middleware: an exception no handler answered becomes a one-line 500 (the exception's
    type only, never its text), reported to `on_crash` once per request; the exception stops here.

    And a request still running when a stopping server's grace period is over (uvicorn cancels it:
    a body that never came, or model work that took longer) is answered 503 "stopping" instead of
    ending in a CancelledError traceback in the log."""

    def __init__(self, app: Any, on_crash: Callable[[BaseException], None],
                 stopping: Callable[[], bool] = lambda: False) -> None:
        self.app, self.on_crash, self.stopping = app, on_crash, stopping

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)
        try:
            await self.app(scope, receive, tracking)
        except asyncio.CancelledError:
            if not self.stopping():
                raise
            if not started:
                response = error_response(503, "stopping", "the server stopped before this request was done; "
                                                           "retry when it is back", {"Connection": "close"})
                await response(scope, receive, send)
        except Exception as exc:  # noqa: BLE001 - the point: log it once and answer, never re-raise
            self.on_crash(exc)
            if not started:
                response = error_response(500, "internal", f"internal error ({type(exc).__name__}); the server goes on")
                await response(scope, receive, send)
