"""`specdec serve`: the cloud thinker behind an HTTP API (Starlette under uvicorn).

One session per clip. A session is a `LocalCloud` — the same object the in-process loop uses, so
scoring, the lazy prefill, the rules and the verdict are the same code on both sides — plus the
clip's decoding rules, its owner (the token that opened it) and when it was last used. The server
owns each session's cache; the client owns the sequence of record and can rebuild a lost session.

Endpoints (bodies: MessagePack or JSON, see wire.py; every error a one-line JSON object):
  GET    /health               the model, its vocabulary width, dtype, fingerprints, open sessions
  GET    /metrics              Prometheus text format
  GET    /openapi.json         this API as an OpenAPI document, generated from wire.py's structs
  POST   /v1/verify            open a session (with the clip) and/or verify a draft in it
  POST   /v1/generate          cloud-only: the whole description in one request
  POST   /v1/sessions          open a session with the clip and prefill it now (--upload eager)
  DELETE /v1/sessions/{id}     close a session

Every request is checked before any model runs: the body against wire.py's schema (types, ranges,
finite floats, lengths), then what depends on the model (token ids in its vocabulary, lengths
within its context, the clip's rate and length, bounded before it is decoded). Client input never
gets a 5xx: a 5xx is a specdec bug, logged once with its traceback (http_errors.py). The limits on
connections (limits.py), sessions (sessions.py: in total and per token) and bodies, and their flags,
are listed in docs/security.md. Model work runs in a worker thread, one turn at a time, so /health
and /metrics answer while a forward runs.

Fair share and abandoned work (issue 33, fairness.py says how): the next turn of the model, and of
decoding clips (`--prep-slots` at a time), goes to the waiting token that has had the least of it,
and the batchers fill their batches one request per token in turn; a batch's model time is charged
to the tokens of its rows, a lazy prefill's to its session's token, and the verification batcher
orders its queue by those counters too (issue 42, batching.py says how); a token has at most --max-requests-per-token
requests in flight (checked from the head, before its body is read) and --max-waiting-per-token of
them waiting for a turn or a batch (503 with Retry-After beyond either); a request whose client
disconnects once its body is read is cancelled (it leaves its queue or its batch at the next step,
and a session it was opening is not kept).

Verifications of concurrent sessions that arrive within --batch-window-ms of each other run as one
batched forward (at most --max-batch sessions; `batching.py` says how, who owns a session's cache
meanwhile, and how a failing batch is retried one request at a time so that a request fails only
itself); --batch-window-ms 0 or --max-batch 1 verifies one request at a time. Cloud-only
generations are batched continuously (at most --max-generate-batch rows; generations.py says how);
--max-generate-batch 1 runs one at a time.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import functools
import hmac
import ipaddress
import logging
import math
import re
import secrets
import socket
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
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
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .. import __version__
from ..errors import InputError
from . import access_log, fairness, gate, limits, openapi, wire
from .http_errors import ApiError, CrashGuard, OnceLog, error_response
from .sessions import MAX_AHEAD, CloudSession, MemoryReturn, Sessions, wait_until

SESSION_ID = re.compile(wire.SESSION_ID_PATTERN)

__all__ = ["ApiError", "CloudSession", "Hosted", "Metrics", "ServeOptions", "Sessions", "create_app", "serve"]

MAX_DRAFT = wire.MAX_DRAFT            # tokens in one draft
MAX_NEW_TOKENS = wire.MAX_NEW_TOKENS  # a config may not ask the server for more than this
BATCH_WINDOW_MS = 10.0    # how long a verification waits for others to share its forward (bench/server_batching.py)
MAX_BATCH = 16            # verifications in one forward
MAX_GENERATE_BATCH = 16   # cloud-only generations decoded together (continuous batching)
SESSION_PREFIX = access_log.PREFIX  # characters of a session id shown in /metrics (and the access log)
PREFILL_LABELS = 4096     # sessions whose prefill count /metrics keeps
MAX_WAITING_PER_TOKEN = 8  # requests of one token waiting for a turn of the model or a batch
PREP_SLOTS = 2            # clips decoded (samples -> features) at once
FAIR_HOLD_MS = 20.0       # how long the model waits for a lighter token's next request (fairness.Turns, batching)
FAIR_CREDIT_S = 0.5       # model time a token may stay behind the least served active one (fairness.Turns.lift)
METRICS_EVERY_S = 1.0     # /metrics is rendered at most this often for each token's view (Rendered)
MAX_REFUSALS_PER_S = 10.0  # refused requests a second per token before its next ones wait (gate.py; burst: twice)
HOLD_AHEAD_MS = 2000.0    # how long a verification that came before the verdict it assumes waits for it (held_back)


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

    @functools.cached_property
    def min_samples(self) -> int:
        """The shortest clip: the fewest samples that give the audio encoder one frame to emit.
        Fewer, and the feature extractor fails (below n_fft/2 + 1 samples its reflect padding does
        not fit) or yields no audio token (the demo's and Qwen's: 480 samples, 30 ms at 16 kHz).
        Found by asking the extractor itself (a bisection over 1 s), so it holds for any."""
        import numpy as np

        from ..processor import audio_token_count

        def enough(n: int) -> bool:
            try:
                _, mask = self.processor.features(np.zeros(n, np.float32))
            except Exception:  # noqa: BLE001 - too short for this extractor, whatever it raises
                return False
            return audio_token_count(int(mask.sum())) >= 1
        lo, hi = 1, self.rate
        assert enough(hi), "one second of audio gives no audio token"
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if enough(mid) else (mid + 1, hi)
        return lo


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




# -- metrics ----------------------------------------------------------------------------------------

class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.sessions = Gauge("specdec_sessions_open", "Open sessions", registry=r)
        self.opened = Counter("specdec_sessions_opened", "Sessions opened", registry=r)
        self.ended = Counter("specdec_sessions_ended", "Sessions ended, by why", ["reason"], registry=r)
        self.verifications = Counter("specdec_verifications", "Drafts verified", registry=r)
        self.out_of_sync = Counter("specdec_verifications_out_of_sync", "Verifications refused before any forward: "
                                   "the prefix they assume is not the session's (409 out_of_sync)", registry=r)
        self.held = Counter("specdec_verifications_held", "Verifications that came before the verdict they assume "
                            "and waited for it, by how the wait ended: in_turn (the session reached the prefix "
                            "they assume), broke (it cannot any more), late (--hold-ahead-ms passed)", ["end"],
                            registry=r)
        self.ahead = Gauge("specdec_verifications_ahead", "Verifications waiting now for the verdict they assume "
                           "(or for their session's open)", registry=r)
        self.generations = Counter("specdec_generations", "Cloud-only descriptions", registry=r)
        self.tokens = Counter("specdec_tokens_scored", "Tokens run through the model (prompts included)",
                              registry=r)
        self.latency = Histogram("specdec_verify_seconds", "Time to answer a verification (queue + forward)",
                                 buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10), registry=r)
        self.requests = Counter("specdec_requests", "Requests answered, by status", ["status"], registry=r)
        self.batch_size = Histogram("specdec_verify_batch_size", "Verifications scored in one forward",
                                    buckets=(1, 2, 4, 8, 16, 32, 64), registry=r)
        self.generate_rows = Histogram("specdec_generate_batch_size", "Cloud-only generations in one step",
                                       buckets=(1, 2, 4, 8, 16, 32, 64), registry=r)
        # Sticky routing, checked: a session id prefilled more than once (summed over replicas) was
        # rebuilt (a request reached a replica that did not hold it, or the session was lost).
        # Labelled by the id's first 8 characters (48 of its >= 128 bits: never enough to use it);
        # only the last PREFILL_LABELS sessions keep a series, so the label set stays bounded.
        self.prefills = Counter("specdec_session_prefills", "Prefills run per session (by its id's first 8 "
                                "characters; the last 4096 sessions)", ["session"], registry=r)
        self._prefill_labels: OrderedDict[str, None] = OrderedDict()
        self.abandoned = Counter("specdec_abandoned_requests", "Requests whose client disconnected before "
                                 "the answer (their work cancelled), by endpoint", ["endpoint"], registry=r)
        self.paced = Counter("specdec_paced_requests", "Requests held before they were read because their "
                             "token's refusals were over --max-refusals-per-s", registry=r)
        self.cancelled = Counter("specdec_cancelled_work", "Work dropped because its client had gone: queued "
                                 "(left a queue before its turn), row (a generation left its batch), session "
                                 "(a session being opened not kept)", ["what"], registry=r)

    def prefilled(self, sid: str, owner: int = 0) -> None:
        label = sid[:SESSION_PREFIX]
        self.prefills.labels(label).inc()
        self._prefill_labels[label] = owner
        self._prefill_labels.move_to_end(label)
        while len(self._prefill_labels) > PREFILL_LABELS:
            self.prefills.remove(self._prefill_labels.popitem(last=False)[0])

    def label_owners(self) -> dict[str, int]:
        """The token whose session each per-session series is (a series of 8 characters of an id)."""
        return dict(self._prefill_labels)

    def exposition(self, owner: int | None = None, owners: dict[str, int] | None = None) -> bytes:
        """The Prometheus text; `owner`: only that token's per-session series (least disclosure
        between tenants, issue 42: any token saw every tenant's session prefixes and prefills),
        by `owners` (label_owners(), taken on the event loop when this runs in a worker thread)."""
        text = generate_latest(self.registry)
        return text if owner is None else tenant_view(text, self.label_owners() if owners is None else owners, owner)


class Rendered:
    """A text made at most once per `every_s` for each key (a token's view of /metrics), in a
    worker thread, and never more than a fifth of the time: a caller waits for the next making
    that starts after it came (never an older text than its request), which starts `every_s`
    after the one before began at the earliest, and four times as long as that one took after it
    ended; every caller waiting then gets that one.

    Why (issue 55): /metrics rendered every per-session series (up to PREFILL_LABELS) and filtered
    them for the asking token on the event loop, ~30 ms at 1,400 series and ~110 ms at 4,096, for
    every request: a token polling it from two connections took another token's verifications to
    3 % of their rate. Polled as fast as a client can, it is now made once a second (less often
    when it takes long: on a loaded machine 4,096 series took 2.5 s), and the pollers wait for it.
    Written by hand: prometheus_client renders on each call."""

    def __init__(self, every_s: float = METRICS_EVERY_S) -> None:
        self.every_s = every_s
        self._last: dict[Any, tuple[float, float]] = {}  # key -> when its last making started, ended
        self._next: dict[Any, asyncio.Task] = {}       # key -> the making its callers now wait for
        self._making: dict[Any, asyncio.Lock] = {}     # key -> held while one is made (one at a time)

    async def get(self, key: Any, make: Callable[[], Awaitable[bytes]]) -> bytes:
        upcoming = self._next.get(key)
        if upcoming is None:
            upcoming = asyncio.ensure_future(self._make(key, make))
            self._next[key] = upcoming
        return await asyncio.shield(upcoming)  # (a caller that leaves does not cancel the others')

    async def _make(self, key: Any, make: Callable[[], Awaitable[bytes]]) -> bytes:
        async with self._making.setdefault(key, asyncio.Lock()):  # after the making under way, if any
            try:
                if key in self._last:
                    started, ended = self._last[key]
                    wait = max(started + self.every_s, ended + 4 * (ended - started)) - time.monotonic()
                    if wait > 0:
                        await asyncio.sleep(wait)
            finally:
                if self._next.get(key) is asyncio.current_task():
                    del self._next[key]  # callers from now on wait for the next making
            started = time.monotonic()
            try:
                return await make()
            finally:
                self._last[key] = (started, time.monotonic())


_SESSION_LABEL = re.compile(rb'^specdec_session_prefills_(?:total|created)\{.*session="([^"]*)"')


def tenant_view(text: bytes, owners: dict[str, int], owner: int) -> bytes:
    """Prometheus text less the per-session series of other tokens' sessions (their 8-character
    prefixes and prefill counts): the aggregate series stay, which tell no tenant's sessions."""
    kept = []
    for line in text.splitlines(keepends=True):
        m = _SESSION_LABEL.match(line)
        if m is None or owners.get(m.group(1).decode("ascii", "replace")) == owner:
            kept.append(line)
    return b"".join(kept)


# -- the app ----------------------------------------------------------------------------------------

@dataclass
class ServeOptions:
    """`specdec serve`'s limits; the defaults are the flags' (docs/security.md lists them all)."""
    max_sessions: int = 64
    session_ttl_s: float = 300.0
    tokens: list[str] = field(default_factory=list)  # empty: no authentication (loopback only)
    batch_window_ms: float = BATCH_WINDOW_MS  # 0: one verification at a time
    max_batch: int = MAX_BATCH                 # 1: one verification at a time
    max_sessions_per_token: int = 0            # 0: a fair share, max_sessions / tokens (all of them without tokens)
    max_connections: int = 1024                # lowered to what the descriptor limit allows
    header_timeout_s: float = 10.0             # a request head must arrive within this
    body_timeout_s: float = 60.0               # ... and its body within this after it
    keep_alive_timeout_s: int = 5              # an idle keep-alive connection is closed after this
    max_generate_batch: int = MAX_GENERATE_BATCH  # 1: one cloud-only generation at a time
    max_requests_per_token: int = 0            # in flight at once; 0: the token's share of sessions (per_token)
    max_waiting_per_token: int = MAX_WAITING_PER_TOKEN  # waiting for a turn of the model, or in a batcher's queue
    prep_slots: int = PREP_SLOTS               # clips decoded at once
    fair_hold_ms: float = FAIR_HOLD_MS         # a free model turn kept for a lighter owner's next request; 0: never
    max_refusals_per_s: float = MAX_REFUSALS_PER_S  # per token (and for all requests without one); 0: no limit
    hold_ahead_ms: float = HOLD_AHEAD_MS       # a verification ahead of its session waits this long; 0: refused at once

    @property
    def per_token(self) -> int:
        if self.max_sessions_per_token > 0:
            return min(self.max_sessions_per_token, self.max_sessions)
        return max(1, math.ceil(self.max_sessions / max(1, len(self.tokens))))

    @property
    def requests_per_token(self) -> int:
        return self.max_requests_per_token if self.max_requests_per_token > 0 else self.per_token


def is_loopback(host: str) -> bool:
    """Whether `host` (a --host value: a name, an address, `[::1]`) is this machine's loopback."""
    try:
        return host == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, tokens: list[str]) -> None:
    """Anything but loopback needs a token: a cloud model open to a network serves whoever finds it."""
    if tokens:
        return
    if not is_loopback(host):
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
    from . import batching, generations

    metrics = Metrics()
    memory = MemoryReturn()
    sessions = Sessions(options.max_sessions, options.session_ttl_s, metrics, per_token=options.per_token,
                        on_drop=memory.soon)
    # One forward at a time (the model and its rope_deltas are shared), the turns shared fairly.
    def cancelled_queued() -> None:
        metrics.cancelled.labels("queued").inc()
    model_turns = fairness.Turns(1, options.max_waiting_per_token, cancelled_queued, options.fair_hold_ms / 1000,
                                 FAIR_CREDIT_S)
    prep_turns = fairness.Turns(options.prep_slots, options.max_waiting_per_token, cancelled_queued)
    in_flight = fairness.InFlight(options.requests_per_token)
    # Refusals per token (gate.py); as many of a token's requests may wait for its rate as it may
    # have in flight.
    pacer = fairness.Pacer(options.max_refusals_per_s, max(1, round(2 * options.max_refusals_per_s)),
                           lambda key: gate.ANONYMOUS_WAITING if key == gate.ANONYMOUS else options.requests_per_token)
    tokens = [t.encode() for t in options.tokens]
    crashed = OnceLog()
    # Bodies: the longest clip as float32 (FLAC is smaller) plus room for ids and settings.
    body_cap = hosted.max_samples * 4 + 1024 * 1024
    document = openapi.document()
    rendered = Rendered()  # /metrics, each token's view at most once a second
    hosted.min_samples  # found once, now, not in the first request  # noqa: B018

    def token_of(given: str) -> int | None:
        """The token an Authorization header's value names (its index; 0 without tokens), or None."""
        if not tokens:
            return 0
        scheme, _, value = given.partition(" ")
        value_b = value.strip().encode()
        found = None
        for i, token in enumerate(tokens):  # every token compared, in constant time each
            if hmac.compare_digest(value_b, token) and scheme.lower() == "bearer":
                found = i
        return found

    def identify(scope: dict[str, Any]) -> int | None:
        given = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), b"")
        return token_of(given.decode("latin-1"))

    def owner_of(request: Request) -> int:
        found = token_of(request.headers.get("authorization", ""))
        if found is None:  # (the gate answered it already; kept for a caller outside the app's stack)
            raise ApiError(401, "unauthorized", gate.UNAUTHORIZED, {"WWW-Authenticate": "Bearer"})
        return found

    async def body_of(request: Request, kind: type, owner: int) -> Any:
        length = request.headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                raise ApiError(400, "bad_request", "Content-Length is not a number")
            if int(length) > body_cap:
                raise ApiError(413, "too_large", f"body of {length} bytes is over the {body_cap}-byte limit "
                                                 f"(a clip is at most {hosted.processor.max_seconds:g} s)")
        chunks, total = [], 0
        try:
            # The whole body within --body-timeout: a client that trickles it is cut off (the
            # head's deadline is limits.py's).
            async with asyncio.timeout(options.body_timeout_s):
                async for chunk in request.stream():
                    total += len(chunk)
                    if total > body_cap:
                        raise ApiError(413, "too_large", f"body over the {body_cap}-byte limit")
                    chunks.append(chunk)
        except TimeoutError:
            raise ApiError(408, "timeout", f"the body did not arrive within {options.body_timeout_s:g} s",
                           {"Connection": "close"}) from None
        except ClientDisconnect:  # the client went while sending: counted with the abandoned requests
            metrics.abandoned.labels({"/v1/verify": "verify", "/v1/generate": "generate",
                                      "/v1/sessions": "open"}.get(request.url.path, "other")).inc()
            raise ApiError(400, "truncated", "the body ended before its Content-Length") from None
        # Decoded on the event loop: within the schema's bounds (wire.py: lists of ids by the
        # longest context, JSON's list entries counted before decoding) a body decodes in at most a
        # few milliseconds, and its CPU is charged to its token's model time (the counters its turns
        # are granted by), so one token's bodies cost the others nothing they are not paid back.
        started = time.thread_time()
        try:
            return wire.decode(kind, b"".join(chunks), request.headers.get("content-type"))
        except wire.BadMessage as exc:
            raise ApiError(400, "bad_request", str(exc)) from None
        finally:
            model_turns.charge(owner, time.thread_time() - started)

    def answer(request: Request, message: msgspec.Struct) -> Response:
        """MessagePack (the client's), or JSON when the request accepts JSON and not MessagePack."""
        accept = request.headers.get("accept", "").lower()
        if wire.JSON in accept and wire.MSGPACK not in accept:
            return Response(msgspec.json.encode(message), media_type=wire.JSON)
        return Response(wire.encode(message), media_type=wire.MSGPACK)

    def check_ids(ids: list[int], what: str) -> None:
        """Every id within the vocabulary: min and max in C (a list's length is checked first, by
        the schema and against the context, so this is at most a context's worth of ids)."""
        if ids and (min(ids) < 0 or max(ids) >= hosted.vocab):
            bad = next(t for t in ids if not 0 <= t < hosted.vocab)
            raise ApiError(400, "bad_token", f"{what} holds token id {bad}, outside the vocabulary (0..{hosted.vocab - 1})")

    def config_of(given: wire.DecodingSettings, mode: str) -> Any:
        """The session's DecodingConfig: the ranges are the schema's (checked while decoding);
        DecodingConfig's own checks (e.g. no special tokens in an instruction) run here."""
        try:
            return DecodingConfig(**{**msgspec.structs.asdict(given), "mode": mode})
        except (TypeError, ValueError) as exc:
            raise ApiError(400, "bad_config", f"bad decoding settings: {wire.first_line(exc)}") from None

    def inputs_of(clip: wire.Clip) -> dict[str, Any]:
        """The thinker inputs the client built for this clip, rebuilt here: the features from the
        samples (the same extractor), the ids as sent; their audio placeholders must match."""
        import torch

        from ..processor import audio_token_count
        from ..speech import NoSpeech, check_speech

        if clip.rate != hosted.rate:
            raise ApiError(400, "bad_clip", f"the clip is at {clip.rate} Hz; this model hears {hosted.rate} Hz")
        check_ids(clip.prompt_ids, "the prompt")
        try:
            audio = wire.decode_audio(clip.audio, clip.codec, hosted.max_samples, hosted.rate)
        except wire.TooLong as exc:
            raise ApiError(413, "bad_clip", str(exc)) from None
        except wire.BadAudio as exc:
            raise ApiError(400, "bad_clip", str(exc)) from None
        if len(audio) < hosted.min_samples:
            raise ApiError(400, "bad_clip", f"the clip holds {len(audio)} samples; at least {hosted.min_samples} "
                                            f"({hosted.min_samples / hosted.rate * 1000:g} ms) make one audio token")
        # The client checks for speech before it sends (Pair.read); a caller of the API directly
        # is held to the same policy (issue 52): a tone or noise gets no speaker. Here, in a worker
        # thread in the token's prep turn: Silero costs ~22 ms of CPU per second of audio.
        try:
            check_speech(audio, hosted.rate, "the clip")
        except NoSpeech as exc:
            raise ApiError(400, "bad_clip", str(exc)) from None
        features, feature_mask = hosted.processor.features(audio)
        expected = audio_token_count(int(feature_mask.sum()))
        placed = sum(1 for t in clip.prompt_ids if t == hosted.audio_token_id)
        if placed != expected:
            raise ApiError(400, "bad_clip", f"the prompt holds {placed} audio placeholders; this clip needs {expected}")
        device = hosted.model.device
        ids = torch.tensor([clip.prompt_ids], dtype=torch.long)
        return {"input_ids": ids.to(device), "attention_mask": torch.ones_like(ids).to(device),
                "input_features": features.to(device), "feature_attention_mask": feature_mask.to(device)}

    async def in_worker(fn: Callable[[], Any], owner: Any, capped: bool = True) -> Any:
        """fn() in a worker thread, in `owner`'s turn of the model. Cancelled while waiting for the
        turn, it leaves the queue; once running, the thread finishes first (anyio shields it)."""
        async with model_turns.turn(owner, capped):
            return await to_thread.run_sync(fn)

    async def in_shared_worker(fn: Callable[[], Any], owners: Iterable[int],
                               costs: Callable[[], Iterable[tuple[int, float]]]) -> Any:
        """fn() for several tokens at once (a batcher's step), in a turn of the least served of
        `owners`; then each token is charged the model time `costs()` says fn spent on its rows
        (issue 42: a batch's time is its tokens', never the batcher's). Never capped: its requests
        were counted against their tokens when they queued."""
        lead = min(owners, key=lambda owner: model_turns.served.get(owner, 0.0))
        async with model_turns.turn(lead, capped=False, charged=False):
            try:
                return await to_thread.run_sync(fn)
            finally:
                for owner, seconds in costs():
                    model_turns.charge(owner, seconds)

    async def prepared(clip: wire.Clip, owner: Any) -> dict[str, Any]:
        """The clip's thinker inputs (decoding + features: CPU work), in `owner`'s turn of the
        --prep-slots: one token's flood of long clips does not crowd out another's."""
        async with prep_turns.turn(owner):
            return await to_thread.run_sync(inputs_of, clip)

    def batch_failed(exc: BaseException, n: int) -> None:
        crashed(f"a batched forward of {n} verifications failed (a specdec bug); each was verified alone", exc)

    async def verify_batch(jobs: list[batching.Job]) -> list[Any]:
        """One answer or exception per job: batched, and alone when the batch fails (batching.py);
        each job's model time charged to its session's token."""
        metrics.batch_size.observe(len(jobs))
        return await in_shared_worker(lambda: batching.verify_batch(hosted.model, jobs, batch_failed),
                                      [job.owner for job in jobs], lambda: [(job.owner, job.cost) for job in jobs])

    awaiting_open: collections.Counter[str] = collections.Counter()  # verifications waiting for their session's open
    # verify requests in their handler (being read, checked, opened, or verified), per token
    arriving: collections.Counter[int] = collections.Counter()
    batcher = (batching.Batcher(verify_batch, options.batch_window_ms / 1000, options.max_batch,
                                lambda due: sessions.idle(due) + sum(n for o, n in arriving.items() if due(o)),
                                cancelled_queued, ledger=model_turns, hold_s=options.fair_hold_ms / 1000)
               if options.batch_window_ms > 0 and options.max_batch > 1 else None)

    def generate_alone(inputs: Any, cfg: Any) -> Any:
        from ..decoding.baselines import generate_baseline

        return generate_baseline(hosted.model, inputs, cfg, hosted.masks, hosted.eos_ids)

    def generate_failed(exc: BaseException, n: int) -> None:
        crashed(f"a batched step of {n} cloud-only generations failed (a specdec bug); each was run alone", exc)

    def generate_rows() -> Any:
        from ..decoding.batch_loop import GenerateRows

        return GenerateRows(hosted.model, hosted.masks, hosted.eos_ids, "cloud")
    def generate_cancelled(where: str) -> None:
        metrics.cancelled.labels(where).inc()
        memory.soon()  # its row's cache is gone

    generator = (generations.GenerateBatcher(generate_rows, in_shared_worker,
                                             generate_alone, options.max_generate_batch, generate_failed,
                                             metrics.generate_rows.observe, options.max_waiting_per_token,
                                             generate_cancelled)
                 if options.max_generate_batch > 1 else None)

    async def until_gone(request: Request, endpoint: str, work: Awaitable[Response],
                         on_gone: Callable[[], None] | None = None) -> Response:
        """`work` (the request once its body is read), cancelled when its client disconnects."""
        try:
            return await fairness.watch_disconnect(request.receive, work, on_gone)
        except fairness.Gone:
            metrics.abandoned.labels(endpoint).inc()
            raise ApiError(499, "client_gone", "the client closed the connection before the answer") from None

    async def verify_now(job: batching.Job) -> wire.VerifyResponse:
        """Batched with other sessions' verifications, or alone (--batch-window-ms 0 / --max-batch 1)."""
        if batcher is not None:
            return await batcher.submit(job)
        got = (await verify_batch([job]))[0]
        if isinstance(got, BaseException):
            raise got
        return got

    # -- handlers -----------------------------------------------------------------------------

    async def health(request: Request) -> Response:
        owner = owner_of(request)
        sessions.expire()
        # Least disclosure between tenants (issue 42): with tokens, a token sees its own sessions,
        # and the model by its name, not where it lies on the server's disk.
        model = Path(hosted.model_id).name if tokens and Path(hosted.model_id).is_absolute() else hosted.model_id
        return Response(msgspec.json.encode(wire.Health(
            status="ok", model=model, fingerprint=hosted.fingerprint, tokenizer=hosted.tokenizer,
            vocab=hosted.vocab, dtype=hosted.dtype, device=hosted.device, context=hosted.context, rate=hosted.rate,
            max_seconds=float(hosted.processor.max_seconds), min_samples=hosted.min_samples, protocol=wire.PROTOCOL,
            version=__version__, sessions=sessions.held_by(owner) if tokens else len(sessions),
            max_sessions=options.max_sessions,
            max_sessions_per_token=options.per_token, session_ttl_s=options.session_ttl_s,
            batch_window_ms=options.batch_window_ms if batcher is not None else 0,
            max_batch=options.max_batch if batcher is not None else 1)), media_type=wire.JSON)

    async def metrics_endpoint(request: Request) -> Response:
        owner = owner_of(request)  # (no expire() here: the sweeper ends idle sessions, and /metrics shows it)
        view = owner if tokens else None

        def make() -> Awaitable[bytes]:
            owners = metrics.label_owners()  # (taken on the loop, which changes the table)
            return to_thread.run_sync(metrics.exposition, view, owners)
        return Response(await rendered.get(view, make), media_type=CONTENT_TYPE_LATEST)

    async def openapi_endpoint(request: Request) -> Response:
        owner_of(request)
        return JSONResponse(document)

    def session_id(given: str | None, owner: int) -> str:
        """The id a new session opens under: the client's (so that a session-affine router places
        its first request where the rest follow; the client draws it as we would, 128 random bits),
        claimed at once (Sessions.claim: a rebuild of this token's own, 404 for another token's),
        else one minted here."""
        if given is None:
            return secrets.token_urlsafe(16)  # 128 random bits
        if not SESSION_ID.fullmatch(given):
            raise ApiError(400, "bad_session_id", "a session id a client chooses is 22 to 64 URL-safe base64 "
                                                  "characters (e.g. secrets.token_urlsafe(16))")
        sessions.claim(given, owner)
        return given

    async def new_session(owner: int, clip: wire.Clip, cfg: Any, prompt: list[int], *, prefill: bool,
                          sid: str | None = None) -> CloudSession:
        """A session for `clip`, registered under `sid` (the client's) or a new id. `prefill`: run
        the prompt's prefill now (an eager open); else the cloud only takes the inputs and
        prefills lazily with the first draft (a verification)."""
        sid = session_id(sid, owner)  # the client's id claimed before any await (Sessions.claim)
        try:
            return await opened_session(sid, owner, clip, cfg, prompt, prefill)
        finally:
            sessions.release(sid, owner)  # (a no-op once the session was added)

    async def opened_session(sid: str, owner: int, clip: wire.Clip, cfg: Any, prompt: list[int],
                             prefill: bool) -> CloudSession:
        inputs = await prepared(clip, owner)  # decoding + features: off the event loop, in turns
        sessions.reserve(owner)  # 503 before any model work when the server (or this token's share) is full

        def build() -> CloudSession:
            cloud = LocalCloud(hosted.model)
            if prefill:
                cloud.prefill(inputs)
            else:
                cloud.start(inputs)
            rules = DecodingRules.build(cfg, hosted.masks, len(prompt), hosted.eos_ids)
            return CloudSession(sid, owner, cloud, rules, len(prompt))
        try:
            session = await in_worker(build, owner)
        except asyncio.CancelledError:  # its client has gone: the session is not kept
            metrics.cancelled.labels("session").inc()
            memory.soon()
            raise
        session.length = len(session.cloud)  # (the worker is done with it: read on the loop from now on)
        sessions.add(session)
        metrics.prefilled(sid, owner)  # now (eager) or with its first draft (lazy): one prefill either way
        return session

    async def verify(request: Request) -> Response:
        started = time.perf_counter()
        owner = owner_of(request)
        with in_flight(owner):
            arriving[owner] += 1  # (the batcher's window waits only while one of these could join)
            try:
                req: wire.VerifyRequest = await body_of(request, wire.VerifyRequest, owner)
                return await until_gone(request, "verify", verify_read(request, owner, req, started))
            finally:
                arriving[owner] -= 1
                if not arriving[owner]:
                    del arriving[owner]

    async def verify_read(request: Request, owner: int, req: wire.VerifyRequest, started: float) -> Response:
        # Lengths, then the session, then the ids (issue 55: every id of `pending` was looked at
        # before its length or the session was).
        k = len(req.draft)
        if len(req.pending) + k > hosted.context:
            raise ApiError(400, "too_long", f"{len(req.pending) + k} tokens are over the model's context "
                                            f"({hosted.context})")
        check_ids(req.draft, "the draft")
        if req.sampling is not None and not (len(req.sampling.p_draft) == len(req.sampling.u) == k):
            raise ApiError(400, "bad_request", "sampling needs one p_draft and one u per draft token")
        # (one function, not one per path: a crash's logged traceback stays as short as it was)
        async with contextlib.AsyncExitStack() as turn:
            if req.session is None or req.clip is not None:
                if req.clip is None or req.config is None:
                    raise ApiError(400, "bad_request", "a new session needs the clip and the config")
                cfg = config_of(req.config, "spec")
                prompt = list(req.clip.prompt_ids)
                if len(prompt) + len(req.pending) + k > hosted.context:
                    raise ApiError(400, "too_long", f"{len(prompt) + len(req.pending) + k} tokens are over the "
                                                    f"model's context ({hosted.context})")
                check_ids(req.pending, "pending")
                session = await new_session(owner, req.clip, cfg, prompt, prefill=False, sid=req.session)
                # Its turn taken before anything can await: a verification of it sent before this
                # verdict (protocol 3) waits behind this one instead of reading a cache being filled.
                await session.turn.acquire()  # (a fresh lock: taken at once, no suspension)
                turn.callback(session.turn.release)
                sequence = prompt + list(req.pending)
            else:
                # Protocol 3: one session's verifications run in arrival order, each checked against
                # the session as the ones before it left it (a client may send the next one before
                # this verdict).
                session = await opened_by_now(req.session, owner)
                if req.held > session.length:  # sent ahead, and here before the verdict it assumes
                    await held_back(session, req)
                    session = sessions.get(req.session, owner, queue=True)  # still open, still room
                session.queued += 1
                try:
                    await session.turn.acquire()
                finally:
                    session.queued -= 1
                turn.callback(session.turn.release)
                session = sessions.get(req.session, owner)  # still open (it may have ended meanwhile)
                check_assumption(session, req)
                check_ids(req.pending, "pending")
                sequence_len = len(session.cloud) + len(req.pending)
                if not req.pending and session.cloud.state.last_logits is None:
                    raise ApiError(400, "bad_request", "the session was cut back to a prefix; send the token that "
                                                       "follows it (the recovered one) in pending")
                if sequence_len + k > hosted.context:
                    raise ApiError(400, "too_long", f"{sequence_len + k} tokens are over the model's context "
                                                    f"({hosted.context})")
                sequence = session.cloud.state.ids + list(req.pending)
            session.busy = True
            try:
                verdict = await verify_now(batching.Job(session, sequence, req))
            except ApiError:
                raise
            except asyncio.CancelledError:
                # Its client has gone: nobody will send the next draft; a session it was opening, or
                # one whose state the client will never learn, is not kept.
                session.busy = False
                if sessions.abandon(session.id, owner):
                    metrics.cancelled.labels("session").inc()
                raise
            except Exception:
                # It failed alone too: the session's state is unknown; end it (the client rebuilds).
                session.busy = False
                sessions.close(session.id, owner)
                raise
            finally:
                session.busy = False
                session.last_used = time.monotonic()
            # The token the next verification must start with, where the server drew it (a sampled
            # rejection's token the client draws from the row this answer carries).
            session.owed = verdict.token if verdict.target_row is None and verdict.token >= 0 else None
            # The blocks waiting ahead: one that assumed this verdict comes next; a draft not kept
            # whole breaks every one (each assumed it kept whole, as the client drafts ahead).
            session.wake(len(session.cloud), broke=verdict.accepted < k)
            if verdict.ended:
                sessions.end(session.id)
        metrics.verifications.inc()
        metrics.tokens.inc(verdict.fed + verdict.prefilled)
        metrics.latency.observe(time.perf_counter() - started)
        return answer(request, verdict)

    async def opened_by_now(sid: str, owner: int) -> CloudSession:
        """The session a verification names (Sessions.get); one this token is opening now (the
        verification carrying its clip is being read or decoded) waited for first, as held_back
        waits for a verdict, at most MAX_AHEAD per id and --hold-ahead-ms: the client sends its
        second block before the first one's verdict, and it was refused as an unknown session."""
        if options.hold_ahead_ms > 0 and sessions.opening(sid, owner) and awaiting_open[sid] < MAX_AHEAD:
            awaiting_open[sid] += 1
            metrics.ahead.inc()
            try:
                await wait_until(lambda: not sessions.opening(sid, owner), lambda: sessions.settled,
                                 options.hold_ahead_ms / 1000)
            finally:
                metrics.ahead.dec()
                awaiting_open[sid] -= 1
                if not awaiting_open[sid]:
                    del awaiting_open[sid]
        return sessions.get(sid, owner, queue=True)

    async def held_back(session: CloudSession, req: wire.VerifyRequest) -> None:
        """A verification whose assumed prefix is longer than the session (one sent ahead, on
        another connection than the block before it, that got here first) waits, in no turn and
        holding no lock, until the session reaches that length (then it takes its turn and is
        checked as any other), or can no longer reach it in the chain the block assumes (a verdict
        that did not keep its whole draft, a block in turn refused, the session dropped), or for
        --hold-ahead-ms; then it is checked as it stands: refused, unchanged, as before.

        Why (issue 55, finding 5): such blocks were refused at once, and with perfect drafts at
        depth 4, 21 % (one session) to 59 % (six sessions) of valid blocks came back 409
        out_of_sync, each a round trip and a resend. At most MAX_AHEAD wait per session (more:
        checked at once); a block shorter than the session, a duplicate, is never held."""
        if options.hold_ahead_ms <= 0 or session.ahead >= MAX_AHEAD:
            return
        breaks = session.breaks
        session.ahead += 1
        metrics.ahead.inc()
        try:
            settled = await wait_until(lambda: req.held <= session.length or session.breaks != breaks,
                                       lambda: session.moved, options.hold_ahead_ms / 1000)
        finally:
            session.ahead -= 1
            metrics.ahead.dec()
        metrics.held.labels("late" if not settled else "broke" if req.held > session.length else "in_turn").inc()

    def check_assumption(session: CloudSession, req: wire.VerifyRequest) -> None:
        """409 out_of_sync, before any forward and with the session unchanged, unless the request's
        assumed prefix is the session's verified one: its length, the digest of its answer tokens
        (when the request names one: protocol 3's client always does) and the token the last
        verdict gave at the head of `pending` (where the server drew it). A block in turn refused
        for its tokens breaks the chain the blocks waiting ahead assume (held_back)."""
        held = len(session.cloud)
        unchanged = "nothing was run and the session is unchanged; send it again after the verdicts before it"
        if req.held != held:
            metrics.out_of_sync.inc()
            raise ApiError(409, "out_of_sync", f"the session holds {held} tokens, the client said {req.held}; "
                                               f"{unchanged}, or rebuild the session")
        if req.prefix is None:
            return
        if req.prefix != wire.prefix_digest(session.cloud.state.ids[session.prompt_len:held]):
            metrics.out_of_sync.inc()
            session.wake(broke=True)
            raise ApiError(409, "out_of_sync", f"the session's {held} tokens are not the ones the request assumes "
                                               f"(digest); {unchanged}")
        if session.owed is not None and req.pending[:1] != [session.owed]:
            metrics.out_of_sync.inc()
            session.wake(broke=True)
            raise ApiError(409, "out_of_sync", "the request does not start with the token the last verdict gave; "
                                               f"{unchanged}")

    async def generate(request: Request) -> Response:
        owner = owner_of(request)
        with in_flight(owner):
            req: wire.GenerateRequest = await body_of(request, wire.GenerateRequest, owner)
            gone = threading.Event()  # a generation run alone (HF generate) stops at its next step
            return await until_gone(request, "generate", generate_read(request, owner, req, gone), gone.set)

    async def generate_read(request: Request, owner: int, req: wire.GenerateRequest,
                            gone: threading.Event) -> Response:
        cfg = config_of(req.config, "cloud")
        if len(req.clip.prompt_ids) + cfg.max_new_tokens > hosted.context:
            raise ApiError(400, "too_long", "the prompt plus max_new_tokens are over the model's context")
        pad = req.pad_id
        if pad is not None:
            check_ids([pad], "pad_id")
        inputs = await prepared(req.clip, owner)
        if generator is not None and not cfg.sample:
            # Continuously batched with the other generations (generations.py). The pad id is HF
            # generate's for finished rows of a batch; a batch-1 greedy run never pads.
            result = await generator.submit(inputs, cfg, owner)
        else:
            def run() -> Any:
                from ..decoding.baselines import generate_baseline

                return generate_baseline(hosted.model, inputs, cfg, hosted.masks, hosted.eos_ids, pad, gone.is_set)
            result = await in_worker(run, owner)
        memory.soon()  # its cache is gone
        s = result.stats
        metrics.generations.inc()
        metrics.tokens.inc(s.cloud_prefill_tokens + s.cloud_tokens)
        stats = {"cloud_calls": s.cloud_calls, "cloud_tokens": s.cloud_tokens,
                 "cloud_prefill_tokens": s.cloud_prefill_tokens, "cloud_work_forwards": s.cloud_work_forwards}
        return answer(request, wire.GenerateResponse(result.tokens, stats))

    async def open_session(request: Request) -> Response:
        """A session opened with its prefill run now: the client sends the clip at the start of
        the clip (`--upload eager`) and its first verification carries only ids."""
        owner = owner_of(request)
        with in_flight(owner):
            req: wire.OpenRequest = await body_of(request, wire.OpenRequest, owner)
            return await until_gone(request, "open", open_read(request, owner, req))

    async def open_read(request: Request, owner: int, req: wire.OpenRequest) -> Response:
        cfg = config_of(req.config, "spec")
        prompt = list(req.clip.prompt_ids)
        if len(prompt) + 1 > hosted.context:
            raise ApiError(400, "too_long", f"the prompt's {len(prompt)} tokens leave no room in the model's context")
        session = await new_session(owner, req.clip, cfg, prompt, prefill=True, sid=req.session)
        session.last_used = time.monotonic()
        metrics.tokens.inc(session.cloud.prefill_tokens)
        return answer(request, wire.Opened(session.id, len(session.cloud), session.cloud.prefill_tokens,
                                           session.cloud.all_forwards))

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

    def on_crash(exc: BaseException) -> None:
        metrics.requests.labels("500").inc()
        crashed("a request was answered 500 (a specdec bug)", exc)

    def counted(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        async def wrapped(request: Request) -> Response:
            response = await handler(request)
            metrics.requests.labels(str(response.status_code)).inc()
            return response
        return wrapped

    routes = [
        Route("/health", counted(health), methods=["GET"]),
        Route("/metrics", counted(metrics_endpoint), methods=["GET"]),
        Route("/openapi.json", counted(openapi_endpoint), methods=["GET"]),
        Route("/v1/verify", counted(verify), methods=["POST"]),
        Route("/v1/generate", counted(generate), methods=["POST"]),
        Route("/v1/sessions", counted(open_session), methods=["POST"]),
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
            memory.cancel()

    # CrashGuard inside Starlette's ServerErrorMiddleware: http_errors.py says why.
    stopping = threading.Event()  # set by serve() when a signal stops the server
    def gate_answered(status: int) -> None:
        metrics.requests.labels(str(status)).inc()
    app = Starlette(routes=routes, lifespan=lifespan,
                    middleware=[Middleware(CrashGuard, on_crash=on_crash, stopping=stopping.is_set),
                                Middleware(gate.Gate, identify=identify, pacer=pacer, answered=gate_answered,
                                           paced=metrics.paced.inc)],
                    exception_handlers={ApiError: on_api_error, HTTPException: on_http_error})
    # No redirect from `/v1/sessions/` to `/v1/sessions` (Starlette's default since that route
    # exists): a 307 is neither an answer nor a one-line error, and no client of ours needs it.
    app.router.redirect_slashes = False
    app.state.stopping = stopping
    app.state.sessions = sessions
    app.state.metrics = metrics
    app.state.rendered = rendered
    app.state.owner_of = owner_of     # (a fleet's /health and /metrics show each token its own)
    app.state.tenants = bool(tokens)
    app.state.memory = memory
    return app


# -- running it -------------------------------------------------------------------------------------

def listen(host: str, port: int) -> socket.socket:
    """The listening socket, bound here rather than by uvicorn so that a port in use, an address
    this machine does not have, or `[::1]` (brackets and all) get a one-line answer."""
    address = host.strip("[]")
    try:
        infos = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise InputError(f"cannot listen on {host}: {exc.strerror or exc}") from None
    family, kind, proto, _, where = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(where)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise InputError(f"port {port} on {host} is already in use (another specdec serve?); stop it, "
                             "give another --port, or --port 0 for any free one") from None
        raise InputError(f"cannot listen on {host} port {port}: {exc.strerror or exc}") from None
    return sock


def _configure_logging(level: str = "info") -> None:
    """specdec's own lines and uvicorn's warnings on stderr, each message at most once per 10 s;
    the access log (access_log.py) at `level` (`warning` and above: none)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("specdec serve: %(message)s"))
    ours = logging.getLogger("specdec.serve")
    ours.handlers[:] = [handler]
    ours.propagate = False
    ours.setLevel(max(logging.INFO, logging.getLevelName(level.upper())))
    access_log.configure(level)
    repeats = limits.RepeatFilter()
    ours.addFilter(repeats)
    logging.getLogger("uvicorn.error").addFilter(repeats)


def serve(hosted: Hosted, host: str, port: int, options: ServeOptions,
          announce: Callable[[str], None], sock: socket.socket | None = None, log_level: str = "info") -> None:
    """Run until SIGINT/SIGTERM (uvicorn's own handlers: in-flight requests finish, then exit).
    `sock`: the socket `listen(host, port)` bound already (else it is bound here). `log_level`:
    uvicorn's names; `info` logs a line per request (access_log.py), `warning` only problems."""
    import uvicorn

    check_bind(host, options.tokens)
    sock = sock if sock is not None else listen(host, port)
    fd_limit = limits.raise_fd_limit()
    cap = limits.connection_cap(options.max_connections, fd_limit, limits.open_fds())
    _configure_logging(log_level)
    app = create_app(hosted, options)
    guard = limits.ConnectionGuard(cap, options.header_timeout_s)
    batching_note = (f"verifications batched (up to {options.max_batch}, {options.batch_window_ms:g} ms window)"
                     if options.batch_window_ms > 0 and options.max_batch > 1 else "verifications one at a time")
    fewer = f" (descriptor limit {fd_limit})" if cap < options.max_connections else ""

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

        async def shutdown(self, sockets: Any = None) -> None:
            app.state.stopping.set()
            await super().shutdown(sockets)

        async def startup(self, sockets: Any = None) -> None:
            limits.quiet_accept_errors(asyncio.get_running_loop())
            await super().startup(sockets)
            if self.started:  # the real port, also when --port 0 let the system pick one
                bound = self.servers[0].sockets[0].getsockname()
                shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
                announce(f"specdec serve: listening on http://{shown}:{bound[1]} · cloud {hosted.model_id} "
                         f"(vocab {hosted.vocab}, {hosted.dtype}, {hosted.device}, weights {hosted.fingerprint}) "
                         f"· at most {options.max_sessions} sessions ({options.per_token} per token), idle ones "
                         f"closed after {options.session_ttl_s:g} s · at most {cap} connections{fewer}, "
                         f"{options.requests_per_token} requests in flight and {options.max_waiting_per_token} "
                         f"waiting per token · "
                         f"{batching_note} · {'token required' if options.tokens else 'no token (loopback only)'}")

    # loop="asyncio": the connection guard is asyncio's accept() (limits.GuardedListener); uvloop
    # (which Ray Serve's extra installs) accepts in C and would bypass it.
    config = uvicorn.Config(access_log.AccessLog(app), http=limits.guarded_protocol(guard), loop="asyncio",
                            log_level="warning", access_log=False,
                            timeout_graceful_shutdown=5, h11_max_incomplete_event_size=64 * 1024,
                            timeout_keep_alive=options.keep_alive_timeout_s,
                            limit_concurrency=cap + 1)  # over the cap (every connection busy): uvicorn's 503
    server = _Server(config)
    asyncio.run(server.serve(sockets=[limits.GuardedListener.wrap(sock, guard)]))
