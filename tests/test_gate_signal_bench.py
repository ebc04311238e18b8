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


def test_auc_se_is_hanley_and_mcneils():
    bench = bench_module()
    # A = 0.5, 10 + 10 clips: Q1 = Q2 = 1/3, A^2 = 1/4 -> (1/4 + 9/12 + 9/12) / 100 = 0.0175
    assert bench.auc_se(0.5, 10, 10) == pytest.approx(0.0175 ** 0.5)
    # a perfect ranking has nothing left to vary; no AUC, no error
    assert bench.auc_se(1.0, 30, 20) == pytest.approx(0.0)
    assert bench.auc_se(None, 0, 5) is None


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


# 说话人是女声，语速较快，音调偏低，音量适中，停顿较少，整体情绪平静。 as the demo tokenizer splits it
PIECES = ["说话", "人", "是", "女", "声", "，", "语", "速", "较快", "，", "音", "调", "偏低", "，", "音", "量", "适", "中",
          "，", "停", "顿", "较少", "，", "整体", "情绪", "平静", "。"]


def ends_of(pieces):
    return list(np.cumsum([len(p) for p in pieces]))


def test_value_positions_are_the_tokens_that_choose_each_phrase():
    bench = bench_module()
    got = bench.value_positions(ends_of(PIECES), "".join(PIECES))
    # gender: 男声/女声 share no prefix -> 女 and 声; rate: after 语速 -> 较快; pitch: after 音调 -> 偏低;
    # volume: after 音量 -> 适, 中; pauses: 较少/较多 share 停顿较, and the token 较少 holds the 少;
    # emotion: after 情绪 -> 平静
    assert got == {"gender": [3, 4], "rate": [8], "pitch": [12], "volume": [16, 17], "pauses": [21],
                   "emotion": [25]}


def test_value_positions_follow_characters_not_tokens():
    bench = bench_module()
    # 语速较 | 快: the value's characters (较快, offsets 2-3) start inside the first token
    assert bench.value_positions(ends_of(["语速较", "快", "。"]), "语速较快。")["rate"] == [0, 1]
    # an attribute stated twice (ambiguous) or not at all gets no position
    twice = bench.value_positions(ends_of(["语速较快", "语速较慢"]), "语速较快语速较慢")
    assert twice["rate"] == [] and twice["pitch"] == []


def test_attribute_features_sum_over_each_attribute_and_floor_the_missing():
    bench = bench_module()
    logp = [-0.1, -0.2, -0.3, -0.4]
    entropy = [0.5, 0.6, 0.7, 0.8]
    positions = {"gender": [0, 1], "rate": [2], "pitch": [3], "volume": [], "pauses": [], "emotion": []}
    lp, ent = bench.attribute_features(logp, entropy, positions)
    assert lp == pytest.approx([-0.3, -0.3, -0.4, -10.0, -10.0, -10.0])
    # missing: the entropy of a uniform choice among the attribute's 3 / 2 / 3 phrases
    assert ent == pytest.approx([1.1, 0.7, 0.8, np.log(3), np.log(2), np.log(3)])


def test_known_attribute_auc_ranks_the_known_attribute_first():
    bench = bench_module()
    # attributes in ATTRIBUTES' order: gender, rate, pitch, volume, pauses, emotion
    logp = np.zeros((4, 6))
    logp[:, 1] = [-0.2, -3.0, -0.3, -0.4]  # rate
    logp[:, 2] = [-1.0, -0.5, -2.0, -0.1]  # pitch
    right = np.ones((4, 6), dtype=bool)
    right[1, 1] = False  # clip 1's rate is wrong
    good = [True, False, True, False]  # clip 3 is worse than cloud-only for another reason
    got = bench.known_attribute_auc(logp, right, good)
    # rate known: scores 1e6-1, -0.5, 1e6-2, 1e6-0.1 -> positives (0, 2) beat clip 1, lose to clip 3: 2/4
    assert got["rate"] == pytest.approx(0.5)
    # pitch known (all right): the rate column ranks alone: -0.2, -0.3 above -3.0 and -0.4: 4/4
    assert got["pitch"] == pytest.approx(1.0)


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="the bench synthesises held-out clips with espeak-ng")
def test_gate_signal_bench_smallest_run(tmp_path):
    run = subprocess.run([sys.executable, str(ROOT / "bench/gate_signal.py"), "--clips", "4", "--work", str(tmp_path)],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout)
    for name in ("calibration", "measurement"):
        part = report[name]
        assert part["clips"] == 4 and 0 <= part["edge_as_good_as_cloud"] <= 4
        assert {"confidence", "value_confidence", "value_min", "consistency", "probe", "value_probe"} \
            <= set(part["signals"])
        assert set(part["attributes"]) == {"gender", "rate", "pitch", "volume", "pauses", "emotion"}
        for signal in part["signals"].values():
            assert set(signal["kept_vs_cloud_points"]) == {"10%", "20%", "30%"}
        # the oracle keeps the clips where the edge is no worse: it never loses accuracy
        assert all(v >= 0 for v in part["oracle"]["kept_vs_cloud_points"].values())
    assert "probe" in report["measurement"]["signals"] and "probe" in report["calibration"]["signals"]
