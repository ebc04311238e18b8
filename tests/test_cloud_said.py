"""A dead cloud said out loud (issue 52, point 5): while a request waits out the client's retry
window, the client says what it waits for and for how long (once per outage), and when the cloud
answers again; the batch's closing link line counts the clips from what happened (answered, tried
and never answered, never needed), not from what was sent."""

from __future__ import annotations

import http.server
import socket
import threading

import pytest

from specdec_cli.commands.ui import LinkTally
from specdec_cli.remote.client import CloudUnreachable, LinkStats, RemoteClient


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args) -> None:
        pass


def test_the_wait_is_said_once_with_how_long_and_the_return_after_it():
    port = free_port()
    said: list[str] = []
    client = RemoteClient(f"http://127.0.0.1:{port}", retry_s=2.5)
    client.on_wait = said.append
    with pytest.raises(CloudUnreachable):
        client.call("GET", "/health", None, bytes, LinkStats(), cap=1024)
    assert len(said) == 1, said
    assert said[0].startswith(f"the cloud at http://127.0.0.1:{port} does not answer (")
    assert said[0].endswith("; retrying for up to 2 s, the clip waiting")
    with pytest.raises(CloudUnreachable):  # given up: the next request tries once, and says nothing new
        client.call("GET", "/health", None, bytes, LinkStats(), cap=1024)
    assert len(said) == 1
    server = http.server.HTTPServer(("127.0.0.1", port), _Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert client.call("GET", "/health", None, bytes, LinkStats(), cap=1024) == b"{}"
    finally:
        server.shutdown()
        server.server_close()
    assert len(said) == 2 and said[1].startswith(f"the cloud at http://127.0.0.1:{port} answers again, after ")


def test_a_window_under_two_seconds_goes_unsaid():
    """A 1 s window (what the CLI tests give SPECDEC_CLOUD_RETRY_S) ends in its one error line only."""
    said: list[str] = []
    client = RemoteClient(f"http://127.0.0.1:{free_port()}", retry_s=1.0)
    client.on_wait = said.append
    with pytest.raises(CloudUnreachable):
        client.call("GET", "/health", None, bytes, LinkStats(), cap=1024)
    assert said == []


def test_the_link_line_counts_what_happened_not_what_was_sent():
    """Issue 52: 46 clips, the cloud killed after the first: the line said "every one of 46 clips
    went up · 6.4 MB up" though 45 never reached it."""
    tally = LinkTally()
    tally.add({"error": None, "uplink_bytes": 140_000, "downlink_bytes": 900, "round_trips": 3, "cloud_wait_s": 0.4,
               "fallback": None})
    for _ in range(45):  # each tried (its bytes counted as sent) and never answered
        tally.add({"error": None, "uplink_bytes": 140_000, "downlink_bytes": 0, "round_trips": 1, "cloud_wait_s": 0.0,
                   "fallback": "unreachable"})
    tally.add({"error": None, "uplink_bytes": 0, "downlink_bytes": 0, "round_trips": 0, "cloud_wait_s": 0.0,
               "fallback": None})  # never escalated
    line = tally.line()
    assert line.startswith("cloud link: 1 of 47 clips went up, 45 never reached the cloud, 1 never needed it "
                           "(45 finished on the edge alone) · 6.4 MB up or tried · 900 B down · 48 round trips")
    assert "every one" not in line
