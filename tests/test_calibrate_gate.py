"""`specdec calibrate` fits the meaning gate (issue 26): the presets file it writes carries a `[gate]`
table and a `frugal` preset that describe and the Pair use exactly as the explicit settings; the
objective that picks frugal counts the clips that go up; `--no-gate` writes neither."""

from __future__ import annotations

import json
import math
import shutil
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from specdec_cli.calibration_objective import choose, clip_cost, score_clips, select
from specdec_cli.commands.app import app
from specdec_cli.gate_presets import gate_id, load_gate

SAMPLES = Path(__file__).resolve().parents[1] / "samples"
# Six of the bundled samples (three per half) on the demo pair, one k and a coarse grid: ~10 s.
FAST = ["--ks", "6", "--percentiles", "50"]
# Three clips a half show nothing within 1 point (calibration_objective.gap_bound keeps a margin of
# at least 16.7 / 5 = 3.3 points of standard error for a perfect match on 3 clips): a wide frugal
# budget, so that the mechanics of writing frugal and its gate are what these tests see.
WIDE = ["--frugal-points", "30"]


def invoke(*args: str):
    return CliRunner().invoke(app, ["--threads", "1", *args])


# -- the objective on a hand-made table --------------------------------------------------------------

def _stats(tokens: int, calls: int, forwards: int, work: int) -> SimpleNamespace:
    return SimpleNamespace(tokens=tokens, cloud_calls=calls, cloud_work_forwards=forwards, cloud_work_tokens=work)


def test_frugal_is_the_cheapest_by_clips_that_go_up_within_the_target():
    """Four clips, cloud-only right on all (each: prefill 200 + 10 fed = 210 work tokens).
    `every` sends every clip up for one verification (4 calls / 80 tokens = 0.05 per token, 4 x 205
    work); `half` keeps two clips home and verifies the other two three times each (6 / 80 = 0.075
    per token: more calls per token, calibrate's old `pick` would take `every`) but its work per clip
    is 2 x 215 / 4 = 107.5 against 205: `half` wins. `none` sends nothing and is 50 points down:
    outside 5 points. Four clips show nothing within 3 points (calibration_objective.gap_bound: a
    perfect match keeps 16.7 / 6 = 2.8 points of standard error, and three candidates make z 1.62:
    a 4.5-point margin): the best quality, then the cheapest (`half`), flagged; within 5, `half`.
    The plain rule (z = 0) takes `every` and `half` within 0 points (every clip right): still
    `half`. `none` qualifies once its gap fits: within 60 points by the plain rule (mean -50); by
    the bound (adjusted mean -200/6 = -33.3, se sqrt((20000 + 277.8) / 6 - 33.3^2) / sqrt(6) = 19.4,
    z 1.62: -64.8) within 80, not 60."""
    ref = [clip_cost(_stats(20, 20, 21, 210), 1.0) for _ in range(4)]
    every = [clip_cost(_stats(20, 1, 2, 205), 1.0) for _ in range(4)]
    half = [clip_cost(_stats(20, 0, 0, 0), 1.0)] * 2 + [clip_cost(_stats(20, 3, 4, 215), 1.0)] * 2
    none = [clip_cost(_stats(20, 0, 0, 0), q) for q in (1.0, 0.0, 1.0, 0.0)]
    assert score_clips(half).up_share == 0.5 and score_clips(every).up_share == 1.0
    assert score_clips(half).call_rate > score_clips(every).call_rate
    assert score_clips(half).work_per_clip == pytest.approx(107.5)
    candidates = [("every", every), ("half", half), ("none", none)]
    assert choose(candidates, ref, 3.0)[::2] == ("half", False)
    assert choose(candidates, ref, 5.0)[::2] == ("half", True)
    assert choose(candidates, ref, 0.0, z=0.0)[::2] == ("half", True)
    assert choose(candidates, ref, 60.0, z=0.0)[::2] == ("none", True)
    assert choose(candidates, ref, 60.0)[::2] == ("half", True)
    assert choose(candidates, ref, 80.0)[::2] == ("none", True)
    # upload bytes count only for a clip that reached the cloud
    assert clip_cost(_stats(5, 0, 0, 0), 1.0, 9_000).upload_bytes == 0
    assert clip_cost(_stats(5, 1, 2, 40), 1.0, 9_000).upload_bytes == 9_000


# -- the command on the demo pair ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("samples6")
    for wav in sorted(SAMPLES.glob("*.wav"))[:6]:
        shutil.copy(wav, root / wav.name)
    return root


@pytest.fixture(scope="module")
def calibrated(clips, tmp_path_factory) -> tuple[Path, str]:
    """The presets file and the output of one calibrate run; its --report JSON is beside the file
    (report.json)."""
    out = tmp_path_factory.mktemp("presets") / "presets.toml"
    result = invoke("calibrate", str(clips), "--out", str(out), *FAST, *WIDE, "--report",
                    str(out.with_name("report.json")))
    assert result.exit_code == 0, result.stderr
    return out, result.stdout


def _record(*args: str) -> dict:
    result = invoke("describe", *args, "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


SAME = ("description", "tokens", "cloud_calls", "cloud_work_forwards", "cloud_work_tokens", "cloud_free",
        "escalations", "accepted_tokens")


def test_calibrate_writes_a_gate_and_frugal_that_describe_uses_as_the_explicit_settings(calibrated, clips):
    out, stdout = calibrated
    data = tomllib.loads(out.read_text(encoding="utf-8"))
    assert {"quality", "fluent", "frugal", "gate"} <= set(data)
    frugal = data["frugal"]
    assert frugal["verify"] == "meaning" and frugal["k"] == 6
    assert frugal["threshold"] == data["fluent"]["threshold"]  # the entropy fallback is fluent's
    gate = load_gate(out)
    assert gate is not None and gate.weights and gate.instruction.startswith("请用一句中文")
    assert "frugal: k 6, gate_upload" in stdout and "frugal" in stdout.split("quality measure")[0]

    # the Pair loads the written gate (not the demo pair's bundled one)
    from specdec import Pair

    assert Pair(presets=out).gate == gate

    # oracle: the preset == the explicit settings with that gate, on every clip
    explicit = ["--verify", "meaning", "--gate-upload", repr(frugal["gate_upload"]),
                "--gate-verify", repr(frugal["gate_verify"]), "--k", "6", "--threshold", repr(frugal["threshold"])]
    for wav in sorted(clips.glob("*.wav"))[:3]:
        by_preset = _record(str(wav), "--presets", str(out), "--preset", "frugal")
        by_hand = _record(str(wav), "--presets", str(out), *explicit)
        assert {k: by_preset[k] for k in SAME} == {k: by_hand[k] for k in SAME}
        assert by_preset["settings"]["gate"] == by_hand["settings"]["gate"] == gate_id(gate)
        for key in ("gate_upload", "gate_verify"):
            assert by_preset["settings"][key] == frugal[key]


def test_the_fitted_gate_falls_back_for_another_instruction(calibrated, clips):
    """The gate records the task it was fitted on: with another --instruction frugal decodes with the
    entropy gate at its threshold, token for token as --verify entropy (gate.active)."""
    out, _ = calibrated
    frugal = tomllib.loads(out.read_text(encoding="utf-8"))["frugal"]
    wav = str(sorted(clips.glob("*.wav"))[0])
    other = ["--instruction", "用一句话描述这段声音。", "--max-new-tokens", "16"]
    by_preset = _record(wav, "--presets", str(out), "--preset", "frugal", *other)
    entropy = _record(wav, "--presets", str(out), "--verify", "entropy", "--k", "6",
                      "--threshold", repr(frugal["threshold"]), *other)
    assert {k: by_preset[k] for k in SAME} == {k: entropy[k] for k in SAME}


def test_the_report_says_what_the_presets_file_says(calibrated):
    """`calibrate --report` (what the docs tables about a calibration are drawn from) against an
    independent reading of the same run: the presets file, parsed as TOML for the chosen settings
    and read from its comments for their scores (written to 1 and 3 decimals)."""
    from cli_helpers import report_matches_presets

    out, _ = calibrated
    text = out.read_text(encoding="utf-8")
    report = json.loads(out.with_name("report.json").read_text(encoding="utf-8"))
    assert (report["n_calib"], report["n_check"]) == (3, 3) and "clips: 6 from" in text
    report_matches_presets(report, text)
    # what the rule computed: every swept setting's bounds on both halves, each preset's verdicts
    spec = [s for s in report["settings"] if s["mode"] == "spec" and s["gap"] is not None]
    assert {s["name"] for s in report["settings"] if s["chosen"]} <= {s["name"] for s in spec}
    for s in spec:
        for half in ("calibration", "check"):
            b = s["gap"][half]
            assert b["lower"] == pytest.approx(b["adjusted"] - b["z"] * b["se"]) and b["se"] > 0
    for c in [*report["choices"], report["gate"]]:
        assert c["margin"] == 1.0 and c["z"] >= 1.0 and c["chains"]
        assert set(c["accepted"]) <= {n for chain in c["chains"] for n in chain}
        assert c["met"] is (c["setting"] in c["confirmed"]) or c.get("taken_from") is not None
        assert not c["confirmed"] or c["proposed"] in c["accepted"]


@pytest.mark.parametrize("where", ["a folder", "the --out file"])
def test_a_bad_report_path_is_a_one_line_error_before_loading(tmp_path, clips, where):
    out = tmp_path / "p.toml"
    report = tmp_path if where == "a folder" else out
    result = invoke("calibrate", str(clips), "--out", str(out), "--report", str(report), "--edge", str(tmp_path / "none"))
    assert result.exit_code == 2, result.output
    err = result.stderr.strip()
    assert f"--report {report} must be a .json file path" in err and "\n" not in err and "Traceback" not in err
    assert not out.exists()


def test_an_unwritable_report_is_a_one_line_error(tmp_path, clips):
    """Checked before the models load as far as a path can be; a folder that cannot be made is
    found when the report is written, after the presets file, and said in one line."""
    (tmp_path / "file").write_text("", encoding="utf-8")
    report = tmp_path / "file" / "report.json"
    result = invoke("calibrate", str(clips), "--out", str(tmp_path / "p.toml"), "--ks", "6", "--percentiles", "50",
                    "--no-gate", "--limit", "2", "--report", str(report))
    assert result.exit_code == 2, result.output
    err = result.stderr.strip().splitlines()[-1]
    assert err.startswith(f"error: cannot write {report}") and "Traceback" not in result.output
    assert not report.exists()


def test_no_gate_writes_no_gate_table(tmp_path, clips):
    out = tmp_path / "p.toml"
    result = invoke("calibrate", str(clips), "--out", str(out), *FAST, "--no-gate", "--limit", "4")
    assert result.exit_code == 0, result.stderr
    data = tomllib.loads(out.read_text(encoding="utf-8"))
    assert set(data) == {"quality", "fluent"}
    assert "frugal" not in result.stdout and "meaning gate" not in out.read_text(encoding="utf-8")
    assert not math.isnan(data["fluent"]["threshold"])


def test_margin_is_the_objectives_z_for_every_preset(tmp_path, clips, monkeypatch):
    """`--margin Z` reaches the objective (calibration_objective.select) as z for quality, fluent
    and frugal, once each, with the check half, and the written presets say how they were chosen;
    within 100 points every setting qualifies at z = 0, so frugal is written. A negative margin is
    refused in one line."""
    import specdec_cli.calibrate as calibration

    seen = []

    def recording(candidates, reference, points, z=1.0, **kw):
        seen.append((points, z, kw["check"] is not None))
        return select(candidates, reference, points, z=z, **kw)

    monkeypatch.setattr(calibration, "select", recording)
    out = tmp_path / "p.toml"
    result = invoke("calibrate", str(clips), "--out", str(out), *FAST, "--margin", "0", "--frugal-points", "100")
    assert result.exit_code == 0, result.stderr
    assert seen == [(1.0, 0.0, True), (3.0, 0.0, True), (100.0, 0.0, True)]
    assert "--margin 0: the plain rule" in result.stdout
    text = out.read_text(encoding="utf-8")
    assert "[frugal]" in text and text.count("(specdec calibrate --margin 0)") == 3
    bad = invoke("calibrate", str(clips), "--out", str(tmp_path / "q.toml"), *FAST, "--margin", "-1")
    assert bad.exit_code == 2 and "Traceback" not in bad.output
