"""Results files of batch runs: the folder walk, and a results file that survives being killed at any instant and
never deletes a line specdec did not write.

The results file is JSON Lines, one record per clip (the record of `describe --json`), each with
the settings that made it (`settings`, see settings.py).

Opening a results file (`ResultsFile`):
  1. Takes its writer lock (writer_lock.py): a second batch on the same file is refused at once;
     a lock left by a killed run never blocks the next one.
  2. Reads it strictly: every complete line must be a specdec record made with this run's
     settings (blank lines are ignored). A last line without its newline is a write cut short by
     a kill and is dropped, but only when it starts like one of our lines. Anything else refuses
     the run before a byte of the file changes: the file may be another tool's output, or results
     the user asked for with other settings, and resuming would silently mix or delete them.
  3. Compacts it: a later line for a clip supersedes an earlier one, and error records are
     dropped (those clips are retried); with `--retry-fallback` so are the records of clips the
     edge finished alone because the cloud failed (`fallback` set). The rest is written to a temporary file, fsync'd and
     renamed over the original; the rename is atomic, so a kill leaves the old file or the new
     one, both readable.
  `--overwrite` replaces 2 and 3: the old file is first kept as NAME.bak (NAME.bak-2, … when that
  exists; a hard link, so a kill never leaves half a backup), then the run starts from an empty file.
Then each finished clip is appended as one line, flushed and fsync'd before the next clip starts:
a kill mid-append leaves at most one torn last line, which the next open drops (that clip is
decoded again). Clips whose successful record survives are skipped, so the final file holds
exactly one line per clip: its success, or its latest error.

Clips are matched by absolute path (the `file` field is the path as given, resolved against the
current directory), so rerun from the same directory, or give an absolute DIR.

With --segment each record is one segment of a recording (`file` is the recording; `segment` its
index, `segments` how many the recording has): records are matched by path and index, so a batch
killed mid-recording resumes at its first segment not recorded, and a recording all of whose
segments are recorded is skipped without being read. (A recording that could not be cut at all gets
one error record, without segment fields.) The settings say whether a file holds segments, so the
two kinds are never mixed in one file.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from .errors import RETRYABLE, InputError, error_kind, one_line, printable
from .records import RECORD_FIELDS
from .settings import RunSettings, differences
from .strict_json import dumps_record
from .writer_lock import LockHeld, WriterLock


@dataclass
class Found:
    """What a folder holds for a batch: the audio files (sorted, for a stable order), the files
    that are not audio, the dotfiles left out, and every other entry that was skipped with the
    reason (a FIFO, a device, a symlink loop, a dangling link, a folder that cannot be read)."""

    files: list[Path]
    ignored: list[Path] = field(default_factory=list)
    hidden: int = 0
    skipped: list[tuple[Path, str]] = field(default_factory=list)

    def ignored_line(self) -> str:
        """One line saying what was left out and why (names printable: no escape reaches a terminal)."""
        parts = []
        if self.ignored:
            names = ", ".join(printable(p.name) for p in self.ignored[:3]) + (", …" if len(self.ignored) > 3 else "")
            n = len(self.ignored)
            parts.append(f"{n} file{'' if n == 1 else 's'} that {'is' if n == 1 else 'are'} not audio ({names})")
        if self.hidden:
            parts.append(f"{self.hidden} dotfile{'' if self.hidden == 1 else 's'} (add --hidden to include "
                         f"{'it' if self.hidden == 1 else 'them'})")
        return "ignored " + " and ".join(parts)

    def skipped_lines(self) -> list[str]:
        """One line per entry that is neither a file nor a folder specdec can read, with the reason."""
        return [f"skipped: {printable(str(path))}: {why}" for path, why in self.skipped]


# Names that say "audio": such a file is a clip even when it cannot be read (it is then described
# as failed, with the reason, like any clip that fails); any other name counts only when it reads.
AUDIO_NAMES = frozenset((".wav", ".wave", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".aif", ".aiff", ".aifc",
                         ".au", ".snd", ".caf", ".w64", ".rf64", ".m4a", ".aac", ".wma", ".webm"))


def is_audio(path: Path) -> bool:
    """Whether the audio library reads `path`, by its header alone (whatever its name says)."""
    import soundfile as sf

    try:
        sf.info(str(path))
    except Exception:  # not audio, or unreadable: either way not a clip by its content
        return False
    return True


def _not_a_file(path: Path) -> str | None:
    """Why an entry of the folder is skipped (None: a regular file, or a folder, taken as before):
    a FIFO would block the decoder, a device (/dev/zero behind a link) never ends, and a link that
    leads nowhere names no clip. Said, never dropped unseen."""
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symlink loop"
        if path.is_symlink() and isinstance(exc, FileNotFoundError):
            return f"a dangling symlink (to {printable(os.readlink(path))})"
        return f"cannot read it: {exc.strerror or exc}"
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe), not a file"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device, not a file"
    return "not a regular file"


def _entries(root: Path, recursive: bool, skipped: list[tuple[Path, str]]) -> Iterator[Path]:
    """Every entry under `root` but the folders (one level, or every level), each folder that cannot
    be read added to `skipped` (os.walk's onerror: rglob would pass over it without a word)."""
    def unreadable(exc: OSError) -> None:
        where = Path(exc.filename) if exc.filename else root
        skipped.append((where, f"cannot read this folder: {exc.strerror or exc}"))

    for folder, dirs, names in os.walk(root, onerror=unreadable):
        base = Path(folder)
        for name in names:
            yield base / name
        if not recursive:
            return
        for name in dirs:  # a link to a folder is not followed (os.walk's default), as rglob did not
            if (base / name).is_symlink():
                yield base / name


def find_audio(root: Path, recursive: bool = False, hidden: bool = False) -> Found:
    """Every file under `root` that is audio: one the audio library reads (probed by its header,
    whatever its name), or one named as audio (a broken one is then recorded as failed, not
    skipped unseen). Dotfiles and dot-folders are left out unless `hidden`; every other entry that
    is not a file (FIFO, device, symlink loop, dangling link, unreadable folder) is named in
    `skipped` with the reason."""
    try:
        found = root.stat()
    except (FileNotFoundError, NotADirectoryError):
        raise InputError(f"no such folder: {root}; check the path") from None
    except OSError as exc:  # a name too long, a parent without search permission: one line, no traceback
        raise InputError(f"cannot read {root}: {exc.strerror or exc}") from exc
    if not stat.S_ISDIR(found.st_mode):
        raise InputError(f"{root} is a file; `specdec batch` takes a folder (use `specdec describe {root}`)")
    result = Found([])
    for path in sorted(_entries(root, recursive, result.skipped)):
        if not hidden and any(part.startswith(".") for part in path.relative_to(root).parts):
            result.hidden += 1
        elif (why := _not_a_file(path)) is not None:
            result.skipped.append((path, why))
        elif not path.is_file():
            continue  # a link to a folder
        elif path.suffix.lower() in AUDIO_NAMES or is_audio(path):
            result.files.append(path)
        else:
            result.ignored.append(path)
    result.skipped.sort()
    if not result.files:
        hint = "" if recursive else " (add --recursive to look in subfolders)"
        more = f"; {result.ignored_line()}" if result.ignored or result.hidden else ""
        gone = f"; skipped {len(result.skipped)} other entries" if result.skipped else ""
        raise InputError(f"no audio files in {root}{hint}{more}{gone}")
    return result


def clip_key(file: str) -> str:
    """How two records are known to describe the same clip."""
    return os.path.normpath(os.path.abspath(file))


# What a record describes: a clip (its key), or a segment of a recording (the key and the index).
Key = str | tuple[str, int]


def record_key(record: dict[str, Any]) -> Key:
    """How two records are known to describe the same clip, or the same segment of a recording."""
    key = clip_key(record["file"])
    segment = record.get("segment")
    return key if segment is None else (key, segment)


# Every line we write starts with this (the record's first field); a torn last line that does
# not is someone else's, and is not ours to drop.
OUR_LINE_START = b'{"file": '


def backup_path(path: Path) -> Path:
    """Where --overwrite keeps the old file: NAME.bak, else the first free NAME.bak-N (N >= 2)."""
    candidate, n = path.with_name(f"{path.name}.bak"), 2
    while candidate.exists():
        candidate, n = path.with_name(f"{path.name}.bak-{n}"), n + 1
    return candidate


def refusal(path: Path, what: str) -> InputError:
    """The one-line refusal for a results file this run must not rewrite: what is wrong, what to do."""
    return InputError(f"{path} {what}; the file was left as it is. Give another --out, or add --overwrite "
                      f"to start over (the old file is then kept as {backup_path(path)})")


def _excerpt(line: bytes) -> str:
    text = line.decode("utf-8", "replace").strip()
    return repr(text if len(text) <= 40 else text[:40] + "…")


def why_not_a_record(value: Any) -> str | None:
    """What keeps a parsed line from being a specdec record; None when it is one."""
    if not isinstance(value, dict):
        return f"is JSON but not a record (a {type(value).__name__})"
    missing = [name for name in RECORD_FIELDS if name not in value]
    if missing:
        more = ", …" if len(missing) > 3 else ""
        return f"is not a specdec record (no {', '.join(missing[:3])}{more} field)"
    if not isinstance(value["file"], str):
        return f"is not a specdec record (its file is {value['file']!r}, not a path)"
    if value["error"] is not None and not isinstance(value["error"], str):
        return f"is not a specdec record (its error is {value['error']!r})"
    if value.get("segment") is not None and not (_count(value["segment"]) and _count(value.get("segments"))
                                                and value["segment"] < value["segments"]):
        return (f"is not a specdec record (its segment is {value['segment']!r} of {value.get('segments')!r}, "
                "not an index and a count)")
    return None


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def numbered_records(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """Every complete record in a results file with its line number (from 1), in order. A last
    line without its newline is a write cut short by a kill and is ignored when it starts like one
    of ours; anything else that is not a specdec record raises the refusal (nothing is changed)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise InputError(f"cannot read results file {path}: {exc.strerror or exc}") from exc
    lines = raw.split(b"\n")
    *complete, tail = lines  # `tail` follows the last newline: empty, or a torn write
    records = []
    for number, line in enumerate(complete, start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError:  # not JSON, or not text
            raise refusal(path, f"line {number} is not JSON ({_excerpt(line)})") from None
        problem = why_not_a_record(value)
        if problem is not None:
            raise refusal(path, f"line {number} {problem}")
        records.append((number, value))
    torn = tail.lstrip()
    if torn and not (torn.startswith(OUR_LINE_START) or OUR_LINE_START.startswith(torn)):
        raise refusal(path, f"line {len(lines)} ends without a newline and is not a specdec record "
                            f"({_excerpt(tail)})")
    return records


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of a results file, in order (see `numbered_records`)."""
    return [record for _, record in numbered_records(path)]


def check_settings(path: Path, records: list[tuple[int, dict[str, Any]]], settings: RunSettings) -> None:
    """Refuse a file holding any record made otherwise than this run would make it: resuming
    would mix the two, or skip a clip the user asked to have described anew."""
    current = settings.as_record()
    for number, record in records:
        recorded = record.get("settings")
        if not isinstance(recorded, dict):
            raise refusal(path, f"line {number} carries no settings (written before specdec 0.2), so it "
                                "cannot be told apart from other settings")
        if recorded != current:
            raise refusal(path, f"line {number} was made with other settings ({differences(recorded, current)})")


def latest_by_clip(records: list[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    """The last record per clip, or per segment (a retried clip's new line supersedes its old one)."""
    latest: dict[Key, dict[str, Any]] = {}
    for record in records:
        key = record_key(record)
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


def _keep_backup(path: Path) -> Path:
    """Keep the old file under a new backup name (never over an existing one), on disk on return."""
    while True:
        backup = backup_path(path)
        try:
            # A hard link is atomic and never replaces an existing name; the compaction's rename then
            # gives `path` a new file and leaves the backup the old bytes. A kill leaves no half copy.
            os.link(path, backup)
        except FileExistsError:
            continue  # a backup appeared meanwhile: take the next name
        except OSError:  # a filesystem without hard links: copy instead
            try:
                _copy_new(path, backup)
            except FileExistsError:
                continue
        _fsync_dir(path.parent)
        return backup


def _copy_new(src: Path, dst: Path) -> None:
    data = src.read_bytes()
    with open(dst, "xb") as f:  # "x": never over an existing file
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


class ResultsFile:
    """A results file opened for a (resumed) batch by its one writer; see the module doc."""

    def __init__(self, path: Path, settings: RunSettings, overwrite: bool = False, retry_fallback: bool = False) -> None:
        self.path = path
        self.backup: Path | None = None  # where --overwrite kept the old file
        self._file: TextIO | None = None
        self._lock = WriterLock(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._lock.acquire()
        except LockHeld as held:
            pid = f"pid {held.pid}" if held.pid is not None else "pid unknown"
            raise InputError(f"{path} is being written by another specdec batch ({pid}); wait for it to "
                             "finish, or give this run another --out") from None
        except OSError as exc:
            raise InputError(f"cannot write results file {path}: {exc.strerror or exc}") from exc
        self.segments: dict[str, int] = {}  # recording -> how many segments it has (from its records)
        try:
            self.done = self._open(settings, overwrite, retry_fallback)
        except BaseException:
            self.close()
            raise

    def _open(self, settings: RunSettings, overwrite: bool, retry_fallback: bool = False) -> set[Key]:
        """Check, back up or compact, then open for appending; the clips (or segments) already
        recorded without error (`retry_fallback`: and not finished on the edge alone because the
        cloud failed; those records are dropped with the failed ones, to be made again)."""
        path = self.path
        kept: dict[Key, dict[str, Any]] = {}
        if not overwrite:
            records = numbered_records(path)  # refuses foreign lines before anything is written
            check_settings(path, records, settings)
            kept = {k: r for k, r in latest_by_clip([r for _, r in records]).items()
                    if r["error"] is None and not (retry_fallback and r.get("fallback") is not None)}
        try:
            if overwrite and path.is_file() and path.stat().st_size > 0:
                self.backup = _keep_backup(path)
            _write_atomically(path, [dumps_record(r) for r in kept.values()])
            self._file = open(path, "a", encoding="utf-8")  # closed in close()
        except OSError as exc:
            raise InputError(f"cannot write results file {path}: {exc.strerror or exc}") from exc
        for key, record in kept.items():
            if isinstance(key, tuple):
                self.segments[key[0]] = record["segments"]
        return set(kept)

    def skip(self, path: Path) -> set[int]:
        """The segments of the recording at `path` already recorded without error."""
        key = clip_key(str(path))
        return {i for i in range(self.segments.get(key, 0)) if (key, i) in self.done}

    def append(self, record: dict[str, Any]) -> None:
        assert self._file is not None, "results file is closed"
        self._file.write(dumps_record(record) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())  # on disk before the next clip starts: a kill loses no finished clip

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._lock.release()

    def __enter__(self) -> ResultsFile:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class StreamResults:
    """`--out -`: records written to a stream (stdout) as each clip ends; nothing to resume from,
    no lock (the stream is this run's alone)."""

    path = Path("-")
    backup: Path | None = None
    done: frozenset[Key] = frozenset()  # a stream resumes nothing
    segments: dict[str, int] = {}  # never written: nothing was recorded before

    def skip(self, path: Path) -> set[int]:
        return set()

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def append(self, record: dict[str, Any]) -> None:
        self._stream.write(dumps_record(record) + "\n")
        self._stream.flush()

    def __enter__(self) -> StreamResults:
        return self

    def __exit__(self, *exc_info: object) -> None:
        pass


@dataclass
class BatchSummary:
    ok: int = 0
    failed: int = 0
    skipped: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)  # (file, message)


def pending(files: list[Path], results: ResultsFile, segment: bool = False) -> tuple[list[Path], int]:
    """The clips still to do, and how many records are skipped as already there. With `segment`:
    the recordings with a segment still to do, and how many segments are skipped."""
    if not segment:
        todo = [f for f in files if clip_key(str(f)) not in results.done]
        return todo, len(files) - len(todo)
    todo, skipped = [], 0
    for f in files:
        done = len(results.skip(f))
        skipped += done
        if clip_key(str(f)) not in results.segments or done < results.segments[clip_key(str(f))]:
            todo.append(f)
    return todo, skipped


# How the clips still to do become records: given them in order, yields (clip, record) as each clip
# ends, in any order, each clip exactly once (a failed clip as its error record). One clip at a
# time in this process (`_describe_each`), several rows in flight, or remote workers: the results
# file, its one writer and its guarantees stay here.
DescribeAll = Callable[[list[Path]], Iterator[tuple[Path, dict[str, Any]]]]


def run_batch(
    files: list[Path],
    results: ResultsFile,
    describe: Callable[[Path], dict[str, Any]] | None,
    error_record: Callable[[Path, str], dict[str, Any]] | None,
    on_done: Callable[[Path, dict[str, Any]], None] | None = None,
    describe_all: DescribeAll | None = None,
    segment: bool = False,
) -> BatchSummary:
    """Describe each clip not yet recorded and append its record as that clip ends. A clip that
    fails gets a record with `error` set and the batch goes on; KeyboardInterrupt stops it (the file
    stays consistent). `describe_all` replaces the one-at-a-time default (see DescribeAll); then
    `describe` and `error_record` may be None (a Ray driver loads no model). `segment`: the clips
    are recordings, each given to `describe_all` (which yields a record per segment) while one of
    its segments is not recorded."""
    todo, skipped = pending(files, results, segment)
    summary = BatchSummary(skipped=skipped)
    if describe_all is None:
        assert describe is not None and error_record is not None, "describe_all or describe + error_record"
        def describe_all(clips: list[Path]) -> Iterator[tuple[Path, dict[str, Any]]]:
            return _describe_each(clips, describe, error_record)
    for path, record in describe_all(todo):
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
        yield path, describe_or_error(path, describe, error_record)


def describe_or_error(path: Path, describe: Callable[[Path], dict[str, Any]],
                      error_record: Callable[[Path, str], dict[str, Any]]) -> dict[str, Any]:
    """One clip's record: its description, or its error record (also used by remote workers)."""
    try:
        return describe(path)
    except Exception as exc:  # one bad clip must not stop the batch; its record says why
        record = error_record(path, one_line(exc))
        if "error_kind" in record:  # a record of this run's kind: say whether a rerun may help
            record["error_kind"] = error_kind(exc)
            record["retry"] = record["error_kind"] == RETRYABLE
        return record
