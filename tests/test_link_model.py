"""bench/link_model.py (issue 43, item 6): the modelled time per clip over a link, against cases
worked out by hand from the recursion in its docstring."""

from __future__ import annotations

import pytest
from cli_helpers import bench_module


@pytest.fixture(scope="module")
def lm():
    return bench_module("link_model")


def test_verdict_times_by_hand(lm):
    # k = 1: t_d = 2 (two edge steps), t_v = 1, R = 10 (5 each way).
    # D = 1: block 1 drafted at 2, sent at 2, verified 7..8, verdict 13; block 2 drafted at 4
    # (while block 1 is in flight), sent at 13 after the verdict, verified 18..19, verdict 24.
    assert lm.verdict_times(2, 1, 2.0, 1.0, 10.0) == [13.0, 24.0]
    # D = 2: block 2 is sent at 4 without waiting, reaches the cloud at 9 (free since 8): verdict 15.
    assert lm.verdict_times(2, 2, 2.0, 1.0, 10.0) == [13.0, 15.0]
    # the first verification carrying the prefill (4 instead of 1): verified 7..11, verdict 16; block 2
    # reaches the cloud at 9 but waits for it until 11: verified 11..12, verdict 17.
    assert lm.verdict_times(2, 2, 2.0, 1.0, 10.0, first_verify=4.0) == [16.0, 17.0]
    # D = 1, block 3: drafting waits for verdict 1 (one block ahead at most): drafted 15, sent at 24.
    assert lm.verdict_times(3, 1, 2.0, 1.0, 10.0)[2] == 35.0


def test_expected_time_by_hand(lm):
    # every position kept: 4 tokens at k = 1 are two clean blocks, the last verdict ends the clip
    assert lm.expected_time(4, 1, 1, 1.0, 2.0, 1.0, 10.0) == 24.0
    assert lm.expected_time(4, 1, 2, 1.0, 2.0, 1.0, 10.0) == 15.0
    # nothing kept: each verdict gives one token (the cloud's) and ends its episode, at any depth
    assert lm.expected_time(2, 1, 1, 0.0, 2.0, 1.0, 10.0) == 26.0
    assert lm.expected_time(2, 1, 3, 0.0, 2.0, 1.0, 10.0) == 26.0
    # a = 0.5, 2 tokens, k = 1: the first position fails with 0.5 (1 token at 13, then a fresh
    # episode of 13 for the last one), else the clip is done at the first verdict:
    # 0.5 * 26 + 0.5 * 13 = 19.5
    assert lm.expected_time(2, 1, 2, 0.5, 2.0, 1.0, 10.0) == pytest.approx(19.5)


def test_table_is_consistent(lm):
    rows = lm.table(rtts_ms=(10, 150), depths=(1, 2))
    assert len(rows) == 2 * 2 * 2  # acceptances x edge formats x round trips
    for r in rows:
        # more verifications in flight never costs time in the model (D = 1 is one of D = 2's schedules)
        assert r["d2_ms"] <= r["d1_ms"] + 1e-9
        assert r["best_x_cloud"] == round(min(r["d1_ms"], r["d2_ms"]) / r["cloud_only_ms"], 2)
    # cloud-only is its fixed cost plus the round trip
    assert rows[1]["cloud_only_ms"] - rows[0]["cloud_only_ms"] == pytest.approx(140, abs=0.2)
