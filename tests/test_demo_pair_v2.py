"""What the bundled demo pair must show: its tokenizer, its report's bar (the cloud's from v2, issue
11; the edge's from v3, issue 34), its samples and its presets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import run_specdec
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


@pytest.fixture(scope="module")
def bundled_pair():
    from specdec_cli.models import load_pair

    return load_pair(None, None)


def test_report_meets_the_bar_and_describes_the_bundled_models(bundled_pair):
    """Issue 11's bar, as `python -m specdec_cli.demo.evaluate_pair` measured it on 600 held-out
    clips (too long to rerun here: its schema is accuracy[bucket][attribute | "mean"], bucket "all"
    = every clean clip), and a check that the report is about the models shipped beside it: their
    parameter counts, counted now, are the ones it states."""
    report = json.loads((MODELS / "report.json").read_text(encoding="utf-8"))
    for name, model in (("edge", bundled_pair.edge), ("cloud", bundled_pair.cloud)):
        total = sum(p.numel() for p in model.parameters())
        vision = sum(p.numel() for n, p in model.named_parameters() if ".visual." in f".{n}")
        assert report["models"][name]["params"]["total"] == total, name
        assert report["models"][name]["params"]["no_vision"] == total - vision, name
    cloud, edge = report["models"]["cloud"], report["models"]["edge"]
    acc = cloud["accuracy"]
    assert acc["all"]["mean"] >= 0.95
    assert min(acc["all"][a] for a in ATTRIBUTES) >= 0.90
    for lo, hi in BUCKETS:
        assert acc[f"{lo}-{hi}"]["mean"] >= 0.93, (lo, hi)
    assert cloud["noisy"]["mean"] >= 0.88
    # v3's edge (issue 34, items 1-2): a real drafter, at most 300 k parameters without the vision
    # tower and at most half the cloud's time per token (measured in the same run), that still
    # leaves the cloud a real job: 88-95 % mean attribute accuracy, clean and noisy
    assert edge["mean_accuracy"] <= cloud["mean_accuracy"] - 0.05
    for mean in (edge["accuracy"]["all"]["mean"], edge["noisy"]["mean"]):
        assert 0.88 <= mean <= 0.95
    assert edge["params"]["no_vision"] <= 300_000 and 3 * edge["params"]["no_vision"] <= cloud["params"]["no_vision"]
    assert 2 * edge["ms_per_token"] <= cloud["ms_per_token"]
    # its doubts follow the cloud's: the cloud disagrees on the edge's top-entropy decile, and on
    # at most a fifth as many of its bottom-half tokens (None: never)
    ratio = report["entropy_curve"]["ratio"]
    assert report["entropy_curve"]["top_decile_rate"] > 0 and (ratio is None or ratio >= 5)


@pytest.fixture(scope="module")
def samples_eval() -> dict:
    """`specdec eval` on the bundled samples with the shipped presets, as a real process (~15 s)."""
    result = run_specdec("eval", str(ROOT / "samples"), "--modes", "edge,cloud,fluent,quality", "--json",
                         timeout=600)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_shipped_presets_meet_the_bar_on_the_samples(samples_eval):
    """The bar the presets were chosen for (quality within about a point of cloud-only at <= 0.15
    cloud calls per token, fluent cheaper; `specdec calibrate` measured it on its check half), run
    now on the 9 bundled samples: 54 labelled attributes, so one wrong attribute is 1.85 points.
    Measured when written: cloud 1.000, quality 0.981 at 0.140 calls/token, fluent 0.926 at 0.118,
    edge 0.778."""
    rows = {m["mode"]: m for m in samples_eval["modes"]}
    assert samples_eval["clips"] == 9 and all(m["errors"] == 0 for m in rows.values())
    assert rows["cloud"]["mean_accuracy"] >= 0.95
    assert rows["edge"]["mean_accuracy"] <= rows["cloud"]["mean_accuracy"] - 0.05
    assert rows["quality"]["mean_accuracy"] >= rows["cloud"]["mean_accuracy"] - 2 / 54 - 1e-9
    assert rows["quality"]["cloud_call_rate"] <= 0.15
    assert rows["fluent"]["cloud_call_rate"] <= rows["quality"]["cloud_call_rate"]
    assert rows["fluent"]["mean_accuracy"] >= rows["cloud"]["mean_accuracy"] - 0.1


def test_samples_include_ordinary_sentence_lengths():
    """The spoken sentences of the samples have ordinary lengths (at least two of 15-30 characters),
    and the labels file describes the clips shipped beside it: each clip decodes to the duration
    its label states."""
    import soundfile as sf

    rows = [json.loads(x) for x in (ROOT / "samples" / "labels.jsonl").read_text(encoding="utf-8").splitlines()]
    lengths = [sum("\u4e00" <= c <= "\u9fff" for c in row["sentence"]) for row in rows]
    assert 8 <= len(rows) <= 10
    assert sum(15 <= n <= 30 for n in lengths) >= 2
    for row in rows:
        info = sf.info(str(ROOT / "samples" / row["file"]))
        assert abs(info.frames / info.samplerate - row["seconds"]) < 0.01, row["file"]
