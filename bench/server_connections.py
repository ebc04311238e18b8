"""Can idle and trickling sockets lock real clients out of `specdec serve`? (issue 25)

    python bench/server_connections.py [--json] [--nofile 256] [--idle 200] [--trickling 200] [--hold 12]

A real server process (`specdec --threads 1 serve --port 0`, a token, the bundled demo cloud) under
a descriptor limit of `--nofile` (soft and hard, as `ulimit -n` sets them); `--idle` sockets that
connect and send nothing and `--trickling` ones that send a partial request head and then one byte
every 0.5 s, all held for `--hold` seconds. One second in, a real client with the token asks for
/health (httpx, 8 s timeout). Reported: that request's status and time, the server's open
descriptors and RSS while the sockets are held, its log lines over the whole run, and /health again
once they are gone. Issue 25's target: /health within 2 s and fewer than 1,000 log lines (before:
it timed out, and ~150,000 `socket.accept() out of system resource` tracebacks in 10 s).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import httpx  # noqa: E402

from specdec_cli.remote.local_server import LocalServer as Server  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nofile", type=int, default=256)
    parser.add_argument("--idle", type=int, default=200)
    parser.add_argument("--trickling", type=int, default=200)
    parser.add_argument("--hold", type=float, default=12.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    token = secrets.token_urlsafe(24)
    log = Path(tempfile.mkdtemp()) / "serve.log"
    out: dict = vars(args).copy()
    with Server(env={"SPECDEC_TOKEN": token}, log=log, nofile=args.nofile) as server:
        headers = {"Authorization": f"Bearer {token}"}
        socks: list[tuple[socket.socket, bool]] = []
        for i in range(args.idle + args.trickling):
            try:
                sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            except OSError as exc:
                out["connect_failed"] = str(exc)
                break
            sock.setblocking(False)
            trickle = i >= args.idle
            if trickle:
                sock.send(b"GET /health HTTP/1.1\r\nHo")
            socks.append((sock, trickle))
        stop = time.monotonic() + args.hold

        def drip() -> None:
            while time.monotonic() < stop:
                for sock, trickle in socks:
                    if trickle:
                        try:
                            sock.send(b"x")
                        except OSError:
                            pass
                time.sleep(0.5)
        dripping = threading.Thread(target=drip)
        dripping.start()
        time.sleep(1.0)
        started = time.perf_counter()
        try:
            r = httpx.get(f"{server.url}/health", headers=headers, timeout=8)
            out["health"] = r.status_code
        except httpx.HTTPError as exc:
            out["health"] = type(exc).__name__
        out["health_s"] = round(time.perf_counter() - started, 3)
        out["server_fds_while_held"] = server.open_fds()
        out["server_rss_mb_while_held"] = round(server.rss_kb() / 1024, 1)
        dripping.join()
        out["server_fds_after_hold"] = server.open_fds()
        for sock, _ in socks:
            sock.close()
        time.sleep(1.0)
        started = time.perf_counter()
        try:
            out["health_after"] = httpx.get(f"{server.url}/health", headers=headers, timeout=8).status_code
        except httpx.HTTPError as exc:
            out["health_after"] = type(exc).__name__
        out["health_after_s"] = round(time.perf_counter() - started, 3)
        server.stop()
    out["log_lines"] = log.read_text(errors="replace").count("\n")
    out["start_line"] = log.read_text(errors="replace").splitlines()[0]
    os.unlink(log)
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for key, value in out.items():
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
