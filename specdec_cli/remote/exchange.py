"""One HTTP request to a `specdec serve`, bounded in time and in size: what the client sends and
reads, and nothing it cannot afford to.

* A total deadline per request (connect, send, wait, read). httpx's timeouts are per socket
  operation, so a server that drips a byte at a time within each one holds a request forever, and
  httpx has no overall deadline (encode/httpx#1450, open). Asyncio's can cancel a request wherever
  it waits; the client's requests therefore run on an event loop of their own, on a daemon thread
  (`Exchange`), each under `asyncio.timeout`. A connection not made within `CONNECT_S` is "cannot
  reach", not "no answer".
* A size cap, applied before the body is read: a declared Content-Length over it is refused
  without reading; otherwise the body is read as it streams and the read stops past the cap. The
  body is asked for and taken uncompressed only (a compressed body could expand beyond any cap).
* Retry-After in both of RFC 9110's forms (seconds, or an HTTP date), bounded.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import email.utils
import math
import os
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx

from ..errors import InputError

CONNECT_S = 10.0  # a connection not made in this time: the server is unreachable (retried as down)
TIMEOUT_ENV = "SPECDEC_CLOUD_TIMEOUT"  # the total deadline of one request, in seconds (--cloud-timeout)
DEFAULT_TIMEOUT_S = 60.0


def cloud_timeout(given: float | None = None) -> float:
    """Seconds one request may take in all: `given` (--cloud-timeout), else $SPECDEC_CLOUD_TIMEOUT,
    else 60. InputError unless a positive, finite number."""
    source = "--cloud-timeout"
    if given is None:
        raw = os.environ.get(TIMEOUT_ENV, "").strip()
        if not raw:
            return DEFAULT_TIMEOUT_S
        source = TIMEOUT_ENV
        try:
            given = float(raw)
        except ValueError:
            given = math.nan
    if not (math.isfinite(given) and given > 0):
        raise InputError(f"{source} must be a positive number of seconds (the default is {DEFAULT_TIMEOUT_S:g})")
    return float(given)


class Unusable(ValueError):
    """An answer specdec cannot use; the text says what was wrong with it."""


@dataclass(frozen=True)
class Answer:
    status: int
    reason: str
    headers: httpx.Headers
    body: bytes

    @property
    def wire_bytes(self) -> int:
        """HTTP/1.1 as received: status line, headers, body."""
        line = len(f"HTTP/1.1 {self.status} {self.reason}\r\n")
        return line + sum(len(k) + len(v) + 4 for k, v in self.headers.raw) + 2 + len(self.body)


class Exchange:
    """Requests to one server: a connection pool (keep-alive) driven by an event loop on a daemon
    thread, so that a process that never closes its client still exits."""

    def __init__(self, base_url: str, headers: dict[str, str], timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="specdec-cloud-client")
        self._thread.start()
        # Per operation, httpx's own timeouts stay off (the deadline bounds the whole request), but
        # for connecting: a server that takes no connection is unreachable, told apart from one that
        # took it and did not answer.
        timeout = httpx.Timeout(None, connect=min(CONNECT_S, 0.9 * timeout_s))
        self.http = self._run(_client(base_url, {"Accept-Encoding": "identity", **headers}, timeout))

    def _run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # Ctrl-C while waiting: the request stops too
            raise

    def request(self, method: str, path: str, body: bytes, headers: dict[str, str] | None) -> httpx.Request:
        return self.http.build_request(method, path, content=body or None, headers=headers)

    def send(self, request: httpx.Request, cap: int, timeout_s: float | None = None) -> Answer:
        """The answer, read whole, within `timeout_s` (default: the exchange's) from now and `cap`
        bytes of body. Raises TimeoutError past the deadline, Unusable for a body over the cap or
        compressed, and httpx.TransportError when the connection fails (ConnectError/ConnectTimeout:
        none made)."""
        return self._run(self._send(request, self.timeout_s if timeout_s is None else timeout_s, cap))

    def send_later(self, request: httpx.Request, cap: int, timeout_s: float) -> concurrent.futures.Future:
        """Send `request` without waiting for its answer: the future holds the Answer (or the
        exception `send` would raise) once it came, within `timeout_s`. The request runs on this
        exchange's event loop beside any other (the pool opens a second connection if one is busy)."""
        return asyncio.run_coroutine_threadsafe(self._send(request, timeout_s, cap), self._loop)

    async def _send(self, request: httpx.Request, timeout_s: float, cap: int) -> Answer:
        async with asyncio.timeout(timeout_s):
            response = await self.http.send(request, stream=True)
            try:
                declared = response.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > cap:
                    raise Unusable(f"an answer of {int(declared):,} bytes, over the {cap:,} it can be")
                encoding = response.headers.get("content-encoding", "identity").strip().lower()
                if encoding not in ("", "identity"):
                    raise Unusable(f"a {encoding[:40]}-compressed answer, not asked for")
                body = bytearray()
                async for chunk in response.aiter_raw():
                    body += chunk
                    if len(body) > cap:
                        raise Unusable(f"an answer over the {cap:,} bytes it can be")
            finally:
                await response.aclose()
        return Answer(response.status_code, response.reason_phrase, response.headers, bytes(body))

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._run(self.http.aclose())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            if not self._thread.is_alive():
                self._loop.close()


async def _client(base_url: str, headers: dict[str, str], timeout: httpx.Timeout) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout)


def retry_after(value: str | None, default: float = 1.0, most: float = 5.0) -> float:
    """Seconds to wait before retrying, from a Retry-After header (RFC 9110 §10.2.3: delay-seconds
    or an HTTP-date), within [0, most]; `default` when absent or unreadable."""
    if not value or not value.strip():
        return default
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError, OverflowError):
            return default
        if when.tzinfo is None:  # "-0000": UTC, origin unknown (RFC 5322)
            when = when.replace(tzinfo=UTC)
        seconds = (when - datetime.now(UTC)).total_seconds()
    if not math.isfinite(seconds):
        return default
    return min(max(seconds, 0.0), most)

