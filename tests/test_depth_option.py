"""Issue 43, the depth as an option: RemoteClient.depth bounded to 1..MAX_DEPTH (or "auto"), the
rule `auto` follows (decoding/block_length.py's best_depth, against hand-computed cases), and
`--depth` on every command that takes `--cloud URL`, reaching the client."""

from __future__ import annotations

import pytest

from specdec_cli.decoding.block_length import MAX_DEPTH, best_depth, clean_block, parse_depth
from specdec_cli.errors import InputError
from specdec_cli.remote.client import RemoteClient


@pytest.mark.parametrize("bad", [0, -1, 5, 99, "0", "5", "two", "", "2.5", 2.5, True, None])
def test_a_depth_outside_one_to_max_is_refused_in_one_line(bad):
    client = RemoteClient("http://127.0.0.1:9")  # nothing is sent until a request
    try:
        with pytest.raises(InputError) as caught:
            client.depth = bad
    finally:
        client.close()
    message = str(caught.value)
    assert "\n" not in message and f"1 to {MAX_DEPTH}" in message and "auto" in message, message
    assert caught.value.exit_code == 2
    assert client.depth == 1  # unchanged


@pytest.mark.parametrize("good, expected", [(1, 1), (4, 4), ("3", 3), (" 2 ", 2), ("auto", "auto"), ("AUTO", "auto")])
def test_a_depth_in_range_is_kept(good, expected):
    client = RemoteClient("http://127.0.0.1:9")
    try:
        client.depth = good
        assert client.depth == expected
    finally:
        client.close()
    assert parse_depth(good) == expected


def test_max_depth_is_what_the_server_queues_per_session():
    from specdec_cli.remote import client, sessions

    assert MAX_DEPTH == client.MAX_DEPTH == sessions.MAX_QUEUED == 4


# -- the auto rule, by hand -------------------------------------------------------------------------

def test_clean_block_by_hand():
    assert clean_block(3, 0.5) == pytest.approx(0.0625)      # 0.5^4
    assert clean_block(1, 0.9) == pytest.approx(0.81)
    assert clean_block(12, 1.0) == 1.0


def test_auto_depth_hand_computed_cases():
    # a = 1 (every block clean): D = 1 + ceil(wait / (k t_edge)), at most 4.
    assert best_depth(0.050, 0.010, 4, 1.0) == 3      # 50 / 40 = 1.25 -> 2 blocks drafted per wait: 3
    assert best_depth(0.040, 0.010, 4, 1.0) == 2      # 40 / 40 = 1 -> 2
    assert best_depth(0.010, 0.010, 4, 1.0) == 2      # 10 / 40 -> ceil 1 -> 2
    assert best_depth(0.0, 0.010, 4, 1.0) == 1        # no wait: nothing to hide
    assert best_depth(0.150, 0.005, 2, 1.0) == 4      # 150 / 10 = 15 -> capped at MAX_DEPTH
    assert best_depth(0.150, 0.005, 2, 1.0, max_depth=8) == 8
    # a = 0.9, k = 2: clean 0.729 >= 0.3: the wait decides; 0.0535 / (2 * 0.02) = 1.34 -> 3.
    assert best_depth(0.0535, 0.02, 2, 0.9) == 3
    # a = 0.8, k = 5: clean 0.8^6 = 0.262 < 0.3: one in flight whatever the wait.
    assert best_depth(1.0, 0.001, 5, 0.8) == 1
    # a = 0.8, k = 4: clean 0.8^5 = 0.328 >= 0.3: 0.010 / 0.004 = 2.5 -> 1 + 3 = 4.
    assert best_depth(0.010, 0.001, 4, 0.8) == 4
    # The demo pair's quality (k 12, a 0.44): clean ~ 2e-5: 1.
    assert best_depth(0.0535, 0.0004, 12, 0.44) == 1


@pytest.mark.parametrize("args", [(-1.0, 0.01, 4, 1.0), (float("nan"), 0.01, 4, 1.0), (0.1, 0.0, 4, 1.0),
                                  (0.1, 0.01, 0, 1.0), (0.1, 0.01, 4, 1.5)])
def test_auto_depth_refuses_impossible_figures(args):
    with pytest.raises(ValueError):
        best_depth(*args)


def test_auto_depth_on_the_client_follows_the_recent_acceptance():
    client = RemoteClient("http://127.0.0.1:9")
    try:
        client.depth = "auto"
        client.rtt_s, client.edge_token_s = 0.050, 0.010  # as if measured: no probe is sent
        assert client.depth_for(None, 4) == 1              # prior a = 0.6: 0.6^5 = 0.08 < 0.3
        client.recent.extend([(4, 4)] * 10)                # every draft kept: a = 1
        assert client.depth_for(None, 4) == 3
        client.recent.extend([(0, 4)] * 40)                # then mostly rejected: a = 0.2
        assert client.depth_for(None, 4) == 1
        client.depth = 2
        assert client.depth_for(None, 4) == 2              # a depth set is kept as set
    finally:
        client.close()
