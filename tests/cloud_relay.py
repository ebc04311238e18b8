"""A TCP relay on 127.0.0.1 in front of a real `specdec serve`, for the fallback tests: a cloud that
vanishes at a chosen request, or answers slowly.

It runs on an event loop in a daemon thread of the test process (a free port, stopped by the test)
and copies bytes both ways. It counts the verification requests as they pass (`POST /v1/verify`
at the start of a request line; a request body is msgpack and never starts a line with it), so a
test can act before the n-th one is forwarded: `before_verify(n)` (e.g. SIGKILL the server by its
pid, then `refuse()` further connections, as a dead server's port does). `delay_s` holds every
client-to-server chunk that long: a slow link.

Hand-written, like bench/link.py's relay: a counting, delaying TCP relay is a few lines of asyncio,
and no maintained package does this without root (tc netem) or a separate server (toxiproxy).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

VERIFY = b"POST /v1/verify "


class Relay:
    def __init__(self, upstream_port: int, before_verify: Callable[[int], bool] | None = None,
                 delay_s: float = 0.0) -> None:
        """`before_verify(n)` is called before the n-th verification request is forwarded; when
        it returns True the request is not forwarded and its connection is closed."""
        self.upstream_port, self.before_verify, self.delay_s = upstream_port, before_verify, delay_s
        self.verifications = 0
        self.port = 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="test-relay")
        self.server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, upward: bool) -> None:
        try:
            while data := await reader.read(65536):
                if upward:
                    if self.delay_s:
                        await asyncio.sleep(self.delay_s)
                    for _ in range(data.count(VERIFY)):
                        self.verifications += 1
                        if self.before_verify is not None and self.before_verify(self.verifications):
                            return
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self._tasks.add(asyncio.current_task())
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client_w.close()
            return
        up = asyncio.ensure_future(self._pump(client_r, server_w, True))
        down = asyncio.ensure_future(self._pump(server_r, client_w, False))
        try:
            await asyncio.wait([up, down], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (up, down):
                task.cancel()
            server_w.close()
            client_w.close()
            self._tasks.discard(asyncio.current_task())

    def refuse(self) -> None:
        """Stop listening (called from before_verify, on the relay's loop): later connections are refused."""
        assert self.server is not None
        self.server.close()

    def __enter__(self) -> Relay:
        self.thread.start()

        async def start() -> None:
            self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
            self.port = self.server.sockets[0].getsockname()[1]
        asyncio.run_coroutine_threadsafe(start(), self.loop).result(timeout=30)
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            assert self.server is not None
            self.server.close()
            for task in list(self._tasks):
                task.cancel()
        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
