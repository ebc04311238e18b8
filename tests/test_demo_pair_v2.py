"""What the bundled demo pair (v2, issue 11) must show: its tokenizer, its report's bar, its samples
and its presets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import cloud_only_measured, measured
from transformers import AutoTokenizer

from specdec_cli.demo.corpus import BUCKETS
from specdec_cli.demo.tokenizer import build_qwen_style_tokenizer
from specdec_cli.phrases import ATTRIBUTES

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "specdec_cli" / "demo" / "models"


@pytest.mark.parametrize("model", ["edge", "cloud"])
def test_bundled_pair_uses_the_qwen_style_tokenizer(model):
    bundled = AutoTokenizer.from_pretrained(MODELS / model)
    v2 = build_qwen_style_tokenizer()
    text = "说话人是女声，语速较快，音调偏高，音量适中，停顿较少，整体情绪激动。"
    assert bundled.tokenize(text) == v2.tokenize(text)
    assert bundled.get_vocab() == v2.get_vocab()


def test_report_meets_the_bar_per_length_bucket_and_on_noise():
    """Issue 11's bar, read from the report `python -m specdec_cli.demo.evaluate_pair` wrote for the
    bundled pair (its schema: accuracy[bucket][attribute | "mean"], bucket "all" = every clean clip)."""
    report = json.loads((MODELS / "report.json").read_text(encoding="utf-8"))
    cloud, edge = report["models"]["cloud"], report["models"]["edge"]
    acc = cloud["accuracy"]
    assert acc["all"]["mean"] >= 0.95
    assert min(acc["all"][a] for a in ATTRIBUTES) >= 0.90
    for lo, hi in BUCKETS:
        assert acc[f"{lo}-{hi}"]["mean"] >= 0.93, (lo, hi)
    assert cloud["noisy"]["mean"] >= 0.88
    assert edge["mean_accuracy"] <= cloud["mean_accuracy"] - 0.05
    assert 3 * edge["params"]["no_vision"] <= cloud["params"]["no_vision"]
    assert edge["ms_per_token"] < cloud["ms_per_token"]
    ratio = report["entropy_curve"]["ratio"]  # None: the cloud never disagrees in the bottom half
    assert report["entropy_curve"]["top_decile_rate"] > 0 and (ratio is None or ratio >= 5)


def test_samples_include_ordinary_sentence_lengths():
    rows = [json.loads(x) for x in (ROOT / "samples" / "labels.jsonl").read_text(encoding="utf-8").splitlines()]
    lengths = [sum("\u4e00" <= c <= "\u9fff" for c in row["sentence"]) for row in rows]
    assert 8 <= len(rows) <= 10
    assert sum(15 <= n <= 30 for n in lengths) >= 2


def test_shipped_presets_meet_the_bar_on_the_check_half():
    """quality within 1 point of cloud-only at <= 0.15 cloud calls per token, fluent cheaper: as
    measured by `specdec calibrate` on the check half (clips the choice never saw)."""
    text = (MODELS / "edge" / "specdec_presets.toml").read_text(encoding="utf-8")
    cloud_check = cloud_only_measured(text)[1]
    check = {name: measured(text)[f"{name}/check"] for name in ("quality", "fluent")}
    assert check["quality"][0] >= cloud_check - 1.0
    assert check["quality"][1] <= 0.15
    assert check["fluent"][1] <= check["quality"][1]
