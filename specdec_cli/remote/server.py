"""`specdec serve`: the cloud thinker behind an HTTP API (Starlette under uvicorn).

One session per clip. A session is a `LocalCloud` — the same object the in-process loop uses, so
scoring, the lazy prefill, the rules and the verdict are the same code on both sides — plus the
clip's decoding rules, its owner (the token that opened it) and when it was last used. The server
owns each session's cache; the client owns the sequence of record and can rebuild a lost session.

Endpoints (bodies: MessagePack or JSON, see wire.py; every error a one-line JSON object):
  GET    /health               the model, its vocabulary width, dtype, fingerprints, open sessions
  GET    /metrics              Prometheus text format
  POST   /v1/verify            open a session (with the clip) and/or verify a draft in it
  POST   /v1/generate          cloud-only: the whole description in one request
  DELETE /v1/sessions/{id}     close a session

Limits: bodies are capped (a clip up to the model's window, the rest bounded), token ids must be in
the vocabulary, lengths within the context, sessions at most --max-sessions (the least recently
used idle one is evicted for a new one; when every one is busy the answer is 503 + Retry-After),
idle sessions evicted after --session-ttl. Model work runs in a worker thread under one lock, so
/health and /metrics answer while a forward runs.

Verifications of concurrent sessions that arrive within --batch-window-ms of each other run as one
batched forward (at most --max-batch sessions; `batching.py` says how, and who owns a session's
cache meanwhile); --batch-window-ms 0 or --max-batch 1 verifies one request at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
from anyio import to_thread
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .. import __version__
from ..errors import InputError
from . import wire

RETRY_AFTER_S = 1
MAX_DRAFT = 256           # tokens in one draft (k is a handful; a bound keeps one request's work bounded)
MAX_NEW_TOKENS = 4096     # a config may not ask the server for more than this
BATCH_WINDOW_MS = 10.0    # how long a verification waits for others to share its forward (bench/server_batching.py)
MAX_BATCH = 16            # verifications in one forward


class ApiError(Exception):
    """An answer other than 200: status, a machine-readable code and one line for a person."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Response:
    return JSONResponse({"error": message.splitlines()[0] if message else code, "code": code},
                        status_code=status, headers=headers)


# -- what the server hosts --------------------------------------------------------------------------

@dataclass
class Hosted:
    """The loaded cloud: model, processor, the rules' vocabulary masks, and how it is known."""
    model: Any
    processor: Any
    masks: Any
    eos_ids: list[int]
    model_id: str
    fingerprint: str
    tokenizer: str
    vocab: int
    dtype: str
    device: str
    context: int
    audio_token_id: int

    @property
    def rate(self) -> int:
        return self.processor.sampling_rate

    @property
    def max_samples(self) -> int:
        return int(self.processor.max_seconds * self.rate)

    def describe(self) -> dict[str, Any]:
        return {"model": self.model_id, "fingerprint": self.fingerprint, "tokenizer": self.tokenizer,
                "vocab": self.vocab, "dtype": self.dtype, "device": self.device, "context": self.context,
                "rate": self.rate, "max_seconds": self.processor.max_seconds, "protocol": wire.PROTOCOL,
                "version": __version__}


def weights_fingerprint(model: Any, full_below: int = 50_000_000) -> str:
    """A short hash of the model's weights: names, shapes, dtypes and values. Every value for a
    model under `full_below` parameters; above it a fixed stride through each tensor (hashing a 7B
    model whole would take tens of seconds at every start), which still tells apart checkpoints,
    fine-tunes and dtypes."""
    import hashlib

    import torch

    h = hashlib.sha256()
    total = sum(p.numel() for p in model.state_dict().values())
    for name, tensor in model.state_dict().items():
        h.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype};".encode())
        flat = tensor.detach().reshape(-1)
        if total > full_below and flat.numel() > 4096:
            flat = flat[:: flat.numel() // 4096]
        h.update(flat.cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def load_hosted(cloud: str, device: str = "cpu", dtype: str = "float32") -> Hosted:
    """Load the cloud thinker and its processor the way `load_pair` loads them."""
    from ..checkpoints import dtype_name, eos_ids_for, load_model, load_processor, model_id
    from ..decoding.processors import VocabMasks

    processor = load_processor(cloud)
    model = load_model(cloud, device, dtype)
    vocab = model.get_output_embeddings().weight.shape[0]
    masks = VocabMasks.for_tokenizer(processor.tokenizer, vocab)
    text_config = getattr(model.config, "text_config", model.config)
    audio_token = getattr(model.config, "audio_token_id", None)
    if audio_token is None:
        audio_token = processor.tokenizer.convert_tokens_to_ids(processor.audio_token)
    return Hosted(model, processor, masks, eos_ids_for(processor.tokenizer), model_id(cloud),
                  weights_fingerprint(model), wire.tokenizer_fingerprint(processor.tokenizer), int(vocab),
                  dtype_name(dtype) if dtype != "auto" else str(model.dtype).removeprefix("torch."),
                  str(model.device), int(getattr(text_config, "max_position_embeddings", 32768)), int(audio_token))


# -- sessions ---------------------------------------------------------------------------------------

@dataclass
class CloudSession:
    id: str
    owner: int
    cloud: Any            # decoding.verifier.LocalCloud
    rules: Any            # decoding.processors.DecodingRules
    prompt_len: int
    last_used: float = field(default_factory=time.monotonic)
    busy: bool = False


class Sessions:
    """Open sessions, least recently used first. Only the event loop's thread touches this map;
    a session marked busy is in a worker thread and is never evicted."""

    def __init__(self, limit: int, ttl_s: float, metrics: Metrics) -> None:
        self.limit, self.ttl_s, self.metrics = limit, ttl_s, metrics
        self._open: OrderedDict[str, CloudSession] = OrderedDict()

    def __len__(self) -> int:
        return len(self._open)

    def expire(self) -> None:
        now = time.monotonic()
        for sid in [s.id for s in self._open.values() if not s.busy and now - s.last_used > self.ttl_s]:
            self._drop(sid, "ttl")

    def get(self, sid: str, owner: int) -> CloudSession:
        """The caller's session; unknown, expired or another token's are all 'unknown' (a session
        id of another token is not confirmed to exist)."""
        self.expire()
        session = self._open.get(sid)
        if session is None or session.owner != owner:
            raise ApiError(404, "unknown_session", f"no session {sid[:12]}…: it ended, was evicted or the "
                                                   "server restarted; open a new one")
        if session.busy:
            raise ApiError(409, "session_busy", "this session is already verifying; send one request at a time")
        self._open.move_to_end(sid)
        return session

    def idle(self) -> int:
        """Open sessions not verifying now (those that could send a verification)."""
        return sum(1 for s in self._open.values() if not s.busy)

    def reserve(self) -> None:
        """Make room for one new session: evict the least recently used idle one at the limit; 503
        when every open session is busy."""
        self.expire()
        while len(self._open) >= self.limit:
            idle = next((s for s in self._open.values() if not s.busy), None)
            if idle is None:
                raise ApiError(503, "full", f"all {self.limit} sessions are busy; retry shortly",
                               {"Retry-After": str(RETRY_AFTER_S)})
            self._drop(idle.id, "lru")

    def add(self, session: CloudSession) -> None:
        self.reserve()
        self._open[session.id] = session
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

    def _drop(self, sid: str, why: str) -> None:
        del self._open[sid]
        self.metrics.sessions.set(len(self._open))
        self.metrics.ended.labels(why).inc()


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.sessions = Gauge("specdec_sessions_open", "Open sessions", registry=r)
        self.opened = Counter("specdec_sessions_opened", "Sessions opened", registry=r)
        self.ended = Counter("specdec_sessions_ended", "Sessions ended, by why", ["reason"], registry=r)
        self.verifications = Counter("specdec_verifications", "Drafts verified", registry=r)
        self.generations = Counter("specdec_generations", "Cloud-only descriptions", registry=r)
        self.tokens = Counter("specdec_tokens_scored", "Tokens run through the model (prompts included)",
                              registry=r)
        self.latency = Histogram("specdec_verify_seconds", "Time to answer a verification (queue + forward)",
                                 buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10), registry=r)
        self.requests = Counter("specdec_requests", "Requests answered, by status", ["status"], registry=r)
        self.batch_size = Histogram("specdec_verify_batch_size", "Verifications scored in one forward",
                                    buckets=(1, 2, 4, 8, 16, 32, 64), registry=r)


# -- the app ----------------------------------------------------------------------------------------

@dataclass
class ServeOptions:
    max_sessions: int = 64
    session_ttl_s: float = 300.0
    tokens: list[str] = field(default_factory=list)  # empty: no authentication (loopback only)
    batch_window_ms: float = BATCH_WINDOW_MS  # 0: one verification at a time
    max_batch: int = MAX_BATCH                 # 1: one verification at a time


def check_bind(host: str, tokens: list[str]) -> None:
    """Anything but loopback needs a token: a cloud model open to a network serves whoever finds it."""
    if tokens:
        return
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise InputError(f"refusing to listen on {host} without a token: give --token-file FILE (or set "
                         "SPECDEC_TOKEN), or listen on 127.0.0.1")


def read_tokens(path: str | None, env: str | None) -> list[str]:
    """Tokens from --token-file (one per line; blank lines and # comments skipped) or SPECDEC_TOKEN."""
    tokens: list[str] = []
    if path is not None:
        try:
            text = open(path, encoding="utf-8").read()
        except OSError as exc:
            raise InputError(f"cannot read token file {path}: {exc.strerror or exc}") from exc
        tokens = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
        if not tokens:
            raise InputError(f"token file {path} holds no token; put one per line")
    elif env:
        tokens = [env.strip()]
    short = [t for t in tokens if len(t) < 16]
    if short:
        raise InputError("a token must be at least 16 characters (e.g. `python -c 'import secrets; "
                         "print(secrets.token_urlsafe(32))'`)")
    return tokens


def create_app(hosted: Hosted, options: ServeOptions) -> Starlette:
    from ..decoding.config import DecodingConfig
    from ..decoding.processors import DecodingRules
    from ..decoding.verifier import LocalCloud
    from . import batching

    metrics = Metrics()
    sessions = Sessions(options.max_sessions, options.session_ttl_s, metrics)
    model_lock = threading.Lock()  # one forward at a time: the model and its rope_deltas are shared
    tokens = [t.encode() for t in options.tokens]
    # Bodies: the longest clip as float32 (FLAC is smaller) plus room for ids and settings.
    body_cap = hosted.max_samples * 4 + 1024 * 1024

    def owner_of(request: Request) -> int:
        if not tokens:
            return 0
        given = request.headers.get("authorization", "")
        scheme, _, value = given.partition(" ")
        value_b = value.strip().encode()
        found = -1
        for i, token in enumerate(tokens):  # every token compared, in constant time each
            if hmac.compare_digest(value_b, token) and scheme.lower() == "bearer":
                found = i
        if found < 0:
            raise ApiError(401, "unauthorized", "missing or wrong token: send Authorization: Bearer <token>",
                           {"WWW-Authenticate": "Bearer"})
        return found

    async def body_of(request: Request, kind: type) -> Any:
        length = request.headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                raise ApiError(400, "bad_request", "Content-Length is not a number")
            if int(length) > body_cap:
                raise ApiError(413, "too_large", f"body of {length} bytes is over the {body_cap}-byte limit "
                                                 f"(a clip is at most {hosted.processor.max_seconds:g} s)")
        chunks, total = [], 0
        try:
            async for chunk in request.stream():
                total += len(chunk)
                if total > body_cap:
                    raise ApiError(413, "too_large", f"body over the {body_cap}-byte limit")
                chunks.append(chunk)
        except ClientDisconnect:
            raise ApiError(400, "truncated", "the body ended before its Content-Length") from None
        try:
            return wire.decoder(kind, request.headers.get("content-type")).decode(b"".join(chunks))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ApiError(400, "bad_request", f"malformed {kind.__name__}: {exc}") from None

    def check_ids(ids: list[int], what: str) -> None:
        bad = next((t for t in ids if not 0 <= t < hosted.vocab), None)
        if bad is not None:
            raise ApiError(400, "bad_token", f"{what} holds token id {bad}, outside the vocabulary (0..{hosted.vocab - 1})")

    def config_of(given: dict[str, Any], mode: str) -> Any:
        try:
            cfg = DecodingConfig(**{**given, "mode": mode})
        except (TypeError, ValueError) as exc:
            raise ApiError(400, "bad_config", f"bad decoding settings: {exc}") from None
        if cfg.max_new_tokens > MAX_NEW_TOKENS:
            raise ApiError(400, "bad_config", f"max_new_tokens {cfg.max_new_tokens} is over {MAX_NEW_TOKENS}")
        return cfg

    def inputs_of(clip: wire.Clip) -> dict[str, Any]:
        """The thinker inputs the client built for this clip, rebuilt here: the features from the
        samples (the same extractor), the ids as sent; their audio placeholders must match."""
        import torch

        from ..processor import audio_token_count

        if clip.rate != hosted.rate:
            raise ApiError(400, "bad_clip", f"the clip is at {clip.rate} Hz; this model hears {hosted.rate} Hz")
        if not clip.prompt_ids:
            raise ApiError(400, "bad_clip", "the prompt is empty")
        check_ids(clip.prompt_ids, "the prompt")
        try:
            audio = wire.decode_audio(clip.audio, clip.codec)
        except Exception as exc:  # soundfile raises several types for bytes that are not FLAC
            raise ApiError(400, "bad_clip", f"the audio does not decode ({wire.first_line(exc)})") from None
        if not 0 < len(audio) <= hosted.max_samples:
            raise ApiError(413 if len(audio) else 400, "bad_clip",
                           f"the clip holds {len(audio)} samples; 1..{hosted.max_samples} "
                           f"({hosted.processor.max_seconds:g} s) are allowed")
        features, feature_mask = hosted.processor.features(audio)
        expected = audio_token_count(int(feature_mask.sum()))
        placed = sum(1 for t in clip.prompt_ids if t == hosted.audio_token_id)
        if placed != expected:
            raise ApiError(400, "bad_clip", f"the prompt holds {placed} audio placeholders; this clip needs {expected}")
        device = hosted.model.device
        ids = torch.tensor([clip.prompt_ids], dtype=torch.long)
        return {"input_ids": ids.to(device), "attention_mask": torch.ones_like(ids).to(device),
                "input_features": features.to(device), "feature_attention_mask": feature_mask.to(device)}

    async def in_worker(fn: Callable[[], Any]) -> Any:
        def locked() -> Any:
            with model_lock:
                return fn()
        return await to_thread.run_sync(locked)

    async def verify_batch(jobs: list[batching.Job]) -> list[Any]:
        metrics.batch_size.observe(len(jobs))
        if len(jobs) == 1:
            return [await in_worker(lambda: batching.verify_one(jobs[0]))]
        return await in_worker(lambda: batching.verify_together(hosted.model, jobs))

    arriving = [0]  # verify requests in their handler (being read, checked, opened, or verified)
    batcher = (batching.Batcher(verify_batch, options.batch_window_ms / 1000, options.max_batch,
                                lambda: sessions.idle() + arriving[0])
               if options.batch_window_ms > 0 and options.max_batch > 1 else None)

    async def verify_now(job: batching.Job) -> wire.VerifyResponse:
        """Batched with other sessions' verifications, or alone (--batch-window-ms 0 / --max-batch 1)."""
        if batcher is not None:
            return await batcher.submit(job)
        return (await verify_batch([job]))[0]

    # -- handlers -----------------------------------------------------------------------------

    async def health(request: Request) -> Response:
        owner_of(request)
        sessions.expire()
        return JSONResponse({"status": "ok", **hosted.describe(), "sessions": len(sessions),
                             "max_sessions": options.max_sessions, "session_ttl_s": options.session_ttl_s,
                             "batch_window_ms": options.batch_window_ms if batcher is not None else 0,
                             "max_batch": options.max_batch if batcher is not None else 1})

    async def metrics_endpoint(request: Request) -> Response:
        owner_of(request)  # (no expire() here: the sweeper ends idle sessions, and /metrics shows it)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def verify(request: Request) -> Response:
        started = time.perf_counter()
        owner = owner_of(request)
        req: wire.VerifyRequest = await body_of(request, wire.VerifyRequest)
        k = len(req.draft)
        if not 1 <= k <= MAX_DRAFT:
            raise ApiError(400, "bad_request", f"a draft holds 1..{MAX_DRAFT} tokens, got {k}")
        check_ids(req.draft, "the draft")
        check_ids(req.pending, "pending")
        if req.sampling is not None and not (len(req.sampling.p_draft) == len(req.sampling.u) == k):
            raise ApiError(400, "bad_request", "sampling needs one p_draft and one u per draft token")
        if req.session is None:
            if req.clip is None or req.config is None:
                raise ApiError(400, "bad_request", "a new session needs the clip and the config")
            cfg = config_of(req.config, "spec")
            inputs = await to_thread.run_sync(inputs_of, req.clip)  # decoding + features: off the event loop
            prompt = list(req.clip.prompt_ids)
            sequence_len = len(prompt) + len(req.pending)
            session = None
        else:
            session = sessions.get(req.session, owner)
            held = len(session.cloud)
            if req.held != held:
                raise ApiError(409, "out_of_sync", f"the session holds {held} tokens, the client said {req.held}; "
                                                   "rebuild it")
            sequence_len = held + len(req.pending)
            if not req.pending and session.cloud.state.last_logits is None:
                raise ApiError(400, "bad_request", "the session was cut back to a prefix; send the token that "
                                                   "follows it (the recovered one) in pending")
        if sequence_len + k > hosted.context:
            raise ApiError(400, "too_long", f"{sequence_len + k} tokens are over the model's context ({hosted.context})")

        if session is None:
            sessions.reserve()  # 503 before any work when the server is full
            sid = secrets.token_urlsafe(16)  # 128 random bits

            def open_session() -> CloudSession:
                cloud = LocalCloud(hosted.model)
                cloud.start(inputs)
                rules = DecodingRules.build(cfg, hosted.masks, len(prompt), hosted.eos_ids)
                return CloudSession(sid, owner, cloud, rules, len(prompt))
            session = await in_worker(open_session)
            sessions.add(session)
            sequence = prompt + list(req.pending)
        else:
            sequence = session.cloud.state.ids + list(req.pending)
        session.busy = True
        try:
            answer = await verify_now(batching.Job(session, sequence, req))
        except ApiError:
            raise
        except Exception:
            # The session's state is unknown after a failed forward: end it (the client rebuilds).
            session.busy = False
            sessions.close(session.id, owner)
            raise
        finally:
            session.busy = False
            session.last_used = time.monotonic()
        if answer.ended:
            sessions.end(session.id)
        metrics.verifications.inc()
        metrics.tokens.inc(answer.fed + answer.prefilled)
        metrics.latency.observe(time.perf_counter() - started)
        return Response(wire.encode(answer), media_type=wire.MSGPACK)

    async def generate(request: Request) -> Response:
        owner_of(request)
        req: wire.GenerateRequest = await body_of(request, wire.GenerateRequest)
        cfg = config_of(req.config, "cloud")
        inputs = await to_thread.run_sync(inputs_of, req.clip)
        if len(req.clip.prompt_ids) + cfg.max_new_tokens > hosted.context:
            raise ApiError(400, "too_long", "the prompt plus max_new_tokens are over the model's context")
        pad = req.pad_id
        if pad is not None:
            check_ids([pad], "pad_id")

        def run() -> Any:
            from ..decoding.baselines import generate_baseline

            return generate_baseline(hosted.model, inputs, cfg, hosted.masks, hosted.eos_ids, pad)
        result = await in_worker(run)
        s = result.stats
        metrics.generations.inc()
        metrics.tokens.inc(s.cloud_prefill_tokens + s.cloud_tokens)
        stats = {"cloud_calls": s.cloud_calls, "cloud_tokens": s.cloud_tokens,
                 "cloud_prefill_tokens": s.cloud_prefill_tokens, "cloud_work_forwards": s.cloud_work_forwards}
        return Response(wire.encode(wire.GenerateResponse(result.tokens, stats)), media_type=wire.MSGPACK)

    async def close(request: Request) -> Response:
        owner = owner_of(request)
        if not sessions.close(request.path_params["sid"], owner):
            raise ApiError(404, "unknown_session", "no such session (it ended, was evicted or the server restarted)")
        return JSONResponse({"closed": True})

    # -- errors: always one line of JSON, never a traceback -----------------------------------

    async def on_api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        metrics.requests.labels(str(exc.status)).inc()
        return error_response(exc.status, exc.code, exc.message, exc.headers)

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        metrics.requests.labels(str(exc.status_code)).inc()
        return error_response(exc.status_code, "not_found" if exc.status_code == 404 else "bad_request",
                              str(exc.detail), dict(exc.headers or {}))

    async def on_crash(request: Request, exc: Exception) -> Response:
        metrics.requests.labels("500").inc()
        return error_response(500, "internal", f"internal error ({type(exc).__name__}); the server goes on")

    def arrives(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        """Counts the verify requests in progress: the batcher's window waits only while one of
        them, or an idle session, could still join its batch."""
        async def wrapped(request: Request) -> Response:
            arriving[0] += 1
            try:
                return await handler(request)
            finally:
                arriving[0] -= 1
        return wrapped

    def counted(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        async def wrapped(request: Request) -> Response:
            response = await handler(request)
            metrics.requests.labels(str(response.status_code)).inc()
            return response
        return wrapped

    routes = [
        Route("/health", counted(health), methods=["GET"]),
        Route("/metrics", counted(metrics_endpoint), methods=["GET"]),
        Route("/v1/verify", counted(arrives(verify)), methods=["POST"]),
        Route("/v1/generate", counted(generate), methods=["POST"]),
        Route("/v1/sessions/{sid}", counted(close), methods=["DELETE"]),
    ]
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> Any:
        # Idle sessions end after the TTL even when no request comes to notice: their caches are
        # the server's memory.
        async def sweep() -> None:
            while True:
                await asyncio.sleep(min(max(options.session_ttl_s / 2, 0.5), 30.0))
                sessions.expire()
        task = asyncio.create_task(sweep())
        try:
            yield
        finally:
            task.cancel()

    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={ApiError: on_api_error, HTTPException: on_http_error, Exception: on_crash})
    app.state.sessions = sessions
    app.state.metrics = metrics
    return app


# -- running it -------------------------------------------------------------------------------------

def serve(hosted: Hosted, host: str, port: int, options: ServeOptions,
          announce: Callable[[str], None]) -> None:
    """Run until SIGINT/SIGTERM (uvicorn's own handlers: in-flight requests finish, then exit)."""
    import uvicorn

    check_bind(host, options.tokens)
    app = create_app(hosted, options)
    batching_note = (f"verifications batched (up to {options.max_batch}, {options.batch_window_ms:g} ms window)"
                     if options.batch_window_ms > 0 and options.max_batch > 1 else "verifications one at a time")

    class _Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            # uvicorn re-raises the signal that stopped it once it has shut down (so a SIGTERM
            # still kills the process, -15). A server stopped on request has stopped cleanly: exit 0.
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
                announce(f"specdec serve: listening on http://{shown}:{bound[1]} · cloud {hosted.model_id} "
                         f"(vocab {hosted.vocab}, {hosted.dtype}, {hosted.device}, weights {hosted.fingerprint}) "
                         f"· at most {options.max_sessions} sessions, idle ones closed after "
                         f"{options.session_ttl_s:g} s · {batching_note} · "
                         f"{'token required' if options.tokens else 'no token (loopback only)'}")

    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=5, h11_max_incomplete_event_size=64 * 1024)
    server = _Server(config)
    asyncio.run(server.serve())
