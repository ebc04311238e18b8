"""batch.py's results file in this process, on the details a mutation once slipped past: backups under
a race, one-byte files, nested --out folders, a compaction that cannot write, the exact refusals,
and what run_batch reports per clip. (test_batch.py holds the main behaviour; test_error_paths.py
the same refusals through the real command.)"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from specdec_cli import results as batch
from specdec_cli.decoding.config import DecodingConfig
from specdec_cli.errors import InputError
from specdec_cli.records import RECORD_FIELDS
from specdec_cli.results import (
    ResultsFile,
    _keep_backup,
    backup_path,
    dumps_record,
    numbered_records,
    run_batch,
)
from specdec_cli.settings import RunSettings
from specdec_cli.writer_lock import lock_path

SETTINGS = RunSettings.of(DecodingConfig(), "fluent", "hub/edge", "hub/cloud", "float32")


def record(path: Path, error: str | None = None, **extra) -> dict:
    return {**dict.fromkeys(RECORD_FIELDS), "file": str(path), "description": None if error else "说话人是女声。",
            "error": error, "settings": SETTINGS.as_record(), **extra}


def refused(path: Path, **kwargs) -> str:
    with pytest.raises(InputError) as info:
        ResultsFile(path, SETTINGS, **kwargs)
    assert info.value.exit_code == 2
    return info.value.message


def test_records_keep_chinese_as_text():
    line = dumps_record(record(Path("语音.wav")))
    assert '"file": "语音.wav"' in line and "\\u" not in line
    assert json.loads(line)["description"] == "说话人是女声。"


def test_backup_names_count_up_from_2(tmp_path):
    out = tmp_path / "r.jsonl"
    assert backup_path(out) == tmp_path / "r.jsonl.bak"
    for name, after in (("r.jsonl.bak", "r.jsonl.bak-2"), ("r.jsonl.bak-2", "r.jsonl.bak-3"),
                        ("r.jsonl.bak-3", "r.jsonl.bak-4")):
        (tmp_path / name).write_text("old")
        assert backup_path(out) == tmp_path / after


@pytest.mark.parametrize("links", [True, False], ids=["hard-link", "copy"])
def test_a_backup_name_taken_meanwhile_moves_on_to_the_next(tmp_path, monkeypatch, links):
    """Between choosing NAME.bak and creating it, another process took the name: the backup goes
    to NAME.bak-2, the other file is left alone (by hard link, or by copy where links fail)."""
    out = tmp_path / "r.jsonl"
    out.write_bytes(b"mine\n")
    taken = tmp_path / "r.jsonl.bak"
    real_link, real_copy = os.link, batch._copy_new

    def race(first):
        def wrapped(src, dst):
            if Path(dst) == taken and not taken.exists():
                taken.write_bytes(b"theirs\n")  # the other process wins the name
                raise FileExistsError(errno.EEXIST, "File exists")
            return first(src, dst)
        return wrapped

    if links:
        monkeypatch.setattr(batch.os, "link", race(real_link))
    else:
        def no_links(src, dst):
            raise OSError(errno.EPERM, "Operation not permitted")
        monkeypatch.setattr(batch.os, "link", no_links)
        monkeypatch.setattr(batch, "_copy_new", race(real_copy))
    assert _keep_backup(out) == tmp_path / "r.jsonl.bak-2"
    assert taken.read_bytes() == b"theirs\n" and (tmp_path / "r.jsonl.bak-2").read_bytes() == b"mine\n"


def test_overwrite_keeps_even_a_one_byte_file(tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_bytes(b"\n")
    with ResultsFile(out, SETTINGS, overwrite=True) as results:
        assert results.backup == tmp_path / "r.jsonl.bak"
    assert (tmp_path / "r.jsonl.bak").read_bytes() == b"\n" and out.read_bytes() == b""


def test_out_in_folders_that_do_not_exist_yet(tmp_path):
    out = tmp_path / "a" / "b" / "r.jsonl"
    with ResultsFile(out, SETTINGS) as results:
        results.append(record(tmp_path / "c.wav"))
    assert [r["file"] for r in batch.read_records(out)] == [str(tmp_path / "c.wav")]


def test_a_compaction_that_cannot_write_leaves_the_file_and_says_so(tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_text(dumps_record(record(tmp_path / "a.wav")) + "\n", encoding="utf-8")
    before = out.read_bytes()
    (tmp_path / ".r.jsonl.tmp").mkdir()  # where the compacted copy would be written
    assert refused(out) == f"cannot write results file {out}: Is a directory"
    assert out.read_bytes() == before
    assert not lock_path(out).exists()  # the lock was let go


def test_a_results_file_that_cannot_be_created(tmp_path):
    blocker = tmp_path / "notes"
    blocker.write_text("mine")
    assert refused(blocker / "r.jsonl") == f"cannot write results file {blocker / 'r.jsonl'}: File exists"


def test_refusals_word_for_word(tmp_path):
    out = tmp_path / "r.jsonl"
    tail = (f"; the file was left as it is. Give another --out, or add --overwrite to start over (the old "
            f"file is then kept as {out}.bak)")
    old = record(tmp_path / "a.wav")
    del old["settings"]
    out.write_text(dumps_record(old) + "\n", encoding="utf-8")
    assert refused(out) == (f"{out} line 1 carries no settings (written before specdec 0.2), so it cannot be "
                            f"told apart from other settings{tail}")
    out.write_text("x" * 60 + "\n", encoding="utf-8")
    assert refused(out) == f"{out} line 1 is not JSON ('{'x' * 40}…'){tail}"
    out.write_text("y" * 40 + "\n", encoding="utf-8")
    assert refused(out) == f"{out} line 1 is not JSON ('{'y' * 40}'){tail}"
    out.write_text("z" * 41 + "\n", encoding="utf-8")
    assert refused(out) == f"{out} line 1 is not JSON ('{'z' * 40}…'){tail}"
    out.write_text(dumps_record(record(tmp_path / "a.wav", error=None)) + "\n" + "[1, 2]\n", encoding="utf-8")
    assert refused(out) == f"{out} line 2 is JSON but not a record (a list){tail}"
    out.write_text(json.dumps({"file": "a.wav"}) + "\n", encoding="utf-8")
    assert refused(out) == f"{out} line 1 is not a specdec record (no description, mode, preset, … field){tail}"
    out.write_text(dumps_record(record(tmp_path / "a.wav", file=3)) + "\n", encoding="utf-8")
    assert refused(out) == f"{out} line 1 is not a specdec record (its file is 3, not a path){tail}"
    out.write_text(dumps_record(record(tmp_path / "a.wav", error=["x"])) + "\n", encoding="utf-8")
    assert refused(out) == f"{out} line 1 is not a specdec record (its error is ['x']){tail}"
    out.write_bytes(b"\xff\xfe not ours")
    assert refused(out) == (f"{out} line 1 ends without a newline and is not a specdec record "
                            f"('\ufffd\ufffd not ours'){tail}")


def test_records_are_numbered_by_line_blank_lines_included(tmp_path):
    out = tmp_path / "r.jsonl"
    a, b = record(tmp_path / "a.wav"), record(tmp_path / "b.wav")
    out.write_text(f"{dumps_record(a)}\n\n{dumps_record(b)}\n", encoding="utf-8")
    assert [(n, r["file"]) for n, r in numbered_records(out)] == [(1, a["file"]), (3, b["file"])]


def test_a_closed_results_file_refuses_appends_and_closes_twice(tmp_path):
    results = ResultsFile(tmp_path / "r.jsonl", SETTINGS)
    results.close()
    with pytest.raises(AssertionError, match="^results file is closed$"):
        results.append(record(tmp_path / "a.wav"))
    results.close()  # idempotent: a `with` block after an explicit close


def test_run_batch_reports_each_clip_to_on_done_and_the_failures_in_order(tmp_path):
    files = [tmp_path / f"{name}.wav" for name in ("a", "b", "c")]
    seen = []

    def describe(path: Path) -> dict:
        if path.name == "b.wav":
            raise ValueError("bad clip")
        return record(path)

    with ResultsFile(tmp_path / "r.jsonl", SETTINGS) as results:
        summary = run_batch(files, results, describe, lambda p, m: record(p, error=m),
                            on_done=lambda p, r: seen.append((p, r["error"])))
    assert seen == [(files[0], None), (files[1], "ValueError: bad clip"), (files[2], None)]
    assert (summary.ok, summary.failed, summary.skipped) == (2, 1, 0)
    assert summary.failures == [(str(files[1]), "ValueError: bad clip")]


def test_a_lock_held_without_a_pid_is_pid_unknown(tmp_path):
    import fcntl

    out = tmp_path / "r.jsonl"
    fd = os.open(lock_path(out), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert refused(out) == (f"{out} is being written by another specdec batch (pid unknown); wait for it "
                                "to finish, or give this run another --out")
        os.write(fd, b"4242\n")
        assert refused(out) == (f"{out} is being written by another specdec batch (pid 4242); wait for it "
                                "to finish, or give this run another --out")
    finally:
        os.close(fd)
    assert not out.exists()


def test_folder_refusals_word_for_word(tmp_path):
    from specdec_cli.results import find_audio

    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(InputError) as info:
        find_audio(tmp_path)
    assert info.value.message == (f"no audio files in {tmp_path} (add --recursive to look in subfolders); "
                                  "ignored 1 file that is not audio (notes.txt)")
    with pytest.raises(InputError) as info:
        find_audio(tmp_path, recursive=True)
    assert info.value.message == f"no audio files in {tmp_path}; ignored 1 file that is not audio (notes.txt)"
    long = tmp_path / ("d" * 300)
    with pytest.raises(InputError) as info:
        find_audio(long)
    assert info.value.message == f"cannot read {long}: File name too long"
    with pytest.raises(InputError) as info:
        find_audio(tmp_path / "notes.txt" / "x")
    assert info.value.message == f"no such folder: {tmp_path / 'notes.txt' / 'x'}; check the path"


def test_run_batch_needs_describe_and_error_record_without_describe_all(tmp_path):
    with ResultsFile(tmp_path / "r.jsonl", SETTINGS) as results:
        for describe, error_record in ((None, None), (record, None), (None, record)):
            with pytest.raises(AssertionError, match=r"^describe_all or describe \+ error_record$"):
                run_batch([tmp_path / "a.wav"], results, describe, error_record)


def test_missing_fields_are_named_up_to_three(tmp_path):
    out = tmp_path / "r.jsonl"
    tail = (f"; the file was left as it is. Give another --out, or add --overwrite to start over (the old "
            f"file is then kept as {out}.bak)")
    full = record(tmp_path / "a.wav")
    names = list(RECORD_FIELDS)
    for drop, listed in ((3, ", ".join(names[1:4])), (4, ", ".join(names[1:4]) + ", …")):
        partial = {k: v for k, v in full.items() if k not in names[1:1 + drop]}
        out.write_text(json.dumps(partial) + "\n", encoding="utf-8")
        assert refused(out) == f"{out} line 1 is not a specdec record (no {listed} field){tail}"


def test_a_results_file_that_is_a_folder(tmp_path):
    out = tmp_path / "r.jsonl"
    out.mkdir()
    assert refused(out) == f"cannot read results file {out}: Is a directory"
    assert list(out.iterdir()) == []


def test_clips_the_edge_finished_alone_are_done_unless_retry_fallback(tmp_path):
    """A record whose `fallback` is set has a description: a rerun skips its clip, as any clip
    described; with retry_fallback its record is dropped at start (as an error record is) and the
    clip is to be described again. Records of the cloud's own descriptions stay either way."""
    out = tmp_path / "r.jsonl"
    a, b, c = (tmp_path / f"{n}.wav" for n in "abc")
    lines = [record(a, fallback=None), record(b, fallback="unreachable"), record(c, error="boom")]
    out.write_text("".join(dumps_record(r) + "\n" for r in lines))
    with ResultsFile(out, SETTINGS) as kept:
        assert {Path(k) for k in kept.done} == {a.resolve(), b.resolve()}
    assert [json.loads(line)["file"] for line in out.read_text().splitlines()] == [str(a), str(b)]
    with ResultsFile(out, SETTINGS, retry_fallback=True) as retried:
        assert {Path(k) for k in retried.done} == {a.resolve()}
    assert [json.loads(line)["file"] for line in out.read_text().splitlines()] == [str(a)]
