"""The command line as a user expects it (issue 29, item 3), each point through a real `specdec`
process: several clips in one describe, --json as data only, no wrapping off a terminal, tables on
stdout, `--out -`, calibrate's --overwrite, plain words for a wrong model path, a port in use and a
settings mismatch, Ctrl-C's message (test_batch), progress lines at a bounded rate, the warning
below 16 kHz, the folder probe (test_batch), and global options after the command."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest
from cli_helpers import FAST, run_specdec, specdec_exe, subprocess_env, write_clip

pytestmark = pytest.mark.spawns
ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "samples"
N = len(list(SAMPLES.glob("*.wav")))  # the bundled clips (10 since demo pair v5)


def specdec(*args: str, **kw) -> subprocess.CompletedProcess:
    """The installed command, one torch thread (given first: the old CLI took it only there)."""
    return run_specdec("--threads", "1", *args, **kw)


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("clips")
    for i in range(3):
        write_clip(folder / f"c{i}.wav", seconds=0.6, seed=i)
    return folder


def test_describe_takes_several_clips_one_record_each(clips):
    files = sorted(str(p) for p in clips.glob("*.wav"))
    done = specdec("describe", *files, "--json", *FAST)
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]  # JSON Lines
    assert [r["file"] for r in records] == files
    single = json.loads(specdec("describe", files[1], "--json", *FAST).stdout)
    timing = ("latency_s", "tokens_per_s")
    assert {k: v for k, v in records[1].items() if k not in timing} == \
        {k: v for k, v in single.items() if k not in timing}
    plain = specdec("describe", *files, *FAST)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.splitlines() == [f"{f}: {r['description']}" for f, r in zip(files, records, strict=True)]


def test_json_is_data_only_and_global_options_follow_the_command(clips):
    """--json: nothing drawn (no panel, no trace) even when asked for the live view's terminal;
    `--threads 1` after the command is the global option."""
    done = subprocess.run([specdec_exe(), "describe", str(clips / "c0.wav"), "--json", *FAST, "--threads", "1"],
                          capture_output=True, text=True, env={**subprocess_env(), "FORCE_COLOR": "1",
                                                               "TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1"})
    assert done.returncode == 0, done.stderr
    json.loads(done.stdout)
    assert "cloud calls" not in done.stderr and "trace ·" not in done.stderr and "╭" not in done.stderr


def test_off_a_terminal_lines_never_wrap(tmp_path):
    """A results path longer than 80 columns stays on one line in the summary."""
    deep = tmp_path / ("长的文件夹名字" * 6) / "结果 1.jsonl"
    done = specdec("batch", str(SAMPLES), "--out", str(deep), "--mode", "edge", *FAST)
    assert done.returncode == 0, done.stderr
    assert any(line.endswith(str(deep)) and line.startswith(f"batch: {N} ok") for line in done.stderr.splitlines())


def test_batch_out_dash_writes_records_to_stdout(tmp_path):
    done = specdec("batch", str(SAMPLES), "--out", "-", "--mode", "edge", *FAST, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(records) == N and all(r["error"] is None for r in records)
    assert not (tmp_path / "-").exists()
    assert "ignored 1 file that is not audio (labels.jsonl)" in done.stderr


def test_progress_lines_off_a_terminal_at_a_bounded_rate(tmp_path):
    def lines(every: str) -> list[str]:
        done = subprocess.run([specdec_exe(), "--threads", "1", "batch", str(SAMPLES), "--out", str(tmp_path / f"{every}.jsonl"),
                               "--mode", "edge", *FAST, "--batch-size", "1"], capture_output=True, text=True,
                              env={**subprocess_env(), "SPECDEC_PROGRESS_S": every}, timeout=300)
        assert done.returncode == 0, done.stderr
        return [line for line in done.stderr.splitlines() if line.startswith("batch: ") and f"/{N} clips" in line]

    every = lines("0")  # no bound: one line per clip
    assert [line.split()[1] for line in every] == [f"{i}/{N}" for i in range(1, N + 1)]
    bounded = lines("3600")  # at most one an hour: the first clip, and the last
    assert [line.split()[1] for line in bounded] == ["1/" + str(N), f"{N}/{N}"]


def test_eval_prints_its_tables_on_stdout(tmp_path):
    done = specdec("eval", str(SAMPLES), "--modes", "edge", "--limit", "2", *FAST, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "quality · 2 clips" in done.stdout and "quality · 2 clips" not in done.stderr


def test_calibrate_refuses_to_overwrite_without_overwrite(tmp_path):
    out = tmp_path / "p.toml"
    out.write_text("# mine\n")
    done = specdec("calibrate", str(SAMPLES), "--out", str(out))
    assert done.returncode == 2
    assert done.stderr == f"error: {out} exists; add --overwrite to replace it, or give another --out\n"
    assert out.read_text() == "# mine\n"


@pytest.mark.parametrize("given, words", [
    ("./models/edge", "no such edge folder: ./models/edge; check the path"),
    ("/nowhere/edge", "no such edge folder: /nowhere/edge; check the path"),
])
def test_a_wrong_model_path_in_plain_words(given, words):
    done = specdec("describe", str(SAMPLES / "m_slow_low.wav"), "--edge", given)
    assert done.returncode == 1 and "Repo id" not in done.stderr
    assert done.stderr.startswith(f"error: {words}") and done.stderr.count("\n") == 1


def test_a_folder_without_a_checkpoint_in_plain_words(tmp_path):
    done = specdec("describe", str(SAMPLES / "m_slow_low.wav"), "--cloud", str(tmp_path))
    assert done.returncode == 1
    assert done.stderr.startswith(f"error: the cloud folder {tmp_path} holds no config.json")


def test_serve_on_a_port_in_use_says_so():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = specdec("serve", "--port", str(port), timeout=120)
    assert done.returncode == 2
    assert done.stderr == (f"error: port {port} on 127.0.0.1 is already in use (another specdec serve?); stop it, "
                           "give another --port, or --port 0 for any free one\n")


def test_a_clip_below_16_khz_gets_a_one_line_warning(tmp_path):
    low = write_clip(tmp_path / "low.wav", sr=8000)
    done = specdec("describe", str(low), *FAST)
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [f"warning: {low} is recorded at 8000 Hz, below the models' 16000 Hz: it is upsampled, "
                        "which adds no detail, and the description may differ from a recording at the full rate"]
    full = specdec("describe", str(write_clip(tmp_path / "full.wav")), *FAST)
    assert "warning:" not in full.stderr


def test_a_remote_cloud_is_asked_who_it_is_once_per_run(tmp_path, monkeypatch):
    """Settings are resolved once per run: one /health for a batch against a `specdec serve`
    (it was three: the results file's settings, the session's, the loader's)."""
    from remote_helpers import Server
    from typer.testing import CliRunner

    from specdec_cli.commands.app import app
    from specdec_cli.remote.client import RemoteClient

    asked: list[str] = []
    real = RemoteClient.health
    monkeypatch.setattr(RemoteClient, "health", lambda self: asked.append(self.url) or real(self))
    with Server() as server:
        result = CliRunner().invoke(app, ["batch", str(SAMPLES), "--out", str(tmp_path / "r.jsonl"), "--cloud",
                                          server.url, "--mode", "cloud", *FAST])
    assert result.exit_code == 0, result.output
    assert asked == [server.url]
    records = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(records) == N and all(r["error"] is None and r["cloud_url"] == server.url for r in records)


def test_commands_that_load_models_share_their_options_word_for_word():
    """Item 2: the model, device, dtype, prompt and sampling options of describe, batch, eval and
    calibrate are one declaration: the same names, the same help; --cloud names a server URL."""
    import typer.main

    from specdec_cli.commands.app import app

    group = typer.main.get_command(app)
    shared = ("edge", "cloud", "device", "edge_device", "cloud_device", "dtype", "instruction", "system", "sample",
              "seed", "temperature", "top_p", "top_k", "max_new_tokens")
    helps = {}
    for name in ("describe", "batch", "eval", "calibrate"):
        params = {p.name: p for p in group.commands[name].params}
        assert set(shared) <= set(params), (name, set(shared) - set(params))
        helps[name] = {s: (params[s].opts, params[s].secondary_opts, params[s].help) for s in shared}
    assert helps["batch"] == helps["describe"] == helps["eval"] == helps["calibrate"]
    assert "http://HOST:PORT" in helps["eval"]["cloud"][2]


def test_describe_goes_on_past_a_failed_clip_and_exits_1(clips, tmp_path):
    """Several clips: one that fails gets its line on stderr (and its error record with --json),
    the others are described; exit 1 says not all went well."""
    silent = write_clip(tmp_path / "silent.wav", amplitude=0.0)
    good = str(clips / "c0.wav")
    done = specdec("describe", good, str(silent), "--json", *FAST)
    assert done.returncode == 1
    first, second = (json.loads(line) for line in done.stdout.splitlines())
    assert first["file"] == good and first["error"] is None
    assert second["file"] == str(silent) and "silent" in second["error"] and second["description"] is None
    assert f"error: {silent} is silent" in done.stderr
    assert done.stderr.strip().splitlines()[-1] == "error: 1 of 2 clips failed (each said why above)"


def test_a_bare_name_that_is_no_folder_is_a_wrong_path_not_a_hub_id(tmp_path, monkeypatch):
    """Issue 44: Pair(edge="nope") spoke of the Hub (a Hub id not in the cache). A name without
    owner/ that is no folder here is a wrong path; an owner/name id still goes to the Hub check."""
    from specdec_cli.checkpoints import check_model
    from specdec_cli.errors import ModelError

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub reads the variable once, at import: whether it was set before the first
    # import depended on test order, so the constant itself is set too.
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    with pytest.raises(ModelError) as info:
        check_model("nope", "edge")
    assert str(info.value) == ("no such edge folder: nope; check the path (or give a Hub id such as "
                               "Qwen/Qwen2.5-Omni-3B)")
    with pytest.raises(ModelError, match="Hub id that is not in the local cache"):
        check_model("someone/not-cached-here", "edge")
