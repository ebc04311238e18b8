"""`specdec calibrate`: the scoring, the choice, and the command end to end on the tiny pair, with and
without labels; the presets file it writes is then used by describe and shown by presets."""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path

import pytest
from cli_helpers import cloud_only_measured, measured, run_specdec, write_clip
from typer.testing import CliRunner

from specdec_cli.calibrate import (
    Choice,
    Run,
    Score,
    agreement,
    no_dearer_than_narrower,
    sweep_chains,
    thresholds_for,
)
from specdec_cli.commands.app import app
from specdec_cli.decoding import DecodingConfig

pytest_plugins = ["cli_fixtures"]

LABELS = {"gender": "女声", "rate": "语速较快", "pitch": "音调偏高", "volume": "音量适中", "pauses": "停顿较少",
          "emotion": "情绪激动"}
FAST = ["--ks", "2", "--max-new-tokens", "8"]


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


# -- scoring and choosing ----------------------------------------------------------------------------

def test_agreement_by_phrases_counts_the_references_attributes():
    ref = "女声，语速较快，音调偏高。"           # three attributes stated
    same, how = agreement("语速较快的女声，音调偏高。", ref)
    assert (same, how) == (1.0, "phrases")      # wording differs, every attribute agrees
    half, _ = agreement("女声，语速较慢，音调偏低。", ref)
    assert half == pytest.approx(1 / 3)         # one of three agrees
    assert agreement("", ref)[0] == 0.0


def test_agreement_without_phrases_is_character_similarity():
    # 4 of the 6 characters match in order: ratio = 2 * 4 / (6 + 6)
    value, how = agreement("声音低沉快速", "声音低沉缓慢")
    assert how == "chars" and value == pytest.approx(8 / 12)
    assert agreement("声音低沉缓慢", "声音低沉缓慢") == (1.0, "chars")


def test_thresholds_span_never_to_always_around_the_edges_percentiles():
    grid = thresholds_for([float(x) for x in range(1, 11)])  # median 5.5 (numpy's linear percentile)
    assert grid[0] == 0.0 and math.isinf(grid[-1]) and grid == sorted(grid)
    assert 5.5 in grid and all(1 <= t <= 10 for t in grid[1:-1])
    assert thresholds_for([]) == [0.0, math.inf]
    # a finer grid: exactly the requested percentiles (numpy's linear rule: p% of 1..11 is 1 + p/10)
    assert thresholds_for([float(x) for x in range(1, 12)], [5, 50, 95]) == [0.0, 1.5, 6.0, 10.5, math.inf]


def test_the_sweep_is_tested_in_chains_from_each_ks_safest_setting():
    """calibration_objective.select tests each chain in order: the entropy gate per k from threshold
    0 (every block verified) to inf, the meaning gate per (k, gate_upload) from gate_verify 0; the
    order comes from the settings, not from how they scored."""
    cfg = DecodingConfig()
    configs = {"k=4 t=inf": cfg.with_(k=4, threshold=math.inf), "k=4 t=0.5": cfg.with_(k=4, threshold=0.5),
               "k=6 t=0": cfg.with_(k=6, threshold=0.0), "k=4 t=0": cfg.with_(k=4, threshold=0.0),
               "m up=0.6 ver=0.6": cfg.with_(k=4, verify="meaning", gate_upload=0.6, gate_verify=0.6),
               "m up=0.6 ver=0": cfg.with_(k=4, verify="meaning", gate_upload=0.6, gate_verify=0.0),
               "m up=0.9 ver=0": cfg.with_(k=4, verify="meaning", gate_upload=0.9, gate_verify=0.0)}
    assert sorted(sweep_chains(configs)) == sorted([["k=4 t=0", "k=4 t=0.5", "k=4 t=inf"], ["k=6 t=0"],
                                                    ["m up=0.6 ver=0", "m up=0.6 ver=0.6"], ["m up=0.9 ver=0"]])


def test_a_wider_budget_is_never_dearer_than_a_narrower_one_it_contains():
    """Each budget's check half can stop a different k's chain: fluent (3 points) then takes
    quality's setting when quality (shown within 1, so within 3) is cheaper, or when fluent was
    shown within nothing; a cheaper fluent of its own stays."""
    def choice(name: str, points: float, t: float, rate: float, met: bool) -> Choice:
        return Choice(name, points, Run(f"t={t}", DecodingConfig(threshold=t)), Score(98.0, rate), Score(98.0, rate), met)

    quality = choice("quality", 1.0, 0.8, 0.09, True)
    taken = no_dearer_than_narrower([quality, choice("fluent", 3.0, 0.5, 0.12, True)])[1]
    assert (taken.run.name, taken.met, taken.taken_from) == ("t=0.8", True, "quality")
    unmet = no_dearer_than_narrower([quality, choice("fluent", 3.0, 0.0, 0.05, False)])[1]
    assert (unmet.run.name, unmet.met, unmet.taken_from) == ("t=0.8", True, "quality")
    own = no_dearer_than_narrower([quality, choice("fluent", 3.0, 1.2, 0.06, True)])[1]
    assert (own.run.name, own.taken_from) == ("t=1.2", None)
    unmet_quality = choice("quality", 1.0, 0.0, 0.13, False)
    assert no_dearer_than_narrower([unmet_quality, choice("fluent", 3.0, 0.0, 0.14, False)])[1].taken_from is None


# -- the command on the tiny pair --------------------------------------------------------------------

@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("clips")
    for i in range(4):
        write_clip(root / f"c{i}.wav", seconds=0.6 + 0.2 * i, seed=i)
    (root / "labels.jsonl").write_text(
        "".join(json.dumps({"file": f"c{i}.wav", "labels": LABELS}, ensure_ascii=False) + "\n" for i in range(4)),
        encoding="utf-8")
    return root


@pytest.mark.parametrize("with_labels", [False, True], ids=["agreement", "labels"])
def test_calibrate_writes_usable_presets(tmp_path, clips, models, with_labels):
    out = tmp_path / "presets.toml"
    args = ["calibrate", str(clips), "--out", str(out), *models, *FAST]
    if with_labels:  # this one as a real `specdec` process, the other through CliRunner
        args += ["--labels", str(clips / "labels.jsonl")]
        result = run_specdec(*args, timeout=600)
        assert result.returncode == 0, result.stderr
    else:
        result = invoke(*args)
        assert result.exit_code == 0, result.stderr
    text = out.read_text(encoding="utf-8")
    data = tomllib.loads(text)
    for name in ("quality", "fluent"):
        assert set(data[name]) >= {"threshold", "k", "uncertainty", "verify", "description"}
        assert data[name]["k"] == 2 and data[name]["verify"] == "entropy"
    assert "clips: 4 from" in text and "2 calibration" in text and "2 check" in text
    cloud_cal, cloud_chk = cloud_only_measured(text)
    if with_labels:
        assert "accuracy against the labels" in result.stdout
    else:
        # cloud-only agrees with itself: 100 on both halves, whichever measure the clips needed
        assert (cloud_cal, cloud_chk) == (100.0, 100.0)
        assert "agreement" in result.stdout or "similarity" in result.stdout
    scores = measured(text)
    for name, points in (("quality", 1.0), ("fluent", 3.0)):
        quality, _ = scores[f"{name}/calibration"]
        if data[name]["description"].startswith("cheapest"):
            assert quality >= cloud_cal - points - 0.05  # the comments round to one decimal
        assert f"{name}/check" in scores
    # fluent's allowance is wider, so it never costs more than quality
    assert scores["fluent/calibration"][1] <= scores["quality/calibration"][1]
    # the table and the choices are the output (issue 29: `calibrate > file` keeps them)
    assert "calibration half" in result.stdout and "check" in result.stdout
    assert f"presets: {out}" in result.stdout and "calibration half" not in result.stderr

    # the file works with --presets: presets shows it, describe uses its fluent preset
    shown = run_specdec("presets", "--presets", str(out), "--json")  # a real process
    assert shown.returncode == 0, shown.stderr
    listed = json.loads(shown.stdout)
    thr = data["fluent"]["threshold"]
    as_json = "inf" if math.isinf(thr) else thr  # JSON has no infinity: records write "inf"
    assert listed["fluent"]["threshold"] == as_json
    assert listed["fluent"]["source"].endswith("presets.toml")
    described = invoke("describe", str(clips / "c0.wav"), "--presets", str(out), "--json", *models,
                       "--max-new-tokens", "8")
    assert described.exit_code == 0, described.stderr
    record = json.loads(described.stdout)
    assert record["threshold"] == as_json and record["k"] == 2


def test_missing_presets_file_is_a_one_line_error(tmp_path, clips):
    result = invoke("describe", str(clips / "c0.wav"), "--presets", str(tmp_path / "nope.toml"))
    assert result.exit_code == 2
    assert result.stderr.strip().startswith("error: presets file not found") and "\n" not in result.stderr.strip()


@pytest.mark.parametrize("args, phrase", [
    (["--ks", "0"], "block lengths"),
    (["--ks", "a"], "bad --ks"),
    (["--uncertainty", "median"], "sum, max or mean"),
    (["--percentiles", "0,50"], "strictly between 0 and 100"),
    (["--percentiles", "50,x"], "bad --percentiles"),
    (["--dtype", "float8"], "unknown dtype"),
])
def test_bad_options_fail_before_loading(tmp_path, clips, args, phrase):
    result = invoke("calibrate", str(clips), "--out", str(tmp_path / "p.toml"), *args)
    assert result.exit_code == 2 and phrase in result.stderr
    assert not (tmp_path / "p.toml").exists()


def test_one_clip_is_not_enough(tmp_path):
    write_clip(tmp_path / "only.wav")
    result = invoke("calibrate", str(tmp_path), "--out", str(tmp_path / "p.toml"))
    assert result.exit_code == 2 and "at least 2 clips" in result.stderr


def test_eval_uses_a_presets_file(tmp_path, clips, models):
    presets = tmp_path / "p.toml"
    presets.write_text('[fluent]\nthreshold = 0.25\nk = 3\n', encoding="utf-8")
    result = invoke("eval", str(clips), "--presets", str(presets), "--modes", "fluent", "--limit", "1", "--json",
                    "--max-new-tokens", "8", *models)
    assert result.exit_code == 0, result.stderr
    cfg = json.loads(result.stdout)["settings"]["configs"]["fluent"]
    assert (cfg["threshold"], cfg["k"]) == (0.25, 3)


@pytest.mark.spawns
def test_off_a_terminal_calibrate_prints_plain_bounded_progress_on_stderr(tmp_path, clips, models):
    """Issue 44: with stderr a log or a pipe (no bar), calibrate was silent until it ended (~95 s on
    the bundled pair). Now: a plain line per tenth of the decodes, the gate fit's once, on stderr."""
    out = tmp_path / "presets.toml"
    result = run_specdec("calibrate", str(clips), "--out", str(out), *models, *FAST, timeout=600)
    assert result.returncode == 0, result.stderr
    progress = [line for line in result.stderr.splitlines() if line.startswith("calibrate: ") and "decodes" in line]
    assert 3 <= len(progress) <= 11, result.stderr
    assert "\x1b" not in result.stderr and "decodes" not in result.stdout
    assert any(line.endswith("decodes, fitting the meaning gate") for line in progress), progress
    counted = [line for line in progress if "elapsed" in line]
    done = [tuple(map(int, line.split()[1].split("/"))) for line in counted]
    assert done == sorted(done) and done[-1][0] == done[-1][1], progress  # the last says every decode is done
    assert all(len(line) <= 80 for line in progress), progress


def test_one_clip_per_half_is_said_as_one_clip(tmp_path, models):
    """Issue 44: "calibration half (1 clips)", "chose on 1 clips", "on 1 calibration clips"."""
    for i in range(2):
        write_clip(tmp_path / "two" / f"c{i}.wav", seconds=0.6, seed=i)
    out = tmp_path / "presets.toml"
    result = invoke("calibrate", str(tmp_path / "two"), "--out", str(out), *models, *FAST)
    assert result.exit_code == 0, result.stderr
    said = result.stdout + result.stderr + out.read_text(encoding="utf-8")
    assert "1 clips" not in said and "1 calibration clips" not in said, said
    assert "calibration half (1 clip) · check half (1 clip)" in result.stdout
    assert "calibrate: chose on 1 clip, checked on 1" in result.stderr
    assert "the choice rests on 1 calibration clip (checked on 1)" in result.stderr


def test_labels_that_leave_attributes_out_are_scored_and_counted(tmp_path, models):
    """Issue 51: what demo.measure writes (an ambiguous attribute left out of `labels`) is read; a
    clip whose every attribute is left out has nothing to score and is left out with a note."""
    folder = tmp_path / "mine"
    partial = [LABELS, {a: v for a, v in LABELS.items() if a != "volume"},
               {a: v for a, v in LABELS.items() if a not in ("gender", "pitch", "emotion")}, {}]
    for i in range(4):
        write_clip(folder / f"c{i}.wav", seconds=0.6, seed=i)
    (folder / "labels.jsonl").write_text("".join(json.dumps({"file": f"c{i}.wav", "labels": lab}, ensure_ascii=False)
                                                 + "\n" for i, lab in enumerate(partial)), encoding="utf-8")
    out = tmp_path / "presets.toml"
    result = invoke("calibrate", str(folder), "--labels", str(folder / "labels.jsonl"), "--out", str(out),
                    "--no-gate", *models, *FAST)
    assert result.exit_code == 0, result.stderr
    assert f"note: {folder / 'labels.jsonl'} labels no attribute of 1 clip, left out: c3.wav" in result.stderr
    assert "calibration half (2 clips) · check half (1 clip)" in result.stdout
    said = " ".join(result.stdout.split())
    assert "labels left out: gender 1, pitch 1, volume 1, emotion 1 of 3 clips" in said
    assert "each attribute over the clips labelled for it" in said
    assert "# labels left out: gender 1, pitch 1, volume 1, emotion 1 of 3 clips" in out.read_text(encoding="utf-8")
    # the calibration half (c0 all six, c2 without gender, pitch, emotion): gender on one clip of two, so one
    # attribute of one clip moves its quality by up to 100 / (6 x 1) points
    assert "moves quality by up to 16.7 points" in " ".join(result.stderr.split())
