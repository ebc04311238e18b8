"""Batch runs: folder walk, the crash-safe results file, resume, and a real run killed with SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import FAST, bad_corpus, run_specdec, specdec_exe, subprocess_env, write_clip
from typer.testing import CliRunner

from specdec_cli.commands.app import app
from specdec_cli.decoding.config import DecodingConfig
from specdec_cli.errors import InputError
from specdec_cli.records import RECORD_FIELDS
from specdec_cli.results import (
    ResultsFile,
    clip_key,
    dumps_record,
    find_audio,
    latest_by_clip,
    read_records,
    run_batch,
)
from specdec_cli.settings import RunSettings
from specdec_cli.writer_lock import lock_path

# The tiny saved model pair and the `models` options, shared by the whole session.
pytest_plugins = ["cli_fixtures"]



def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


SETTINGS = RunSettings.of(DecodingConfig(), "fluent", "hub/edge", "hub/cloud", "float32")


def record(path: Path, description: str | None, error: str | None, settings: RunSettings = SETTINGS) -> dict:
    return {**dict.fromkeys(RECORD_FIELDS), "file": str(path), "description": description, "error": error,
            "settings": settings.as_record()}


def ok(path: Path) -> dict:
    return record(path, "说话人是女声。", None)


def failed(path: Path, message: str) -> dict:
    return record(path, None, message)


# -- folder walk --------------------------------------------------------------------------------

def test_find_audio_takes_what_the_audio_library_reads_whatever_its_name(tmp_path):
    """Issue 29: files are probed by their header (soundfile), not picked by suffix: an Opus clip and
    audio without a suffix are taken; a text file is not, but one named .wav is (a broken clip is
    recorded as failed, not skipped unseen); dotfiles (._x.wav from macOS) are left out unless asked
    for, and all of it is said."""
    write_clip(tmp_path / "b.wav")
    write_clip(tmp_path / "a.FLAC")
    write_clip(tmp_path / "c.opus.ogg")
    import soundfile as sf
    from cli_helpers import tone

    sf.write(str(tmp_path / "e.opus"), tone(sr=48000), 48000, format="OGG", subtype="OPUS")
    sf.write(str(tmp_path / "noext"), tone(), 16000, format="WAV")
    (tmp_path / "notes.wav").write_text("not audio")
    (tmp_path / "readme.txt").write_text("x")
    (tmp_path / "data.bin").write_bytes(b"\0" * 100)
    write_clip(tmp_path / "._b.wav")
    write_clip(tmp_path / "sub" / "d.wav")
    write_clip(tmp_path / ".cache" / "x.wav")
    found = find_audio(tmp_path)
    assert [p.name for p in found.files] == ["a.FLAC", "b.wav", "c.opus.ogg", "e.opus", "noext", "notes.wav"]
    assert [p.name for p in found.ignored] == ["data.bin", "readme.txt"] and found.hidden == 1
    assert found.ignored_line() == ("ignored 2 files that are not audio (data.bin, readme.txt) and 1 dotfile "
                                    "(add --hidden to include it)")
    deep = find_audio(tmp_path, recursive=True)
    assert [p.name for p in deep.files] == ["a.FLAC", "b.wav", "c.opus.ogg", "e.opus", "noext", "notes.wav", "d.wav"]
    assert deep.hidden == 2
    every = find_audio(tmp_path, recursive=True, hidden=True)
    assert [p.relative_to(tmp_path).as_posix() for p in every.files] == [
        "._b.wav", ".cache/x.wav", "a.FLAC", "b.wav", "c.opus.ogg", "e.opus", "noext", "notes.wav", "sub/d.wav"]


def test_find_audio_refusals(tmp_path):
    with pytest.raises(InputError, match="no such folder"):
        find_audio(tmp_path / "nope")
    (tmp_path / "f.txt").write_bytes(b"x")
    with pytest.raises(InputError, match="is a file"):
        find_audio(tmp_path / "f.txt")
    with pytest.raises(InputError, match="no audio files.*--recursive"):
        find_audio(tmp_path)


# -- the results file ---------------------------------------------------------------------------

def test_reader_drops_only_a_torn_last_line_that_starts_like_ours(tmp_path):
    out = tmp_path / "r.jsonl"
    good = dumps_record(ok(Path("a.wav"))) + "\n"
    for torn in (dumps_record(ok(Path("b.wav")))[:20], '{"fi', "{", ""):
        out.write_text(good + "\n" + torn, encoding="utf-8")  # a blank line holds nothing: passed over
        assert [r["file"] for r in read_records(out)] == ["a.wav"], torn


OK_LINE = dumps_record(ok(Path("a.wav"))) + "\n"
OURS = OK_LINE.encode()
ALL_FIELDS_BUT_FILE = json.dumps({**ok(Path("x.wav")), "file": 3}).encode()
FOREIGN = {  # name: (file content, what the refusal says about which line)
    "garbage": (b'garbage\n{"file": 3}\n', "line 1 is not JSON ('garbage')"),
    "file only": (OURS + b'{"file": 3}\n', "line 2 is not a specdec record (no description, mode, preset, … field)"),
    "array": (OURS + b"[1, 2]\n", "line 2 is JSON but not a record (a list)"),
    "file not a path": (OURS + ALL_FIELDS_BUT_FILE + b"\n", "line 2 is not a specdec record (its file is 3, not a path)"),
    "not text": (OURS + b"\xff\xfe\n", "line 2 is not JSON"),
    "foreign last line": (OURS + b"a note", "line 2 ends without a newline and is not a specdec record ('a note')"),
}


@pytest.mark.parametrize("name", FOREIGN)
def test_a_file_with_lines_specdec_did_not_write_is_refused_unchanged(tmp_path, name):
    content, what = FOREIGN[name]
    out = tmp_path / "r.jsonl"
    out.write_bytes(content)
    with pytest.raises(InputError) as refused:
        ResultsFile(out, SETTINGS)
    message = refused.value.message
    assert message.startswith(f"{out} {what}"), message
    assert message.endswith(f"Give another --out, or add --overwrite to start over (the old file is then kept "
                            f"as {out}.bak)")
    assert "\n" not in message
    assert out.read_bytes() == content
    assert not lock_path(out).exists()  # the refused run let go of the file


def test_records_made_with_other_settings_are_refused_unchanged(tmp_path):
    out = tmp_path / "r.jsonl"
    cloud = RunSettings.of(DecodingConfig(mode="cloud"), None, "hub/edge", "hub/cloud", "float32")
    out.write_text(OK_LINE + dumps_record(record(Path("b.wav"), "说话人是男声。", None, cloud)) + "\n",
                   encoding="utf-8")
    before = out.read_bytes()
    with pytest.raises(InputError) as refused:
        ResultsFile(out, SETTINGS)
    assert refused.value.message.startswith(
        f"{out} line 2 was made with other settings (made with mode cloud, no preset, no threshold, no draft "
        "blocks, no verification, no uncertainty gate; this run has mode spec, preset fluent, threshold 5.5, "
        "blocks of k 4 tokens, verify entropy, uncertainty sum); the file was left as it is.")
    assert out.read_bytes() == before


def test_records_of_specdec_0_1_count_as_other_settings(tmp_path):
    out = tmp_path / "r.jsonl"
    old = {k: v for k, v in ok(Path("a.wav")).items() if k != "settings"}
    out.write_text(json.dumps(old) + "\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"line 1 carries no settings \(written before specdec 0.2\)"):
        ResultsFile(out, SETTINGS)


def test_settings_keep_only_what_can_change_the_sentence(tmp_path):
    """Cloud-only ignores the speculative knobs, greedy ignores the seed, dtype aliases and the
    same model folder named two ways are one setting; anything that can change the output differs."""
    def settings(cfg: DecodingConfig, preset: str | None = "fluent", edge: str = "hub/edge",
                 dtype: str = "float32") -> dict:
        return RunSettings.of(cfg, preset, edge, "hub/cloud", dtype).as_record()

    base = DecodingConfig()
    assert settings(base.with_(mode="cloud", threshold=1.0, k=6), "quality") == settings(base.with_(mode="cloud"))
    assert settings(base.with_(seed=7)) == settings(base)
    assert settings(base, dtype="fp32") == settings(base)
    (tmp_path / "edge").mkdir()
    assert settings(base, edge=str(tmp_path / "edge")) == settings(base, edge=os.path.relpath(tmp_path / "edge"))
    for changed in (base.with_(sample=True), base.with_(threshold=float("inf")), base.with_(constraints=False),
                    base.with_(max_new_tokens=12), base.with_(mode="edge")):
        assert settings(changed) != settings(base), changed
    assert settings(base.with_(sample=True, seed=1)) != settings(base.with_(sample=True))
    assert settings(base, "quality") != settings(base)


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
    with ResultsFile(out, SETTINGS) as results:
        assert results.done == {clip_key("a.wav"), clip_key("c.wav")}
    assert [r["file"] for r in lines(out)] == ["a.wav", "c.wav"]  # error, duplicate and torn line gone
    assert not (tmp_path / ".r.jsonl.tmp").exists()


def test_overwrite_starts_over_keeping_each_old_file_as_a_new_backup(tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_bytes(b"garbage\n")
    with ResultsFile(out, SETTINGS, overwrite=True) as results:
        assert results.done == set() and results.backup == tmp_path / "r.jsonl.bak"
    assert out.read_bytes() == b"" and (tmp_path / "r.jsonl.bak").read_bytes() == b"garbage\n"

    out.write_bytes(b"second\n")
    with ResultsFile(out, SETTINGS, overwrite=True) as results:
        assert results.backup == tmp_path / "r.jsonl.bak-2"
    assert (tmp_path / "r.jsonl.bak").read_bytes() == b"garbage\n"  # an old backup is never replaced
    assert (tmp_path / "r.jsonl.bak-2").read_bytes() == b"second\n"

    with ResultsFile(out, SETTINGS, overwrite=True) as results:
        assert results.backup is None  # an empty file holds nothing to keep


def test_overwrite_copies_the_old_file_where_hard_links_are_not_supported(tmp_path, monkeypatch):
    def no_links(src, dst):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    out = tmp_path / "r.jsonl"
    out.write_bytes(b"garbage\n")
    (tmp_path / "r.jsonl.bak").write_bytes(b"older\n")
    with ResultsFile(out, SETTINGS, overwrite=True) as results:
        assert results.backup == tmp_path / "r.jsonl.bak-2"
    assert (tmp_path / "r.jsonl.bak-2").read_bytes() == b"garbage\n" and out.read_bytes() == b""
    assert (tmp_path / "r.jsonl.bak").read_bytes() == b"older\n"


def test_one_writer_per_results_file(tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_text(OK_LINE, encoding="utf-8")
    with ResultsFile(out, SETTINGS):
        before = out.read_bytes()
        with pytest.raises(InputError) as refused:  # another open file description: flock refuses it too
            ResultsFile(out, SETTINGS, overwrite=True)
        assert refused.value.message == (f"{out} is being written by another specdec batch (pid {os.getpid()}); "
                                         "wait for it to finish, or give this run another --out")
        assert out.read_bytes() == before and not (tmp_path / "r.jsonl.bak").exists()
    with ResultsFile(out, SETTINGS) as results:  # let go on close
        assert results.done == {clip_key("a.wav")}
    assert not lock_path(out).exists()


def test_a_lock_file_left_by_a_dead_process_does_not_block(tmp_path):
    out = tmp_path / "r.jsonl"
    lock_path(out).write_text("999999\n")  # what a SIGKILLed run leaves: the file, with no lock held on it
    with ResultsFile(out, SETTINGS) as results:
        assert results.done == set()


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

    with ResultsFile(out, SETTINGS) as results:
        summary = run_batch(files, results, describe, failed)
    assert (summary.ok, summary.failed, summary.skipped) == (2, 2, 0)
    assert [r["error"] for r in lines(out)] == [None, f"{files[1]} is silent", "RuntimeError: unexpected", None]

    fail_once.clear()
    seen = []
    with ResultsFile(out, SETTINGS) as results:
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

    with pytest.raises(KeyboardInterrupt), ResultsFile(out, SETTINGS) as results:
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


@pytest.mark.spawns
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
    # Issue 44: none of these can succeed on a rerun; the records and the last line say so, and what
    # to do instead (before: "rerun to retry them" for every one, and no field to tell them apart)
    assert "retry" not in records["good.wav"] and "error_kind" not in records["good.wav"]
    for kind, (path, _) in corpus.items():
        want = "too_long" if kind == "too_long" else "input"
        assert (records[path.name]["error_kind"], records[path.name]["retry"]) == (want, False), kind
    last = proc.stderr.splitlines()[-1]
    assert last == (f"error: {len(corpus)} of {len(corpus) + 1} files failed; their records in {out} say why; "
                    "1 is longer than the model takes: add --segment (and another --out) to describe it in "
                    f"segments; {len(corpus) - 1} cannot be described as they are: fix or remove them (a rerun "
                    "fails them again)"), last
    assert "rerun to retry" not in proc.stderr


def test_the_advice_suggests_a_rerun_only_for_what_a_rerun_may_fix():
    from specdec_cli.commands.ui import failure_advice

    assert failure_advice({"failed": 2}) == "; rerun to retry them"
    assert failure_advice({"failed": 2, "input": 1}) == ("; 1 cannot be described as it is: fix or remove it (a rerun "
                                                         "fails it again); rerun to retry the 2 that may succeed")
    assert failure_advice({"too_long": 2}, to_stdout=True) == ("; 2 are longer than the model takes: add --segment to "
                                                              "describe them in segments")


def test_a_clip_that_raises_is_retryable_and_a_bad_one_is_not(tmp_path):
    from specdec_cli.errors import InputError, TooLong
    from specdec_cli.results import describe_or_error

    def record(path, message):
        return {"file": str(path), "error": message, "error_kind": "failed", "retry": True}

    for exc, kind in ((RuntimeError("CUDA out of memory"), "failed"), (InputError("x is silent"), "input"),
                      (TooLong("x is 31.0 s long"), "too_long")):
        def describe(path, exc=exc):
            raise exc
        got = describe_or_error(tmp_path / "a.wav", describe, record)
        assert (got["error_kind"], got["retry"]) == (kind, kind == "failed")


# The real `specdec batch` (same entry point, its own process, real signals and files), gated: after
# each record it appends (the one writer every describe path goes through, one clip at a time or
# rows in flight), the child blocks until the test lets it go on, by reading one byte from a pipe
# the test holds. The test lets it write exactly N records, waits for the file to hold them (file
# contents, not a schedule: the child cannot run ahead), then signals it. No sleep decides anything,
# however loaded the machine. Test-only: the gate lives here.
GATED_SPECDEC = """
import os, sys
import specdec_cli.results as batch
gate = int(os.environ["SPECDEC_TEST_GATE_FD"])
append = batch.ResultsFile.append
def gated(self, record):
    append(self, record)
    if not os.read(gate, 1):  # blocks until the test allows one more record
        os._exit(3)           # the test closed the pipe: it is gone
batch.ResultsFile.append = gated
from specdec_cli.commands.app import main
main()
"""


def count_lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def signal_after(args: list[str], out: Path, records: int, sig: signal.Signals) -> subprocess.CompletedProcess:
    """Run the gated batch, let it append exactly `records` more lines to `out`, then send `sig`
    while it waits at the gate."""
    read_end, write_end = os.pipe()
    env = dict(subprocess_env(), SPECDEC_TEST_GATE_FD=str(read_end))
    start = count_lines(out)
    # SIGINT back to its default in the child: a test run started in the background of a
    # non-interactive shell (`make test &`, some CI runners) inherits SIGINT *ignored*, and Python
    # then installs no KeyboardInterrupt handler, so Ctrl-C would be simulated on a process that
    # cannot receive it (the batch simply finished: rc 0, a clean-clone CI failure).
    proc = subprocess.Popen([sys.executable, "-c", GATED_SPECDEC, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, pass_fds=(read_end,),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    os.close(read_end)
    try:
        os.write(write_end, b"x" * (records - 1))  # the records-th append then blocks at the gate
        # Compaction rewrites the file first (same line count), then each clip appends one line.
        deadline = time.monotonic() + 600  # a guard against a hung child, not a pace
        while proc.poll() is None and count_lines(out) < start + records and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proc.poll() is None, f"the batch ended early: {proc.communicate()}"
        assert count_lines(out) == start + records
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        os.close(write_end)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(args, proc.returncode, stdout, stderr)


@pytest.mark.spawns
def test_batch_interrupted_then_killed_resumes_complete_without_duplicates(tmp_path, models):
    """Ctrl-C (SIGINT), then SIGKILL, then a full run: every clip recorded once, nothing lost, and
    the lock the killed run left behind does not block the resumed one."""
    clips = tmp_path / "clips"
    n = 8
    for i in range(n):
        write_clip(clips / f"clip_{i:02d}.wav", seconds=0.5, seed=i)
    out = tmp_path / "results.jsonl"
    # One clip at a time (run_batch's default describe path); test_batch_rows_cli runs the same gate
    # with rows in flight.
    args = ["batch", str(clips), "--out", str(out), *models, *FAST, "--batch-size", "1"]
    specdec_exe()  # skips the test where the console script is not installed, as before

    interrupted = signal_after(args, out, 2, signal.SIGINT)
    assert interrupted.returncode == 130, interrupted.stderr
    after_int = read_records(out)
    assert len(after_int) == 2
    # Issue 29: it says what was kept and the command that resumes (the one given, rerun below).
    import shlex

    assert interrupted.stderr.strip().splitlines()[-1] == (
        f"interrupted: 2 records are kept in {out} (2 from this run); resume with: {shlex.join(['specdec', *args])}")
    assert "Traceback" not in interrupted.stderr

    assert not lock_path(out).exists()  # an interrupted run lets go of its lock
    killed = signal_after(args, out, 3, signal.SIGKILL)
    assert killed.returncode == -signal.SIGKILL
    assert lock_path(out).exists()  # a killed one leaves its lock file; the kernel dropped the lock itself
    after_kill = read_records(out)
    assert len(after_kill) == 5
    assert after_kill[:2] == after_int

    resumed = subprocess.run([specdec_exe(), *args], capture_output=True, text=True, env=subprocess_env(), timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "Traceback" not in resumed.stderr and "5 skipped" in resumed.stderr
    final = lines(out)  # every line parses: no torn line left behind
    files = [r["file"] for r in final]
    assert len(files) == n and len(set(files)) == n  # complete, no clip recorded twice
    assert all(r["error"] is None for r in final)
    assert final[:5] == after_kill  # nothing lost, nothing rewritten
    assert not lock_path(out).exists()
