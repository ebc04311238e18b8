"""bench/capacity.py at its smallest settings: it runs from the checkout, prints the JSON the issue
asks for, and its counts add up (every clip sent is done or failed, per step and per mode)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="the bench synthesises held-out clips with espeak-ng")
def test_capacity_bench_smallest_run(tmp_path):
    plot = tmp_path / "capacity.png"
    run = subprocess.run([sys.executable, str(ROOT / "bench/capacity.py"), "--json", "--plot", str(plot),
                          "--modes", "cloud,fluent", "--clips", "2", "--workers", "2", "--per-step", "3",
                          "--max-steps", "2", "--bisect", "0"],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout)
    assert set(report["modes"]) == {"cloud", "fluent"}
    assert report["slo_s"] > 0 and len(report["load_avg"]["start"]) == 3
    assert plot.stat().st_size > 0
    for name, m in report["modes"].items():
        for key in ("max_clips_per_s", "p50_s", "p95_s", "accuracy", "server_cpu_s_per_clip", "uplink_bytes_per_clip"):
            assert key in m, (name, key)
        assert 0 <= m["accuracy"] <= 100 and m["accuracy_clips"] == 2
        steps = m["steps"]
        assert 1 <= len(steps) <= 2 and all(s["clips"] == 3 for s in steps)
        assert all(s["done"] + s["failed"] == s["clips"] for s in steps)
        assert m["clips_sent"] == sum(s["clips"] for s in steps) == m["clips_done"] + m["clips_failed"]
        # The highest rate within the SLO is one of the steps' (or 0 when none was).
        within = [s["rate_clips_per_s"] for s in steps if s["within_slo"]]
        assert m["max_clips_per_s"] == (max(within) if within else 0.0)
        if m["clips_done"]:
            assert m["uplink_bytes_per_clip"] > 0 and m["server_cpu_s_per_clip"] >= 0


def test_an_unknown_mode_is_refused_in_one_line_before_anything_starts(tmp_path):
    run = subprocess.run([sys.executable, str(ROOT / "bench/capacity.py"), "--modes", "cloud,nosuch", "--quick"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert run.returncode != 0
    assert run.stderr.strip().count("\n") == 0 and "unknown preset 'nosuch'" in run.stderr
