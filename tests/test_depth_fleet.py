"""Issue 43: several verifications in flight through `specdec serve --replicas 2` (a real local Ray
Serve, two replicas of the bundled demo cloud behind one HTTP address): with depth 3, greedy, on
every bundled sample, the tokens and blocks equal the in-process run's (the oracle: edge and cloud
in this process, `Describer`). Blocks are drafted ahead whatever the timings (`always_ahead`), so
blocks really are sent ahead: some are used, some refused unrun, none run and wasted.

One fleet for the module, started on a free loopback port and stopped by its pid (as in
tests/test_serve_fleet.py, whose teardown this shares)."""

from __future__ import annotations

import pytest
from test_depth import always_ahead, local, pair, remote_runs, sent_ahead  # noqa: F401 (fixtures)
from test_pipeline import GREEDY, SAMPLES
from test_serve_fleet import fleet  # noqa: F401 (the fleet fixture: started and stopped by its pid tree)

pytest.importorskip("ray.serve")
pytestmark = pytest.mark.spawns


def test_depth_3_through_two_replicas_gives_the_in_process_tokens(fleet, local, always_ahead, sent_ahead):  # noqa: F811
    cfgs = [GREEDY["always"], GREEDY["always"].with_(k=2), GREEDY["quality"]]
    sums = remote_runs(fleet.url, local, cfgs, SAMPLES, 3)
    print(sums, sent_ahead)
    assert len(SAMPLES) >= 9  # every bundled sample went through (10 since demo pair v5)
    assert sent_ahead["verdict"] > 0 and sent_ahead["refused"] > 0, sent_ahead
    # (out of sync: bounded by the refusals, not required — a block that arrives early is held for the
    # verdict before it now, issue 55 finding 5, and which refusal a block sent ahead meets is timing's)
    assert sums["out_of_sync"] <= sent_ahead["refused"] and sums["discarded_forwards"] == 0, (sums, sent_ahead)
    # A session stays on one replica (sticky routing): none was rebuilt, every verification but the
    # refused ones gave a verdict the loop used.
    assert sums["rebuilds"] == 0, sums
    assert sums["verifications"] == sums["escalations"] + sent_ahead["refused"], (sums, sent_ahead)
