"""Error paths a user meets, through real `specdec` processes: each asserts the one line on stderr,
the exit code, and that nothing already written changed (the results file's bytes before and after).

Most cases run twice, through the installed console script and through the real app in this
process (`specdec_cli.commands.app.app` under CliRunner): the same line and code from both, and the
in-process run is the one mutation testing (`make mutate`) can see.

Tests run as root here (and in CI), and root ignores permission bits. The permission cases
therefore run the command as root without the two capabilities that bypass them
(CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, dropped from the bounding set in the child before exec):
the files stay root's, so the venv and the models remain readable, and a mode-000 clip is refused
as it would be for any user. (`setuid(nobody)` was the other way; here the venv's Python lives
under /root, which `nobody` cannot enter.) Skipped where the capabilities cannot be dropped; as an
ordinary user the same cases need nothing.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from cli_helpers import FAST, specdec_exe, subprocess_env, write_clip
from typer.testing import CliRunner

from specdec_cli.commands.app import app
from specdec_cli.writer_lock import lock_path

pytest_plugins = ["cli_fixtures"]

HOW = pytest.mark.parametrize("how", [pytest.param("process", marks=pytest.mark.spawns), "app"])


def specdec(how: str, *args: str, preexec: Callable[[], None] | None = None) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `specdec ARGS`: the installed command ("process"; `preexec`
    runs in the child before exec), or the real app in this process ("app")."""
    if how == "app":
        result = CliRunner().invoke(app, list(args))
        return result.exit_code, result.stdout, result.stderr
    proc = subprocess.run([specdec_exe(), *args], capture_output=True, text=True, encoding="utf-8",
                          env=subprocess_env(), timeout=300, preexec_fn=preexec)
    return proc.returncode, proc.stdout, proc.stderr


def one_line(stderr: str, expected: str) -> None:
    assert stderr == f"error: {expected}\n", stderr


# -- a finished batch to rerun -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def done(tmp_path_factory, models) -> tuple[Path, Path, list[str]]:
    """(clips folder, results file of a complete batch over it, the batch's arguments)."""
    root = tmp_path_factory.mktemp("done")
    clips = root / "clips"
    for i in range(2):
        write_clip(clips / f"c{i}.wav", seconds=0.5, seed=i)
    out = root / "results.jsonl"
    args = ["batch", str(clips), "--out", str(out), *models, *FAST]
    code, _, stderr = specdec("app", *args)
    assert code == 0, stderr
    return clips, out, args


@pytest.fixture
def results(done, tmp_path) -> Iterator[tuple[Path, list[str], bytes]]:
    """A private copy of the finished results file: (path, batch args writing to it, its bytes)."""
    clips, out, args = done
    mine = tmp_path / "results.jsonl"
    shutil.copyfile(out, mine)
    args = [str(mine) if a == str(out) else a for a in args]
    before = mine.read_bytes()
    yield mine, args, before


def refusal(out: Path, what: str) -> str:
    return (f"{out} {what}; the file was left as it is. Give another --out, or add --overwrite to start "
            f"over (the old file is then kept as {out}.bak)")


# -- results files ---------------------------------------------------------------------------------

@pytest.mark.spawns
def test_rerun_with_every_clip_done_loads_no_model(done, tmp_path, tiny_pair):
    """A rerun with nothing left to do opens the results file, skips every clip and exits 0 without
    loading a model: here both model folders have lost their weights, so a load would fail."""
    clips, _, _ = done
    pair = tmp_path / "pair"
    for name, folder in zip(("edge", "cloud"), tiny_pair, strict=True):
        shutil.copytree(folder, pair / name)
    out = tmp_path / "results.jsonl"
    args = ["batch", str(clips), "--out", str(out), "--edge", str(pair / "edge"), "--cloud", str(pair / "cloud"),
            *FAST]
    assert specdec("app", *args)[0] == 0
    before = out.read_bytes()
    for name in ("edge", "cloud"):
        for weights in (pair / name).glob("*.safetensors"):
            weights.unlink()
    code, stdout, stderr = specdec("process", *args)
    assert code == 0, stderr
    assert stderr.startswith("batch: 0 ok · 0 failed · 2 skipped") and stdout == ""
    assert out.read_bytes() == before
    # the control: the same folders do fail where a model is needed
    code, _, stderr = specdec("app", "describe", str(clips / "c0.wav"), "--edge", str(pair / "edge"),
                              "--cloud", str(pair / "cloud"), "--no-live")
    assert code != 0 and stderr.startswith("error: ")


@HOW
def test_a_record_whose_error_is_not_a_string_is_refused(results, how):
    out, args, _ = results
    record = json.loads(out.read_text(encoding="utf-8").splitlines()[1])
    record["error"] = 5
    out.write_text(out.read_text(encoding="utf-8") + json.dumps(record) + "\n", encoding="utf-8")
    before = out.read_bytes()
    code, stdout, stderr = specdec(how, *args)
    assert code == 2 and stdout == ""
    one_line(stderr, refusal(out, "line 3 is not a specdec record (its error is 5)"))
    assert out.read_bytes() == before


@HOW
def test_a_lock_held_by_a_process_that_wrote_no_pid(results, how):
    """The holder locked the file but has not written its pid (or cannot): "pid unknown"."""
    out, args, before = results
    fd = os.open(lock_path(out), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        code, stdout, stderr = specdec(how, *args)
    finally:
        os.close(fd)
    assert code == 2 and stdout == ""
    one_line(stderr, f"{out} is being written by another specdec batch (pid unknown); wait for it to finish, "
                     "or give this run another --out")
    assert out.read_bytes() == before


@HOW
def test_a_results_file_that_cannot_be_read(done, tmp_path, how):
    """--out names a folder: it cannot be read as a results file (and is left as it was)."""
    clips, _, args = done
    out = tmp_path / "results.jsonl"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    args = [str(out) if a.endswith("results.jsonl") else a for a in args]
    code, stdout, stderr = specdec(how, *args)
    assert code == 2 and stdout == ""
    one_line(stderr, f"cannot read results file {out}: Is a directory")
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


@HOW
def test_a_results_file_that_cannot_be_written(done, tmp_path, how):
    """--out inside a path whose parent is a file: nothing is created, the file is left as it was."""
    clips, _, args = done
    blocker = tmp_path / "notes"
    blocker.write_text("mine")
    out = blocker / "results.jsonl"
    args = [str(out) if a.endswith("results.jsonl") else a for a in args]
    code, stdout, stderr = specdec(how, *args)
    assert code == 2 and stdout == ""
    one_line(stderr, f"cannot write results file {out}: File exists")
    assert blocker.read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["notes"]


# -- presets files ---------------------------------------------------------------------------------

PRESETS = {
    "broken": ("[fluent\nk = 4\n", "cannot read presets file {path}: Expected ']' at the end of a table "
                                   "declaration (at line 1, column 8)"),
    "k0": ("[fluent]\nk = 0\n", "preset 'fluent' from {path} is invalid: k must be at least 1, got 0"),
    "threshold": ("[fluent]\nthreshold = -1.0\n",
                  "preset 'fluent' from {path} is invalid: threshold must be a non-negative number or inf, "
                  "got -1.0"),
    "uncertainty": ('[fluent]\nuncertainty = "median"\n',
                    "preset 'fluent' from {path} is invalid: uncertainty must be sum, max or mean, got 'median'"),
}


@HOW
@pytest.mark.parametrize("case", sorted(PRESETS))
def test_a_broken_or_out_of_range_presets_file(results, tmp_path, how, case):
    """--presets FILE that does not parse, or holds a value out of range: refused before the
    results file is touched."""
    out, args, before = results
    text, message = PRESETS[case]
    path = tmp_path / "p.toml"
    path.write_text(text, encoding="utf-8")
    code, stdout, stderr = specdec(how, *args, "--presets", str(path))
    assert code == 2 and stdout == ""
    one_line(stderr, message.format(path=path))
    assert out.read_bytes() == before


@pytest.mark.spawns
def test_a_broken_presets_file_in_the_model_folder(done, tmp_path, tiny_pair):
    """The edge folder's own specdec_presets.toml, broken: named in the one line."""
    clips, _, _ = done
    edge = tmp_path / "edge"
    shutil.copytree(tiny_pair[0], edge)
    (edge / "specdec_presets.toml").write_text("[quality]\nk = 'six'\n[quality]\n", encoding="utf-8")
    out = tmp_path / "r.jsonl"
    code, stdout, stderr = specdec("process", "batch", str(clips), "--out", str(out), "--edge", str(edge),
                                   "--cloud", tiny_pair[1], *FAST)
    assert code == 2 and stdout == ""
    one_line(stderr, f"cannot read presets file {edge / 'specdec_presets.toml'}: Cannot declare ('quality',) "
                     "twice (at line 3, column 9)")
    assert not out.exists()


# -- clips -----------------------------------------------------------------------------------------

def corrupt_flac(path: Path) -> Path:
    """A FLAC whose header reads (1 s at 16 kHz) but whose frames do not decode."""
    sf.write(str(path), 0.3 * np.sin(np.arange(16000) / 10).astype(np.float32), 16000)
    data = bytearray(path.read_bytes())
    for i in range(200, len(data)):  # past STREAMINFO and the first frame header
        data[i] = (data[i] * 7 + 13) % 256
    path.write_bytes(bytes(data))
    assert sf.info(str(path)).frames == 16000
    return path


@HOW
def test_a_clip_that_fails_mid_decode(results, done, how, models):
    """describe: one line, exit 2. batch: the clip's error record is appended, every line already
    written stays as it was, exit 1."""
    out, args, before = results
    clips, _, _ = done
    bad = corrupt_flac(out.parent / "bad.flac")
    code, stdout, stderr = specdec(how, "describe", str(bad), *models, "--no-live")
    assert code == 2 and stdout == ""
    assert stderr.startswith(f"error: cannot decode {bad} as audio (Internal psf_fseek() failed); give a ")
    assert stderr.count("\n") == 1, stderr

    folder = out.parent / "clips"
    shutil.copytree(clips, folder)
    shutil.copyfile(bad, folder / "bad.flac")
    args = [str(folder) if a == str(clips) else a for a in args]
    first = specdec("app", *args)  # the copied clips are new paths: they are described first
    assert first[0] == 1, first[2]
    before = out.read_bytes()
    code, stdout, stderr = specdec(how, *args)
    assert code == 1 and stdout == ""
    assert stderr.endswith("error: 1 of 3 files failed; their records in "
                           f"{out} say why; 1 cannot be described as it is: fix or remove it (a rerun fails it "
                           "again)\n"), stderr
    after = out.read_bytes()
    # the successes stay, byte for byte and in order; the old error line is dropped (its clip was
    # retried) and the retry's error record appended
    kept = b"".join(line + b"\n" for line in before.splitlines() if b'"error": null' in line)
    assert kept.count(b"\n") == 4 and after.startswith(kept)
    added = [json.loads(line) for line in after[len(kept):].decode().splitlines()]
    assert [r["file"] for r in added] == [str(folder / "bad.flac")]
    assert added[0]["error"].startswith(f"cannot decode {folder / 'bad.flac'} as audio (Internal psf_fseek() failed)")


@HOW
def test_a_clip_whose_name_cannot_be_looked_up(tmp_path, how, models):
    """stat fails with something other than "no such file" (here: a name longer than the
    filesystem allows): one line, exit 2, no traceback."""
    clip = tmp_path / ("a" * 300 + ".wav")
    code, stdout, stderr = specdec(how, "describe", str(clip), *models, "--no-live")
    assert code == 2 and stdout == ""
    one_line(stderr, f"cannot read {clip}: File name too long")
    code, stdout, stderr = specdec(how, "batch", str(tmp_path / ("d" * 300)), "--out", str(tmp_path / "r.jsonl"))
    assert code == 2 and stdout == ""
    one_line(stderr, f"cannot read {tmp_path / ('d' * 300)}: File name too long")


# -- permissions: root without its permission-bypass capabilities ---------------------------------------

CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 1, 2
PR_CAPBSET_DROP = 24


def drop_permission_bypass() -> None:
    """In the child before exec: drop CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from the capability
    bounding set, so the exec'd root process obeys permission bits like any user (Linux)."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


@pytest.fixture(scope="module")
def as_user(tmp_path_factory):
    """How to run `specdec` so that permission bits apply: `specdec(..., preexec=as_user)`. As
    root: with the two capabilities dropped (checked on a mode-000 file first; skipped where the
    kernel or container does not allow it). As any other user: unchanged."""
    if os.geteuid() != 0:
        return None
    probe = tmp_path_factory.mktemp("probe") / "secret"
    probe.write_text("x")
    probe.chmod(0o000)
    try:
        seen = subprocess.run(["cat", str(probe)], capture_output=True, preexec_fn=drop_permission_bypass)
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot drop root's permission bypass here: {exc}")
    if seen.returncode == 0:
        pytest.skip("root still reads a mode-000 file with its bypass dropped")
    return drop_permission_bypass


@pytest.mark.spawns
def test_permission_denied_on_a_clip(tmp_path, models, as_user):
    """A clip the user may not read: one line, exit 2 from describe; in a batch its error record is
    appended after the lines already written (unchanged), exit 1."""
    folder = tmp_path / "clips"
    write_clip(folder / "a.wav", seconds=0.5)
    out = tmp_path / "results.jsonl"
    args = ["batch", str(folder), "--out", str(out), *models, *FAST]
    assert specdec("app", *args)[0] == 0
    before = out.read_bytes()
    secret = write_clip(folder / "b.wav", seconds=0.5, seed=1)
    secret.chmod(0o000)

    code, stdout, stderr = specdec("process", "describe", str(secret), *models, "--no-live", preexec=as_user)
    assert code == 2 and stdout == ""
    one_line(stderr, f"cannot read {secret}: permission denied")
    code, stdout, stderr = specdec("process", *args, preexec=as_user)
    assert code == 1 and stdout == "", stderr
    after = out.read_bytes()
    assert after.startswith(before)
    added = [json.loads(line) for line in after[len(before):].decode().splitlines()]
    assert [(r["file"], r["error"]) for r in added] == [(str(secret), f"cannot read {secret}: permission denied")]


@pytest.mark.spawns
def test_permission_denied_on_the_folder_of_a_clip(tmp_path, models, as_user):
    """stat itself fails (no search permission on the clip's folder): one line, exit 2."""
    locked = tmp_path / "locked"
    clip = write_clip(locked / "a.wav", seconds=0.5)
    locked.chmod(0o000)
    try:
        code, stdout, stderr = specdec("process", "describe", str(clip), *models, "--no-live", preexec=as_user)
    finally:
        locked.chmod(0o755)
    assert code == 2 and stdout == ""
    one_line(stderr, f"cannot read {clip}: Permission denied")


@pytest.mark.spawns
def test_a_results_file_in_a_folder_the_user_cannot_write(tmp_path, models, as_user):
    """The results file itself is writable but its folder is not, so neither the lock nor the
    compacted copy can be created: one line, exit 2, the file unchanged."""
    clips = tmp_path / "clips"
    write_clip(clips / "a.wav", seconds=0.5)
    folder = tmp_path / "out"
    out = folder / "results.jsonl"
    args = ["batch", str(clips), "--out", str(out), *models, *FAST]
    assert specdec("app", *args)[0] == 0
    before = out.read_bytes()
    folder.chmod(0o555)
    try:
        code, stdout, stderr = specdec("process", *args, preexec=as_user)
    finally:
        folder.chmod(0o755)
    assert code == 2 and stdout == ""
    one_line(stderr, f"cannot write results file {out}: Permission denied")
    assert out.read_bytes() == before and sorted(p.name for p in folder.iterdir()) == ["results.jsonl"]


@pytest.mark.spawns
def test_a_results_file_the_user_cannot_read(tmp_path, models, as_user):
    """A results file without read permission: one line, exit 2, the file unchanged."""
    clips = tmp_path / "clips"
    write_clip(clips / "a.wav", seconds=0.5)
    out = tmp_path / "results.jsonl"
    args = ["batch", str(clips), "--out", str(out), *models, *FAST]
    assert specdec("app", *args)[0] == 0
    before = out.read_bytes()
    out.chmod(0o200)
    try:
        code, stdout, stderr = specdec("process", *args, preexec=as_user)
    finally:
        out.chmod(0o644)
    assert code == 2 and stdout == ""
    one_line(stderr, f"cannot read results file {out}: Permission denied")
    assert out.read_bytes() == before
