"""`specdec serve`: host the cloud model for edges that run `specdec … --cloud http://HOST:PORT`."""

from __future__ import annotations

import os
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Annotated, Any

import typer

from ..checkpoints import dtype_name
from ..errors import InputError
from . import ui
from .options import DtypeOpt


def serve(
    cloud: Annotated[str | None, typer.Option(help="Cloud model to host: folder or Hub id (default: bundled demo cloud).",
                                              show_default=False)] = None,
    host: Annotated[str, typer.Option(help="Address to listen on. Anything but loopback needs a token.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port (0: any free one; the start line says which).")] = 8765,
    device: Annotated[str, typer.Option(help="Torch device for the cloud model.")] = "cpu",
    dtype: DtypeOpt = "float32",
    max_sessions: Annotated[int, typer.Option(min=1, help="Open sessions (one per clip in flight) before the least "
                                              "recently used idle one is closed.")] = 64,
    session_ttl: Annotated[float, typer.Option(min=0.001, help="Seconds an idle session stays open.")] = 300.0,
    token_file: Annotated[Path | None, typer.Option(help="Bearer tokens, one per line; every request must carry one "
                                                    "(default: $SPECDEC_TOKEN, else none).", show_default=False)] = None,
    batch_window_ms: Annotated[float, typer.Option(min=0, help="Milliseconds a verification waits for other "
                                                   "sessions' ones to share its forward (0: one at a time).")] = 10.0,
    max_batch: Annotated[int, typer.Option(min=1, help="Verifications in one forward at most (1: one at a time).")] = 16,
    max_generate_batch: Annotated[int, typer.Option(min=1, help="Cloud-only generations decoded together, "
                                                    "continuously batched (1: one at a time).")] = 16,
    max_sessions_per_token: Annotated[int, typer.Option(min=0, help="Open sessions one token may hold; room for "
                                                        "more is made from its own least recently used one "
                                                        "(0: --max-sessions / the number of tokens).")] = 0,
    max_connections: Annotated[int, typer.Option(min=1, help="Open connections; beyond it the one idle longest is "
                                                 "closed, or 503 when all are busy (lowered to what the "
                                                 "descriptor limit allows).")] = 1024,
    header_timeout: Annotated[float, typer.Option(min=0.001, help="Seconds a connection may take to send a request's "
                                                  "headers (from connecting, or from the last answer).")] = 10.0,
    body_timeout: Annotated[float, typer.Option(min=0.001, help="Seconds a request may take to send its body.")] = 60.0,
    keep_alive_timeout: Annotated[int, typer.Option(min=1, help="Seconds an idle keep-alive connection stays open.")] = 5,
    log_level: Annotated[str, typer.Option(help="critical, error, warning, info (a line per request on stderr, in "
                                           "uvicorn's access-log format) or debug.")] = "info",
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No line per request (--log-level warning).")] = False,
    replicas: Annotated[int | None, typer.Option(min=1, help="Serve N replicas of the cloud on Ray Serve behind one "
                                                 "address, each session's requests routed to one replica "
                                                 "(default with --ray: 2). Needs pip install 'specdec-omni\\[serve]'.",
                                                 show_default=False)] = None,
    ray: Annotated[str | None, typer.Option(metavar="auto|ADDRESS", help="Where the replicas run: auto starts a Ray "
                                            "on this machine; ADDRESS joins a cluster (what `ray start --head` "
                                            "prints).", show_default=False)] = None,
    autoscale: Annotated[str | None, typer.Option(metavar="MIN:MAX[:TARGET]", help="Let Ray Serve scale the "
                                                  "replicas between MIN and MAX on requests in flight per replica "
                                                  "(TARGET, default 8) instead of --replicas.",
                                                  show_default=False)] = None,
    replica_cpus: Annotated[float, typer.Option(min=0.01, help="CPUs Ray reserves for each replica (its torch "
                                                "threads: the whole number of them, at least 1).")] = 1.0,
    behind_proxy: Annotated[bool, typer.Option("--behind-proxy", help="A fleet: a proxy with connection limits "
                                               "(nginx, HAProxy) stands in front, so --host may be other than "
                                               "loopback.")] = False,
    max_requests_per_token: Annotated[int, typer.Option(min=0, help="Requests one token may have in flight (being "
                                                        "read, waiting or running); beyond it 503, before the body "
                                                        "is read (0: its share of sessions).")] = 0,
    max_waiting_per_token: Annotated[int, typer.Option(min=1, help="Requests one token may have waiting for a turn "
                                                       "of the model or a batch; beyond it 503.")] = 8,
    prep_slots: Annotated[int, typer.Option(min=1, help="Clips decoded (samples to features) at once; the turns "
                                            "go round the tokens.")] = 2,
    fair_hold_ms: Annotated[float, typer.Option(min=0, help="Milliseconds a free turn of the model is kept for the "
                                                "token that has had less model time than the next waiter "
                                                "(its next request is a round trip away; 0: never).")] = 20.0,
    max_refusals_per_s: Annotated[float, typer.Option(min=0, help="Refused requests (4xx) a second one token may "
                                                      "have (twice that at once); beyond it its next requests wait "
                                                      "before they are read. Requests without a valid token share "
                                                      "one such limit (0: no limit).")] = 10.0,
    hold_ahead_ms: Annotated[float, typer.Option(min=0, help="Milliseconds a verification sent ahead that arrives "
                                                 "before the verdict it assumes waits for it; then it is refused as "
                                                 "out of sync (0: at once).")] = 2000.0,
) -> None:
    """Host the cloud model for edges that run `specdec … --cloud http://HOST:PORT` (limits: docs/security.md)."""
    from ..models import demo_pair
    from ..remote import access_log, server

    dtype_name(dtype)
    if log_level.lower() not in access_log.LEVELS:
        raise InputError(f"--log-level takes one of {', '.join(access_log.LEVELS)}, not {log_level!r}")
    level = "warning" if quiet else log_level.lower()
    fleet = _fleet_options(replicas, ray, autoscale, replica_cpus, device, behind_proxy)
    tokens = server.read_tokens(str(token_file) if token_file is not None else None, os.environ.get("SPECDEC_TOKEN"))
    server.check_bind(host, tokens)  # before loading a model
    if fleet is not None:
        from ..scale import serve_fleet

        serve_fleet.check_front(host, fleet.behind_proxy)  # before Ray starts

    def announce(line: str) -> None:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    options = server.ServeOptions(max_sessions, session_ttl, tokens, batch_window_ms, max_batch, max_sessions_per_token,
                                  max_connections, header_timeout, body_timeout, keep_alive_timeout,
                                  max_generate_batch, max_requests_per_token, max_waiting_per_token, prep_slots,
                                  fair_hold_ms, max_refusals_per_s, hold_ahead_ms)
    if fleet is not None:  # each replica loads the model; this process only deploys them
        from ..scale import serve_fleet

        serve_fleet.run_fleet(cloud or str(demo_pair()[1]), device, dtype, host, port, options, fleet, announce, level)
        sys.stderr.write("specdec serve: stopped\n")
        return
    sock = server.listen(host, port)  # a port in use: one line, before loading a model
    err = ui.console()
    with err.status("loading the cloud model…") if err.is_terminal else nullcontext():
        hosted = server.load_hosted(cloud or demo_pair()[1], device, dtype)
    server.serve(hosted, host, port, options, announce, sock, level)
    sys.stderr.write("specdec serve: stopped\n")


def _fleet_options(replicas: int | None, ray: str | None, autoscale: str | None, replica_cpus: float,
                   device: str, behind_proxy: bool = False) -> Any:
    """The fleet asked for (--replicas, --ray, --autoscale), checked before anything loads; None: one process."""
    if replicas is None and ray is None and autoscale is None:
        if behind_proxy:
            raise InputError("--behind-proxy is for a fleet (--replicas, --ray or --autoscale); one process "
                             "limits its own connections")
        return None
    if replicas is not None and autoscale is not None:
        raise InputError("give --replicas N or --autoscale MIN:MAX, not both")
    from ..scale import serve_fleet

    serve_fleet.require_serve()  # the install hint, exit 2
    scaling = serve_fleet.parse_autoscale(autoscale) if autoscale is not None else None
    gpus = 1.0 if device.startswith("cuda") else 0.0
    return serve_fleet.FleetOptions(ray or "auto", replicas or 2, scaling, replica_cpus, gpus, behind_proxy)
