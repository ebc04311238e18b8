"""bench/link.py --depth (issue 43): one pipelined client per RemoteClient.depth, and the table its
rows make, on figures worked out by hand (the bench itself runs servers for minutes: not here)."""

from __future__ import annotations

import pytest
from cli_helpers import bench_module

from specdec_cli.errors import InputError
from specdec_cli.remote.client import RemoteClient


@pytest.fixture(scope="module")
def link():
    return bench_module("link")


def test_one_client_per_depth(link):
    client = RemoteClient("http://127.0.0.1:9")
    try:
        assert link.variants(client, ("1", "3", "auto")) == ["d1", "d3", "dauto"]
        assert link.variants(client) == ["legacy", "blocking", "pipelined", "eager"]
        for variant, depth in (("d3", 3), ("dauto", "auto"), ("d1", 1), ("pipelined", 1)):
            link.set_variant(client, variant)
            assert client.depth == depth and client.pipelined and client.upload == "lazy"
        with pytest.raises(InputError):
            link.set_variant(client, "d5")
    finally:
        client.close()


def test_always_is_quality_with_every_block_verified(link):
    cfgs = link.modes(("quality", "always"))
    assert cfgs["always"] == cfgs["quality"].with_(verify="always")


def test_depth_table_by_hand(link):
    def row(s, trips, oos=0.0, used=1.0):
        return {"s_per_clip": s, "round_trips": trips, "verifications": trips, "out_of_sync": oos,
                "discarded_forwards": 0.0, "depth_used": used, "same_tokens": "9/9"}
    out = {"pairs": {"self": {"in_process": {"always": {"s_per_clip": 0.25}}, "remote": {"50ms": {
        "cloud": {"s_per_clip": 0.2, "round_trips": 1.0, "same_tokens": "9/9"},
        "always/d1": row(0.4, 3.0), "always/d2": row(0.3, 4.0, 1.0, 2.0), "rtt_s": 0.0535}}}}}
    lines = link.depth_table(out).splitlines()
    assert lines[2] == "| self | 50ms | always | 1 | 0.400 | 0.250 | 2.00 | 1.00 | 3.0 | 3.0 | 0.0 | 0.0 | 1.0 | 9/9 |"
    assert lines[3] == "| self | 50ms | always | 2 | 0.300 | 0.250 | 1.50 | 0.75 | 4.0 | 4.0 | 1.0 | 0.0 | 2.0 | 9/9 |"
