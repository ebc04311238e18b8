"""What the bundled demo pair must show: its tokenizer, its report's bar (v4: issue 41, on corpus v4's
held-out sets), its samples and its presets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import run_specdec
from transformers import AutoTokenizer

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


def _report() -> dict:
    return json.loads((MODELS / "report.json").read_text(encoding="utf-8"))


def _mean(model: dict, split: str, kind: str = "clean") -> float:
    return model["sets"][split][kind]["all"]["mean"]


def test_report_meets_the_bar_and_describes_the_bundled_models(bundled_pair):
    """Issue 41's bar for demo pair v4 (demo contract v3: labels measured from the audio), as
    `python -m specdec_cli.demo.evaluate_pair` measured it greedily on every held-out clip of corpus
    v4 (800 clips, clean and noisy: too long to rerun here; the report's schema is
    sets[split][clean|noisy][bucket|"all"|"group:…"][attribute | "mean"]), and a check that the
    report is about the models shipped beside it: their parameter counts, counted now, are the ones
    it states. The goals v4 does not meet are the xfail tests below."""
    report = _report()
    for name, model in (("edge", bundled_pair.edge), ("cloud", bundled_pair.cloud)):
        total = sum(p.numel() for p in model.parameters())
        vision = sum(p.numel() for n, p in model.named_parameters() if ".visual." in f".{n}")
        assert report["models"][name]["params"]["total"] == total, name
        assert report["models"][name]["params"]["no_vision"] == total - vision, name
    cloud, edge = report["models"]["cloud"], report["models"]["edge"]
    assert set(cloud["sets"]) == {"val", "val_voices", "val_synth"} and report["sets"]["val_voices"] >= 300
    # item 3: held-out sentences of the training voices >= 97 %, the held-out synthesizer >= 90 %
    assert _mean(cloud, "val") >= 0.97
    assert _mean(cloud, "val_synth") >= 0.90
    # item 4: a real drafter, at most 300 k parameters without the vision tower, at most half the
    # cloud's time per token (measured in the same run), below the cloud where the cloud is sure
    assert edge["params"]["no_vision"] <= 300_000 and 3 * edge["params"]["no_vision"] <= cloud["params"]["no_vision"]
    assert 2 * edge["ms_per_token"] <= cloud["ms_per_token"]
    assert _mean(edge, "val") < _mean(cloud, "val")
    # its doubts follow the cloud's: the cloud disagrees on the edge's top-entropy decile, and on
    # at most a fifth as many of its bottom-half tokens (None: never)
    ratio = report["entropy_curve"]["ratio"]
    assert report["entropy_curve"]["top_decile_rate"] > 0 and (ratio is None or ratio >= 5)


@pytest.mark.xfail(strict=True, reason="issue 41 item 3, not met by v4: the cloud generalises to voices it never "
                   "heard at ~87 % greedy (four espeak-ng variants heard as the other gender; docs/demo-pair.md)")
def test_cloud_meets_the_held_out_voices_goal():
    cloud = _report()["models"]["cloud"]
    assert _mean(cloud, "val_voices") >= 0.93
    assert all(cloud["sets"][s][k]["all"][a] >= 0.88 for s in cloud["sets"] for k in ("clean", "noisy")
               for a in ATTRIBUTES)


@pytest.mark.xfail(strict=True, reason="issue 41 item 4, not met by v4: the distilled edge is above the 85-93 % "
                   "band on the training voices' and the held-out synthesizer's clips (it leaves the cloud little)")
def test_edge_leaves_the_cloud_a_job():
    edge = _report()["models"]["edge"]
    assert all(0.85 <= _mean(edge, s, k) <= 0.93 for s in edge["sets"] for k in ("clean", "noisy"))


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
    half), run now on the 9 bundled samples: 54 labelled attributes, so one wrong attribute is 1.85
    points. Measured when written (v4 pair): cloud 0.926, quality 0.926 at 0.075 calls/token, fluent
    0.907 at 0.059, edge 0.833. The cloud's misses are the v4 pair's known ones, shown on purpose:
    the held-out voice `steph2` (f_slow_low_quiet.wav) heard as a man, so its pitch and emotion go
    too, and one pause (docs/demo-pair.md, "v4")."""
    rows = {m["mode"]: m for m in samples_eval["modes"]}
    assert samples_eval["clips"] == 9 and all(m["errors"] == 0 for m in rows.values())
    assert rows["cloud"]["mean_accuracy"] >= 0.90
    assert rows["edge"]["mean_accuracy"] <= rows["cloud"]["mean_accuracy"] - 0.05
    assert rows["quality"]["mean_accuracy"] >= rows["cloud"]["mean_accuracy"] - 2 / 54 - 1e-9
    assert rows["quality"]["cloud_call_rate"] <= 0.12
    assert rows["fluent"]["cloud_call_rate"] <= rows["quality"]["cloud_call_rate"]
    assert rows["fluent"]["mean_accuracy"] >= rows["cloud"]["mean_accuracy"] - 0.1


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
