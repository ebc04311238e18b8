"""The edge's side of a remote cloud: `RemoteClient` (one per run: the server's address, its
identity, the HTTP connection) and `RemoteCloud` (one per clip: the loop's `Cloud`, a session on
the server).

The loop asks a RemoteCloud what it asks the in-process LocalCloud — start a clip, verify a
draft, roll back — and never learns that a network is involved. A RemoteCloud sends nothing until
the first verification; then the clip once, with the prompt, the answer so far and the draft;
after that only the tokens the server has not seen and the draft. It owns the sequence of record,
so a session the server lost (evicted, restarted) is rebuilt from the clip and the sequence and
decoding goes on with the same output. Every byte, round trip and second spent waiting is counted
here, at the client (`LinkStats`).

The server is a machine the client does not control. Each request has a total deadline and each
answer a size cap before it is read (exchange.py); each answer is checked against the request and
the server's /health before the loop sees it (answers.py). A failure says which of three things
happened: no connection (CloudUnreachable), no answer in time (CloudTimeout), or an answer specdec
cannot use (CloudAnswerError); it fails that clip, and never becomes a description.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import os
import secrets
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import httpx
import msgspec
import numpy as np
import torch

from .. import __version__
from ..decoding.acceptance import Verdict, recovered_token, sampling_uniforms
from ..decoding.block_length import MAX_DEPTH, PRIOR_ACCEPTANCE, best_depth, parse_depth
from ..decoding.config import DecodingConfig
from ..decoding.drafter import Proposal
from ..decoding.loop import DecodeResult, DecodeStats, Refused
from ..decoding.processors import DecodingRules
from ..decoding.verifier import completed
from ..errors import InputError, SpecdecError
from . import answers, wire
from .exchange import TIMEOUT_ENV, Answer, Exchange, Unusable, cloud_timeout, retry_after

TOKEN_ENV = "SPECDEC_TOKEN"
WAIT_UNSAID_S = 2.0  # a retry window shorter than this is not said while it runs (see _wait_said)
RETRY_ENV = "SPECDEC_CLOUD_RETRY_S"  # how long a request keeps trying a down or full server (default 20)
ERROR_TEXT_CHARS = 300  # of a server's error text quoted in a message
# Requests sent without waiting (a session's close): each bounded in time, and at most this many
# unanswered at once; past that one is not sent (the server's session TTL ends what it would have).
BACKGROUND_S = 5.0
BACKGROUND_MAX = 8
# Statuses a proxy in front of specdec serve answers when it lost its upstream (with a body that is
# not specdec's one-line JSON error): retried like a dropped connection.
UPSTREAM_LOST = (500, 502, 504)
UPLOADS = ("eager", "lazy", "auto")  # --upload: when a clip goes up (RemoteClient.upload)
# --depth: verifications one clip may have in flight (decoding/block_length.py: MAX_DEPTH, 4, the
# server's sessions.MAX_QUEUED; the rule for `auto`).
RECENT_BLOCKS = 64  # --depth auto: the acceptance of this run's last verified blocks
# The link measurement (--depth auto, and k where it is free): each of its GET /health may take
# this long, within the clip's deadline, and is tried once. A failure (an error, a 5xx, no answer
# in time) leaves the run at depth 1 and the preset's k (issue 55: a /health that failed or took
# 40 s failed the clip, or held it far past its deadline).
MEASURE_S = 2.0
# Link counters are added to from every thread a clip's requests run on (several verifications in
# flight): one lock, held for a few additions.
_COUNTING = threading.Lock()

log = logging.getLogger("specdec.client")


def check_url(url: str) -> str:
    """`url` without a trailing slash, or InputError when it cannot name a server."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        port, parts = -1, None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or port == -1:
        raise InputError(f"--cloud {url} is not a server address; give http://HOST:PORT of a `specdec serve`")
    return url.rstrip("/")


# Every way the cloud can fail a clip is one of these classes, and each names its failure in
# `cloud_failure`: the word a record's `fallback` field carries when the edge finishes the clip
# alone (decoding/loop.py reads the attribute; it never imports this module). An exception
# without it (a bug, a bad option) is never taken for a cloud failure.

class CloudUnreachable(SpecdecError):
    """The server cannot be reached (down, wrong address): bad usage for `describe` (exit 2); in a
    batch the clip gets an error record and is retried on resume."""

    exit_code = 2
    cloud_failure = "unreachable"


class CloudError(SpecdecError):
    """The server answered, but not with a result (full for too long, refused the request)."""

    cloud_failure = "refused"


class CloudDropped(CloudError):
    """The server took the connection and closed it without answering, for the whole retry window."""

    cloud_failure = "dropped"
    why = ""  # the last attempt's failure, in a few words


class CloudTimeout(CloudError):
    """The server took the connection but did not answer within the request's deadline."""

    cloud_failure = "timeout"


class CloudDeadline(CloudTimeout):
    """The clip's whole-clip budget for the cloud (--cloud-deadline) ran out before an answer."""

    cloud_failure = "deadline"


class CloudAnswerError(CloudError):
    """The server answered with something specdec cannot use: the clip fails, never decodes on."""

    cloud_failure = "unusable"


@dataclass
class LinkStats:
    """What crossed the link for one clip, counted at the client. Bytes are HTTP/1.1 as sent and
    received: request and status lines, headers and bodies (TCP/IP framing not included)."""
    uplink_bytes: int = 0
    downlink_bytes: int = 0
    round_trips: int = 0
    cloud_wait_s: float = 0.0    # wall time waiting on the cloud (link + queue + its forwards)
    rebuilds: int = 0            # sessions the server had lost and the client rebuilt
    # Protocol 3 (issue 43): what several verifications in flight would cost, counted already with
    # one. `verifications`: /v1/verify requests sent (every attempt); `out_of_sync`: of them, refused
    # because the prefix they assumed was not the session's (409 out_of_sync: no forward run);
    # `discarded_forwards`: cloud forwards in verdicts this clip received and did not use.
    verifications: int = 0
    out_of_sync: int = 0
    discarded_forwards: int = 0

    def as_record(self) -> dict[str, Any]:
        d = asdict(self)
        d["cloud_wait_s"] = round(d["cloud_wait_s"], 6)
        return d


def _request_bytes(request: httpx.Request, body: bytes) -> int:
    line = len(request.method) + 1 + len(request.url.raw_path) + len(" HTTP/1.1\r\n")
    return line + sum(len(k) + len(v) + 4 for k, v in request.headers.raw) + 2 + len(body)


class RemoteClient:
    """A `specdec serve` server, for one run. `retry_s` bounds how long a request keeps trying
    while the server is unreachable (a restart) or full (503); `timeout_s` bounds each attempt in
    all, connect to last byte (default: $SPECDEC_CLOUD_TIMEOUT, else 60 s); `link_delay_s` adds a
    round-trip delay per request, for measuring a slower link on loopback (bench/remote.py).

    Nothing a server sends is trusted: every answer is size-capped before it is read, decoded into
    its type and checked (answers.py); one that fails is a CloudAnswerError for that clip."""

    def __init__(self, url: str, token: str | None = None, retry_s: float | None = None,
                 link_delay_s: float = 0.0, timeout_s: float | None = None) -> None:
        self.url = check_url(url)
        self.token = token if token is not None else (os.environ.get(TOKEN_ENV) or None)
        if retry_s is None:
            try:
                retry_s = float(os.environ.get(RETRY_ENV, "20"))
            except ValueError:
                raise InputError(f"{RETRY_ENV} must be a number of seconds") from None
        self.retry_s, self.link_delay_s = retry_s, link_delay_s
        self.timeout_s = cloud_timeout(timeout_s)
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self.exchange = Exchange(self.url, headers, self.timeout_s)
        self.info: dict[str, Any] = {}
        # After a request gave up on an unreachable server, the next ones try once and report at
        # once (a batch over a dead server must not wait retry_s per clip), until one gets through.
        self._down = False
        self._background: set[concurrent.futures.Future] = set()  # requests sent without waiting
        # Pipelining: a clip's verification runs on one worker thread while the edge drafts ahead
        # (decoding/loop.py); False: each verification blocks the loop, as before issue 28.
        self.pipelined = True
        # Verifications one clip may have in flight (issue 43): 1, the next block drafted while
        # the verdict is out but sent after it; D > 1, sent before the verdicts it assumes
        # (protocol 3), at most D at once. Each runs on a worker thread of its own. "auto": D per
        # clip from this link's round trip, the edge's step, k and the recent acceptance (`depth_for`).
        self._depth: int | str = 1
        self.recent: deque[tuple[int, int]] = deque(maxlen=RECENT_BLOCKS)  # (accepted, drafted) per verdict
        self._worker: ThreadPoolExecutor | None = None
        self._worker_size = 0
        self._block_k: int | None = None  # block_k(), once measured
        self.rtt_s = self.edge_token_s = 0.0
        self.unmeasured: str | None = None  # why the link could not be measured (then never tried again)
        # When a clip goes up: "lazy" at its first verification (a clip the edge keeps sends
        # nothing); "eager" at its start, in the background (`POST /v1/sessions`: the server
        # prefills while the edge drafts); "auto" decides per clip from this run's clips so far
        # (`eager_for`). Lazy is the default: docs/pipelining.md has the measurement.
        self.upload = "lazy"
        self.clips = self.clips_verified = 0
        # The last clips': per escalated clip, its start to its first verification; per clip
        # uploaded, the request that carried the clip, sent to answered.
        self.lead_s: deque[float] = deque(maxlen=32)
        self.upload_s: deque[float] = deque(maxlen=32)
        self._background_lock = threading.Lock()  # done-callbacks run on the exchange's thread
        # Said out loud (issue 52): `on_wait(line)` when a request starts waiting out the retry window
        # (what for, how long) and when the cloud answers again, after a wait or a give-up; None:
        # nothing said. Requests run on worker threads too, so an outage is one per client
        # (`_waiting_since`, from the first wait to the next answer), under a lock.
        self.on_wait: Callable[[str], None] | None = None
        self._waiting_since: float | None = None
        self._wait_lock = threading.Lock()

    # -- identity ---------------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """The server's /health, checked (one quick try: at start-up a down server is an error at
        once). A 5xx that is not specdec's own answer (a proxy in front of a stopped server answers
        502, HAProxy 503), or a connection dropped unanswered, is the cloud being unreachable: the
        run then describes on the edge when it may (issue 55: it was "dropped", exit 1)."""
        try:
            body = self.call("GET", "/health", None, bytes, LinkStats(), cap=answers.HEALTH_CAP, retry_s=0.0,
                             down_on_5xx=True)
        except CloudDropped as exc:
            self._down = True
            raise CloudUnreachable(f"cannot reach the cloud at {self.url} ({exc.why}); start `specdec serve` "
                                   "(behind the proxy) or check --cloud") from None
        self.info = self.check(answers.health, body)
        return self.info

    @property
    def vocab(self) -> int | None:
        return self.info.get("vocab")

    @property
    def model_id(self) -> str:
        return str(self.info.get("model", self.url))

    @property
    def fingerprint(self) -> str:
        return str(self.info.get("fingerprint", ""))

    @property
    def depth(self) -> int | str:
        """Verifications one clip may have in flight: 1..MAX_DEPTH, or "auto" (`depth_for`)."""
        return self._depth

    @depth.setter
    def depth(self, value: int | str) -> None:
        self._depth = parse_depth(value)  # InputError, one line, outside 1..MAX_DEPTH

    def acceptance(self) -> tuple[float, float | None]:
        """Over this run's last verified blocks: the per-token acceptance (PRIOR_ACCEPTANCE before
        any), and the share of blocks whose whole draft was kept (None before any)."""
        with _COUNTING:
            recent = list(self.recent)
        drafted = sum(d for _, d in recent)
        if not drafted:
            return PRIOR_ACCEPTANCE, None
        return sum(a for a, _ in recent) / drafted, sum(a == d for a, d in recent) / len(recent)

    def depth_for(self, edge: Any, k: int, until: float | None = None) -> int:
        """The depth a clip decodes with: the one set, or with "auto" decoding/block_length.py's
        rule from the round trip and the edge's step (measured once per run, as for `block_k`; the
        cloud's forward counts as 0 there too), the clip's k and the share of the last verified
        blocks that came back whole. `until`: the clip's deadline, which the measurement keeps;
        a link that could not be measured decodes at depth 1."""
        if self._depth != "auto":
            return int(self._depth)
        if not self.measure(edge, until):
            return 1
        acceptance, clean = self.acceptance()
        return best_depth(self.rtt_s, self.edge_token_s, k, acceptance, clean)

    def measure(self, edge: Any, until: float | None = None) -> bool:
        """The round trip (median of three GET /health) and the edge's time per token (median of
        five one-token steps of `edge` on a short text prompt), once per run. Each /health is tried
        once, within MEASURE_S and the clip's deadline `until`; False when one fails (`unmeasured`
        says why; the run is not measured again)."""
        if self.edge_token_s > 0:
            return True
        if self.unmeasured is not None:
            return False
        trips = []
        try:
            for _ in range(3):
                started = time.perf_counter()
                limit = time.monotonic() + MEASURE_S
                self.call("GET", "/health", None, bytes, LinkStats(), cap=answers.HEALTH_CAP, retry_s=0.0,
                          until=limit if until is None else min(limit, until), down_on_5xx=True)
                trips.append(time.perf_counter() - started)
        except SpecdecError as exc:  # down, refusing, a proxy's 5xx, too slow: the run goes on unmeasured
            self.unmeasured = exc.message
            log.debug("the link to %s could not be measured (%s): depth 1 and the preset's k", self.url, exc.message)
            return False
        self.rtt_s = sorted(trips)[1]
        self.edge_token_s = edge_token_time(edge)
        return True

    def block_k(self, edge: Any) -> int | None:
        """The block length for this link (decoding/block_length.py), measured once per run: the
        round trip (median of three GET /health), the edge's time per token (median of five
        one-token steps of `edge` on a short text prompt). The cloud's forward is not known here
        and counts as 0 (its share of the wait is the round trip's server time). None when the
        link could not be measured (the caller keeps its preset's k)."""
        if self._block_k is None:
            from ..decoding.block_length import best_k

            if not self.measure(edge):
                return None
            self._block_k = best_k(self.rtt_s, self.edge_token_s)
        return self._block_k

    def close(self) -> None:
        if self._worker is not None:
            self._worker.shutdown(wait=True)  # each request has its deadline: this ends
            self._worker = None
        self.settle()
        self.exchange.close()

    def worker(self) -> ThreadPoolExecutor:
        """The threads verifications run on while the loop drafts ahead: `depth` of them (a clip
        has at most `depth` verifications in flight; the eager upload takes its turn on them too;
        MAX_DEPTH of them with "auto")."""
        size = MAX_DEPTH if self._depth == "auto" else int(self._depth)
        if self._worker is not None and self._worker_size != size:
            self._worker.shutdown(wait=True)  # (the depth was changed between clips)
            self._worker = None
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=size, thread_name_prefix="specdec-verify")
            self._worker_size = size
        return self._worker

    def settle(self, timeout_s: float = BACKGROUND_S) -> None:
        """Wait (at most `timeout_s`) for the requests sent without waiting to be answered."""
        with self._background_lock:
            pending = list(self._background)
        concurrent.futures.wait(pending, timeout=timeout_s)

    def send_later(self, method: str, path: str, link: LinkStats, session: str | None = None) -> bool:
        """Send a request whose answer nobody waits for (a session's close): no round trip is spent
        on it, its bytes up are counted in `link`, a failure is logged, never raised (a closed
        session the server did not hear of ends at its TTL). False when not sent: the server is
        down, or too many such requests are still unanswered."""
        with self._background_lock:
            if self._down or len(self._background) >= BACKGROUND_MAX:
                return False
            request = self.exchange.request(method, path, b"", _session_header(session))
            future = self.exchange.send_later(request, answers.HEALTH_CAP, min(BACKGROUND_S, self.timeout_s))
            self._background.add(future)
        with _COUNTING:
            link.uplink_bytes += _request_bytes(request, b"")
        future.add_done_callback(lambda f: self._answered(f, method, path))
        return True

    def _answered(self, future: concurrent.futures.Future, method: str, path: str) -> None:
        with self._background_lock:
            self._background.discard(future)
        if future.cancelled():
            return
        failure = future.exception()
        if failure is not None:
            why = wire.first_line(failure)
        else:
            answer = future.result()
            if answer.status < 400 or answer.status == 404:  # 404: the session had ended already
                return
            why = f"{answer.status} {_error_text(answer)}"
        # Debug, not warning: a request nobody waits for (closing a session) failing changes no result
        # (the server expires the session), and with no handler set a warning reached the user's
        # stderr as an internal line (issue 44).
        log.debug("%s %s%s (not waited for) failed: %s", method, self.url, path, why)

    # -- requests ---------------------------------------------------------------------------------

    def call(self, method: str, path: str, message: msgspec.Struct | None, kind: type | None,
             link: LinkStats, cap: int | None = None, retry_s: float | None = None, session: str | None = None,
             until: float | None = None, down_on_5xx: bool = False) -> Any:
        """One request, retried while the server is unreachable or full, within `retry_s` (default:
        the client's); every attempt is counted in `link`. `session`: the clip's session id, sent
        in the X-Session-Id header (a session-affine router's key: every request of a clip, the
        first included, reaches the replica that holds or will hold its session). Returns the decoded
        answer (None when `kind` is None, the body when it is `bytes`); `cap`: the most bytes the answer's body may take (default: one
        verdict with its probability row at the vocabulary /health reported). `until`: the clip's
        deadline (time.monotonic()): no attempt outlives it, none starts after it (CloudDeadline).
        `down_on_5xx`: any 5xx is taken for a proxy that lost its server (CloudDropped once retrying
        is over), specdec's own 503 included (a /health is never refused as busy)."""
        body = wire.encode(message) if message is not None else b""
        cap = answers.answer_cap(self.vocab) if cap is None else cap
        retry_s = self.retry_s if retry_s is None else retry_s
        deadline = time.monotonic() + (0.0 if self._down else retry_s)
        if until is not None:
            deadline = min(deadline, until)
        pause = 0.1
        while True:
            budget = self.timeout_s if until is None else min(self.timeout_s, until - time.monotonic())
            if budget <= 0:
                raise self._late()
            headers = {**({"Content-Type": wire.MSGPACK} if body else {}), **_session_header(session)}
            request = self.exchange.request(method, path, body, headers or None)
            started = time.perf_counter()
            if self.link_delay_s:
                time.sleep(self.link_delay_s)
            answer: Answer | None = None
            failure: httpx.TransportError | None = None
            try:
                answer = self.exchange.send(request, cap, budget)
            except httpx.TransportError as exc:  # refused, reset, dropped: the server may be restarting
                failure = exc
            except TimeoutError:
                if budget < self.timeout_s:  # cut short by the clip's deadline, not the request's own
                    raise self._late() from None
                raise CloudTimeout(f"the cloud at {self.url} did not answer within {self.timeout_s:g} s; check that "
                                   f"it is a working `specdec serve`, or allow longer with --cloud-timeout SECONDS "
                                   f"({TIMEOUT_ENV})") from None
            except Unusable as exc:
                raise self._unusable(exc) from None
            finally:
                with _COUNTING:
                    link.cloud_wait_s += time.perf_counter() - started
                    link.round_trips += 1
                    link.uplink_bytes += _request_bytes(request, body)
                    link.verifications += path == "/v1/verify"
            if answer is not None:
                self._down = False
                with _COUNTING:
                    link.downlink_bytes += answer.wire_bytes
                    link.out_of_sync += answer.status == 409 and _error_code(answer) == "out_of_sync"
                upstream_lost = ((answer.status in UPSTREAM_LOST and not _error_code(answer))
                                 or (down_on_5xx and answer.status >= 500))
                if answer.status != 503 and not upstream_lost:  # (a proxy's 5xx is no answer of the cloud's)
                    self._answers_again()
                if answer.status != 503 and not upstream_lost:
                    self._raise_for(answer, path)
                    if kind is None:
                        return None
                    if kind is bytes:
                        return answer.body
                    return self.check(answers.decode, answer.body, kind)
                if upstream_lost:
                    # Not a specdec error (every one of those is one-line JSON with a code): a proxy
                    # in front (Ray Serve's, scale/serve_fleet.py; nginx) lost the replica that was
                    # answering (killed, restarting). Retried like a dropped connection; a session
                    # the replica held is gone, and the retry's answer (unknown_session, or
                    # out_of_sync had it verified) has it rebuilt from the clip.
                    failure = httpx.RemoteProtocolError(f"{answer.status} {_error_text(answer)} from a proxy")
                    answer = None
                    wait = pause
                    pause = min(pause * 2, 2.0)
                else:
                    wait = retry_after(answer.headers.get("retry-after"))
            else:
                wait = pause
                pause = min(pause * 2, 2.0)
            if time.monotonic() + wait > deadline:
                if answer is None:
                    assert failure is not None
                    raise self._failed(failure)
                raise CloudError(f"the cloud at {self.url} stayed full for {retry_s:g} s (503: "
                                 f"{_error_text(answer)}); retry later, or start it with a larger --max-sessions")
            self._wait_said(deadline, "is full (503)" if answer is not None else
                          f"does not answer ({wire.first_line(failure) if failure is not None else 'no answer'})")
            time.sleep(wait)

    def _wait_said(self, deadline: float, why: str) -> None:
        """Said once per outage: the cloud `why`, and how long requests keep trying. A window
        shorter than WAIT_UNSAID_S goes unsaid: no longer than a slow answer, and the error that
        ends it (or nothing, when the cloud answers) is all a user needs."""
        if deadline - time.monotonic() < WAIT_UNSAID_S:
            return
        with self._wait_lock:
            if self._waiting_since is not None:
                return
            self._waiting_since = time.monotonic()
        if self.on_wait is not None:
            left = max(0.0, deadline - time.monotonic())
            self.on_wait(f"the cloud at {self.url} {why}; retrying for up to {left:.0f} s, the clip waiting")

    def _answers_again(self) -> None:
        """Said after an outage that was said: the cloud answers again, and after how long."""
        with self._wait_lock:
            since, self._waiting_since = self._waiting_since, None
        if since is not None and self.on_wait is not None:
            self.on_wait(f"the cloud at {self.url} answers again, after {time.monotonic() - since:.1f} s")

    def _late(self) -> CloudDeadline:
        return CloudDeadline(f"the cloud at {self.url} did not finish the clip within its --cloud-deadline; "
                             "allow longer with --cloud-deadline SECONDS")

    def check(self, fn: Any, *args: Any) -> Any:
        """`fn(*args)` (one of answers.py's checks), its Unusable as this server's CloudAnswerError."""
        try:
            return fn(*args)
        except Unusable as exc:
            raise self._unusable(exc) from None

    def _unusable(self, exc: Unusable) -> CloudAnswerError:
        return CloudAnswerError(f"the cloud at {self.url} sent an answer specdec cannot use ({exc}); check that "
                                f"--cloud names a `specdec serve` of specdec {__version__}")

    def _raise_for(self, answer: Answer, path: str) -> None:
        if 200 <= answer.status < 300:
            return
        if answer.status < 400:  # a redirect's body is not the answer (httpx follows none): never a verdict
            raise self._unusable(Unusable(f"a {answer.status} answer (a redirect, which specdec does not follow)"))
        text, code = _error_text(answer), _error_code(answer)
        if answer.status == 401 and path == "/health":
            # At start-up (the /health check) a refused token is a usage error; later in a run it
            # is the cloud refusing the clip (token revoked, server restarted with other tokens):
            # `refused`, and the edge finishes the clip (docs/serve.md).
            raise InputError(f"the cloud at {self.url} refused the request ({text}); set {TOKEN_ENV} to a "
                             "token from its --token-file")
        if code in ("unknown_session", "out_of_sync"):
            raise SessionLost(text)
        raise CloudError(f"the cloud at {self.url} answered {answer.status}: {text}")

    def _failed(self, exc: httpx.TransportError) -> SpecdecError:
        """The last attempt's failure, once retrying is over: no connection made (unreachable,
        exit 2), or one made and dropped before an answer."""
        why = wire.first_line(exc)
        if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
            self._down = True
            return CloudUnreachable(f"cannot reach the cloud at {self.url} ({why}); start it with "
                                    "`specdec serve --cloud PATH_OR_ID` or check --cloud")
        dropped = CloudDropped(f"the cloud at {self.url} dropped the connection without answering ({why}); "
                               "check its log, or retry")
        dropped.why = why
        return dropped

    # -- per clip ---------------------------------------------------------------------------------

    def clip(self, audio: np.ndarray, cfg: DecodingConfig, until: float | None = None) -> RemoteCloud:
        """The cloud for one clip (a session opened at its start with --upload eager, else at its
        first verification, if any); `until`: the clip's deadline (time.monotonic()), or None."""
        return RemoteCloud(self, audio, cfg, self.eager_for(cfg), until)

    def eager_for(self, cfg: DecodingConfig) -> bool:
        """Whether this clip goes up at its start. "auto": eager only when it pays on this run's
        clips so far — most of them escalated, and the edge reached the first escalation later than
        the request carrying the clip took (upload, features, prefill, round trip), so that an
        eager upload is answered before the first verification needs the session. Otherwise (the
        first clips, a cloud never consulted, a fast edge) lazy: the first verification would
        only wait behind the open."""
        if self.upload != "auto":
            return self.upload == "eager"
        if cfg.verify != "always" and cfg.threshold == float("inf"):
            return False
        if not self.lead_s or not self.upload_s or 2 * self.clips_verified < self.clips:
            return False
        return sum(self.lead_s) / len(self.lead_s) > sum(self.upload_s) / len(self.upload_s)

    def generate(self, audio: np.ndarray, inputs: Mapping[str, torch.Tensor], cfg: DecodingConfig,
                 pad_id: int | None, link: LinkStats | None = None,
                 until: float | None = None) -> tuple[DecodeResult, LinkStats]:
        """Cloud-only: the clip goes up, the description comes back (one round trip). `link`: where
        to count it (a new LinkStats by default); `until`: the clip's deadline, or None."""
        link = LinkStats() if link is None else link
        clip = clip_message(audio, self.info["rate"], inputs)
        answer = self.call("POST", "/v1/generate", wire.GenerateRequest(clip, config_dict(cfg), pad_id),
                           wire.GenerateResponse, link, cap=answers.generate_cap(cfg.max_new_tokens), until=until)
        self.check(answers.generated, answer, self.info["vocab"], cfg.max_new_tokens)
        stats = DecodeStats(tokens=len(answer.tokens))
        for name, value in answer.stats.items():
            if name in ("cloud_calls", "cloud_tokens", "cloud_prefill_tokens", "cloud_work_forwards"):
                setattr(stats, name, int(value))
        return DecodeResult(list(answer.tokens), stats), link


def edge_token_time(model: Any, steps: int = 5) -> float:
    """Seconds one edge decoding step takes (the median of `steps`, after an 8-token text prompt)."""
    from ..decoding.state import ModelState

    state = ModelState(model, "probe")
    ids = torch.arange(100, 108, dtype=torch.long)[None]
    state.prefill({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    times = []
    for i in range(steps):
        started = time.perf_counter()
        state.advance([110 + i])
        times.append(time.perf_counter() - started)
    return sorted(times)[steps // 2]


def _session_header(session: str | None) -> dict[str, str]:
    return {wire.SESSION_HEADER: session} if session else {}


class SessionLost(SpecdecError):
    """The server no longer holds the session as the client knows it: rebuild it."""


def config_dict(cfg: DecodingConfig) -> dict[str, Any]:
    return cfg.as_dict()


def clip_message(audio: np.ndarray, rate: int, inputs: Mapping[str, torch.Tensor]) -> wire.Clip:
    data, codec = wire.encode_audio(audio, rate)
    return wire.Clip(data, codec, int(rate), inputs["input_ids"][0].tolist())


class RemoteCloud:
    """One clip's cloud on a server: the loop's `Cloud` interface (see decoding/loop.py)."""

    MAX_REBUILDS = 3  # per request: a server that loses the session every time is reported

    def __init__(self, client: RemoteClient, audio: np.ndarray, cfg: DecodingConfig, eager: bool = False,
                 until: float | None = None) -> None:
        self.client, self.audio, self.cfg, self.eager = client, audio, cfg, eager
        self.until = until  # the clip's deadline (time.monotonic()): every request of the clip ends by it
        self.link = LinkStats()
        self._opening: Future[None] | None = None  # the eager upload, on the verification thread
        self._opened: tuple[int, int] | None = None  # its (prefilled, all_forwards), counted at the first verdict
        self._verified = False
        self._started = 0.0
        self.session: str | None = None  # the session as the server holds it (None: not open there)
        # The id this clip's session opens under, chosen here (128 random bits, as the server
        # would mint) and sent with every request of the clip, the first included, so that a
        # session-affine router (Ray Serve's, scale/serve_fleet.py) places the session where the
        # rest of the clip's requests will go. A rebuild reopens it under the same id.
        self.session_id = secrets.token_urlsafe(16)
        self.held = 0                 # tokens the server's session holds (prompt included)
        self.prompt_ids: list[int] = []
        self.inputs: Mapping[str, torch.Tensor] | None = None
        self._clip: wire.Clip | None = None  # encoded once, at the first verification
        self.prefill_tokens = self.forwards = self.tokens_fed = self.all_forwards = 0
        # Several verifications in flight (depth > 1): each gets a number in the order it was
        # sent; the session's state (`session`, `held`) is taken from the answer of the latest one
        # answered, whatever order the answers come back in (the server runs them in order).
        self._lock = threading.Lock()
        self._sent = 0
        self._state_n = 0
        self._spent: dict[Future, list[int]] = {}  # a future sent ahead: the forwards its answer spent

    def __len__(self) -> int:
        return self.held

    def start(self, inputs: Mapping[str, torch.Tensor]) -> None:
        """Remember the clip's prompt; nothing leaves the device (lazy), or the clip goes up now in
        the background and the server prefills it while the edge drafts (eager)."""
        self.inputs = inputs
        self.prompt_ids = inputs["input_ids"][0].tolist()
        self.session, self.held = None, 0
        self._started = time.perf_counter()
        if self.eager:
            self._opening = self.client.worker().submit(self._open)

    def _open(self) -> None:
        """The eager upload: open the session with the clip, prefilled. A failure is logged and
        leaves the session unopened: the first verification then opens it lazily, as without."""
        sent = time.perf_counter()
        try:
            opened = self.client.call("POST", "/v1/sessions", wire.OpenRequest(self._clip_message(),
                                                                                config_dict(self.cfg), self.session_id),
                                      wire.Opened, self.link, session=self.session_id, until=self.until)
        except (CloudError, CloudUnreachable, InputError) as exc:
            log.warning("opening a session at %s failed (%s); the clip goes up at its first verification",
                        self.client.url, wire.first_line(exc))
            return
        # Trusted no more than a verdict (issue 33): a bad answer is this server's CloudAnswerError,
        # raised at the clip's first verification (the clip fails, as for a bad verdict).
        self.client.check(answers.opened, opened, len(self.prompt_ids), self.session_id)
        self.session, self.held = opened.session, opened.held
        self._opened = (opened.prefilled, opened.all_forwards)
        self.client.upload_s.append(time.perf_counter() - sent)

    def _clip_message(self) -> wire.Clip:
        if self._clip is None:
            self._clip = clip_message(self.audio, self.client.info["rate"], self.inputs)
        return self._clip

    def prefill(self, inputs: Mapping[str, torch.Tensor]) -> None:
        raise NotImplementedError("a remote cloud starts lazily, at the first verification")

    def verify(self, sequence: list[int], proposal: Proposal, rules: DecodingRules,
               generator: torch.Generator | None, acceptance: Any = None) -> tuple[Verdict, int]:
        return self.submit(sequence, proposal, rules, generator, acceptance).result()

    def submit(self, sequence: list[int], proposal: Proposal, rules: DecodingRules,
               generator: torch.Generator | None, acceptance: Any = None) -> Future[tuple[Verdict, int]]:
        """The verdict on `proposal` as a future: in flight on the client's verification threads
        (`RemoteClient.pipelined`), or done before this returns (the blocking client). The random
        numbers the verdict needs are drawn here, before it returns, in the in-process rule's order.
        It assumes the session as the last verdict answered left it."""
        if acceptance is not None:
            raise NotImplementedError("a custom acceptance rule runs only with an in-process cloud")
        draft, sampling, u_last = self._drawn(proposal, generator)
        work = functools.partial(self._verify, list(sequence), proposal, draft, sampling, u_last, self._number())
        return self.client.worker().submit(work) if self.client.pipelined else completed(work)

    def submit_ahead(self, sequence: list[int], proposal: Proposal, rules: DecodingRules,
                     generator: torch.Generator | None) -> Future[tuple[Verdict, int]]:
        """Sent before the verdict it assumes (decoding/loop.py's `SendsAhead`, protocol 3):
        `sequence` is the previous block's sequence, its whole draft and the edge's guess of its
        bonus token; the request assumes the session holds all of it but the guess, which heads
        `pending` (the token the verdict must have given). The server refuses it unrun unless that
        is so when its turn comes; then the future raises `Refused`, and never rebuilds the
        session (a refusal here is expected, not a lost session)."""
        draft, sampling, u_last = self._drawn(proposal, generator)
        spent = [0]
        future = self.client.worker().submit(functools.partial(
            self._verify, list(sequence), proposal, draft, sampling, u_last, self._number(), True, spent))
        self._spent[future] = spent
        return future

    def discard(self, future: Future[tuple[Verdict, int]]) -> None:
        """A verification sent ahead whose block the loop discarded: waited for (its request has
        its deadline), and its forwards counted as discarded were it run (protocol 3 refuses every
        one whose assumed prefix broke, before any forward: 0)."""
        spent = self._spent.pop(future, [0])
        try:
            future.result()
        except Exception:  # refused, or failed: either way its block was not used
            return
        with _COUNTING:
            self.link.discarded_forwards += spent[0]

    def _number(self) -> int:
        """The next verification's number, in the order the loop sends them."""
        self._sent += 1
        return self._sent

    def _drawn(self, proposal: Proposal, generator: torch.Generator | None) -> tuple[list[int], wire.Sampling | None,
                                                                                    float]:
        """The draft, and the random numbers its verdict needs, drawn now."""
        draft = list(proposal.tokens)
        sampling, u_last = None, 0.0
        if generator is not None:
            # The in-process rule's random numbers, drawn here in the same order: the server
            # decides with them, so the output equals the in-process run's for the same seed.
            u, u_last = sampling_uniforms(len(draft), generator)
            p_draft = [float(proposal.draft_probs[j, t]) for j, t in enumerate(draft)]
            sampling = wire.Sampling(p_draft, u, u_last)
        if not self._verified:
            self.client.lead_s.append(time.perf_counter() - self._started)
            self._verified = True
        return draft, sampling, u_last

    def _verify(self, sequence: list[int], proposal: Proposal, draft: list[int], sampling: wire.Sampling | None,
                u_last: float, number: int, ahead: bool = False, spent: list[int] | None = None) -> tuple[Verdict, int]:
        """One verification's round trip (several if the session must be rebuilt), its answer
        checked and counted. `ahead`: sent before the verdict it assumes (`submit_ahead`)."""
        with self._lock:
            opening, self._opening = self._opening, None
        if opening is not None:  # the eager upload first (already done on a verification thread)
            opening.result()  # a bad answer to it fails the clip here, once
        rebuild = False
        for _ in range(self.MAX_REBUILDS + 1):
            request = self._request(sequence, draft, sampling, ahead and not rebuild, rebuild)
            sent = time.perf_counter()
            try:
                answer = self.client.call("POST", "/v1/verify", request, wire.VerifyResponse, self.link,
                                          session=self.session_id, until=self.until)
                if request.clip is not None:
                    self.client.upload_s.append(time.perf_counter() - sent)
                break
            except SessionLost:
                if ahead:
                    # Unrun (out of sync, or the session not open yet): the loop sends it again in
                    # turn if its assumption held, with these very random numbers.
                    def resend() -> Future[tuple[Verdict, int]]:
                        return self.client.worker().submit(functools.partial(
                            self._verify, sequence, proposal, draft, sampling, u_last, self._number()))
                    raise Refused(resend) from None
                # Evicted, expired or the server restarted: open it again from what we hold.
                rebuild = True
                with self._lock:
                    self.session, self.held = None, 0
                    self._state_n = max(self._state_n, number)
                with _COUNTING:
                    self.link.rebuilds += 1
        else:
            raise CloudError(f"the cloud at {self.client.url} lost this clip's session {self.MAX_REBUILDS + 1} "
                             "times in a row; is it restarting in a loop?")
        vocab = int(self.client.info["vocab"])
        self.client.check(answers.verdict, answer, request, len(sequence), len(self.prompt_ids), vocab)
        target_row = None if answer.target_row is None else self.client.check(answers.target_row,
                                                                                 answer.target_row, vocab)
        with self._lock:
            if number >= self._state_n:  # the latest verdict answered: the session as it stands
                # A verdict that ends the clip closed the session on the server: nothing left to close.
                self.session, self.held = (None if answer.ended else answer.session), answer.held
                self._state_n = number
            if self._opened is not None and not ahead:  # the eager prefill, with the clip's first verdict
                self.prefill_tokens += self._opened[0]
                self.all_forwards += self._opened[1]
                self._opened = None
            self.prefill_tokens += answer.prefilled
            self.tokens_fed += answer.fed
            self.forwards += answer.forwards
            self.all_forwards += answer.all_forwards
        if spent is not None:
            spent[0] = answer.forwards
        with _COUNTING:
            self.client.recent.append((answer.accepted, len(draft)))
        token = answer.token
        if target_row is not None:
            # Rejected while sampling: the residual needs the drafter's row, which is here.
            token = recovered_token(torch.from_numpy(target_row), proposal.draft_probs[answer.accepted], u_last)
        return Verdict(answer.accepted, token, answer.kind), answer.fed

    def _request(self, sequence: list[int], draft: list[int], sampling: wire.Sampling | None, ahead: bool = False,
                 rebuild: bool = False) -> wire.VerifyRequest:
        with self._lock:
            session, held = self.session, self.held
        if ahead:
            # Sent before the verdict it assumes: the session will hold all of `sequence` but its
            # last token (the guess of that verdict's bonus), under the id this clip chose.
            session, held = self.session_id, len(sequence) - 1
        if session is None or rebuild:
            p = len(self.prompt_ids)
            assert sequence[:p] == self.prompt_ids, "the sequence must start with the clip's prompt"
            return wire.VerifyRequest(draft, session=self.session_id, clip=self._clip_message(),
                                      config=config_dict(self.cfg), pending=sequence[p:], sampling=sampling)
        # Protocol 3: the prefix this verification assumes the session holds, by length and digest
        # (the server refuses it, unchanged, if the session holds anything else). Whatever `held`
        # is, the server verifies the draft after exactly `sequence` or runs nothing: a wrong guess
        # of the session's state costs a refusal (or a rebuild), never a token.
        prefix = wire.prefix_digest(sequence[len(self.prompt_ids):held])
        return wire.VerifyRequest(draft, session=session, held=held, pending=sequence[held:],
                                  sampling=sampling, prefix=prefix)

    def rollback(self, length: int) -> None:
        # The server cut its cache to the verdict's prefix in the same request (its answer's `held`
        # is that length, answers.verdict checks it); nothing to send. `held` is not cut here:
        # with several verifications in flight a later verdict may have moved it on already.
        pass

    def close(self) -> None:
        """End the session on the server (the clip is done), without waiting for the answer: the
        description is complete, and a close the server misses ends at its session TTL. A session
        the last verdict ended, or one lost, needs no closing. An eager upload still in flight (a
        clip that never escalated) is waited for first, so that its session is closed and the
        clip's link counts are complete: eager's price on a clip the edge kept."""
        self.client.clips += 1
        self.client.clips_verified += self._verified
        if self._opening is not None:
            try:  # bounded by the request deadline; _open logs its failures, and raises only for a bad answer
                self._opening.result()
            except CloudAnswerError as exc:  # the clip never verified: its description stands
                log.warning("%s", wire.first_line(exc))
            self._opening = None
        if self.session is None:
            return
        sid, self.session = self.session, None
        # Escaped although answers.py admits only URL-safe ids: an id never reaches a URL as sent.
        self.client.send_later("DELETE", f"/v1/sessions/{urllib.parse.quote(sid, safe='')}", self.link,
                               session=self.session_id)


def _error_body(answer: Answer) -> dict[str, Any]:
    try:
        body = msgspec.json.decode(answer.body)
    except msgspec.DecodeError:
        return {}
    return body if isinstance(body, dict) else {}


def _error_text(answer: Answer) -> str:
    """The server's one-line error (cut short; its control characters are escaped where every
    message is, errors.SpecdecError), else the status's reason."""
    text = str(_error_body(answer).get("error", answer.reason) or answer.reason)
    return text if len(text) <= ERROR_TEXT_CHARS else text[:ERROR_TEXT_CHARS] + "…"


def _error_code(answer: Answer) -> str:
    return str(_error_body(answer).get("code", ""))[:64]
