"""Does one token's abandoned or flooding work cost another token? (issue 33)

    python bench/server_fairness.py abandon|flood|slow|lazy|race|refused|metrics|ahead [--json] [--server-path DIR]
        [options] [-- SERVE FLAGS…]

A real server process (`specdec --threads 1 serve --port 0`, the bundled demo cloud, two tokens A
and B, plus any flags after `--`). `--server-path DIR` runs the server from another checkout's
`specdec_cli` (PYTHONPATH=DIR), so the same run measures the code before a change.

abandon: B's small cloud-only generate (`--small-seconds` clip, `--small-tokens` new tokens) is
timed alone (median of 3) and the server's RSS read. Then A sends `--count` cloud-only generates of
`--seconds` clips (each distinct, `--max-new-tokens`), all at once, one connection each, and closes
each connection `--abandon-after` s after sending it. Right after the last is closed, B's generate
is timed again, and the RSS is read when it is answered and `--settle` s later (VmHWM: the peak).
Issue 33's target: B within 3x its unloaded time + 2 s, RSS within 400 MB of where it was.

flood: B opens a session on a short clip and times `--verifies` verifications in it, one after the
other (median: unloaded). Then A sends `--count` eager opens (`POST /v1/sessions`) of `--seconds`
clips all at once while B keeps verifying (until every open of A is answered; at most
`--max-loaded` verifications). Target: B's median within 3x unloaded. A's answers are counted by
status (a bounded server answers some 503).

slow: under a descriptor limit of `--nofile`, A opens `--count` connections that send a verify's
head with a large Content-Length and then drip one body byte every 0.5 s; one second in, B tries
`--tries` first verifications (short clip), one after the other. Reported: B's statuses.

lazy (issue 42): B opens sessions on a `--small-seconds` clip and verifies in them, one request
after the other (a new session when one ends); its answers are counted over `--window` s alone.
Then A sends opens of `--seconds` clips from `--count` connections, each connection one open after
the other: lazy ones by default (`POST /v1/verify` carrying the clip: the default client's
`--upload lazy`), eager ones (`POST /v1/sessions`) with `--a-open eager`. After `--ramp` s, B's
answers are counted over `--window` s again. Target: B keeps at least a third of its unloaded
count (`b_loaded_over_unloaded` >= 0.33). A's answers are counted by status.

race (issue 42, finding 3): in `--trials` trials, tokens A and B open the same fresh session id at
the same moment (both lazy opens of a `--seconds` clip, or eager ones with `--a-open eager`, whose
prefill keeps the old server's window between check and add open; released together by a barrier). Counted:
the trials in which both got 200 (the later open replaced the other's session; target 0), and each
answer's status.

refused (issue 55, finding 1): B's answers are counted over `--window` s alone, as in lazy. Then
A sends requests the server refuses, as fast as it can, from `--count` raw connections (each one
request, then its answer, then the next; `--pipeline N`: N requests sent before their answers are
read), the kind by `--refused`: `unknown` (a verify with `--ids` ids in `pending` to a session that
does not exist: 404, or 400 once the schema bounds the list), `own` (a verify in A's own session
with `--ids` ids in pending and a wrong `held`: 409 out_of_sync), `generate` (a cloud-only request
with `--ids` prompt ids: too long), `json` (`unknown` as JSON), `tiny` (a verify of a few bytes to
an unknown session), `anon` (GET /health without a token: 401), `route` (GET of a path that does
not exist). After `--ramp` s, B's answers are counted over `--window` s again. Target (issue 55):
B keeps at least a third (`b_loaded_over_unloaded` >= 0.33). Reported too: A's answers by status,
and the CPU seconds the server process spent in each window.

metrics (issue 55, finding 2): the server starts with `--series` per-session series of A's in
/metrics (made in the server process before it starts, as that many sessions opened and closed
would leave them: opening them would take minutes here), then A polls /metrics from `--count`
connections as fast as it can while B's answers are counted, as in refused.

ahead (issue 55, finding 5): `--sessions` sessions of A at once, each decoding a `--small-seconds`
clip (`--rounds` clips one after the other: the demo cloud's answers are short) with perfect drafts (the in-process cloud-only answer, `--k` tokens a block) at `--depth`
verifications in flight: block i+1 sent before block i's verdict, each on the connection of one of
`--depth` threads (as the client does), a block refused as out of sync sent again once the blocks
before it are answered (`--lazy-open`: the block opening the session too, as the client's lazy
upload sends it, and a block refused as an unknown session, its session still being opened, sent
again the same way). Counted: the blocks, the requests sent and the 409 out_of_sync answers
among them (the waste: each a round trip and a resend; the issue measured 21 % of the blocks with
one session, 59 % with six), and the server's `specdec_verifications_held` by how each wait ended.

Each run prints the load averages (the machine is shared: judge figures with them).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import httpx  # noqa: E402
import msgspec  # noqa: E402
import numpy as np  # noqa: E402

from specdec_cli.audio import load_audio  # noqa: E402
from specdec_cli.decoding import DecodingConfig  # noqa: E402
from specdec_cli.models import load_pair  # noqa: E402
from specdec_cli.remote import wire  # noqa: E402
from specdec_cli.remote.local_server import LocalServer as Server  # noqa: E402

TOKENS = ["tenant-a-" + "a" * 24, "tenant-b-" + "b" * 24]
MP = {"Content-Type": wire.MSGPACK}


def auth(i: int) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[i]}", **MP}


class Clips:
    """Distinct clips of any length: the samples end to end, each a different circular shift."""

    def __init__(self) -> None:
        self.pair = load_pair()
        self.joined = np.concatenate([load_audio(p, 16000, 30.0) for p in sorted((REPO / "samples").glob("*.wav"))])
        self._prompts: dict[int, list[int]] = {}

    def audio(self, seconds: float, shift: int = 0) -> np.ndarray:
        return np.roll(np.resize(self.joined, int(seconds * 16000)), shift * 977).astype(np.float32)

    def clip(self, seconds: float, shift: int = 0) -> wire.Clip:
        n = int(seconds * 16000)
        audio = self.audio(seconds, shift)
        if n not in self._prompts:  # the same length, the same prompt
            self._prompts[n] = self.pair.processor(audio)["input_ids"][0].tolist()
        data, codec = wire.encode_audio(audio, 16000)
        return wire.Clip(data, codec, 16000, self._prompts[n])


def settings(**changes: object) -> wire.DecodingSettings:
    return msgspec.convert({**DecodingConfig().as_dict(), **changes}, wire.DecodingSettings)


def raw_post(port: int, path: str, token: int, body: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKENS[token]}\r\n"
            f"Content-Type: {wire.MSGPACK}\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    sock.sendall(head + body)
    return sock


def counters(client: httpx.Client) -> dict[str, float]:
    """The server's counters of abandoned and cancelled work and of answers by status."""
    from prometheus_client.parser import text_string_to_metric_families

    text = client.get("/metrics", headers=auth(0)).text
    return {f"{s.name}{{{','.join(f'{k}={v}' for k, v in s.labels.items())}}}": s.value
            for f in text_string_to_metric_families(text) for s in f.samples
            if s.name.startswith(("specdec_abandoned", "specdec_cancelled", "specdec_requests_total"))
            and not s.name.endswith("_created")}


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def rss_mb(server: Server, field: str = "VmRSS") -> float:
    return round(server.rss_kb(field) / 1024, 1)


def run_abandon(args: argparse.Namespace, server: Server, clips: Clips, out: dict) -> None:
    small = wire.encode(wire.GenerateRequest(clips.clip(args.small_seconds), settings(max_new_tokens=args.small_tokens)))
    big_cfg = settings(max_new_tokens=args.max_new_tokens)
    bodies = [wire.encode(wire.GenerateRequest(clips.clip(args.seconds, i + 1), big_cfg)) for i in range(args.count)]
    client = httpx.Client(base_url=server.url, timeout=args.limit)

    def small_once() -> float:
        t0 = time.perf_counter()
        r = client.post("/v1/generate", content=small, headers=auth(1))
        assert r.status_code == 200, r.text
        return time.perf_counter() - t0
    small_once()  # warm-up
    out["unloaded_s"] = round(statistics.median(small_once() for _ in range(3)), 3)
    out["rss_before_mb"] = rss_mb(server)

    def abandon(i: int) -> None:
        try:
            sock = raw_post(server.port, "/v1/generate", 0, bodies[i])
            time.sleep(args.abandon_after)
            sock.close()
        except OSError as exc:
            out.setdefault("abandon_errors", []).append(str(exc))
    threads = [threading.Thread(target=abandon, args=(i,)) for i in range(args.count)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out["abandon_send_s"] = round(time.perf_counter() - t0, 2)
    out["loaded_s"] = round(small_once(), 3)
    out["rss_after_mb"] = rss_mb(server)
    time.sleep(args.settle)
    out["rss_settled_mb"] = rss_mb(server)
    out["hwm_mb"] = rss_mb(server, "VmHWM")
    out["loaded_over_unloaded"] = round(out["loaded_s"] / out["unloaded_s"], 1)
    out["target_s"] = round(3 * out["unloaded_s"] + 2, 3)
    out["rss_growth_mb"] = round(out["rss_after_mb"] - out["rss_before_mb"], 1)
    out["metrics"] = counters(client)
    client.close()


class Verifier:
    """B's session: verifications one after the other, each timed; a new session when one ends."""

    def __init__(self, server: Server, clip: wire.Clip) -> None:
        self.client = httpx.Client(base_url=server.url, timeout=120)
        self.clip, self.session, self.held, self.token = clip, None, 0, 0
        self.cfg = settings(max_new_tokens=wire.MAX_NEW_TOKENS)

    def once(self) -> tuple[float, int]:
        if self.session is None:
            req = wire.VerifyRequest([5, 6, 7, 8], clip=self.clip, config=self.cfg)
        else:
            req = wire.VerifyRequest([5, 6, 7, 8], session=self.session, held=self.held, pending=[self.token])
        t0 = time.perf_counter()
        r = self.client.post("/v1/verify", content=wire.encode(req), headers=auth(1))
        took = time.perf_counter() - t0
        if r.status_code != 200:
            self.session = None
            return took, r.status_code
        answer = msgspec.msgpack.decode(r.content)
        opened = self.session is None
        self.session, self.held, self.token = answer["session"], answer["held"], answer["token"]
        if answer["ended"] or answer["token"] < 0:
            self.session = None
        return took, (0 if opened else 200)  # 0: a first verification (its prefill): not timed


def run_flood(args: argparse.Namespace, server: Server, clips: Clips, out: dict) -> None:
    b = Verifier(server, clips.clip(args.small_seconds))
    cfg = settings()
    bodies = [wire.encode(wire.OpenRequest(clips.clip(args.seconds, i + 1), cfg)) for i in range(args.count)]
    times = [t for t, s in (b.once() for _ in range(args.verifies + 1)) if s == 200]
    out["unloaded_median_s"] = round(statistics.median(times), 4)
    statuses: dict[str, int] = {}
    lock = threading.Lock()

    def open_one(i: int) -> None:
        try:
            r = httpx.post(f"{server.url}/v1/sessions", content=bodies[i], headers=auth(0), timeout=args.limit)
            key = str(r.status_code)
        except httpx.HTTPError as exc:
            key = type(exc).__name__
        with lock:
            statuses[key] = statuses.get(key, 0) + 1
    threads = [threading.Thread(target=open_one, args=(i,)) for i in range(args.count)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    loaded, b_status = [], {}
    while any(t.is_alive() for t in threads) and len(loaded) < args.max_loaded:
        took, status = b.once()
        b_status[str(status)] = b_status.get(str(status), 0) + 1
        if status == 200:
            loaded.append(took)
    for t in threads:
        t.join()
    out["flood_s"] = round(time.perf_counter() - t0, 2)
    out["a_statuses"] = statuses
    out["b_statuses"] = b_status
    out["loaded_verifies"] = len(loaded)
    out["loaded_median_s"] = round(statistics.median(loaded), 4) if loaded else None
    out["loaded_max_s"] = round(max(loaded), 4) if loaded else None
    if loaded:
        out["loaded_over_unloaded"] = round(out["loaded_median_s"] / out["unloaded_median_s"], 2)
    out["metrics"] = counters(b.client)


def run_slow(args: argparse.Namespace, server: Server, clips: Clips, out: dict) -> None:
    body = wire.encode(wire.VerifyRequest([5], clip=clips.clip(args.small_seconds), config=settings()))
    socks = []
    head = (f"POST /v1/verify HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKENS[0]}\r\n"
            f"Content-Type: {wire.MSGPACK}\r\nContent-Length: 1000000\r\n\r\n").encode()
    for _ in range(args.count):
        try:
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            sock.sendall(head)
            sock.setblocking(False)
            socks.append(sock)
        except OSError as exc:
            out["connect_failed"] = str(exc)
            break
    stop = time.monotonic() + args.hold

    def drip() -> None:
        while time.monotonic() < stop:
            for sock in socks:
                try:
                    sock.send(b"x")
                except OSError:
                    pass
            time.sleep(0.5)
    dripping = threading.Thread(target=drip)
    dripping.start()
    time.sleep(1.0)
    statuses: dict[str, int] = {}
    for _ in range(args.tries):
        if time.monotonic() > stop - 1:
            break
        try:
            key = str(httpx.post(f"{server.url}/v1/verify", content=body, headers=auth(1), timeout=8).status_code)
        except httpx.HTTPError as exc:
            key = type(exc).__name__
        statuses[key] = statuses.get(key, 0) + 1
    out["b_statuses"] = statuses
    out["server_fds_while_held"] = server.open_fds()
    dripping.join()
    with httpx.Client(base_url=server.url) as client:
        out["metrics"] = counters(client)
    for sock in socks:
        sock.close()


def run_lazy(args: argparse.Namespace, server: Server, clips: Clips, out: dict) -> None:
    b = Verifier(server, clips.clip(args.small_seconds))
    cfg = settings()
    n_bodies = min(args.count, 24)  # distinct clips; the server keeps nothing across sessions
    if args.a_open == "eager":
        path, bodies = "/v1/sessions", [wire.encode(wire.OpenRequest(clips.clip(args.seconds, i + 1), cfg))
                                        for i in range(n_bodies)]
    else:
        path, bodies = "/v1/verify", [wire.encode(wire.VerifyRequest([5, 6, 7, 8], clip=clips.clip(args.seconds, i + 1),
                                                                     config=cfg)) for i in range(n_bodies)]

    def count_b(seconds: float) -> dict[str, int]:
        got: dict[str, int] = {}
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            _, status = b.once()
            key = "200" if status in (0, 200) else str(status)
            got[key] = got.get(key, 0) + 1
        return got
    count_b(1.0)  # warm-up
    out["b_unloaded"] = count_b(args.window)
    statuses: dict[str, int] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def flood(i: int) -> None:
        with httpx.Client(base_url=server.url, timeout=args.limit) as client:
            while not stop.is_set():
                retry = 1.0
                try:
                    r = client.post(path, content=bodies[i % n_bodies], headers=auth(0))
                    key, retry = str(r.status_code), float(r.headers.get("retry-after", retry))
                except (httpx.HTTPError, ValueError) as exc:
                    key = type(exc).__name__
                with lock:
                    statuses[key] = statuses.get(key, 0) + 1
                if key != "200":
                    time.sleep(min(retry, 5.0))  # a refused open: retry when the server says, as a client would
    threads = [threading.Thread(target=flood, args=(i,)) for i in range(args.count)]
    for t in threads:
        t.start()
    time.sleep(args.ramp)
    with lock:
        statuses.clear()
    out["b_loaded"] = count_b(args.window)
    with lock:
        out["a_statuses"] = dict(statuses)
    stop.set()
    for t in threads:
        t.join()
    unloaded, loaded = out["b_unloaded"].get("200", 0), out["b_loaded"].get("200", 0)
    out["b_loaded_over_unloaded"] = round(loaded / unloaded, 3) if unloaded else None
    out["metrics"] = counters(b.client)


class Raw:
    """A's client for the floods: one raw HTTP/1.1 connection, requests sent as bytes made once,
    answers read by their Content-Length (a flood must cost its client as little as it can)."""

    def __init__(self, port: int, request: bytes, pipeline: int = 1) -> None:
        self.port, self.request, self.pipeline = port, request, pipeline
        self.sock: socket.socket | None = None
        self.buf = b""

    def _connect(self) -> socket.socket:
        self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        self.buf = b""
        return self.sock

    def _answer(self) -> tuple[str, bool]:
        """One answer's status, and whether the server closes the connection after it."""
        assert self.sock is not None
        while b"\r\n\r\n" not in self.buf:
            got = self.sock.recv(65536)
            if not got:
                raise ConnectionError("closed")
            self.buf += got
        head, _, rest = self.buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(fields.get("content-length", "0"))
        while len(rest) < length:
            got = self.sock.recv(65536)
            if not got:
                raise ConnectionError("closed")
            rest += got
        self.buf = rest[length:]
        return lines[0].split(" ")[1], fields.get("connection", "").lower() == "close"

    def round(self) -> list[str]:
        """`pipeline` requests, then their answers: their statuses (an error's name for a failure)."""
        try:
            sock = self.sock or self._connect()
            sock.sendall(self.request * self.pipeline)
            got = []
            for _ in range(self.pipeline):
                status, closing = self._answer()
                got.append(status)
                if closing:
                    break
            if closing:
                self.close()
            return got
        except OSError as exc:
            self.close()
            return [type(exc).__name__]

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def request_bytes(method: str, path: str, token: int | None, body: bytes = b"",
                  content_type: str = wire.MSGPACK) -> bytes:
    head = [f"{method} {path} HTTP/1.1", "Host: x"]
    if token is not None:
        head.append(f"Authorization: Bearer {TOKENS[token]}")
    if body or method == "POST":
        head += [f"Content-Type: {content_type}", f"Content-Length: {len(body)}"]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def refused_request(args: argparse.Namespace, server: Server, clips: Clips) -> bytes:
    """The request A floods with (run_refused's docstring says which kinds there are)."""
    ids = [5] * args.ids
    unknown = {"draft": [5, 6, 7, 8], "session": "u" * 22, "held": 10, "pending": ids}
    if args.refused == "unknown":
        return request_bytes("POST", "/v1/verify", 0, msgspec.msgpack.encode(unknown))
    if args.refused == "json":
        return request_bytes("POST", "/v1/verify", 0, msgspec.json.encode(unknown), wire.JSON)
    if args.refused == "tiny":
        return request_bytes("POST", "/v1/verify", 0, msgspec.msgpack.encode({**unknown, "pending": [5]}))
    if args.refused == "generate":
        clip = clips.clip(1.0)
        body = {"clip": msgspec.to_builtins(clip), "config": msgspec.to_builtins(settings())}
        body["clip"]["prompt_ids"] = ids
        body["clip"]["audio"] = clip.audio
        return request_bytes("POST", "/v1/generate", 0, msgspec.msgpack.encode(body))
    if args.refused == "anon":
        return request_bytes("GET", "/health", None)
    if args.refused == "route":
        return request_bytes("GET", "/v1/nothing-here", 0)
    assert args.refused == "own"
    r = httpx.post(f"{server.url}/v1/verify", headers=auth(0), timeout=120,
                   content=wire.encode(wire.VerifyRequest([5, 6, 7, 8], clip=clips.clip(1.0), config=settings())))
    assert r.status_code == 200, r.text
    sid = msgspec.msgpack.decode(r.content)["session"]
    return request_bytes("POST", "/v1/verify", 0, msgspec.msgpack.encode({**unknown, "session": sid, "held": 1}))


def cpu_s(server: Server) -> float:
    """The server process's CPU seconds so far (user + system)."""
    fields = Path(f"/proc/{server.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def b_under(args: argparse.Namespace, server: Server, clips: Clips, out: dict,
            a_round: Callable[[int], list[str]]) -> None:
    """B's answers alone and while `a_round(i)` runs in a loop on each of A's `--count` threads."""
    b = Verifier(server, clips.clip(args.small_seconds))

    def count_b(seconds: float) -> dict[str, int]:
        got: dict[str, int] = {}
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            _, status = b.once()
            key = "200" if status in (0, 200) else str(status)
            got[key] = got.get(key, 0) + 1
        return got
    count_b(1.0)  # warm-up
    cpu0 = cpu_s(server)
    out["b_unloaded"] = count_b(args.window)
    out["server_cpu_s_unloaded"] = round(cpu_s(server) - cpu0, 2)
    statuses: dict[str, int] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def flood(i: int) -> None:
        while not stop.is_set():
            got = a_round(i)
            with lock:
                for key in got:
                    statuses[key] = statuses.get(key, 0) + 1
    threads = [threading.Thread(target=flood, args=(i,)) for i in range(args.count)]
    for t in threads:
        t.start()
    time.sleep(args.ramp)
    with lock:
        statuses.clear()
    cpu0, t0 = cpu_s(server), time.process_time()
    out["b_loaded"] = count_b(args.window)
    out["server_cpu_s_loaded"] = round(cpu_s(server) - cpu0, 2)
    out["bench_client_cpu_s_loaded"] = round(time.process_time() - t0, 2)  # A's and B's clients together
    with lock:
        out["a_statuses"] = dict(statuses)
    stop.set()
    for t in threads:
        t.join()
    unloaded, loaded = out["b_unloaded"].get("200", 0), out["b_loaded"].get("200", 0)
    out["b_loaded_over_unloaded"] = round(loaded / unloaded, 3) if unloaded else None
    out["metrics"] = counters(b.client)


def run_refused(args: argparse.Namespace, server: Server, clips: Clips, out: dict) -> None:
    request = refused_request(args, server, clips)
    out["a_request_bytes"] = len(request)
    conns = [Raw(server.port, request, args.pipeline) for _ in range(args.count)]
    try:
        b_under(args, server, clips, out, lambda i: conns[i].round())
    finally:
        for conn in conns:
            conn.close()


SERIES = """
from specdec_cli.remote import server as _server
_init = _server.Metrics.__init__
def _with_series(self):
    _init(self)
    for i in range({n}):
        self.prefilled(f"{{i:08x}}", 0)
_server.Metrics.__init__ = _with_series
"""


def run_metrics(args: argparse.Namespace, server: Server, clips: Clips, out: dict) -> None:
    with httpx.Client(base_url=server.url, timeout=300) as client:
        text = client.get("/metrics", headers=auth(0)).content
    out["metrics_bytes"] = len(text)
    out["metrics_series"] = text.count(b"\nspecdec_session_prefills_total{")
    conns = [Raw(server.port, request_bytes("GET", "/metrics", 0)) for _ in range(args.count)]
    try:
        b_under(args, server, clips, out, lambda i: conns[i].round())
    finally:
        for conn in conns:
            conn.close()


def run_race(args: argparse.Namespace, server: Server, clips: Clips, out: dict) -> None:
    import secrets

    clip = clips.clip(args.seconds)
    both, statuses = 0, {}
    for _ in range(args.trials):
        sid = secrets.token_urlsafe(16)
        if args.a_open == "eager":
            path, body = "/v1/sessions", wire.encode(wire.OpenRequest(clip, settings(), session=sid))
        else:
            path, body = "/v1/verify", wire.encode(wire.VerifyRequest([5, 6, 7, 8], session=sid, clip=clip,
                                                                      config=settings()))
        gate, got = threading.Barrier(2), {}

        def open_as(token: int, body: bytes = body, path: str = path, gate: threading.Barrier = gate,
                    got: dict = got) -> None:
            gate.wait()
            got[token] = httpx.post(f"{server.url}{path}", content=body, headers=auth(token),
                                    timeout=args.limit).status_code
        threads = [threading.Thread(target=open_as, args=(t,)) for t in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        both += list(got.values()).count(200) == 2
        for status in got.values():
            statuses[str(status)] = statuses.get(str(status), 0) + 1
        for token in (0, 1):
            httpx.delete(f"{server.url}/v1/sessions/{sid}", headers=auth(token), timeout=30)
    out["both_200_trials"] = both
    out["statuses"] = statuses


def ahead_blocks(truth: list[int], sid: str, held: int, k: int) -> list[wire.VerifyRequest]:
    """Blocks 1, 2, … after the opening one (the answer's first k tokens), as a client drafting
    ahead with perfect drafts sends them: each assumes every block before it kept whole and its
    bonus token guessed right. Only blocks whose verdict leaves the answer unfinished (the session
    open)."""
    blocks = []
    start = k  # the answer tokens the session holds when the block's turn comes
    while start + k + 2 < len(truth):
        blocks.append(wire.VerifyRequest(list(truth[start + 1:start + 1 + k]), session=sid, held=held + start - k,
                                         pending=[truth[start]], prefix=wire.prefix_digest(list(truth[:start]))))
        start += k + 1
    return blocks


def decode_ahead(args: argparse.Namespace, server: Server, clip: wire.Clip, truth: list[int]) -> dict[str, int]:
    """One session's blocks at `--depth` in flight, each on a `--depth` thread's own connection;
    the opening block (the clip, under an id chosen here) answered first, or (`--lazy-open`) in the
    pipeline too, as the client's lazy upload sends it: then a block may reach the server while
    its session is being opened (404 unknown_session before issue 55, sent again in turn too)."""
    import secrets

    sid = secrets.token_urlsafe(16)
    opening = wire.VerifyRequest(list(truth[:args.k]), session=sid, clip=clip,
                                 config=settings(max_new_tokens=wire.MAX_NEW_TOKENS))
    blocks = ahead_blocks(truth, sid, len(clip.prompt_ids) + args.k, args.k)
    local = threading.local()

    def send(request: wire.VerifyRequest) -> str:
        if not hasattr(local, "http"):
            local.http = httpx.Client(base_url=server.url, timeout=args.limit)
            made.append(local.http)
        r = local.http.post("/v1/verify", content=wire.encode(request), headers=auth(0))
        return r.json()["code"] if r.status_code in (404, 409) else str(r.status_code)
    made: list[httpx.Client] = []
    if args.lazy_open:
        blocks.insert(0, opening)
    else:
        assert send(opening) == "200"
    got = {"blocks": len(blocks), "sent": 0}
    in_flight: list[tuple[int, concurrent.futures.Future]] = []
    with concurrent.futures.ThreadPoolExecutor(args.depth) as pool:
        sent = 0
        while sent < len(blocks) or in_flight:
            while sent < len(blocks) and len(in_flight) < args.depth:
                in_flight.append((sent, pool.submit(send, blocks[sent])))
                sent += 1
            i, future = in_flight.pop(0)
            status = future.result()
            got["sent"] += 1
            while status in ("out_of_sync", "unknown_session"):  # in turn now: the blocks before it are answered
                got[status] = got.get(status, 0) + 1
                status = pool.submit(send, blocks[i]).result()
                got["sent"] += 1
            got[status] = got.get(status, 0) + 1
    for client in made:
        client.close()
    httpx.delete(f"{server.url}/v1/sessions/{sid}", headers=auth(0), timeout=args.limit)
    return got


def run_ahead(args: argparse.Namespace, server: Server, clips: Clips, out: dict) -> None:
    from specdec_cli.describe import Describer

    audio = clips.audio(args.small_seconds)
    truth = Describer(clips.pair).run(audio, DecodingConfig(mode="cloud", max_new_tokens=wire.MAX_NEW_TOKENS)).result.tokens
    clip = clips.clip(args.small_seconds)

    def rounds(_: int) -> dict[str, int]:
        got: dict[str, int] = {}
        for _ in range(args.rounds):
            for key, value in decode_ahead(args, server, clip, truth).items():
                got[key] = got.get(key, 0) + value
        return got
    with concurrent.futures.ThreadPoolExecutor(args.sessions) as pool:
        runs = list(pool.map(rounds, range(args.sessions)))
    totals: dict[str, int] = {}
    for run in runs:
        for key, value in run.items():
            totals[key] = totals.get(key, 0) + value
    out["answer_tokens"] = len(truth)
    out["per_session"] = runs
    out["totals"] = totals
    out["out_of_sync_per_block"] = round(totals.get("out_of_sync", 0) / totals["blocks"], 3)
    out["refused_per_block"] = round((totals["sent"] - totals["blocks"]) / totals["blocks"], 3)
    with httpx.Client(base_url=server.url, timeout=60) as http:
        text = http.get("/metrics", headers=auth(0)).text
    out["held"] = {line.split("{", 1)[1].split("}")[0]: float(line.rsplit(" ", 1)[1])
                   for line in text.splitlines() if line.startswith("specdec_verifications_held_total{")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", choices=["abandon", "flood", "slow", "lazy", "race", "refused", "metrics", "ahead"])
    parser.add_argument("--server-path", help="run the server from this checkout (PYTHONPATH)")
    parser.add_argument("--count", type=int, help="A's requests (abandon: 120, flood: 100, slow: 185; "
                        "lazy: A's connections, 24)")
    parser.add_argument("--seconds", type=float, default=30.0, help="A's clips")
    parser.add_argument("--max-new-tokens", type=int, default=512, help="A's abandoned generates")
    parser.add_argument("--abandon-after", type=float, default=0.3)
    parser.add_argument("--small-seconds", type=float, default=3.0, help="B's clip")
    parser.add_argument("--small-tokens", type=int, default=8, help="B's generate")
    parser.add_argument("--settle", type=float, default=5.0)
    parser.add_argument("--verifies", type=int, default=15)
    parser.add_argument("--max-loaded", type=int, default=400)
    parser.add_argument("--limit", type=float, default=300.0, help="timeout of any one request, s")
    parser.add_argument("--nofile", type=int, default=256, help="slow: the server's descriptor limit")
    parser.add_argument("--hold", type=float, default=20.0, help="slow: how long the bodies drip")
    parser.add_argument("--tries", type=int, default=15, help="slow: B's verifications")
    parser.add_argument("--window", type=float, default=20.0, help="lazy: seconds B's answers are counted, each way")
    parser.add_argument("--ramp", type=float, default=3.0, help="lazy: seconds of A's load before B is counted")
    parser.add_argument("--a-open", choices=["lazy", "eager"], default="lazy", help="lazy: how A opens its sessions (race: both)")
    parser.add_argument("--trials", type=int, default=12, help="race: trials")
    parser.add_argument("--refused", choices=["unknown", "own", "generate", "json", "tiny", "anon", "route"],
                        default="unknown", help="refused: what A floods with")
    parser.add_argument("--ids", type=int, default=1 << 20, help="refused: ids in A's list")
    parser.add_argument("--pipeline", type=int, default=1, help="refused: A's requests sent before their answers")
    parser.add_argument("--series", type=int, default=4096, help="metrics: A's per-session series in /metrics")
    parser.add_argument("--sessions", type=int, default=1, help="ahead: A's sessions at once")
    parser.add_argument("--depth", type=int, default=4, help="ahead: verifications of a session in flight")
    parser.add_argument("--rounds", type=int, default=10, help="ahead: clips each session slot decodes in turn")
    parser.add_argument("--lazy-open", action="store_true", help="ahead: the opening block in the pipeline too")
    parser.add_argument("--k", type=int, default=4, help="ahead: draft tokens a block")
    parser.add_argument("--json", action="store_true")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    args.serve_flags = argv[cut + 1:]  # extra `specdec serve` flags
    if args.count is None:
        args.count = {"abandon": 120, "flood": 100, "slow": 185, "lazy": 24, "race": 2, "refused": 4,
                      "metrics": 2, "ahead": 0}[args.run]

    clips = Clips()
    folder = Path(tempfile.mkdtemp())
    (folder / "tokens").write_text("\n".join(TOKENS) + "\n")
    env = {"PYTHONPATH": str(Path(args.server_path).resolve())} if args.server_path else None
    out: dict = {k: v for k, v in vars(args).items() if k != "json"}
    out["loadavg_start"] = loadavg()
    prelude = SERIES.format(n=args.series) if args.run == "metrics" else None
    if prelude is not None and args.server_path:
        # `python -c` puts its folder (this checkout, the server's cwd) before PYTHONPATH: put the
        # other checkout first, or the server would run this one's code
        prelude = f"import sys\nsys.path.insert(0, {str(Path(args.server_path).resolve())!r})\n{prelude}"
    server = Server("--token-file", str(folder / "tokens"), *args.serve_flags, env=env, log=folder / "serve.log",
                    nofile=args.nofile if args.run == "slow" else None,
                    prelude=prelude)
    server.start(timeout=600)  # (a loaded machine, or --series made first, can take minutes)
    try:
        out["start_line"] = server.lines[-1].strip()
        {"abandon": run_abandon, "flood": run_flood, "slow": run_slow, "lazy": run_lazy, "race": run_race,
         "refused": run_refused, "metrics": run_metrics, "ahead": run_ahead}[args.run](args, server, clips, out)
        server.stop()
    finally:
        server.kill()
    out["log_lines"] = (folder / "serve.log").read_text(errors="replace").count("\n")
    out["loadavg_end"] = loadavg()
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for key, value in out.items():
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
