"""The `specdec` command: describe, presets, --version, error mapping, through CliRunner and through
the installed console script."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
from cli_helpers import FAST, bad_corpus, run_specdec, subprocess_env, write_clip
from typer.testing import CliRunner

from specdec_cli import __version__
from specdec_cli.commands.app import app
from specdec_cli.describe import Describer
from specdec_cli.records import RECORD_FIELDS

# The tiny saved model pair and the `models` options, shared by the whole session.
pytest_plugins = ["cli_fixtures"]

DESCRIBE = [*FAST, "--no-live"]


def invoke(*args: str, env: dict | None = None):
    return CliRunner().invoke(app, list(args), env=env)


@pytest.fixture(scope="module")
def clip_path(tmp_path_factory) -> Path:
    return write_clip(tmp_path_factory.mktemp("clips") / "clip.wav", seconds=1.0)


def describe_json(clip: Path, models: list[str], *extra: str) -> dict:
    result = invoke("describe", str(clip), "--json", *models, *DESCRIBE, *extra)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


# -- version, presets ---------------------------------------------------------------------------

def test_version():
    result = invoke("--version")
    assert result.exit_code == 0 and result.stdout.strip() == f"specdec {__version__}"


def test_presets_lists_configs(tmp_path, monkeypatch):
    monkeypatch.setattr("specdec_cli.models.DEMO_DIR", tmp_path)  # whatever presets the demo pair ships
    result = invoke("presets")
    assert result.exit_code == 0
    for text in ("fluent", "quality", "5.75", "3.25", "configs/fluent.toml", "configs/quality.toml"):
        assert text in result.stdout


def test_presets_shows_the_model_folder_override(tmp_path):
    (tmp_path / "specdec_presets.toml").write_text('[fluent]\nthreshold = 2.5\n[never]\nthreshold = inf\n')
    result = invoke("presets", "--edge", str(tmp_path), "--json")
    data = json.loads(result.stdout)
    assert data["fluent"]["threshold"] == 2.5 and data["fluent"]["k"] == 4  # k still from configs/
    assert data["fluent"]["source"].endswith("specdec_presets.toml")
    assert data["never"]["threshold"] == "inf"
    table = invoke("presets", "--edge", str(tmp_path), env={"COLUMNS": "200"}).stdout
    assert "over configs/fluent.toml" in table and "never" in table


# -- describe -----------------------------------------------------------------------------------

def test_describe_prints_the_sentence_and_a_summary(clip_path, models):
    """Off a terminal (CliRunner) the panel comes only when asked; --quiet prints the sentence alone."""
    result = invoke("describe", str(clip_path), *models, *DESCRIBE, "--panel")
    assert result.exit_code == 0, result.output
    sentence = result.stdout.rstrip("\n")
    assert sentence and "Traceback" not in result.output
    assert "cloud calls" in result.stderr and "description" in result.stderr  # the summary panel
    plain = invoke("describe", str(clip_path), *models, *DESCRIBE)
    assert plain.stdout == result.stdout and "cloud calls" not in plain.stderr
    quiet = invoke("describe", str(clip_path), *models, *DESCRIBE, "--quiet", "--trace", "--panel")
    assert quiet.stdout == result.stdout and quiet.stderr == ""


def test_describe_json_is_one_record_on_stdout(clip_path, models):
    record = describe_json(clip_path, models)
    assert list(record)[: len(RECORD_FIELDS)] == list(RECORD_FIELDS)
    assert record["file"] == str(clip_path) and record["error"] is None
    assert isinstance(record["description"], str) and record["tokens"] >= 1
    assert (record["mode"], record["preset"], record["threshold"], record["k"]) == ("spec", "fluent", 5.75, 4)


def test_preset_precedence_configs_then_model_folder_then_flags(tmp_path, clip_path, tiny_pair):
    edge = tmp_path / "edge"
    shutil.copytree(tiny_pair[0], edge)
    (edge / "specdec_presets.toml").write_text('[quality]\nthreshold = 99.0\n')
    models_ = ["--edge", str(edge), "--cloud", tiny_pair[1]]
    record = describe_json(clip_path, models_, "--preset", "quality")
    assert (record["threshold"], record["k"], record["preset"]) == (99.0, 6, "quality")  # folder < configs k
    record = describe_json(clip_path, models_, "--preset", "quality", "--k", "2")
    assert (record["threshold"], record["k"]) == (99.0, 2)  # only the flag given overrides
    record = describe_json(clip_path, models_, "--preset", "quality", "--threshold", "inf")
    assert record["threshold"] == "inf" and record["cloud_calls"] == 0


def test_verify_always_checks_every_block(clip_path, models):
    record = describe_json(clip_path, models, "--verify", "always", "--k", "3")
    assert record["verify"] == "always" and record["cloud_calls"] == record["escalations"] >= 1


@pytest.mark.parametrize("mode", ["edge", "cloud"])
def test_single_model_modes(clip_path, models, mode):
    record = describe_json(clip_path, models, "--mode", mode)
    assert record["mode"] == mode and record["preset"] is None and record["k"] is None


def test_sampling_constraints_and_modelled_latency(clip_path, models):
    record = describe_json(clip_path, models, "--sample", "--seed", "3", "--constraints", "off",
                           "--uncertainty", "max", "--cloud-rtt-ms", "100")
    expected = record["latency_s"] + record["cloud_calls"] * 0.1
    assert record["latency_modelled_s"] == pytest.approx(expected) and record["cloud_rtt_ms"] == 100


def test_plot_calls_plot_trace(clip_path, models, tmp_path, monkeypatch):
    calls = []
    fake = types.ModuleType("specdec_cli.commands.plots")
    fake.require_matplotlib = lambda: None
    fake.plot_trace = lambda events, threshold, path, tokenizer=None: calls.append((events, threshold, path)) or path
    monkeypatch.setitem(sys.modules, "specdec_cli.commands.plots", fake)
    monkeypatch.setattr("specdec_cli.commands.plots", fake, raising=False)
    result = invoke("describe", str(clip_path), *models, *DESCRIBE, "--plot", str(tmp_path / "t.png"), "--threshold", "7")
    assert result.exit_code == 0, result.output
    (events, threshold, path), = calls
    assert events and threshold == 7.0 and path == tmp_path / "t.png"


def test_plot_without_matplotlib_is_a_one_line_input_error(clip_path, models, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    monkeypatch.delitem(sys.modules, "specdec_cli.commands.plots", raising=False)
    result = invoke("describe", str(clip_path), *models, *DESCRIBE, "--plot", str(tmp_path / "t.png"))
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: plotting needs matplotlib: pip install 'specdec-omni[plot]'"


def test_plot_draws_a_real_trace(clip_path, models, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "trace.png"
    result = invoke("describe", str(clip_path), *models, *DESCRIBE, "--plot", str(out), "--threshold", "12")
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "trace plot" in result.stderr


def test_plot_needs_spec_mode(clip_path, models, tmp_path):
    result = invoke("describe", str(clip_path), *models, *DESCRIBE, "--mode", "edge", "--plot", str(tmp_path / "t.png"))
    assert result.exit_code == 2 and "--mode spec" in result.stderr


# -- bad input and errors: one line on stderr, the right exit code ------------------------------

def assert_one_line_error(result, code: int, phrase: str) -> None:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    err = result.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err and phrase in err, err
    assert result.stdout == ""


@pytest.mark.parametrize("kind", ["empty", "not_audio", "too_short", "nan", "inf", "too_long", "silent", "no_samples"])
def test_bad_files(tmp_path, models, kind):
    path, phrase = bad_corpus(tmp_path)[kind]
    assert_one_line_error(invoke("describe", str(path), *models, *DESCRIBE, "--json"), 2, phrase)


def test_missing_file_and_directory(tmp_path, models):
    assert_one_line_error(invoke("describe", str(tmp_path / "nope.wav"), *models), 2, "no such file")
    assert_one_line_error(invoke("describe", str(tmp_path), *models), 2, "is a directory")


def test_accepts_stereo_44k_non_ascii(tmp_path, models):
    path = write_clip(tmp_path / "女声 stereo.flac", seconds=0.5, sr=44100, channels=2)
    record = describe_json(path, models)
    assert record["file"] == str(path) and record["audio_s"] == pytest.approx(0.5, abs=0.01)


@pytest.mark.parametrize(
    ("args", "phrase"),
    [(["--threshold", "nan"], "threshold"), (["--threshold", "-1"], "threshold"),
     (["--preset", "nope"], "unknown preset 'nope'"), (["--dtype", "float8"], "unknown dtype 'float8'")],
)
def test_bad_options(clip_path, models, args, phrase):
    assert_one_line_error(invoke("describe", str(clip_path), *models, *args), 2, phrase)


def test_usage_errors_exit_2(clip_path, models):
    assert invoke("describe", str(clip_path), *models, "--k", "0").exit_code == 2
    assert invoke("describe", str(clip_path), "--mode", "fast").exit_code == 2


def test_a_model_that_fails_to_load(tmp_path, clip_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    result = invoke("describe", str(clip_path), "--edge", str(broken), "--cloud", str(broken))
    assert_one_line_error(result, 1, str(broken))


def test_missing_demo_pair_is_a_runtime_error(clip_path, tmp_path, monkeypatch):
    monkeypatch.setattr("specdec_cli.models.DEMO_DIR", tmp_path / "models")
    assert_one_line_error(invoke("describe", str(clip_path), *DESCRIBE), 1, "bundled demo models are missing")


def test_unexpected_errors_are_one_line_unless_debugging(clip_path, models, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("boom\nmore detail")

    monkeypatch.setattr(Describer, "run", boom)
    result = invoke("describe", str(clip_path), *models, *DESCRIBE)
    assert_one_line_error(result, 1, "unexpected RuntimeError: boom")
    result = invoke("describe", str(clip_path), *models, *DESCRIBE, env={"SPECDEC_DEBUG": "1"})
    assert result.exit_code == 1 and "Traceback" in result.stderr


def test_keyboard_interrupt_exits_130(clip_path, models, monkeypatch):
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(Describer, "run", interrupt)
    result = invoke("describe", str(clip_path), *models, *DESCRIBE)
    # Issue 36: Ctrl-C says what was done and what was not.
    assert result.exit_code == 130 and result.stderr.strip() == (
        f"interrupted: 0 clips described and 0 failed before Ctrl-C (their lines are above); 1 of 1 clip not "
        f"finished, from {clip_path}")


# -- the installed command, in a real process ---------------------------------------------------

def test_installed_command_json(clip_path, models):
    proc = run_specdec("describe", str(clip_path), "--json", *models, *FAST)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)  # exactly one JSON object, nothing else on stdout
    assert proc.stdout.count("\n") == 1 and record["error"] is None
    assert "Traceback" not in proc.stderr and "Loading weights" not in proc.stderr


def test_installed_command_errors(tmp_path, models):
    path, _ = bad_corpus(tmp_path)["not_audio"]
    proc = run_specdec("describe", str(path), "--json", *models, *FAST)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("error: cannot decode") and proc.stderr.count("\n") == 1


def test_python_dash_m():
    proc = subprocess.run([sys.executable, "-m", "specdec_cli", "--version"], capture_output=True, text=True,
                          env=subprocess_env(), timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == f"specdec {__version__}"


# Runs in a child interpreter: `--threads` changes process-wide torch state and `models.threads_pinned`,
# which must not leak into the rest of the session. The child starts at 2 threads, so 3 can only come from --threads; a tiny pair would otherwise be reset to 1 (one_thread_if_tiny).
THREADS_PROBE = """
import sys, torch
from typer.testing import CliRunner
from specdec_cli.commands.app import app
from specdec_cli import models
torch.set_num_threads(2)
before = torch.get_num_threads()
result = CliRunner().invoke(app, sys.argv[1:])
print(before, torch.get_num_threads(), models.threads_pinned, result.exit_code)
"""


def _threads_probe(*args: str) -> tuple[int, int, bool, int]:
    out = subprocess.run([sys.executable, "-c", THREADS_PROBE, *args], capture_output=True, text=True,
                         env=subprocess_env(), timeout=300, check=True).stdout.split()
    return int(out[0]), int(out[1]), out[2] == "True", int(out[3])


def test_threads_option_sets_torch_threads(clip_path, models):
    """--threads N sets torch's thread count and pins it: a tiny pair keeps N (without the option
    the same describe drops to 1 thread). Checked in a child interpreter that starts at 2 threads."""
    assert _threads_probe("--threads", "3", "describe", str(clip_path), *models, *DESCRIBE) == (2, 3, True, 0)
    assert _threads_probe("describe", str(clip_path), *models, *DESCRIBE) == (2, 1, False, 0)
    refused = run_specdec("--threads", "0", "presets")
    assert refused.returncode == 2 and "--threads" in refused.stderr and "Traceback" not in refused.stderr
