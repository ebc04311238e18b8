"""A stand-in for `specdec serve` on 127.0.0.1, for the client's side of the hardening tests: a raw
asyncio socket server (a free port, a daemon thread of the test process, stopped by the test) that
answers each HTTP/1.1 request with whatever the test says, including what no real server sends:
nothing at all, a byte at a time, a body larger than it claims, a broken verdict.

`identity()` is a real `specdec serve`'s /health for the bundled pair (its tokenizer fingerprint,
vocabulary and rate), so a `specdec describe --cloud URL` process accepts the stand-in and reaches
its first verification; `consistent_verdict()` is the verdict a server would give when it rejects
the whole draft, with every count matching the request, so a test changes one field at a time.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
import numpy as np
import torch

from specdec_cli.remote import wire

FOREVER = 3600.0  # a "never": longer than any test's own timeout


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def verify(self) -> wire.VerifyRequest:
        return msgspec.msgpack.decode(self.body, type=wire.VerifyRequest)


@dataclass
class Reply:
    """What to send. `raw` replaces the whole answer (status line and headers included);
    `hang`: accept and send nothing; `drip_s`: send the answer one byte per drip_s seconds
    (`raw` or the built answer), then, with `endless`, keep sending header bytes forever."""
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    raw: bytes | None = None
    hang: bool = False
    drip_s: float | None = None
    endless: bool = False

    def bytes(self) -> bytes:
        if self.raw is not None:
            return self.raw
        headers = {"content-length": str(len(self.body)), **self.headers}
        head = f"HTTP/1.1 {self.status} X\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        return head.encode("latin-1") + self.body


def json_reply(data: object, status: int = 200, headers: dict[str, str] | None = None) -> Reply:
    return Reply(status, msgspec.json.encode(data), {"content-type": wire.JSON, **(headers or {})})


def msgpack_reply(message: object, status: int = 200) -> Reply:
    return Reply(status, msgspec.msgpack.encode(message), {"content-type": wire.MSGPACK})


@functools.cache
def identity() -> dict:
    """The /health a `specdec serve` of the bundled demo cloud gives (model loaded once per run)."""
    from specdec_cli import __version__ as specdec_version
    from specdec_cli.models import demo_pair
    from specdec_cli.remote.server import load_hosted

    hosted = load_hosted(demo_pair()[1])
    return msgspec.to_builtins(wire.Health(
        status="ok", model=hosted.model_id, fingerprint=hosted.fingerprint, tokenizer=hosted.tokenizer,
        vocab=hosted.vocab, dtype=hosted.dtype, device=hosted.device, context=hosted.context, rate=hosted.rate,
        max_seconds=float(hosted.processor.max_seconds), min_samples=hosted.min_samples, protocol=wire.PROTOCOL,
        version=specdec_version, sessions=0, max_sessions=64, max_sessions_per_token=64, session_ttl_s=300.0,
        batch_window_ms=0, max_batch=1))


def consistent_verdict(req: wire.VerifyRequest, **change: object) -> dict:
    """A verdict that rejects the whole draft at its first token (greedy), every count matching the
    request. `change` replaces fields (a dict, so a test can give any type)."""
    prompt = len(req.clip.prompt_ids) if req.clip is not None else 0
    opens = req.clip is not None  # a request carrying the clip opens (or reopens) its session
    held_before = prompt if opens else req.held
    answer = {"session": req.session or "s" * 22, "accepted": 0, "token": 10, "kind": "recovered",
              "held": held_before + len(req.pending), "fed": len(req.pending) + len(req.draft),
              "prefilled": prompt if opens else 0, "forwards": 1, "all_forwards": 1,
              "target_row": None, "ended": False}
    answer.update(change)
    return answer


class FakeCloud:
    """`answer(request) -> Reply` for every request; `url` while running (a context manager)."""

    def __init__(self, answer: Callable[[Request], Reply]) -> None:
        self.answer = answer
        self.requests: list[Request] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.server: asyncio.base_events.Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, v in (x.split(":", 1) for x in lines[1:] if ":" in x)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                request = Request(method, path, headers, body)
                self.requests.append(request)
                reply = self.answer(request)
                if reply.hang:
                    await asyncio.sleep(FOREVER)
                data = reply.bytes()
                if reply.drip_s is None:
                    writer.write(data)
                    await writer.drain()
                    continue
                for i in range(len(data)):
                    writer.write(data[i:i + 1])
                    await writer.drain()
                    await asyncio.sleep(reply.drip_s)
                while reply.endless:
                    writer.write(b"x")
                    await writer.drain()
                    await asyncio.sleep(reply.drip_s)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, asyncio.CancelledError):
            pass  # the client went away, or the test is stopping the stand-in
        finally:
            writer.close()

    def __enter__(self) -> FakeCloud:
        self.thread.start()

        async def start() -> None:
            self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
            self.port = self.server.sockets[0].getsockname()[1]
        asyncio.run_coroutine_threadsafe(start(), self.loop).result(timeout=30)
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            assert self.server is not None
            self.server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()
        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)


VOCAB = 64


def remote_cloud(url: str, sample: bool) -> tuple:
    """A RemoteCloud on `url` that believes /health said VOCAB, one clip started, and what
    verify() takes: the sequence (prompt of 4 + one answer token), a 3-token proposal, a generator."""
    from specdec_cli.decoding.config import DecodingConfig
    from specdec_cli.decoding.drafter import Proposal
    from specdec_cli.remote.client import RemoteClient

    client = RemoteClient(url, retry_s=0, timeout_s=10)
    client.info = {"vocab": VOCAB, "rate": 16000, "model": "fake"}
    cloud = client.clip(np.full(1600, 0.25, np.float32), DecodingConfig())
    cloud.start({"input_ids": torch.tensor([[1, 2, 3, 4]])})
    probs = torch.softmax(torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(0)), -1)
    proposal = Proposal([5, 6, 7], [0.0] * 3, probs if sample else None)
    generator = torch.Generator().manual_seed(1) if sample else None
    return client, cloud, [1, 2, 3, 4, 9], proposal, generator
