"""What the bundled demo pair must show: its tokenizer, its report's bar (v5: issue 51's goal 4, on
corpus v5's held-out sets through every channel family), its samples and its presets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import run_specdec
from transformers import AutoTokenizer

from specdec_cli.demo.tokenizer import build_qwen_style_tokenizer

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


def _report() -> dict:
    return json.loads((MODELS / "report.json").read_text(encoding="utf-8"))


def _mean(model: dict, split: str, kind: str = "clean") -> float:
    return model["sets"][split][kind]["all"]["mean"]


CHANNELS = ("telephone", "codec", "room", "far field")


def test_report_meets_the_bar_and_describes_the_bundled_models(bundled_pair):
    """Issue 51's goal 4 for demo pair v5 (demo contract v4), as `python -m
    specdec_cli.demo.evaluate_pair --corpus .demo-work/corpus-v5` measured it greedily on every
    held-out clip of corpus v5 (800 clips, each clean, with 20-30 dB noise and through every channel
    family: too long to rerun here; the report's schema is
    sets[split][clean|noisy|telephone|…][bucket|"all"|"group:…"][attribute | "mean"]), and a check
    that the report is about the models shipped beside it: their parameter counts, counted now, are
    the ones it states. The goals v5 does not meet are the xfail tests below."""
    report = _report()
    for name, model in (("edge", bundled_pair.edge), ("cloud", bundled_pair.cloud)):
        total = sum(p.numel() for p in model.parameters())
        vision = sum(p.numel() for n, p in model.named_parameters() if ".visual." in f".{n}")
        assert report["models"][name]["params"]["total"] == total, name
        assert report["models"][name]["params"]["no_vision"] == total - vision, name
    cloud, edge = report["models"]["cloud"], report["models"]["edge"]
    assert set(cloud["sets"]) == {"val", "val_voices", "val_synth"} and report["sets"]["val_voices"] >= 300
    assert all(set(CHANNELS) <= set(cloud["sets"][s]) for s in cloud["sets"])  # every family measured
    # goal 4, clean: held-out sentences of the training voices >= 97 %, the held-out synthesizer >= 92 %
    assert _mean(cloud, "val") >= 0.97
    assert _mean(cloud, "val_synth") >= 0.92
    # a real drafter, at most 300 k parameters without the vision tower, at most half the cloud's
    # time per token (measured in turns, under the same load), below the cloud where the cloud is sure
    assert edge["params"]["no_vision"] <= 300_000 and 3 * edge["params"]["no_vision"] <= cloud["params"]["no_vision"]
    assert 2 * edge["ms_per_token"] <= cloud["ms_per_token"]
    assert _mean(edge, "val") < _mean(cloud, "val")
    # its doubts follow the cloud's: the cloud disagrees on the edge's top-entropy decile, and on
    # at most a fifth as many of its bottom-half tokens (None: never)
    ratio = report["entropy_curve"]["ratio"]
    assert report["entropy_curve"]["top_decile_rate"] > 0 and (ratio is None or ratio >= 5)


@pytest.mark.xfail(strict=True, reason="issue 51 goal 4, not met by v5: the cloud states 92.0 % of the held-out "
                   "voices' attributes clean (goal 93; espeak-ng's held-out women heard as men: docs/demo-pair.md)")
def test_cloud_meets_the_held_out_voices_goal():
    assert _mean(_report()["models"]["cloud"], "val_voices") >= 0.93


@pytest.mark.xfail(strict=True, reason="issue 51 goal 4, not met by v5: a telephone line costs the cloud 8-10 "
                   "points (pitch: 56-62 %), rooms and far field 4-8; the goal is within 3 points of clean")
def test_every_channel_family_is_within_three_points_of_clean():
    cloud = _report()["models"]["cloud"]
    assert all(_mean(cloud, s, c) >= _mean(cloud, s) - 0.03 for s in cloud["sets"] for c in CHANNELS)


@pytest.mark.xfail(strict=True, reason="issue 51 goal 4, not met by v5: the edge states 94.4 / 93.6 % clean on the "
                   "training voices' and flite's clips, above the 85-93 % band (it leaves the cloud little)")
def test_edge_leaves_the_cloud_a_job():
    edge = _report()["models"]["edge"]
    assert all(0.85 <= _mean(edge, s) <= 0.93 for s in edge["sets"])


@pytest.fixture(scope="module")
def samples_eval() -> dict:
    """`specdec eval` on the bundled samples with the shipped presets, as a real process (~15 s)."""
    result = run_specdec("eval", str(ROOT / "samples"), "--modes", "edge,cloud,fluent,quality", "--json",
                         timeout=600)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_shipped_presets_meet_the_bar_on_the_samples(samples_eval):
    """The bar the presets were chosen for (quality within about a point of cloud-only at <= 0.12
    cloud calls per token, issue 41's; fluent cheaper; `specdec calibrate` measured it on its check
    half), run now on the 10 bundled samples: 60 labelled attributes, so one wrong attribute is 1.67
    points. Measured when written (v5 pair): cloud 0.917, quality 0.917 at 0.068 calls/token, fluent
    0.933 at 0.054, edge 0.900. The cloud's misses are known ones, shown on purpose: the held-out
    voice `steph2` (f_slow_low_quiet.wav) heard as a man, so its pitch and emotion go too, and two
    pauses (docs/demo-pair.md, docs/benchmarks.md). The v5 edge is close to its cloud on these clips
    (v4's was 9 points below): the test asks only that it is not better."""
    rows = {m["mode"]: m for m in samples_eval["modes"]}
    assert samples_eval["clips"] == 10 and all(m["errors"] == 0 for m in rows.values())
    assert rows["cloud"]["mean_accuracy"] >= 0.90
    assert rows["edge"]["mean_accuracy"] <= rows["cloud"]["mean_accuracy"]
    assert rows["quality"]["mean_accuracy"] >= rows["cloud"]["mean_accuracy"] - 2 / 60 - 1e-9
    assert rows["quality"]["cloud_call_rate"] <= 0.12
    assert rows["fluent"]["cloud_call_rate"] <= rows["quality"]["cloud_call_rate"]
    assert rows["fluent"]["mean_accuracy"] >= rows["cloud"]["mean_accuracy"] - 0.1


def test_the_telephone_sample_is_heard_as_a_woman(samples_eval):
    """Issue 51's point: v4 called every woman on a telephone line a man; samples/f_telephone.wav
    (festival's `slt`, never heard in training, on a G.711 line at 8 kHz) is described by the v5
    cloud and the quality preset with her gender."""
    said = {r["eval_mode"]: r["description"] for r in samples_eval["records"] if r["file"] == "f_telephone.wav"}
    assert "女声" in said["cloud"] and "女声" in said["quality"], said


def test_samples_include_ordinary_sentence_lengths():
    """The spoken sentences of the samples have ordinary lengths (at least two of 15-30 Chinese
    characters or 12-30 words: v4's samples speak Chinese, English or Czech, the description is of
    the voice), they come from several voices of every held-out set, and the labels file describes
    the clips shipped beside it: each clip decodes to the duration its label states."""
    import soundfile as sf

    rows = [json.loads(x) for x in (ROOT / "samples" / "labels.jsonl").read_text(encoding="utf-8").splitlines()]

    def ordinary(row: dict) -> bool:
        if row["lang"] == "zh":
            return 15 <= sum("\u4e00" <= c <= "\u9fff" for c in row["sentence"]) <= 30
        return 12 <= len(row["sentence"].split()) <= 30

    assert 8 <= len(rows) <= 10
    assert sum(map(ordinary, rows)) >= 2
    assert {row["split"] for row in rows} == {"val", "val_voices", "val_synth"}
    assert len({row["voice"] for row in rows}) >= 6
    for row in rows:
        info = sf.info(str(ROOT / "samples" / row["file"]))
        assert abs(info.frames / info.samplerate - row["seconds"]) < 0.01, row["file"]
