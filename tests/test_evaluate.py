"""`specdec eval`: the scorer on hand-made descriptions, the aggregation on hand-computed numbers,
and the command end to end on two generated clips with a tiny random pair."""

from __future__ import annotations

import json
import math

import pytest
import soundfile as sf
import torch
from cli_helpers import run_specdec
from conftest import clip, speech_clip
from typer.testing import CliRunner

from specdec_cli.commands.app import app
from specdec_cli.decoding import DecodingConfig
from specdec_cli.errors import InputError
from specdec_cli.evaluate import (
    EvalMode,
    LabelledClip,
    add_speedups,
    attribute_counts,
    build_report,
    evaluate_clip,
    labels_file,
    latency_stats,
    markdown,
    mode_configs,
    parse_modes,
    parse_sweep,
    partial_resolution,
    read_labels,
    score,
    sentence_valid,
    summarize,
)
from specdec_cli.phrases import ATTRIBUTES

torch.set_num_threads(1)

LABELS = {"gender": "女声", "rate": "语速较快", "pitch": "音调偏高", "volume": "音量适中", "pauses": "停顿较少",
          "emotion": "情绪激动"}
RIGHT = "说话人是女声，语速较快，音调偏高，音量适中，停顿较少，整体情绪激动。"


# -- the scorer ----------------------------------------------------------------------------------

def test_all_correct():
    s = score(RIGHT, LABELS)
    assert s["correct"] == dict.fromkeys(ATTRIBUTES, True)
    assert s["all_correct"] and s["valid"] and s["immediate_repeats"] == 0


def test_wrong_phrase_is_incorrect():
    s = score(RIGHT.replace("女声", "男声").replace("语速较快", "语速较慢"), LABELS)
    assert not s["correct"]["gender"] and not s["correct"]["rate"]
    assert s["correct"]["pitch"] and not s["all_correct"]
    assert s["predicted"]["gender"] == "男声"


def test_ambiguous_attribute_is_incorrect():
    # Both 男声 and 女声: the labelled phrase is present, but so is the other one.
    s = score(RIGHT.replace("说话人是女声", "说话人是女声又像男声"), LABELS)
    assert s["predicted"]["gender"] is None
    assert not s["correct"]["gender"] and not s["all_correct"]
    assert sum(s["correct"].values()) == 5


def test_missing_attribute_is_incorrect():
    s = score("说话人是女声，语速较快。", LABELS)
    assert s["correct"] == {"gender": True, "rate": True, "pitch": False, "volume": False, "pauses": False,
                            "emotion": False}


def test_no_description_scores_nothing():
    s = score(None, LABELS)
    assert not any(s["correct"].values()) and not s["valid"]


def test_immediate_repeats_counted():
    assert score("说说话人是女声声。", LABELS)["immediate_repeats"] == 2


@pytest.mark.parametrize(("text", "valid"), [
    (RIGHT, True),
    ("她语速较快！", True),
    ("她语速较快？", True),
    ("  她语速较快。 ", True),            # surrounding whitespace is not a sentence
    ("她语速较快", False),                # no end
    ("她语速较快，", False),              # ends with a comma
    ("她是女声。语速较快。", False),       # two sentences
    ("她语速较快。。", False),             # a doubled end is a second end
    ("她是女声！语速较快", False),         # an end in the middle, none at the end
    ("", False),
    (None, False),
])
def test_sentence_validity(text, valid):
    assert sentence_valid(text) is valid


# -- aggregation ---------------------------------------------------------------------------------

def _record(mode: str, correct: dict[str, bool], *, valid: bool = True, tokens: int = 10, cloud_calls: int = 0,
            latency: float = 1.0, error: str | None = None, drafted: int = 0, accepted: int = 0) -> dict:
    ok = error is None
    return {
        "file": "x.wav", "eval_mode": mode, "error": error, "correct": correct, "all_correct": all(correct.values()),
        "valid": valid, "immediate_repeats": 1, "punct_density": 0.2 if ok else None,
        "repeat_rate": 0.0 if ok else None, "tokens": tokens if ok else None,
        "cloud_calls": cloud_calls if ok else None, "cloud_tokens": 2 * cloud_calls if ok else None,
        "edge_forwards": tokens if ok else None, "escalations": cloud_calls if ok else None,
        "latency_s": latency if ok else None, "modelled_latency_s": latency + 0.1 * cloud_calls if ok else None,
        "verified_drafted": drafted, "verified_accepted": accepted,
    }


def _correct(*wrong: str) -> dict[str, bool]:
    return {a: a not in wrong for a in ATTRIBUTES}


def test_aggregation_hand_computed():
    spec = EvalMode("fluent", DecodingConfig(threshold=5.0, k=4), "fluent")
    records = [
        _record("fluent", _correct(), tokens=10, cloud_calls=2, latency=1.0, drafted=8, accepted=6),
        _record("fluent", _correct("gender"), tokens=20, cloud_calls=3, latency=2.0, drafted=12, accepted=3),
        _record("fluent", _correct("gender", "rate"), valid=False, tokens=10, cloud_calls=0, latency=3.0),
        _record("fluent", _correct(), tokens=0, error="RuntimeError: boom"),  # counted wrong, no cost
    ]
    records[3]["correct"] = dict.fromkeys(ATTRIBUTES, False)
    records[3]["all_correct"] = records[3]["valid"] = False
    s = summarize(records, spec)
    assert s["clips"] == 4 and s["errors"] == 1
    # gender right only in clip 1; rate in clips 1-2; the other four in clips 1-3 (clip 4 failed).
    assert s["accuracy"] == {"gender": 0.25, "rate": 0.5, "pitch": 0.75, "volume": 0.75, "pauses": 0.75,
                             "emotion": 0.75}
    assert s["mean_accuracy"] == pytest.approx((0.25 + 0.5 + 4 * 0.75) / 6)
    assert s["all_correct_rate"] == 0.25
    assert s["valid_rate"] == 0.5
    assert s["immediate_repeats"] == 4
    # Cost over the three clips that decoded: 5 calls / 40 tokens; acceptance pooled 9 / 20.
    assert s["cloud_call_rate"] == pytest.approx(5 / 40)
    assert s["cloud_calls"] == pytest.approx(5 / 3)
    assert s["tokens"] == pytest.approx(40 / 3)
    assert s["acceptance_rate"] == pytest.approx(9 / 20)
    assert s["latency_s"]["mean"] == pytest.approx(2.0)
    assert s["latency_s"]["p50"] == pytest.approx(2.0)
    assert (s["threshold"], s["k"], s["verify"], s["decoding"]) == (5.0, 4, "entropy", "spec")


def test_latency_percentiles_hand_made():
    st = latency_stats([4.0, 1.0, 3.0, 2.0])
    assert st["mean"] == pytest.approx(2.5)
    assert st["p50"] == pytest.approx(2.5)
    # Linear interpolation: rank 0.95 * 3 = 2.85 between 3 and 4.
    assert st["p95"] == pytest.approx(3.85)
    assert latency_stats([]) == {"mean": None, "p50": None, "p95": None}


def test_speedup_against_cloud_only():
    rows = [{"mode": m, "latency_s": {"mean": lat}, "modelled_latency_s": {"mean": mod}}
            for m, lat, mod in [("cloud", 2.0, 2.5), ("fluent", 0.5, 1.25), ("edge", 0.25, 0.25)]]
    add_speedups(rows)
    assert [r["speedup"] for r in rows] == pytest.approx([1.0, 4.0, 8.0])
    assert [r["modelled_speedup"] for r in rows] == pytest.approx([1.0, 2.0, 10.0])


def test_no_speedup_without_cloud_only():
    rows = [{"mode": "edge", "latency_s": {"mean": 1.0}, "modelled_latency_s": {"mean": 1.0},
             "speedup": None, "modelled_speedup": None}]
    add_speedups(rows)
    assert rows[0]["speedup"] is None


# -- options and labels --------------------------------------------------------------------------

def test_parse_sweep():
    assert parse_sweep("threshold=1:3:3") == [1.0, 2.0, 3.0]
    assert parse_sweep("threshold=2.5:2.5:1") == [2.5]
    assert parse_sweep("threshold=2:2:3") == [2.0]  # one point, not three identical modes
    for bad in ("k=1:3:3", "threshold=1:3", "threshold=a:3:3", "threshold=1:3:0", "threshold=-1:3:2"):
        with pytest.raises(InputError):
            parse_sweep(bad)


# -- labels that leave attributes out (issue 51, item 3) -------------------------------------------

def _without(*attrs: str) -> dict[str, str]:
    return {a: v for a, v in LABELS.items() if a not in attrs}


def test_an_attribute_left_out_is_not_judged():
    # the sentence says 男声 and 音调偏低, both against the labels; neither is labelled here
    s = score(RIGHT.replace("女声", "男声").replace("音调偏高", "音调偏低"), _without("gender", "pitch", "emotion"))
    assert s["correct"] == {"gender": None, "rate": True, "pitch": None, "volume": True, "pauses": True,
                            "emotion": None}
    assert s["all_correct"] is True  # every labelled attribute right
    assert score(RIGHT.replace("语速较快", "语速较慢"), _without("volume"))["all_correct"] is False


def test_each_attribute_is_scored_over_the_clips_labelled_for_it():
    """Four clips. 1: all six labelled, all right. 2: volume left out; gender wrong. 3: gender,
    pitch, emotion left out; rate wrong. 4: all six labelled, failed (all wrong).
    Labelled: gender on 1, 2, 4 (right on 1): 1/3; rate on all four (right on 1, 2): 1/2; pitch on
    1, 2, 4 (right on 1, 2): 2/3; volume on 1, 3, 4 (right on 1, 3): 2/3; pauses on all four (right on
    1-3): 3/4; emotion on 1, 2, 4 (right on 1, 2): 2/3. Every labelled attribute right: clip 1 only."""
    mode = EvalMode("cloud", DecodingConfig(mode="cloud"))
    texts = [RIGHT, RIGHT.replace("女声", "男声"), RIGHT.replace("语速较快", "语速适中"), None]
    labels = [LABELS, _without("volume"), _without("gender", "pitch", "emotion"), LABELS]
    records = []
    for i, (text, lab) in enumerate(zip(texts, labels, strict=True)):
        r = _record("cloud", {}, error=None if text else "RuntimeError: boom")
        r.update(score(text, lab), file=f"c{i}.wav", labels=lab)
        records.append(r)
    s = summarize(records, mode)
    assert s["accuracy"] == pytest.approx({"gender": 1 / 3, "rate": 1 / 2, "pitch": 2 / 3, "volume": 2 / 3,
                                           "pauses": 3 / 4, "emotion": 2 / 3})
    assert s["scored"] == {"gender": 3, "rate": 4, "pitch": 3, "volume": 3, "pauses": 4, "emotion": 3}
    assert s["mean_accuracy"] == pytest.approx((1 / 3 + 1 / 2 + 2 / 3 + 2 / 3 + 3 / 4 + 2 / 3) / 6)
    assert s["all_correct_rate"] == 0.25
    report = build_report(records, [mode], edge="e", cloud="c", samples="s", labels="l.jsonl", settings={})
    assert report["attributes"] == {"gender": {"scored": 3, "left_out": 1}, "rate": {"scored": 4, "left_out": 0},
                                    "pitch": {"scored": 3, "left_out": 1}, "volume": {"scored": 3, "left_out": 1},
                                    "pauses": {"scored": 4, "left_out": 0}, "emotion": {"scored": 3, "left_out": 1}}
    # one attribute of one clip moves the mean by up to 100 / (6 x 3) points (the attributes on 3 clips)
    assert partial_resolution(report) == (pytest.approx(100 / 18), 17)
    md = markdown(report)
    assert "| clips scored | 3 | 4 | 3 | 3 | 4 | 3 |" in md and "| left out | 1 | 0 | 1 | 1 | 0 | 1 |" in md
    assert "all right" in md and "all six" not in md


def test_complete_labels_report_as_before():
    mode = EvalMode("cloud", DecodingConfig(mode="cloud"))
    r = _record("cloud", {})
    r.update(score(RIGHT, LABELS), labels=LABELS)
    report = build_report([r], [mode], edge="e", cloud="c", samples="s", labels="l.jsonl", settings={})
    assert all(c == {"scored": 1, "left_out": 0} for c in report["attributes"].values())
    md = markdown(report)
    assert "all six" in md and "clips scored" not in md


def test_a_labels_file_may_leave_attributes_out(tmp_path):
    """What demo.measure writes: ambiguous attributes left out of `labels` (and listed beside)."""
    lines = [{"file": "a.wav", "labels": _without("rate"), "ambiguous": ["rate"]},
             {"file": "b.wav", "labels": {}, "ambiguous": ["rate", "volume", "pauses"]},  # nothing to score
             {"file": "c.wav", "labels": {"volume": "音量较小"}}]
    (tmp_path / "labels.jsonl").write_text("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in lines),
                                           encoding="utf-8")
    read = labels_file(tmp_path / "labels.jsonl", tmp_path)
    assert [(c.file, c.labels) for c in read.clips] == [("a.wav", _without("rate")), ("c.wav", {"volume": "音量较小"})]
    assert read.unlabelled == ["b.wav"]
    assert attribute_counts([c.labels for c in read.clips]) == {
        "gender": {"scored": 1, "left_out": 1}, "rate": {"scored": 0, "left_out": 2},
        "pitch": {"scored": 1, "left_out": 1}, "volume": {"scored": 2, "left_out": 0},
        "pauses": {"scored": 1, "left_out": 1}, "emotion": {"scored": 1, "left_out": 1}}
    # a label that is there must still be a canonical phrase
    (tmp_path / "labels.jsonl").write_text(json.dumps({"file": "a.wav", "labels": {"rate": "很快"}}) + "\n",
                                           encoding="utf-8")
    with pytest.raises(InputError, match=r"labels.jsonl:1: rate label '很快' is not one of"):
        labels_file(tmp_path / "labels.jsonl", tmp_path)
    (tmp_path / "labels.jsonl").write_text(json.dumps({"file": "b.wav", "labels": {}}) + "\n", encoding="utf-8")
    with pytest.raises(InputError, match="lists no clip with a label"):
        labels_file(tmp_path / "labels.jsonl", tmp_path)


def test_parse_modes():
    assert parse_modes("edge, cloud,always,edge") == ["edge", "cloud", "always"]
    with pytest.raises(InputError, match="spec"):
        parse_modes("edge,spec")


def test_mode_configs_from_presets():
    modes = {m.name: m for m in mode_configs(["edge", "fluent", "quality", "always"], None, 12, thresholds=[2.0])}
    assert modes["edge"].cfg.mode == "edge"
    assert modes["fluent"].cfg.mode == "spec" and modes["fluent"].cfg.verify == "entropy"
    assert modes["always"].cfg.verify == "always" and modes["always"].cfg.k == modes["quality"].cfg.k
    sweep = modes["t=2.0"]
    assert sweep.sweep and sweep.cfg.threshold == 2.0 and sweep.cfg.k == modes["quality"].cfg.k
    assert {m.cfg.max_new_tokens for m in modes.values()} == {12}
    assert mode_configs(["fluent"], None, 12, k=3)[0].cfg.k == 3


def test_read_labels_errors(tmp_path):
    sf.write(tmp_path / "a.wav", clip(0, 0.5), 16000)
    good = {"file": "a.wav", "labels": LABELS}
    cases = {
        "not json": "{oops",
        "null label": json.dumps({"file": "a.wav", "labels": {**LABELS, "pauses": None}}),
        "not canonical": json.dumps({"file": "a.wav", "labels": {**LABELS, "gender": "男的"}}),
    }
    for line in cases.values():
        (tmp_path / "labels.jsonl").write_text(line + "\n", encoding="utf-8")
        with pytest.raises(InputError, match=r"labels.jsonl:1"):
            read_labels(tmp_path / "labels.jsonl", tmp_path)
    (tmp_path / "labels.jsonl").write_text(json.dumps(good, ensure_ascii=False) + "\n\n", encoding="utf-8")
    [only] = read_labels(tmp_path / "labels.jsonl", tmp_path)
    assert only.labels == LABELS and only.path == tmp_path / "a.wav"
    with pytest.raises(InputError, match="not found"):
        read_labels(tmp_path / "nope.jsonl", tmp_path)
    # A missing clip is not the labels' fault: it is kept, then skipped with its reason by the input
    # policy (inputs.check_clips) along with every other unreadable clip, before the models load.
    (tmp_path / "labels.jsonl").write_text(json.dumps({**good, "file": "missing.wav"}) + "\n" + json.dumps(good) + "\n",
                                           encoding="utf-8")
    from specdec_cli.inputs import check_clips

    checked = check_clips(read_labels(tmp_path / "labels.jsonl", tmp_path), lambda c: c.path)
    assert [c.file for c in checked.clips] == ["a.wav"]
    assert [s.line() for s in checked.skipped] == [f"skipped: no such file: {tmp_path / 'missing.wav'}; check the path"]


def test_a_failing_clip_becomes_an_error_record():
    class Broken:
        def run(self, audio, cfg):
            raise RuntimeError("cache holds 3 positions but 4 tokens\nmore detail")

    mode = EvalMode("cloud", DecodingConfig(mode="cloud"))
    record = evaluate_clip(Broken(), LabelledClip("x.wav", None, LABELS), None, mode)
    assert record["error"] == "RuntimeError: cache holds 3 positions but 4 tokens"
    assert record["description"] is None and not record["valid"] and not any(record["correct"].values())
    summary = summarize([record], mode)
    assert summary["errors"] == 1 and summary["mean_accuracy"] == 0 and summary["latency_s"]["mean"] is None


# -- the command end to end ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory, edge, cloud, processor):
    """The conftest's random thinkers saved as model folders, and two 1 s labelled clips."""
    root = tmp_path_factory.mktemp("pair")
    for name, model in (("edge", edge), ("cloud", cloud)):
        model.save_pretrained(root / name)
        processor.save_pretrained(root / name)
    clips = root / "clips"
    clips.mkdir()
    lines = []
    for i in range(2):
        sf.write(clips / f"c{i}.wav", speech_clip(i, 1.0), 16000)
        lines.append(json.dumps({"file": f"c{i}.wav", "labels": LABELS}, ensure_ascii=False))
    (clips / "labels.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def _args(pair_dir, *args: str) -> list[str]:
    return ["eval", str(pair_dir / "clips"), "--edge", str(pair_dir / "edge"), "--cloud", str(pair_dir / "cloud"),
            "--max-new-tokens", "12", *args]


def _invoke(pair_dir, *args: str):
    """The real `specdec` app (specdec_cli.commands.app.app), in this process."""
    return CliRunner().invoke(app, _args(pair_dir, *args))


def test_eval_end_to_end(tiny_pair, tmp_path):
    """As a real `specdec` process (the installed console script)."""
    report = tmp_path / "out" / "report.json"
    result = run_specdec(*_args(tiny_pair, "--report", str(report), "--cloud-rtt-ms", "20", "--json"), timeout=600)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert report.is_file() and report.with_suffix(".md").is_file()
    assert json.loads(report.read_text(encoding="utf-8"))["modes"] == data["modes"]

    rows = {s["mode"]: s for s in data["modes"]}
    assert list(rows) == ["edge", "cloud", "fluent", "quality", "always"]
    assert data["clips"] == 2 and len(data["records"]) == 10 and data["frontier"] is None
    for s in rows.values():
        assert s["clips"] == 2 and s["errors"] == 0
        assert 0 <= s["mean_accuracy"] <= 1 and 0 <= s["valid_rate"] <= 1
        assert set(s["accuracy"]) == set(ATTRIBUTES)
        assert 0 < s["tokens"] <= 12
        assert 0 < s["latency_s"]["p50"] <= s["latency_s"]["p95"]
        assert s["speedup"] > 0
    assert rows["edge"]["cloud_calls"] == 0 and rows["edge"]["edge_forwards"] > 0
    assert rows["cloud"]["edge_forwards"] == 0 and rows["cloud"]["cloud_calls"] > 0
    assert rows["cloud"]["speedup"] == pytest.approx(1.0)
    assert rows["always"]["verify"] == "always" and rows["always"]["acceptance_rate"] is not None
    # Modelled latency: +20 ms per cloud call for spec, once per clip for cloud-only, none for edge.
    assert rows["edge"]["modelled_latency_s"]["mean"] == pytest.approx(rows["edge"]["latency_s"]["mean"])
    assert rows["cloud"]["modelled_latency_s"]["mean"] == pytest.approx(rows["cloud"]["latency_s"]["mean"] + 0.02)
    always = rows["always"]
    assert always["modelled_latency_s"]["mean"] == pytest.approx(
        always["latency_s"]["mean"] + 0.02 * always["cloud_calls"])
    for r in data["records"]:
        assert r["description"] is not None and r["mode"] in ("edge", "cloud", "spec")
        assert r["labels"] == LABELS and set(r["correct"]) == set(ATTRIBUTES)

    md = report.with_suffix(".md").read_text(encoding="utf-8")
    assert "| always |" in md and "## Accuracy per attribute" in md


def test_eval_sweep_and_plot(tiny_pair, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "frontier.png"
    result = _invoke(tiny_pair, "--modes", "edge,cloud", "--sweep", "threshold=0:4:2", "--plot", str(png),
                     "--json", "--limit", "1")
    assert result.exit_code == 0, result.output + repr(result.exception)
    data = json.loads(result.stdout)
    assert [s["mode"] for s in data["modes"]] == ["edge", "cloud"]
    points = data["frontier"]["points"]
    assert [p["threshold"] for p in points] == [0.0, 4.0]
    assert all(0 <= p["cloud_call_rate"] and 0 <= p["mean_accuracy"] <= 1 for p in points)
    assert set(data["frontier"]["references"]) == {"edge", "cloud"}
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(("args", "message"), [
    (["--modes", "edge,turbo"], "error: unknown mode(s) turbo; choose from edge,cloud,fluent,quality,always"),
    (["--labels", "{tmp}/none.jsonl"], "error: labels file not found: {tmp}/none.jsonl"),
    (["--report", "{tmp}/r.md", "--modes", "edge"],
     "error: --report {tmp}/r.md must not end in .md: the Markdown version is written beside it"),
], ids=["mode", "labels", "report"])
def test_eval_bad_input_is_one_line_and_exit_2(tiny_pair, tmp_path, args, message):
    """What the real command gives: one line on stderr, exit 2, nothing on stdout, no traceback."""
    result = _invoke(tiny_pair, *(a.format(tmp=tmp_path) for a in args))
    assert result.exit_code == 2
    assert result.stderr == message.format(tmp=tmp_path) + "\n" and result.stdout == ""
    assert not (tmp_path / "r.json").exists()


def test_modelled_latency_is_never_slept(tiny_pair):
    # A 10 s round trip per call would take minutes if slept; it must only be added to the numbers.
    result = _invoke(tiny_pair, "--modes", "cloud", "--cloud-rtt-ms", "10000", "--json", "--limit", "1")
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout)["modes"][0]
    assert row["latency_s"]["mean"] < 10 and math.isclose(
        row["modelled_latency_s"]["mean"], row["latency_s"]["mean"] + 10, rel_tol=1e-9)


def test_eval_with_attributes_left_out_says_how_many_and_fits_80_columns(tiny_pair, tmp_path):
    """The per-attribute table with the clips scored and left out, on an 80-column terminal."""
    import re

    from rich.cells import cell_len

    clips = tmp_path / "clips"
    clips.mkdir()
    partial = [LABELS, _without("volume"), {}]
    for i in range(len(partial)):
        sf.write(clips / f"c{i}.wav", speech_clip(i, 1.0), 16000)
    (clips / "labels.jsonl").write_text("".join(json.dumps({"file": f"c{i}.wav", "labels": lab}, ensure_ascii=False)
                                                + "\n" for i, lab in enumerate(partial)), encoding="utf-8")
    args = ["eval", str(clips), "--edge", str(tiny_pair / "edge"), "--cloud", str(tiny_pair / "cloud"),
            "--max-new-tokens", "12", "--modes", "edge,cloud"]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "80", "NO_COLOR": "1", "TTY_COMPATIBLE": "1",
                                                "TERMINAL_WIDTH": None})
    assert result.exit_code == 0, result.output
    lines = re.split(r"\r\n|\n|\r", re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", result.output))
    assert not [line for line in lines if cell_len(line) > 80]
    said = " ".join(result.output.split())
    assert "labels no attribute of 1 clip, left out: c2.wav" in said
    assert "left out: volume 1 of 2 clips" in said
    table = result.stdout[result.stdout.index("accuracy per attribute"):]
    assert re.search(r"clips scored\s+2\s+2\s+2\s+1\s+2\s+2", table) and re.search(r"left out\s+0\s+0\s+0\s+1\s+0\s+0", table)
    assert "right" in result.stdout and "six" not in result.stdout  # "all right": every labelled one
