"""`specdec serve --replicas N` / `--ray auto|ADDRESS`: the cloud as a Ray Serve application, N
replicas of today's server behind one HTTP address, each session's requests routed to one replica.

What is Ray Serve's and what is ours:
  * Ray Serve (its proxy on each node, its controller) takes the HTTP connections, keeps the
    replicas running (a replica whose process dies is started again), scales their number between
    --autoscale's bounds on the requests queued per replica, and routes each request. The router is
    its experimental `ConsistentHashRouter` (ray.serve.experimental.consistent_hash_router): a hash
    ring over the `X-Session-Id` header (RAY_SERVE_SESSION_ID_HEADER_KEY), so every request of one
    session reaches one replica; when a replica goes, only its sessions move. No fallback replica
    (`num_fallback_replicas=0`): a busy replica's requests wait for it rather than reach one that
    does not hold their session (that would cost a rebuild, a prefill, each time).
  * Each replica is today's app (remote/server.py `create_app`: the same routes, limits, tokens,
    batching, metrics), wrapped by `FleetApp`, which answers /health and /metrics for the whole fleet
    from what every replica reports to one small Ray actor (`FleetBoard`), and writes the access log.
  * The client names each session (remote/client.py: 128 random bits, scoped to its token on the
    server) and sends its id in the header from the clip's first request on, so the first request
    lands where the others will follow. A request for a session its replica does not hold (its
    replica died, the ring changed) is answered `unknown_session` and the client rebuilds the
    session there from the clip, as it does after a server restart: failover costs a rebuild.

What Ray Serve's proxy does not do that one `specdec serve` does: the per-connection limits of
remote/limits.py (--max-connections, --header-timeout, the connection guard) are uvicorn's inside
one process; Ray Serve's proxy has no head deadline, idle eviction or connection cap (issue 42: 3,000
idle sockets held it 70 s, ~20,000 exhausted its descriptors, no token needed). So a fleet listens on
loopback only, unless `--behind-proxy` declares that a proxy with those limits stands in front
(nginx, HAProxy, Envoy: docs/serve.md, "Deployment"), and it refuses a non-loopback --host without it.

The Ray a fleet starts for itself (`--ray auto` with none running) listens on loopback only and keeps
its auth token private (ray_batch.private_local_ray); Ray's import-time settings are made before
Ray is first imported (ray_batch.ray_environment).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from anyio import to_thread

from ..errors import InputError, SpecdecError, one_line
from ..remote import access_log, server, wire
from .ray_batch import LOOPBACK_ENV, OBJECT_STORE_BYTES, check_reachable, private_local_ray, ray_environment

INSTALL_HINT = "--replicas and --ray need Ray Serve, which is not installed: pip install 'specdec-omni[serve]'"
APP = "specdec"                       # the Ray Serve application's name
BOARD = "specdec-fleet-board"         # the FleetBoard actor's name
ROUTER = "ray.serve.experimental.consistent_hash_router.ConsistentHashRouter"
REPORT_S = 1.0          # how often a replica reports its sessions and metrics to the board
STALE_S = 4.0           # a replica not heard from for this long is left out of /health and /metrics
AUTOSCALE_TARGET = 8.0  # --autoscale's default: requests in flight per replica that autoscaling aims at
START_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class FleetOptions:
    """What --replicas, --ray, --autoscale and --replica-cpus asked for."""
    address: str = "auto"                  # "auto": a Ray on this machine; else a cluster's HOST:PORT
    replicas: int = 2
    autoscale: tuple[int, int, float] | None = None   # (min, max, target requests per replica)
    replica_cpus: float = 1.0
    replica_gpus: float = 0.0
    behind_proxy: bool = False             # --behind-proxy: a proxy with connection limits stands in front


def parse_autoscale(text: str) -> tuple[int, int, float]:
    """`MIN:MAX` or `MIN:MAX:TARGET` (requests in flight per replica), checked."""
    parts = text.split(":")
    try:
        if len(parts) not in (2, 3):
            raise ValueError
        low, high = int(parts[0]), int(parts[1])
        target = float(parts[2]) if len(parts) == 3 else AUTOSCALE_TARGET
    except ValueError:
        raise InputError(f"--autoscale takes MIN:MAX or MIN:MAX:TARGET (e.g. 1:4), not {text!r}") from None
    if not (1 <= low <= high) or not target > 0:
        raise InputError(f"--autoscale {text}: need 1 <= MIN <= MAX and a TARGET above 0")
    return low, high, target


def check_front(host: str, behind_proxy: bool) -> None:
    """A fleet on anything but loopback needs a declared proxy in front (the module says why)."""
    if behind_proxy or server.is_loopback(host):
        return
    raise InputError(f"refusing to serve a fleet on {host}: Ray Serve's proxy has no connection limits (idle "
                     "sockets can lock it); listen on 127.0.0.1 behind nginx or HAProxy, or declare such a "
                     "proxy with --behind-proxy (docs/serve.md)")


def require_serve() -> Any:
    """The `ray.serve` module, or the one-line install hint (exit 2) without the extra."""
    ray_environment()  # before Ray is first imported
    try:
        from ray import serve
    except ImportError as exc:
        if (exc.name or "").split(".")[0] not in ("ray", "fastapi", "starlette", "aiohttp", "uvicorn"):
            raise
        raise InputError(INSTALL_HINT) from None
    return serve


# -- what the replicas report ------------------------------------------------------------------------

class Report(msgspec.Struct):
    """One replica's state, as it last reported it."""
    replica: str
    pid: int
    node: str
    sessions: int
    metrics: str      # its /metrics text (Prometheus)
    at: float         # time.time() of the report
    sessions_of: dict[int, int] = {}     # token -> its sessions here
    label_owners: dict[str, int] = {}    # per-session series label -> the token whose session it is


def _board_class() -> Any:
    import ray

    @ray.remote(num_cpus=0, max_restarts=-1)
    class FleetBoard:
        """What each replica last reported (one writer per key: the replica itself). Restarted if
        its process dies; the replicas' next reports fill it again."""

        def __init__(self) -> None:
            self.reports: dict[str, bytes] = {}

        def report(self, replica: str, encoded: bytes) -> None:
            self.reports[replica] = encoded

        def snapshot(self) -> list[bytes]:
            return list(self.reports.values())
    return FleetBoard


def board_handle() -> Any:
    """The board, created once per fleet by the `specdec serve` driver (it lives while it does)."""
    return _board_class().options(name=BOARD, namespace="serve", get_if_exists=True).remote()


def live(reports: list[Report], now: float | None = None) -> list[Report]:
    """The replicas heard from within STALE_S (a killed one drops out), by replica id."""
    now = time.time() if now is None else now
    return sorted((r for r in reports if now - r.at <= STALE_S), key=lambda r: r.replica)


def fleet_metrics(reports: list[Report], owner: int | None = None) -> bytes:
    """Every replica's metrics as one Prometheus text, each sample labelled with its replica.
    (prometheus_client's own parser and writer; families merged by name so each appears once.)
    `owner`: only that token's per-session series (server.tenant_view, per replica)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.metrics_core import Metric
    from prometheus_client.parser import text_string_to_metric_families

    families: dict[str, Metric] = {}
    for report in reports:
        text = report.metrics if owner is None else server.tenant_view(
            report.metrics.encode(), report.label_owners, owner).decode()
        for family in text_string_to_metric_families(text):
            merged = families.setdefault(family.name, Metric(family.name, family.documentation, family.type))
            for s in family.samples:
                merged.add_sample(s.name, {**s.labels, "replica": report.replica}, s.value, s.timestamp, s.exemplar)

    class Collected:
        def collect(self) -> Any:
            return list(families.values())
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collected())
    return generate_latest(registry)


def fleet_health(own: dict[str, Any], reports: list[Report], owner: int | None = None) -> dict[str, Any]:
    """The replica's own /health with the fleet's count, sessions and per-replica sessions.
    `owner` (a fleet with tokens): that token's sessions only, and no replica's pid or node
    (least disclosure between tenants, issue 42; 0 and "" in their place)."""
    def count(r: Report) -> int:
        return r.sessions if owner is None else r.sessions_of.get(owner, 0)
    per = [wire.ReplicaHealth(r.replica, r.pid if owner is None else 0, r.node if owner is None else "", count(r))
           for r in reports]
    return {**own, "sessions": sum(count(r) for r in reports), "replicas": len(per),
            "per_replica": msgspec.to_builtins(per)}


# -- one replica ---------------------------------------------------------------------------------------

class FleetApp:
    """One replica's ASGI app: today's server (`create_app`) in the access log, with GET /health
    and GET /metrics answered for the fleet once the replica's own handler has accepted the request
    (its token check included): /health sums the replicas' sessions and lists them, /metrics is
    every live replica's metrics labelled `replica`."""

    def __init__(self, app: Any, reporter: Reporter) -> None:
        self.app, self.reporter = app, reporter
        self.fleet_rendered = server.Rendered()
        self.logged = access_log.AccessLog(self._route)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await self.logged(scope, receive, send)

    async def _route(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "GET" or scope.get("path") not in ("/health", "/metrics"):
            await self.app(scope, receive, send)
            return
        start: dict[str, Any] = {}
        body: list[bytes] = []

        async def keep(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
            elif message["type"] == "http.response.body":
                body.append(message.get("body", b""))
        await self.app(scope, receive, keep)
        content = b"".join(body)
        headers = list(start.get("headers", []))
        if start.get("status") == 200:
            from starlette.requests import Request

            state = self.app.state
            owner = state.owner_of(Request(scope)) if state.tenants else None  # (its token was accepted)
            if scope["path"] == "/health":
                reports = await self.reporter.fleet()
                content = msgspec.json.encode(fleet_health(msgspec.json.decode(content), reports, owner))
            else:
                # At most once a second per token's view, off the event loop (server.Rendered, issue 55).
                async def make() -> bytes:
                    return await to_thread.run_sync(fleet_metrics, await self.reporter.fleet(), owner)
                content = await self.fleet_rendered.get(owner, make)
            headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
            headers.append((b"content-length", str(len(content)).encode()))
        await send({**start, "headers": headers})
        await send({"type": "http.response.body", "body": content})


class Reporter:
    """A replica's reports to the board: every REPORT_S from a daemon thread, and at once before it
    answers a /health or /metrics (so the answering replica's own figures are current)."""

    def __init__(self, board: Any, replica: str, node: str, app: Any) -> None:
        self.board, self.replica, self.node, self.app = board, replica, node, app
        self._stop = threading.Event()
        threading.Thread(target=self._loop, name="specdec-fleet-report", daemon=True).start()

    def report(self) -> Any:
        from prometheus_client import generate_latest

        state = self.app.state
        mine = Report(self.replica, os.getpid(), self.node, len(state.sessions),
                      generate_latest(state.metrics.registry).decode(), time.time(),
                      state.sessions.count_by_token(), state.metrics.label_owners())
        return self.board.report.remote(self.replica, msgspec.msgpack.encode(mine))

    def _loop(self) -> None:
        while not self._stop.wait(REPORT_S):
            try:
                self.report()
            except Exception as exc:  # noqa: BLE001 - the board restarting: the next report refills it
                logging.getLogger("specdec.serve").warning("fleet report failed: %s", one_line(exc))

    async def fleet(self) -> list[Report]:
        await self.report()
        encoded = await self.board.snapshot.remote()
        return live([msgspec.msgpack.decode(e, type=Report) for e in encoded])

    def stop(self) -> None:
        self._stop.set()


def _replica_grpc_on_loopback() -> None:
    """In a Ray private_local_ray started: the replica's inter-deployment gRPC server, which Ray
    Serve 2.60 binds to `[::]:0` whatever the node's address (replica.py `_on_initialized`, called
    after this constructor), binds to loopback like the rest of that Ray. By hand: Ray offers no
    setting for it; the name is looked up when the server starts, so wrapping it here is enough."""
    from ray.serve._private import replica

    bind = replica.add_port_to_grpc_server

    def on_loopback(grpc_server: Any, address: str) -> int:
        return bind(grpc_server, "127.0.0.1:" + address.rsplit(":", 1)[1] if address.startswith("[::]:") else address)
    replica.add_port_to_grpc_server = on_loopback


def _replica_class(serve: Any) -> Any:
    @serve.ingress()
    class Replica:
        """One replica: loads the cloud once, serves today's app (server.create_app)."""

        def __init__(self, cloud: str, device: str, dtype: str, options: server.ServeOptions, log_level: str,
                     threads: int) -> None:
            import ray
            import torch

            torch.set_num_threads(threads)
            if os.environ.get(LOOPBACK_ENV) == "1":
                _replica_grpc_on_loopback()
            access_log.configure(log_level)
            self.hosted = server.load_hosted(cloud, device, dtype)
            self.options = options
            context = serve.get_replica_context()
            self.replica = context.replica_id.unique_id
            self.node = ray.get_runtime_context().get_node_id()[:12]
            self.board = ray.get_actor(BOARD, namespace="serve")

        def __serve_build_asgi_app__(self) -> Any:
            app = server.create_app(self.hosted, self.options)
            self.reporter = Reporter(self.board, self.replica, self.node, app)
            return FleetApp(app, self.reporter)
    return Replica


# -- the driver: `specdec serve --replicas N` ----------------------------------------------------------

def running_cluster() -> str:
    """`--ray auto`: the Ray cluster this machine belongs to (RAY_ADDRESS, else the address the last
    `ray start` on this machine recorded, read by Ray's own reader) when something answers there;
    else "auto": a Ray started for this run. (A fleet on a cluster wants its replicas spread over
    its nodes; a batch's --ray auto always starts its own.)"""
    import socket

    address = os.environ.get("RAY_ADDRESS", "")
    if not address:
        try:
            from ray._private.utils import read_ray_address

            address = read_ray_address() or ""
        except (ImportError, OSError):
            address = ""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return "auto"
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=2.0).close()
    except OSError:
        return "auto"  # a cluster that was stopped: start one for this run
    return address


def run_fleet(cloud: str, device: str, dtype: str, host: str, port: int, options: server.ServeOptions,
              fleet: FleetOptions, announce: Callable[[str], None], log_level: str = "info") -> None:
    """Start (or join) Ray, deploy the fleet, announce its address, serve until SIGINT/SIGTERM, then
    take the application down (and the Ray this started)."""
    serve = require_serve()
    import ray
    from ray.serve.config import AutoscalingConfig, RequestRouterConfig

    server.check_bind(host, options.tokens)
    check_front(host, fleet.behind_proxy)
    if port == 0:  # Ray Serve's proxy needs a number: one the system has free now
        with server.listen(host, 0) as probe:
            port = probe.getsockname()[1]
    else:
        server.listen(host, port).close()  # in use: one line now, not Ray's traceback later
    debug = os.environ.get("SPECDEC_DEBUG", "") not in ("", "0")
    quiet = {"logging_level": logging.DEBUG if debug else logging.ERROR,
             "log_to_driver": debug or log_level in ("info", "debug")}  # the replicas' access lines
    started_ray = not ray.is_initialized()
    address = fleet.address if fleet.address != "auto" else running_cluster()
    private = contextlib.ExitStack()
    if started_ray:
        if address == "auto":
            cpus = max(os.cpu_count() or 1, int(fleet.replicas * fleet.replica_cpus + 0.999))
            private.enter_context(private_local_ray())
            try:
                ray.init(address="local", num_cpus=cpus, include_dashboard=False,
                         object_store_memory=OBJECT_STORE_BYTES, **quiet)
            except BaseException:
                private.close()
                raise
        else:
            check_reachable(address)
            try:
                ray.init(address=address, **quiet)
            except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
                raise InputError(f"cannot join the Ray cluster at {address} ({one_line(exc)}); if Ray's lines "
                                 "above say InvalidAuthToken, export RAY_AUTH_MODE=token with the head's "
                                 "~/.ray/auth_token in place") from None
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        # Ray Serve's own lines only when something is wrong (its access log is ours, access_log.py).
        ray_logs = {"log_level": "DEBUG" if debug else "WARNING", "enable_access_log": False}
        logging.getLogger("ray.serve").setLevel(ray_logs["log_level"])
        serve.start(http_options={"host": host.strip("[]"), "port": port,
                                  "keep_alive_timeout_s": options.keep_alive_timeout_s}, logging_config=ray_logs)
        board = board_handle()  # held here: the board lives as long as this driver holds it
        ray.get(board.snapshot.remote())  # up before the replicas look it up
        scaling: dict[str, Any]
        if fleet.autoscale is not None:
            low, high, target = fleet.autoscale
            scaling = {"autoscaling_config": AutoscalingConfig(min_replicas=low, max_replicas=high,
                                                               target_ongoing_requests=target)}
        else:
            scaling = {"num_replicas": fleet.replicas}
        replica = serve.deployment(
            _replica_class(serve), name="cloud",
            ray_actor_options={"num_cpus": fleet.replica_cpus, "num_gpus": fleet.replica_gpus},
            # A clip has at most one request in flight: a replica takes as many as it holds sessions.
            max_ongoing_requests=options.max_sessions, logging_config=ray_logs,
            request_router_config=RequestRouterConfig(
                request_router_class=ROUTER,
                request_router_kwargs={"num_virtual_nodes": 100, "num_fallback_replicas": 0}),
            **scaling)
        threads = max(1, int(fleet.replica_cpus))
        app = replica.bind(cloud, device, dtype, options, log_level, threads)
        try:
            serve.run(app, name=APP, route_prefix="/", blocking=False)
        except Exception as exc:  # noqa: BLE001 - a replica that cannot start says why in one line
            raise SpecdecError(f"the fleet did not start: {one_line(exc)}") from None
        hosted_line = _identity(options)
        count = (f"{fleet.autoscale[0]}-{fleet.autoscale[1]} replicas (autoscaling on "
                 f"{fleet.autoscale[2]:g} requests in flight per replica)" if fleet.autoscale
                 else f"{fleet.replicas} replicas")
        shown = f"[{host.strip('[]')}]" if ":" in host else host
        announce(f"specdec serve: listening on http://{shown}:{port} · {count} on Ray Serve "
                 f"({'a Ray started for it' if address == 'auto' else 'Ray at ' + address}), sessions routed "
                 f"by {wire.SESSION_HEADER} · {hosted_line}")
        while not stop.wait(0.5):
            pass
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        try:
            serve.delete(APP)
            serve.shutdown()
        finally:
            if started_ray:
                ray.shutdown()
            private.close()  # the token file goes with the Ray it was for


def _identity(options: server.ServeOptions) -> str:
    return (f"at most {options.max_sessions} sessions per replica ({options.per_token} per token), idle ones "
            f"closed after {options.session_ttl_s:g} s · "
            f"{'token required' if options.tokens else 'no token (loopback only)'}")
