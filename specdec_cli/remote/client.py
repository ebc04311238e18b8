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
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import httpx
import msgspec
import numpy as np
import torch

from ..decoding.acceptance import Verdict, recovered_token, sampling_uniforms
from ..decoding.config import DecodingConfig
from ..decoding.drafter import Proposal
from ..decoding.loop import DecodeResult, DecodeStats
from ..decoding.processors import DecodingRules
from ..errors import InputError, SpecdecError
from . import wire

TOKEN_ENV = "SPECDEC_TOKEN"
RETRY_ENV = "SPECDEC_CLOUD_RETRY_S"  # how long a request keeps trying a down or full server (default 20)


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


class CloudUnreachable(SpecdecError):
    """The server cannot be reached (down, wrong address): bad usage for `describe` (exit 2); in a
    batch the clip gets an error record and is retried on resume."""

    exit_code = 2


class CloudError(SpecdecError):
    """The server answered, but not with a result (full for too long, refused the request)."""


@dataclass
class LinkStats:
    """What crossed the link for one clip, counted at the client. Bytes are HTTP/1.1 as sent and
    received: request and status lines, headers and bodies (TCP/IP framing not included)."""
    uplink_bytes: int = 0
    downlink_bytes: int = 0
    round_trips: int = 0
    cloud_wait_s: float = 0.0    # wall time waiting on the cloud (link + queue + its forwards)
    rebuilds: int = 0            # sessions the server had lost and the client rebuilt

    def as_record(self) -> dict[str, Any]:
        d = asdict(self)
        d["cloud_wait_s"] = round(d["cloud_wait_s"], 6)
        return d


def _request_bytes(request: httpx.Request, body: bytes) -> int:
    line = len(request.method) + 1 + len(request.url.raw_path) + len(" HTTP/1.1\r\n")
    return line + sum(len(k) + len(v) + 4 for k, v in request.headers.raw) + 2 + len(body)


def _response_bytes(response: httpx.Response) -> int:
    line = len(f"HTTP/1.1 {response.status_code} {response.reason_phrase}\r\n")
    return line + sum(len(k) + len(v) + 4 for k, v in response.headers.raw) + 2 + len(response.content)


class RemoteClient:
    """A `specdec serve` server, for one run. `retry_s` bounds how long a request keeps trying
    while the server is unreachable (a restart) or full (503); `link_delay_s` adds a round-trip
    delay per request, for measuring a slower link on loopback (bench/remote.py)."""

    def __init__(self, url: str, token: str | None = None, retry_s: float | None = None,
                 link_delay_s: float = 0.0, timeout_s: float = 300.0) -> None:
        self.url = check_url(url)
        self.token = token if token is not None else (os.environ.get(TOKEN_ENV) or None)
        if retry_s is None:
            try:
                retry_s = float(os.environ.get(RETRY_ENV, "20"))
            except ValueError:
                raise InputError(f"{RETRY_ENV} must be a number of seconds") from None
        self.retry_s, self.link_delay_s = retry_s, link_delay_s
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)
        self.info: dict[str, Any] = {}
        # After a request gave up on an unreachable server, the next ones try once and report at
        # once (a batch over a dead server must not wait retry_s per clip), until one gets through.
        self._down = False

    # -- identity ---------------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """The server's /health (one quick try: at start-up a down server is an error at once)."""
        try:
            response = self.http.get("/health", timeout=10.0)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        self._raise_for(response)
        self.info = response.json()
        return self.info

    @property
    def model_id(self) -> str:
        return str(self.info.get("model", self.url))

    @property
    def fingerprint(self) -> str:
        return str(self.info.get("fingerprint", ""))

    def close(self) -> None:
        self.http.close()

    # -- requests ---------------------------------------------------------------------------------

    def call(self, method: str, path: str, message: msgspec.Struct | None, kind: type | None,
             link: LinkStats) -> Any:
        """One request, retried while the server is unreachable or full, within `retry_s`; every
        attempt is counted in `link`. Returns the decoded answer (None when `kind` is None)."""
        body = wire.encode(message) if message is not None else b""
        deadline = time.monotonic() + (0.0 if self._down else self.retry_s)
        pause = 0.1
        while True:
            request = self.http.build_request(method, path, content=body or None,
                                              headers={"Content-Type": wire.MSGPACK} if body else None)
            started = time.perf_counter()
            if self.link_delay_s:
                time.sleep(self.link_delay_s)
            try:
                response = self.http.send(request)
                failure: Exception | None = None
            except httpx.TransportError as exc:  # refused, reset, timed out: the server may be restarting
                response, failure = None, exc
            link.cloud_wait_s += time.perf_counter() - started
            link.round_trips += 1
            link.uplink_bytes += _request_bytes(request, body)
            if response is not None:
                self._down = False
                link.downlink_bytes += _response_bytes(response)
                if response.status_code != 503:
                    self._raise_for(response)
                    return msgspec.msgpack.decode(response.content, type=kind) if kind is not None else None
                wait = min(float(response.headers.get("retry-after", "1") or 1), 5.0)
            else:
                wait = pause
                pause = min(pause * 2, 2.0)
            if time.monotonic() + wait > deadline:
                if response is None:
                    self._down = True
                    raise self._unreachable(failure)
                raise CloudError(f"the cloud at {self.url} stayed full for {self.retry_s:g} s (503: "
                                 f"{_error_text(response)}); retry later, or start it with a larger --max-sessions")
            time.sleep(wait)

    def _raise_for(self, response: httpx.Response) -> None:
        if response.status_code < 400:
            return
        text, code = _error_text(response), _error_code(response)
        if response.status_code == 401:
            raise InputError(f"the cloud at {self.url} refused the request ({text}); set {TOKEN_ENV} to a "
                             "token from its --token-file")
        if code in ("unknown_session", "out_of_sync"):
            raise SessionLost(text)
        raise CloudError(f"the cloud at {self.url} answered {response.status_code}: {text}")

    def _unreachable(self, exc: BaseException | None) -> CloudUnreachable:
        why = wire.first_line(exc) if exc is not None else "no answer"
        return CloudUnreachable(f"cannot reach the cloud at {self.url} ({why}); start it with "
                                "`specdec serve --cloud PATH_OR_ID` or check --cloud")

    # -- per clip ---------------------------------------------------------------------------------

    def clip(self, audio: np.ndarray, cfg: DecodingConfig) -> RemoteCloud:
        """The cloud for one clip (a session opened at its first verification, if any)."""
        return RemoteCloud(self, audio, cfg)

    def generate(self, audio: np.ndarray, inputs: Mapping[str, torch.Tensor], cfg: DecodingConfig,
                 pad_id: int | None) -> tuple[DecodeResult, LinkStats]:
        """Cloud-only: the clip goes up, the description comes back (one round trip)."""
        link = LinkStats()
        clip = clip_message(audio, self.info["rate"], inputs)
        answer = self.call("POST", "/v1/generate", wire.GenerateRequest(clip, config_dict(cfg), pad_id),
                           wire.GenerateResponse, link)
        stats = DecodeStats(tokens=len(answer.tokens))
        for name, value in answer.stats.items():
            if name in ("cloud_calls", "cloud_tokens", "cloud_prefill_tokens", "cloud_work_forwards"):
                setattr(stats, name, int(value))
        return DecodeResult(list(answer.tokens), stats), link


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

    def __init__(self, client: RemoteClient, audio: np.ndarray, cfg: DecodingConfig) -> None:
        self.client, self.audio, self.cfg = client, audio, cfg
        self.link = LinkStats()
        self.session: str | None = None
        self.held = 0                 # tokens the server's session holds (prompt included)
        self.prompt_ids: list[int] = []
        self.inputs: Mapping[str, torch.Tensor] | None = None
        self._clip: wire.Clip | None = None  # encoded once, at the first verification
        self.prefill_tokens = self.forwards = self.tokens_fed = self.all_forwards = 0

    def __len__(self) -> int:
        return self.held

    def start(self, inputs: Mapping[str, torch.Tensor]) -> None:
        """Remember the clip's prompt; nothing leaves the device."""
        self.inputs = inputs
        self.prompt_ids = inputs["input_ids"][0].tolist()
        self.session, self.held = None, 0

    def prefill(self, inputs: Mapping[str, torch.Tensor]) -> None:
        raise NotImplementedError("a remote cloud starts lazily, at the first verification")

    def verify(self, sequence: list[int], proposal: Proposal, rules: DecodingRules,
               generator: torch.Generator | None, acceptance: Any = None) -> tuple[Verdict, int]:
        if acceptance is not None:
            raise NotImplementedError("a custom acceptance rule runs only with an in-process cloud")
        draft = list(proposal.tokens)
        sampling, u_last = None, 0.0
        if generator is not None:
            # The in-process rule's random numbers, drawn here in the same order: the server
            # decides with them, so the output equals the in-process run's for the same seed.
            u, u_last = sampling_uniforms(len(draft), generator)
            p_draft = [float(proposal.draft_probs[j, t]) for j, t in enumerate(draft)]
            sampling = wire.Sampling(p_draft, u, u_last)
        for _ in range(self.MAX_REBUILDS + 1):
            try:
                answer = self.client.call("POST", "/v1/verify", self._request(sequence, draft, sampling),
                                          wire.VerifyResponse, self.link)
                break
            except SessionLost:
                # Evicted, expired or the server restarted: open it again from what we hold.
                self.session, self.held = None, 0
                self.link.rebuilds += 1
        else:
            raise CloudError(f"the cloud at {self.client.url} lost this clip's session {self.MAX_REBUILDS + 1} "
                             "times in a row; is it restarting in a loop?")
        # A verdict that ends the clip closed the session on the server: nothing left to close.
        self.session, self.held = (None if answer.ended else answer.session), answer.held
        self.prefill_tokens += answer.prefilled
        self.tokens_fed += answer.fed
        self.forwards += answer.forwards
        self.all_forwards += answer.all_forwards
        token = answer.token
        if answer.target_row is not None:
            # Rejected while sampling: the residual needs the drafter's row, which is here.
            target = torch.from_numpy(wire.dense_row(answer.target_row))
            token = recovered_token(target, proposal.draft_probs[answer.accepted], u_last)
        return Verdict(answer.accepted, token, answer.kind), answer.fed

    def _request(self, sequence: list[int], draft: list[int], sampling: wire.Sampling | None) -> wire.VerifyRequest:
        if self.session is None:
            if self._clip is None:
                self._clip = clip_message(self.audio, self.client.info["rate"], self.inputs)
            p = len(self.prompt_ids)
            assert sequence[:p] == self.prompt_ids, "the sequence must start with the clip's prompt"
            return wire.VerifyRequest(draft, clip=self._clip, config=config_dict(self.cfg),
                                      pending=sequence[p:], sampling=sampling)
        return wire.VerifyRequest(draft, session=self.session, held=self.held, pending=sequence[self.held:],
                                  sampling=sampling)

    def rollback(self, length: int) -> None:
        # The server cut its cache to the verdict's prefix in the same request; nothing to send.
        self.held = min(self.held, length)

    def close(self) -> None:
        """End the session on the server (the clip is done). A lost session needs no closing."""
        if self.session is None:
            return
        sid, self.session = self.session, None
        try:
            self.client.call("DELETE", f"/v1/sessions/{sid}", None, None, self.link)
        except (CloudUnreachable, CloudError, SessionLost):
            pass  # the server's TTL ends it; the description is already complete


def _error_text(response: httpx.Response) -> str:
    try:
        return str(response.json().get("error", response.reason_phrase))
    except (ValueError, AttributeError):
        return response.reason_phrase


def _error_code(response: httpx.Response) -> str:
    try:
        return str(response.json().get("code", ""))
    except (ValueError, AttributeError):
        return ""
