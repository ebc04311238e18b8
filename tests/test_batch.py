"""Batch runs: folder walk, the crash-safe results file, resume, and a real run killed with SIGKILL."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from cli_helpers import FAST, bad_corpus, run_specdec, specdec_exe, subprocess_env, write_clip
from typer.testing import CliRunner

from specdec_cli.batch import (
    ResultsFile,
    clip_key,
    dumps_record,
    find_audio,
    latest_by_clip,
    read_records,
    run_batch,
)
from specdec_cli.cli import app
from specdec_cli.errors import InputError

# The tiny saved model pair and the `models` options, shared by the whole session.
pytest_plugins = ["cli_fixtures"]

SUFFIXES = (".wav", ".flac", ".ogg")


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def ok(path: Path) -> dict:
    return {"file": str(path), "description": "说话人是女声。", "error": None}


def failed(path: Path, message: str) -> dict:
    return {"file": str(path), "description": None, "error": message}


# -- folder walk --------------------------------------------------------------------------------

def test_find_audio_filters_and_recurses(tmp_path):
    for name in ("b.wav", "a.FLAC", "c.ogg", "notes.txt", "sub/d.wav"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    assert [p.name for p in find_audio(tmp_path, SUFFIXES)] == ["a.FLAC", "b.wav", "c.ogg"]
    assert [p.name for p in find_audio(tmp_path, SUFFIXES, recursive=True)] == ["a.FLAC", "b.wav", "c.ogg", "d.wav"]


def test_find_audio_refusals(tmp_path):
    with pytest.raises(InputError, match="no such folder"):
        find_audio(tmp_path / "nope", SUFFIXES)
    (tmp_path / "f.wav").write_bytes(b"x")
    with pytest.raises(InputError, match="is a file"):
        find_audio(tmp_path / "f.wav", SUFFIXES)
    with pytest.raises(InputError, match="no audio files.*--recursive"):
        find_audio(tmp_path, (".mp3",))


# -- the results file ---------------------------------------------------------------------------

def test_reader_ignores_a_torn_last_line_and_garbage(tmp_path):
    out = tmp_path / "r.jsonl"
    good = dumps_record(ok(Path("a.wav"))) + "\n"
    out.write_bytes(good.encode() + b"not json\n" + b'[1, 2]\n' + dumps_record(ok(Path("b.wav"))).encode()[:20])
    assert [r["file"] for r in read_records(out)] == ["a.wav"]


def test_a_complete_last_line_without_newline_is_treated_as_torn(tmp_path):
    """A kill can stop a write right before its newline; the clip is then decoded again, never lost."""
    out = tmp_path / "r.jsonl"
    out.write_text(dumps_record(ok(Path("a.wav"))), encoding="utf-8")
    assert read_records(out) == []


def test_last_record_per_clip_wins(tmp_path):
    records = [failed(Path("a.wav"), "boom"), ok(Path("b.wav")), ok(Path("./a.wav"))]
    latest = latest_by_clip(records)
    assert list(latest) == [clip_key("b.wav"), clip_key("a.wav")]
    assert latest[clip_key("a.wav")]["error"] is None


def test_open_compacts_atomically(tmp_path):
    out = tmp_path / "r.jsonl"
    content = [ok(Path("a.wav")), failed(Path("b.wav"), "bad"), ok(Path("a.wav")), ok(Path("c.wav"))]
    out.write_text("".join(dumps_record(r) + "\n" for r in content) + '{"file": "d.w', encoding="utf-8")
    with ResultsFile(out) as results:
        assert results.done == {clip_key("a.wav"), clip_key("c.wav")}
    assert [r["file"] for r in lines(out)] == ["a.wav", "c.wav"]  # error, duplicate and torn line gone
    assert not (tmp_path / ".r.jsonl.tmp").exists()


def test_overwrite_starts_over(tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_text(dumps_record(ok(Path("a.wav"))) + "\n", encoding="utf-8")
    with ResultsFile(out, overwrite=True) as results:
        assert results.done == set()
    assert out.read_text() == ""


def test_records_are_strict_json_lines():
    line = dumps_record({"file": "说.wav", "threshold": float("inf"), "x": float("nan"), "n": [1.5]})
    assert json.loads(line) == {"file": "说.wav", "threshold": "inf", "x": None, "n": [1.5]}
    assert "\n" not in line and "说" in line


def test_run_batch_goes_on_after_a_failure_and_resume_retries_it(tmp_path):
    files = [tmp_path / f"{i}.wav" for i in range(4)]
    out = tmp_path / "r.jsonl"
    fail_once = {files[1]}

    def describe(path: Path) -> dict:
        if path in fail_once:
            raise InputError(f"{path} is silent")
        if path == files[2]:
            raise RuntimeError("unexpected\nsecond line")
        return ok(path)

    with ResultsFile(out) as results:
        summary = run_batch(files, results, describe, failed)
    assert (summary.ok, summary.failed, summary.skipped) == (2, 2, 0)
    assert [r["error"] for r in lines(out)] == [None, f"{files[1]} is silent", "RuntimeError: unexpected", None]

    fail_once.clear()
    seen = []
    with ResultsFile(out) as results:
        summary = run_batch(files, results, lambda p: seen.append(p) or ok(p), failed)
    assert seen == [files[1], files[2]]  # only the failed ones are retried
    assert (summary.ok, summary.failed, summary.skipped) == (2, 0, 2)
    final = lines(out)
    assert sorted(r["file"] for r in final) == sorted(str(f) for f in files)  # one line per clip
    assert all(r["error"] is None for r in final)


def test_interrupt_keeps_what_was_recorded(tmp_path):
    files = [tmp_path / f"{i}.wav" for i in range(3)]
    out = tmp_path / "r.jsonl"

    def describe(path: Path) -> dict:
        if path == files[1]:
            raise KeyboardInterrupt
        return ok(path)

    with pytest.raises(KeyboardInterrupt), ResultsFile(out) as results:
        run_batch(files, results, describe, failed)
    assert [r["file"] for r in lines(out)] == [str(files[0])]


# -- through the CLI ----------------------------------------------------------------------------

def test_batch_cli_records_each_file_and_resumes(tmp_path, models):
    clips = tmp_path / "clips"
    for i, name in enumerate(["a.wav", "b.flac", "语音.ogg"]):
        write_clip(clips / name, seconds=0.6, seed=i)
    write_clip(clips / "silent.wav", amplitude=0.0)
    (clips / "readme.txt").write_text("not a clip")
    out = tmp_path / "results.jsonl"

    result = CliRunner().invoke(app, ["batch", str(clips), "--out", str(out), *models, *FAST])
    assert result.exit_code == 1, result.output  # a file failed: the batch finished, and says so
    assert "1 of 4 files failed" in result.stderr and "Traceback" not in result.output
    assert "3 ok" in result.stderr and "1 failed" in result.stderr
    records = lines(out)
    assert len(records) == 4
    by_name = {Path(r["file"]).name: r for r in records}
    assert by_name["silent.wav"]["description"] is None and "silent" in by_name["silent.wav"]["error"]
    assert all(isinstance(by_name[n]["description"], str) for n in ("a.wav", "b.flac", "语音.ogg"))
    assert result.stdout == ""  # batch writes data to --out only

    # Fix the bad clip; a rerun skips the three done and retries the failed one.
    write_clip(clips / "silent.wav", amplitude=0.2)
    result = CliRunner().invoke(app, ["batch", str(clips), "--out", str(out), *models, *FAST])
    assert result.exit_code == 0, result.output
    assert "3 skipped" in result.stderr
    records = lines(out)
    assert len(records) == 4 and all(r["error"] is None for r in records)

    result = CliRunner().invoke(app, ["batch", str(clips), "--out", str(out), "--overwrite", *models, *FAST])
    assert result.exit_code == 0 and len(lines(out)) == 4


def test_batch_cli_refuses_an_empty_folder(tmp_path, models):
    result = CliRunner().invoke(app, ["batch", str(tmp_path), "--out", str(tmp_path / "r.jsonl"), *models])
    assert result.exit_code == 2 and "no audio files" in result.stderr


def test_batch_subprocess_records_the_bad_corpus_without_tracebacks(tmp_path, models):
    corpus = bad_corpus(tmp_path / "bad")
    write_clip(tmp_path / "bad" / "good.wav", seconds=0.5)
    out = tmp_path / "r.jsonl"
    proc = run_specdec("batch", str(tmp_path / "bad"), "--out", str(out), *models, *FAST)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    records = {Path(r["file"]).name: r for r in lines(out)}
    assert len(records) == len(corpus) + 1
    assert records["good.wav"]["error"] is None
    for path, phrase in corpus.values():
        assert phrase in records[path.name]["error"], records[path.name]


def kill_when(cmd: list[str], out: Path, lines_at_least: int, sig: signal.Signals) -> subprocess.CompletedProcess:
    """Start a batch and send it `sig` as soon as the results file holds `lines_at_least` lines."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env())
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if out.exists() and out.read_bytes().count(b"\n") >= lines_at_least:
                break
            time.sleep(0.02)
    finally:
        if proc.poll() is None:
            proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def test_batch_interrupted_then_killed_resumes_complete_without_duplicates(tmp_path, models):
    """Ctrl-C (SIGINT), then SIGKILL, then a full run: every clip recorded once, nothing lost."""
    clips = tmp_path / "clips"
    n = 24
    for i in range(n):
        write_clip(clips / f"clip_{i:02d}.wav", seconds=1.0, seed=i)
    out = tmp_path / "results.jsonl"
    cmd = [specdec_exe(), "batch", str(clips), "--out", str(out), *models, "--max-new-tokens", "16"]

    interrupted = kill_when(cmd, out, 2, signal.SIGINT)
    assert interrupted.returncode == 130, interrupted.stderr
    assert interrupted.stderr.strip().endswith("interrupted") and "Traceback" not in interrupted.stderr
    after_int = read_records(out)
    assert 2 <= len(after_int) < n, "interrupted too late to test resuming"

    killed = kill_when(cmd, out, len(after_int) + 2, signal.SIGKILL)
    assert killed.returncode == -signal.SIGKILL
    after_kill = read_records(out)
    assert len(after_int) + 2 <= len(after_kill) < n, "killed too late to test resuming"
    assert [r["file"] for r in after_kill[: len(after_int)]] == [r["file"] for r in after_int]

    resumed = subprocess.run(cmd, capture_output=True, text=True, env=subprocess_env(), timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "Traceback" not in resumed.stderr and f"{len(after_kill)} skipped" in resumed.stderr
    final = lines(out)  # every line parses: no torn line left behind
    files = [r["file"] for r in final]
    assert len(files) == n and len(set(files)) == n  # complete, no clip recorded twice
    assert all(r["error"] is None for r in final)
    assert [r["file"] for r in final[: len(after_kill)]] == [r["file"] for r in after_kill]  # nothing lost
