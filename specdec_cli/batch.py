"""Batch runs: the folder walk and a results file that survives being killed at any instant.

The results file is JSON Lines, one record per clip (the record of `describe --json`).

How resuming works, and why it cannot lose or duplicate a record:
  * Opening a results file compacts it first: it is read tolerantly (a torn last line, left by a
    kill during a write, is dropped; a later line for the same clip supersedes an earlier one),
    error records are dropped (those clips are retried), and what remains is written to a temporary
    file, fsync'd and renamed over the original. The rename is atomic, so a kill during compaction
    leaves either the old file or the new one, both readable.
  * Then each finished clip is appended as one line, flushed and fsync'd before the next clip
    starts. A kill mid-append leaves at most one torn last line, which the next open drops; the clip
    was not recorded, so it is decoded again.
  * Clips whose successful record survives are skipped, so the final file holds exactly one line
    per clip: its success, or its latest error.

Clips are matched by absolute path (the `file` field is the path as given, resolved against the
current directory), so rerun from the same directory, or give an absolute DIR.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from .errors import InputError, one_line
from .metrics import json_safe


def find_audio(root: Path, suffixes: tuple[str, ...], recursive: bool = False) -> list[Path]:
    """Audio files under `root` (by suffix, case-insensitive), sorted for a stable order."""
    if not root.exists():
        raise InputError(f"no such folder: {root}; check the path")
    if not root.is_dir():
        raise InputError(f"{root} is a file; `specdec batch` takes a folder (use `specdec describe {root}`)")
    walk = root.rglob("*") if recursive else root.iterdir()
    files = sorted(p for p in walk if p.is_file() and p.suffix.lower() in suffixes)
    if not files:
        hint = "" if recursive else " (add --recursive to look in subfolders)"
        raise InputError(f"no audio files ({', '.join(suffixes)}) in {root}{hint}")
    return files


def clip_key(file: str) -> str:
    """How two records are known to describe the same clip."""
    return os.path.normpath(os.path.abspath(file))


def dumps_record(record: dict[str, Any]) -> str:
    """One record as one line of strict JSON (no newline)."""
    return json.dumps(json_safe(record), ensure_ascii=False, allow_nan=False)


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every complete record in a results file, in order. A last line without its newline is a
    write cut short by a kill and is ignored; so is any line that is not a JSON object with `file`."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise InputError(f"cannot read results file {path}: {exc.strerror or exc}") from exc
    lines = raw.split(b"\n")
    complete = lines[:-1]  # the piece after the last newline is empty, or torn
    records = []
    for line in complete:
        try:
            record = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            continue
        if isinstance(record, dict) and isinstance(record.get("file"), str):
            records.append(record)
    return records


def latest_by_clip(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The last record per clip (a retried clip's new line supersedes its old one)."""
    latest: dict[str, dict[str, Any]] = {}
    for record in records:
        key = clip_key(record["file"])
        latest.pop(key, None)  # re-insert, so the order follows the latest write
        latest[key] = record
    return latest


def _fsync_dir(path: Path) -> None:
    # The rename is durable only once the directory entry is on disk.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # some filesystems do not allow opening a directory; the rename is still atomic
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_atomically(path: Path, lines: list[str]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


class ResultsFile:
    """A results file opened for a (resumed) batch; see the module doc for the guarantees."""

    def __init__(self, path: Path, overwrite: bool = False) -> None:
        self.path = path
        self._file: TextIO | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            kept = {} if overwrite else {k: r for k, r in latest_by_clip(read_records(path)).items()
                                         if r.get("error") is None}
            _write_atomically(path, [dumps_record(r) for r in kept.values()])
            self._file = open(path, "a", encoding="utf-8")  # closed in close()
        except OSError as exc:
            raise InputError(f"cannot write results file {path}: {exc.strerror or exc}") from exc
        self.done: set[str] = set(kept)  # clips already recorded without error

    def append(self, record: dict[str, Any]) -> None:
        assert self._file is not None, "results file is closed"
        self._file.write(dumps_record(record) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())  # on disk before the next clip starts: a kill loses no finished clip

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> ResultsFile:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@dataclass
class BatchSummary:
    ok: int = 0
    failed: int = 0
    skipped: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)  # (file, message)


def pending(files: list[Path], results: ResultsFile) -> tuple[list[Path], int]:
    """The clips still to do, and how many are skipped as already recorded."""
    todo = [f for f in files if clip_key(str(f)) not in results.done]
    return todo, len(files) - len(todo)


def run_batch(
    files: list[Path],
    results: ResultsFile,
    describe: Callable[[Path], dict[str, Any]],
    error_record: Callable[[Path, str], dict[str, Any]],
    on_done: Callable[[Path, dict[str, Any]], None] | None = None,
) -> BatchSummary:
    """Describe each clip not yet recorded and append its record. A clip that fails gets a record
    with `error` set and the batch goes on; KeyboardInterrupt stops it (the file stays consistent)."""
    todo, skipped = pending(files, results)
    summary = BatchSummary(skipped=skipped)
    for path, record in _describe_each(todo, describe, error_record):
        results.append(record)
        if record.get("error") is None:
            summary.ok += 1
        else:
            summary.failed += 1
            summary.failures.append((record["file"], record["error"]))
        if on_done is not None:
            on_done(path, record)
    return summary


def _describe_each(todo: list[Path], describe: Callable[[Path], dict[str, Any]],
                   error_record: Callable[[Path, str], dict[str, Any]]) -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in todo:
        try:
            record = describe(path)
        except Exception as exc:  # one bad clip must not stop the batch; its record says why
            record = error_record(path, one_line(exc))
        yield path, record
