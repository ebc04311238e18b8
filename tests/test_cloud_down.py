"""A --cloud that is down when the run starts (issue 44, point 4): with the default
`--on-cloud-failure edge` every clip is described on the edge alone, each record marked
(`fallback: "unreachable"`) and the run says so once; with `fail`, one line that names `--mode edge`.
The oracle for the sentences is the edge alone (`mode="edge"` on the bundled pair, no cloud)."""

from __future__ import annotations

import json
import socket

import pytest
from cli_helpers import run_specdec
from remote_helpers import ROOT

CLIPS = [ROOT / "samples/f_fast_high.wav", ROOT / "samples/m_slow_low.wav"]


@pytest.fixture(scope="module")
def down_url() -> str:
    """An address nothing listens on: a port the kernel gave us, closed again."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def edge_alone() -> dict[str, str]:
    from specdec import Pair

    pair = Pair()
    return {str(clip): pair.describe(clip, mode="edge").description for clip in CLIPS}


@pytest.mark.spawns
def test_with_edge_every_clip_is_described_on_the_edge_and_marked(down_url, edge_alone):
    done = run_specdec("describe", *map(str, CLIPS), "--cloud", down_url, "--json")
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["file"] for r in records] == [str(c) for c in CLIPS]
    for r in records:
        assert r["description"] == edge_alone[r["file"]]
        assert (r["fallback"], r["fallback_at_tokens"], r["fallback_verified_tokens"], r["cloud_url"]) == \
            ("unreachable", 0, 0, down_url)
        assert r["fallback_error"].startswith(f"cannot reach the cloud at {down_url}")
        assert r["error"] is None and r["cloud_calls"] == 0
    # said once for the run, not once per clip
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: cannot reach the cloud") and "edge alone" in lines[0]


@pytest.mark.spawns
def test_with_fail_one_line_names_mode_edge(down_url):
    done = run_specdec("describe", str(CLIPS[0]), "--cloud", down_url, "--on-cloud-failure", "fail")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"error: cannot reach the cloud at {down_url}") and "--mode edge" in done.stderr


@pytest.mark.spawns
def test_mode_edge_needs_no_cloud(down_url, edge_alone):
    """What the fail line suggests works as typed: --mode edge with the same --cloud."""
    done = run_specdec("describe", str(CLIPS[0]), "--cloud", down_url, "--on-cloud-failure", "fail",
                       "--mode", "edge", "--json")
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert record["description"] == edge_alone[str(CLIPS[0])] and record["fallback"] is None
    assert done.stderr == ""


def test_the_api_describes_on_the_edge_with_edge(down_url, edge_alone):
    from specdec import Pair

    result = Pair(cloud=down_url, on_cloud_failure="edge").describe(CLIPS[1])
    assert result.description == edge_alone[str(CLIPS[1])] and result.record["fallback"] == "unreachable"


@pytest.mark.spawns
@pytest.mark.parametrize("status, page", [
    (502, b"<html><head><title>502 Bad Gateway</title></head><body><center>nginx</center></body></html>"),
    (503, b"<html><body><h1>503 Service Unavailable</h1>No server is available to handle this request.</body></html>"),
])
def test_a_proxy_whose_server_is_down_is_an_unreachable_cloud(status, page, edge_alone):
    """Issue 55, finding 4: a proxy in front of a stopped server answers 502 (nginx) or 503
    (HAProxy) with a page, not a refused connection. Before: the run stopped ("dropped", or "stayed
    full"; exit 1, no description). Now a 5xx that is not specdec's own answer at the start is the
    cloud being unreachable: the edge describes every clip, each marked, as for a refused
    connection."""
    from fake_cloud import FakeCloud, Reply

    with FakeCloud(lambda request: Reply(status, page, {"content-type": "text/html"})) as proxy:
        done = run_specdec("describe", str(CLIPS[0]), "--cloud", proxy.url, "--json")
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert record["description"] == edge_alone[str(CLIPS[0])]
    assert record["fallback"] == "unreachable" and record["cloud_calls"] == 0
    assert record["fallback_error"].startswith(f"cannot reach the cloud at {proxy.url} ({status}")
    assert len(proxy.requests) == 1  # the start's /health, once
