"""`specdec batch --batch-size N` and `specdec calibrate --batch-size N` (issue 20): the same records
as one clip at a time (oracle: the --batch-size 1 run of the same command), written as each clip
ends, resumable, safe to kill; a bad clip or an engine failure costs only its own record."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest
from cli_helpers import run_specdec, specdec_exe, subprocess_env, write_clip
from test_batch import lines, signal_after
from typer.testing import CliRunner

from specdec_cli.commands.app import app
from specdec_cli.results import read_records
from specdec_cli.writer_lock import lock_path

pytest_plugins = ["cli_fixtures"]

FAST = ["--max-new-tokens", "12"]
TIMING = {"latency_s", "tokens_per_s"}  # a batched clip's wall time includes the other rows' work


def by_file(path: Path) -> dict[str, dict]:
    return {Path(r["file"]).name: {k: v for k, v in r.items() if k not in TIMING} for r in read_records(path)}


@pytest.fixture()
def clips(tmp_path) -> Path:
    root = tmp_path / "clips"
    for i in range(7):  # different lengths: different prompts, rows ending at different blocks
        write_clip(root / f"c{i}.wav", seconds=0.5 + 0.15 * i, seed=i)
    (root / "broken.wav").write_text("not audio\n" * 10)
    return root


@pytest.mark.parametrize("mode", [["--verify", "always"], ["--mode", "cloud"], ["--mode", "edge"]],
                         ids=["spec", "cloud", "edge"])
def test_batched_records_equal_one_at_a_time(tmp_path, clips, models, mode):
    one, many = tmp_path / "one.jsonl", tmp_path / "many.jsonl"
    for out, size in ((one, "1"), (many, "3")):
        result = CliRunner().invoke(app, ["batch", str(clips), "--out", str(out), "--batch-size", size,
                                          *mode, *models, *FAST])
        assert result.exit_code == 1, result.output  # broken.wav failed; the batch finished and says so
    a, b = by_file(one), by_file(many)
    assert set(a) == set(b) and len(a) == 8
    assert a == b  # descriptions, tokens, cloud work, errors: all but the clock
    assert "cannot decode" in b["broken.wav"]["error"]
    work = "edge_forwards" if mode[-1] == "edge" else "cloud_calls"
    assert sum(r[work] for r in b.values() if r["error"] is None) > 0


def test_batched_run_resumes_and_skips_what_is_recorded(tmp_path, clips, models):
    out = tmp_path / "r.jsonl"
    args = ["batch", str(clips), "--out", str(out), "--batch-size", "4", *models, *FAST]
    CliRunner().invoke(app, args)
    first = read_records(out)
    write_clip(clips / "late.wav", seconds=0.8, seed=9)
    result = CliRunner().invoke(app, args)
    assert "7 skipped" in result.stderr  # the 7 good clips; broken.wav is retried
    again = read_records(out)
    assert [r["file"] for r in again[:7]] == [r["file"] for r in first if r["error"] is None]
    assert sorted(Path(r["file"]).name for r in again) == sorted([*(p.name for p in clips.iterdir())])


def test_an_engine_failure_falls_back_to_one_at_a_time_for_the_rows_in_flight(tmp_path, clips, models, monkeypatch):
    """A forward that fails for the whole batch cannot be pinned on a row: the clips in flight are
    described alone, the rest go on batched; every clip gets exactly one record."""
    import specdec_cli.decoding.batch_loop as batch_loop

    real = batch_loop.speculative_decode_batch
    calls = []

    def failing_once(*args, **kwargs):
        calls.append(1)
        engine = real(*args, **kwargs)
        if len(calls) == 1:
            yield next(engine)
            raise RuntimeError("a shared forward failed")
        yield from engine

    monkeypatch.setattr(batch_loop, "speculative_decode_batch", failing_once)
    out = tmp_path / "r.jsonl"
    result = CliRunner().invoke(app, ["batch", str(clips), "--out", str(out), "--batch-size", "3", *models, *FAST])
    assert result.exit_code == 1, result.output
    records = by_file(out)
    assert len(read_records(out)) == len(records) == 8 and len(calls) == 2
    assert [name for name, r in records.items() if r["error"] is not None] == ["broken.wav"]


def test_batched_run_killed_resumes_complete_without_duplicates(tmp_path, models):
    clips = tmp_path / "clips"
    n = 16
    for i in range(n):
        write_clip(clips / f"clip_{i:02d}.wav", seconds=0.6 + 0.05 * i, seed=i)
    out = tmp_path / "results.jsonl"
    args = ["batch", str(clips), "--out", str(out), "--batch-size", "4", *models, *FAST]
    specdec_exe()
    # The real command in its own process, gated after each record it appends (test_batch.signal_after):
    # killed with exactly 3 records written, however loaded the machine.
    killed = signal_after(args, out, 3, signal.SIGKILL)
    assert killed.returncode == -signal.SIGKILL
    after_kill = read_records(out)
    assert len(after_kill) == 3
    resumed = subprocess.run([specdec_exe(), *args], capture_output=True, text=True, env=subprocess_env(), timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{len(after_kill)} skipped" in resumed.stderr
    final = lines(out)
    files = [r["file"] for r in final]
    assert len(files) == n and len(set(files)) == n and all(r["error"] is None for r in final)
    assert files[:len(after_kill)] == [r["file"] for r in after_kill]
    assert not lock_path(out).exists()


def test_calibrate_batched_writes_the_same_presets(tmp_path, models):
    clips = tmp_path / "clips"
    for i in range(4):
        write_clip(clips / f"c{i}.wav", seconds=0.6 + 0.2 * i, seed=i)
    texts = []
    for size in ("1", "3"):
        out = tmp_path / f"presets{size}.toml"
        result = run_specdec("calibrate", str(clips), "--out", str(out), "--batch-size", size, *models,
                             "--ks", "2", "--max-new-tokens", "8", timeout=600)
        assert result.returncode == 0, result.stderr
        # The header says when and how long; the presets and every measured figure must be equal.
        texts.append([line for line in out.read_text(encoding="utf-8").splitlines()
                      if not any(w in line for w in ("Presets written by", "decodes in"))])
    assert texts[0] == texts[1]
    assert any("threshold" in line for line in texts[0])


def test_batch_size_must_be_positive(tmp_path, clips, models):
    result = CliRunner().invoke(app, ["batch", str(clips), "--out", str(tmp_path / "r.jsonl"), "--batch-size", "0",
                                      *models])
    assert result.exit_code == 2 and "batch-size" in result.output


def test_eval_batched_scores_equal_one_at_a_time():
    """`specdec eval --batch-size 4` on the bundled samples: every record's description and counters,
    and so every accuracy and cost figure, equal the --batch-size 1 run's (latencies aside)."""
    reports = []
    for size in ("1", "4"):
        result = CliRunner().invoke(app, ["eval", str(Path(__file__).resolve().parents[1] / "samples"),
                                          "--modes", "fluent,always", "--batch-size", size, "--json"])
        assert result.exit_code == 0, result.stderr
        reports.append(json.loads(result.stdout))
    one, four = reports
    assert four["settings"]["batch_size"] == 4
    drop = TIMING | {"latency_modelled_s", "modelled_latency_s"}
    assert ([{k: v for k, v in r.items() if k not in drop} for r in one["records"]]
            == [{k: v for k, v in r.items() if k not in drop} for r in four["records"]])
    for a, b in zip(one["modes"], four["modes"], strict=True):
        assert (a["accuracy"], a["cloud_calls"], a["cloud_work_tokens"]) == (b["accuracy"], b["cloud_calls"],
                                                                              b["cloud_work_tokens"])
