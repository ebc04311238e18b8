"""The server behind `specdec ui`: one page (static/), its presets, and one endpoint that describes
a clip the browser sends and streams the decode back as it happens.

    GET  /               the page (static/index.html; its CSS and JavaScript under /static/)
    GET  /api/info       the pair, its presets, the longest clip and the largest upload
    POST /api/describe   ?preset=NAME&name=FILE, the clip's bytes as the body: JSON lines, one
                         per event: start (the rule the blocks are read against), note (a warning
                         the library raised, as the CLI prints it), block (one per decoded block:
                         the sentence so far, the gate, each draft token's text, entropy and
                         verdict), then done (the record, as `specdec describe --json` prints it)
                         or error (one line, with the error record)

The clip goes through the library exactly as a file given to `specdec describe` does
(Pair.stream with the upload's bytes: the same formats, length and silence checks, the same
warnings, the same record); this module only carries it. The Pair describes one clip at a time,
so requests take turns (`_turn`). No exception reaches the browser as a traceback: each becomes
one line (errors.one_line). A request whose Host is not one this server was started for is
refused (a page elsewhere that rebinds its name to 127.0.0.1 cannot drive it), and so is a POST
from another origin (a page elsewhere cannot make it describe)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import threading
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..audio import MAX_SAMPLES_PER_SECOND
from ..blocks import (
    MARKS,
    UNIT,
    WHY,
    gate_of,
    gate_rule,
    gate_text,
    level,
    token_budget,
    token_text,
    verdicts,
    where_it_went,
)
from ..errors import error_kind, one_line, printable
from ..presets import load_presets
from ..strict_json import dumps_record

if TYPE_CHECKING:
    from ..decoding.loop import BlockEvent
    from ..pair import Pair, Settings

STATIC = Path(__file__).parent / "static"

# The page's only sources are this server (a CDN or any other host is refused by the browser, not
# only left unused); the microphone's recording is played back from a blob: URL.
CSP = ("default-src 'self'; media-src 'self' blob:; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
       "form-action 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "Cache-Control": "no-store"}

# A file's name as the page names it in its record and messages: the last part of what the browser
# sent, printable, at most this long (a longer one is cut).
MAX_NAME = 100


def max_upload_bytes(max_seconds: float) -> int:
    """The largest body the page takes: the longest clip specdec decodes (the models' window at the
    most samples per second audio.py reads, 768,000: 384 kHz stereo) in 64-bit samples, the widest
    a WAV holds, plus 1 MiB of headers. A larger body cannot be a clip the CLI would describe."""
    return int(MAX_SAMPLES_PER_SECOND * max_seconds * 8) + (1 << 20)


def upload_name(given: str | None) -> str:
    """The name the browser gave the file (a recording: recording.webm), as messages show it."""
    name = (given or "").replace("\\", "/").rsplit("/", 1)[-1].strip()
    name = printable(name)[:MAX_NAME]
    return name if name and name not in (".", "..") else "upload"


def _finite(value: float | None) -> float | None:
    """A float for strict JSON: inf and NaN as null (the page shows ∞ or – for them)."""
    return value if value is not None and math.isfinite(value) else None


def block_json(event: BlockEvent, pair: Pair, cfg: Any) -> dict[str, Any]:
    """One block as the page draws it, in the trace's own words (blocks.py): the sentence so far,
    the gate against its limit, where the block went, each draft token with its entropy (and meaning
    score) against its share of the limit and its verdict, then the cloud's own token."""
    label, score, limit = gate_of(event, cfg)
    gate, over = gate_text(event, cfg)
    where, went = where_it_went(event)
    budget = token_budget(cfg, len(event.draft))
    meaning = event.meaning if event.meaning is not None else [None] * len(event.draft)
    meaning_budget = token_budget(cfg, len(event.draft), event.limit)
    tokens = []
    for tok, h, m, kind in zip(event.draft, event.entropies, meaning, verdicts(event), strict=True):
        item: dict[str, Any] = {"text": token_text(pair.tokenizer, tok), "h": round(h, 2), "level": level(h, budget),
                                "verdict": kind, "mark": MARKS[kind]}
        if m is not None:
            item.update(m=round(m, 2), m_level=level(m, meaning_budget))
        tokens.append(item)
    correction = None
    if event.correction is not None:
        correction = {"text": token_text(pair.tokenizer, event.correction), "kind": event.correction_kind}
    return {"type": "block", "index": event.index + 1, "sentence": pair.text(event.answer),
            "gate": gate, "label": label, "score": _finite(score), "limit": _finite(limit), "over": over,
            "where": where, "went": went, "why": WHY.get(event.reason, event.reason) if event.escalated else None,
            "fallback": event.fallback, "tokens": tokens, "correction": correction,
            "cloud_tokens": event.cloud_tokens, "tokens_so_far": len(event.answer)}


def start_json(run: Settings, preset: str, name: str) -> dict[str, Any]:
    """What the page says before the first block: the clip, the preset and the rule the blocks are
    read against (the trace's header)."""
    cfg = run.cfg
    rule = f"escalate when {gate_rule(cfg)} · k {cfg.k} · verify {cfg.verify}" if cfg.mode == "spec" else None
    return {"type": "start", "file": name, "preset": preset, "mode": cfg.mode, "rule": rule, "unit": UNIT,
            "meaning": cfg.verify == "meaning"}


class Page:
    """The page's state: the loaded pair, the presets it offers and whose turn the pair is."""

    def __init__(self, pair: Pair, default_preset: str = "fluent") -> None:
        self.pair = pair
        # The page describes one clip at a time and has no --segment: what a clip over the window can do.
        pair.too_long_hint = ("record or cut a shorter one (`specdec describe FILE --segment` describes a long "
                              "recording in segments)")
        self.presets = load_presets(list(pair.spec.presets_files))
        self.default_preset = default_preset if default_preset in self.presets else sorted(self.presets)[0]
        self.max_bytes = max_upload_bytes(pair.max_seconds)
        self._turn = asyncio.Lock()  # one clip at a time: a Pair's caches are per call

    def info(self) -> dict[str, Any]:
        models = self.pair.models
        remote = models.remote
        spec = self.pair.spec
        return {
            "edge": models.edge_id, "cloud": models.cloud_id,
            # What the page's header says (the full ids are its tooltip): a phone has no room for two paths.
            "edge_label": "demo edge" if spec.edge is None else _short(models.edge_id),
            "cloud_label": (remote.url if remote is not None else "demo cloud" if spec.cloud is None
                            else _short(models.cloud_id)),
            "cloud_url": remote.url if remote is not None else None,
            "cloud_down": models.cloud_down,
            "presets": [{"name": name, "description": p.description, **{k: _jsonable(v) for k, v in p.values.items()
                                                                          if k in ("threshold", "k", "verify", "mode")}}
                        for name, p in sorted(self.presets.items())],
            "default_preset": self.default_preset,
            "max_seconds": self.pair.max_seconds, "max_bytes": self.max_bytes,
        }

    async def describe(self, name: str, data: bytes, preset: str) -> AsyncIterator[bytes]:
        """The decode of one clip as JSON lines, in turn with the other requests. When the browser
        goes away mid-decode the decode stops at its next block, and the next request's turn comes
        only once it has."""
        if self._turn.locked():
            yield _line({"type": "wait", "message": "another clip is being described; this one comes next"})
        async with self._turn:
            loop = asyncio.get_running_loop()
            queue: asyncio.Queue = asyncio.Queue()
            stop = threading.Event()

            def put(item: dict[str, Any] | None) -> None:
                loop.call_soon_threadsafe(queue.put_nowait, item)

            worker = loop.run_in_executor(None, self._decode, name, data, preset, put, stop)
            try:
                while (item := await queue.get()) is not None:
                    yield _line(item)
            finally:
                stop.set()
                import anyio

                with anyio.CancelScope(shield=True):  # a cancelled request still waits for its decode to end
                    await worker

    def _decode(self, name: str, data: bytes, preset: str, put: Callable[[dict[str, Any] | None], None],
                stop: threading.Event) -> None:
        """In a worker thread: Pair.stream over the clip, each event put for the page; never raises."""
        run = None
        try:
            run = self.pair.resolve(preset)
            put(start_json(run, preset, name))
            with warnings.catch_warnings(record=True) as caught:
                # Every warning of this clip, recorded (the requests take turns, so this clip's own);
                # "always": a second clip at a low rate warns again, as each CLI run does.
                warnings.simplefilter("always")
                stream = self.pair.stream(name, preset=preset, data=data)
                shown = 0
                for event in stream:
                    shown = _notes(caught, shown, put)
                    if stop.is_set():
                        stream.close(wait=60.0)
                        return
                    put(block_json(event, self.pair, run.cfg))
                _notes(caught, shown, put)
            result = stream.result
            if result is not None:
                put({"type": "done", "sentence": result.description or "", "record": dumps_record(result.record)})
        except Exception as exc:  # one line for the page: never a traceback
            message = one_line(exc)
            record = None
            if run is not None:
                try:
                    record = dumps_record(self.pair.error_record(name, run, message, kind=error_kind(exc)))
                except Exception:  # the error line matters, the record is a courtesy
                    record = None
            put({"type": "error", "message": message, "record": record})
        finally:
            put(None)


def _notes(caught: list[warnings.WarningMessage], shown: int, put: Callable[[dict[str, Any]], None]) -> int:
    """specdec's own warnings (a clip below the models' rate, one cut short, …) as notes on the
    page, as the CLI prints them; any other library's go to this server's stderr, as they would."""
    for w in caught[shown:]:
        if type(w.message).__module__.startswith("specdec"):
            put({"type": "note", "message": printable(str(w.message))})  # as the CLI's "warning: …" line
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    return len(caught)


def _short(model: str) -> str:
    """A model as the header names it: a Hub id as it is, a folder by its last part."""
    path = Path(model)
    return path.name if path.is_absolute() or path.exists() else model


def _line(item: dict[str, Any]) -> bytes:
    return (json.dumps(item, ensure_ascii=False, allow_nan=False) + "\n").encode()


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "inf" if value > 0 else None
    return value


def _error(message: str, status: int) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=HEADERS)


async def _read_body(request: Request, limit: int) -> bytes:
    """The request's body, refused past `limit` bytes as it arrives (never held whole beyond it)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _TooLarge
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


class _TooLarge(Exception):
    pass


def _same_origin(request: Request) -> bool:
    """A POST from the page itself: its Origin (when the browser sends one) names this host."""
    origin = request.headers.get("origin")
    return origin is None or urlsplit(origin).netloc == request.headers.get("host", "")


def create_app(page: Page, hosts: list[str]) -> Starlette:
    """The page's ASGI app. `hosts`: the Host names it answers to (loopback's, and --host's)."""

    async def index(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers=HEADERS)

    async def info(request: Request) -> Response:
        return JSONResponse(page.info(), headers=HEADERS)

    async def describe(request: Request) -> Response:
        if not _same_origin(request):
            return _error("this page describes clips sent from itself only", 403)
        preset = request.query_params.get("preset") or page.default_preset
        if preset not in page.presets:
            return _error(f"no preset named {printable(preset)[:40]!r}; choose one of {', '.join(sorted(page.presets))}",
                          400)
        name = upload_name(request.query_params.get("name"))
        try:
            data = await _read_body(request, page.max_bytes)
        except _TooLarge:
            return _error(f"{name} is over {page.max_bytes / 1e6:.0f} MB, larger than any clip of at most "
                          f"{page.pair.max_seconds:g} s; give a shorter clip (or `specdec describe --segment` for "
                          "a long recording)", 413)
        if not data:
            return _error(f"{name} is empty (0 bytes); choose an audio file or record one", 400)
        return StreamingResponse(page.describe(name, data, preset), media_type="application/x-ndjson",
                                 headers={**HEADERS, "X-Accel-Buffering": "no"})

    async def server_error(request: Request, exc: Exception) -> Response:
        # Anything this module did not turn into a line itself: still one line, never a traceback.
        return _error(f"unexpected {one_line(exc)}", 500)

    async def not_found(request: Request, exc: Exception) -> Response:
        return _error(f"no such page: {printable(request.url.path)[:80]}", 404)

    routes = [Route("/", index), Route("/api/info", info), Route("/api/describe", describe, methods=["POST"]),
              Mount("/static", StaticFiles(directory=STATIC), name="static")]
    return Starlette(routes=routes, middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=hosts)],
                     exception_handlers={500: server_error, 404: not_found})


def allowed_hosts(host: str) -> list[str]:
    """The Host names the page answers to: loopback's always, and the address it listens on."""
    names = ["127.0.0.1", "localhost", "[::1]", "::1"]
    bare = host.strip("[]")
    if bare not in names and bare not in ("0.0.0.0", "::"):
        names.append(bare)
    if bare in ("0.0.0.0", "::"):  # every address of this machine: whatever name reaches it
        return ["*"]
    return names


def serve(page: Page, host: str, sock: Any, announce: Callable[[str], None]) -> None:
    """Run the page on `sock` (bound already: remote.server.listen) until Ctrl-C; `announce(url)`
    once it listens."""
    import uvicorn

    app = create_app(page, allowed_hosts(host))

    class _Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            # uvicorn re-raises the signal that stopped it once it has shut down; Ctrl-C is how this
            # page is meant to stop, so it has stopped cleanly (exit 0), as `specdec serve` does.
            with super().capture_signals():
                try:
                    yield
                finally:
                    self._captured_signals.clear()

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.started:  # the real port, also when --port 0 let the system pick one
                bound = self.servers[0].sockets[0].getsockname()
                shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
                announce(f"http://{shown}:{bound[1]}/")

    config = uvicorn.Config(app, loop="asyncio", log_level="warning", access_log=False, timeout_graceful_shutdown=2)
    asyncio.run(_Server(config).serve(sockets=[sock]))

