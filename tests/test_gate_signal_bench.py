"""bench/gate_signal.py: the bound on any gate that reads the edge (issue 26). Its AUC and frontier
against hand-computed values, and the bench at its smallest through its command line."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def bench_module():
    """bench/gate_signal.py as a module (it imports bench/gate.py beside it, as when run)."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        spec = importlib.util.spec_from_file_location("gate_signal_bench", ROOT / "bench/gate_signal.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(ROOT / "bench"))


def test_auc_counts_pairs_with_ties_half():
    bench = bench_module()
    # positives 3 and 1, negatives 2 and 1: pairs (3>2) (3>1) (1<2) (1=1) -> (1 + 1 + 0 + 0.5) / 4
    assert bench.auc([3, 1, 2, 1], [True, True, False, False]) == pytest.approx(2.5 / 4)
    assert bench.auc([1, 2], [True, True]) is None


def test_frontier_keeps_the_surest_clips_on_the_edge():
    bench = bench_module()
    edge = [1.0, 0.5, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    cloud = [1.0] * 10
    scores = [9, 8, 7, 6, 5, 4, 3, 2, 1, 0]  # clip 1 (edge 0.5) is second surest, clip 3 (0.0) fourth
    got = bench.frontier(scores, edge, cloud, shares=(0.1, 0.2, 0.3, 0.4))
    # 10 %: clip 0 (right) -> 0; 20 %: + clip 1 -> -0.5/10 = -5 points; 30 %: + clip 2 -> -5; 40 %: + clip 3 -> -15
    assert got == {"10%": 0.0, "20%": -5.0, "30%": -5.0, "40%": -15.0}
    # ties go to the earlier clip: with every score equal the first clips are kept
    assert bench.frontier([0] * 10, edge, cloud, shares=(0.2,)) == {"20%": -5.0}


def test_probe_ranks_a_separable_set():
    bench = bench_module()
    rng = np.random.default_rng(0)
    good = [bool(i % 2) for i in range(40)]
    features = rng.standard_normal((40, 3)) + np.array([[2.0, 0, 0] if g else [-2.0, 0, 0] for g in good])
    score = bench.fit_probe(features, good)
    assert bench.auc(score(features), good) > 0.95


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="the bench synthesises held-out clips with espeak-ng")
def test_gate_signal_bench_smallest_run(tmp_path):
    run = subprocess.run([sys.executable, str(ROOT / "bench/gate_signal.py"), "--clips", "4", "--work", str(tmp_path)],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout)
    for name in ("calibration", "measurement"):
        part = report[name]
        assert part["clips"] == 4 and 0 <= part["edge_as_good_as_cloud"] <= 4
        assert {"confidence", "consistency"} <= set(part["signals"])
        for signal in part["signals"].values():
            assert set(signal["kept_vs_cloud_points"]) == {"10%", "20%", "30%"}
        # the oracle keeps the clips where the edge is no worse: it never loses accuracy
        assert all(v >= 0 for v in part["oracle"]["kept_vs_cloud_points"].values())
    assert "probe" in report["measurement"]["signals"] and "probe" in report["calibration"]["signals"]
