"""`specdec serve`: host the cloud model for edges that run `specdec … --cloud http://HOST:PORT`."""

from __future__ import annotations

import errno
import os
import socket
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Annotated

import typer

from ..checkpoints import dtype_name
from ..errors import InputError
from . import ui
from .options import DtypeOpt


def check_port_free(host: str, port: int) -> None:
    """Refuse a port something already listens on, in words and before the model loads (uvicorn
    would say `[Errno 98] error while attempting to bind` and exit 3). Bound the way uvicorn binds
    (SO_REUSEADDR), so a port only in TIME_WAIT counts as free, as it does for uvicorn."""
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return  # an address that does not resolve: the server's own check says so
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise InputError(f"port {port} on {host} is already in use (another specdec serve?); stop it, "
                                 "give another --port, or --port 0 for any free one") from None
            if exc.errno == errno.EACCES:
                raise InputError(f"no permission to listen on port {port} (ports below 1024 need root); "
                                 "give a --port of 1024 or more") from None
            raise


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
) -> None:
    """Host the cloud model for edges that run `specdec … --cloud http://HOST:PORT`."""
    from ..models import demo_pair
    from ..remote import server

    dtype_name(dtype)
    tokens = server.read_tokens(str(token_file) if token_file is not None else None, os.environ.get("SPECDEC_TOKEN"))
    server.check_bind(host, tokens)  # before loading a model
    check_port_free(host, port)
    err = ui.console()
    with err.status("loading the cloud model…") if err.is_terminal else nullcontext():
        hosted = server.load_hosted(cloud or demo_pair()[1], device, dtype)

    def announce(line: str) -> None:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    server.serve(hosted, host, port, server.ServeOptions(max_sessions, session_ttl, tokens, batch_window_ms, max_batch),
                 announce)
    sys.stderr.write("specdec serve: stopped\n")
