"""`specdec serve`'s access log: one line per request, on stderr, in uvicorn's access-log format
(its own formatter, `uvicorn.logging.AccessFormatter`) with the time the request took and the
session it belongs to appended:

    INFO:     127.0.0.1:50412 - "POST /v1/verify HTTP/1.1" 200 OK 12.4 ms session AbCdEfGh

What a line never holds: audio, token ids, settings (no body is read here), the bearer token (no
header but the session's is read), a query string, or a whole session id (only its first 8
characters: 48 of its >= 128 bits, enough to follow a clip through the log, never to use its
session). `--quiet` (or `--log-level warning`) turns the lines off.

Written as an ASGI middleware around the app rather than by uvicorn (`access_log=True`) because
uvicorn logs at the response's start, without the time taken, and from the protocol, which a Ray
Serve replica does not run: the same middleware wraps each replica's app (scale/serve_fleet.py).
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any
from urllib.parse import quote

from . import wire

__all__ = ["LEVELS", "AccessLog", "configure"]

LOGGER = "specdec.access"
LEVELS = ("critical", "error", "warning", "info", "debug")  # uvicorn's --log-level names
PREFIX = 8  # characters of a session id shown
PATH_CHARS = 64  # characters of any other path shown (issue 55: a 60 KB path went into the log whole)
FORMAT = '%(levelprefix)s %(client_addr)s - "%(request_line)s" %(status_code)s %(took)s session %(session)s'
_SESSION_HEADER = wire.SESSION_HEADER.lower().encode()
_SESSION_PATH = "/v1/sessions/"


def configure(level: str = "info", stream: Any = None) -> logging.Logger:
    """The access logger, writing to `stream` (stderr) at `level` (its lines are INFO: `warning`
    and above turn them off). Colours only on a terminal, as uvicorn's."""
    from uvicorn.logging import AccessFormatter

    stream = stream if stream is not None else sys.stderr
    handler = logging.StreamHandler(stream)
    handler.setFormatter(AccessFormatter(FORMAT, use_colors=stream.isatty() if hasattr(stream, "isatty") else False))
    logger = logging.getLogger(LOGGER)
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(level.upper())
    return logger


def route_of(path: str) -> tuple[str, str]:
    """The path as logged and the session prefix it names: a session's own path is cut to its
    prefix (`/v1/sessions/AbCdEfGh…`); anything else to its first PATH_CHARS characters (every
    route of the API is shorter), `…` marking a cut."""
    if path.startswith(_SESSION_PATH) and len(path) > len(_SESSION_PATH):
        sid = "".join(c for c in path[len(_SESSION_PATH):][:PREFIX] if c.isalnum() or c in "-_")
        return f"{_SESSION_PATH}{sid[:PREFIX]}…", sid[:PREFIX]
    return (path if len(path) <= PATH_CHARS else path[:PATH_CHARS] + "…"), "-"


class AccessLog:
    """ASGI middleware: the request's line once its answer is sent (or the request failed)."""

    def __init__(self, app: Any, logger: logging.Logger | None = None) -> None:
        self.app = app
        self.logger = logger if logger is not None else logging.getLogger(LOGGER)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not self.logger.isEnabledFor(logging.INFO):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = [500]  # no answer started: the server failed it (uvicorn answers 500)

        async def sending(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)
        try:
            await self.app(scope, receive, sending)
        finally:
            # The decoded path, quoted back (no space or control character reaches the log); not
            # raw_path, which a Ray Serve replica is given cut to its route prefix.
            path, session = route_of(quote(scope.get("path", "")[:4 * PATH_CHARS], safe="/:@!$&'()*+,;=-._~"))
            for name, value in scope.get("headers", ()):
                if name == _SESSION_HEADER:
                    # a client's header: only the id's own characters are shown (no log injection)
                    session = "".join(c for c in value.decode("latin-1")[:PREFIX] if c.isalnum() or c in "-_") or "-"
            client = scope.get("client")
            where = f"{client[0]}:{client[1]}" if client else "-"
            took = f"{(time.perf_counter() - started) * 1000:.1f} ms"
            self.logger.info('%s - "%s %s HTTP/%s" %d', where, scope.get("method", "-"), path,
                             scope.get("http_version", "1.1"), status[0], extra={"took": took, "session": session})
