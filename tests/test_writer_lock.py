"""writer_lock: one writer per results file, against what the kernel says (flock, inodes, modes).

The race the module's retry loop exists for is staged deterministically: flock is wrapped so that,
between our open and our lock, the previous holder lets go the way it does (unlinks the lock file,
then closes), and optionally a third run takes a fresh lock file at the path.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path

import pytest

from specdec_cli import writer_lock
from specdec_cli.writer_lock import LockHeld, WriterLock, _holder_pid, lock_path


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def target(tmp_path) -> Path:
    return tmp_path / "results.jsonl"


def test_lock_file_beside_the_target_holds_our_pid_and_goes_on_release(target):
    old = os.umask(0o022)
    try:
        lock = WriterLock(target)
        lock.acquire()
    finally:
        os.umask(old)
    path = lock_path(target)
    assert path == target.with_name(".results.jsonl.lock")
    assert path.read_text() == f"{os.getpid()}\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    with pytest.raises(LockHeld) as held:
        WriterLock(target).acquire()
    assert held.value.pid == os.getpid() and str(held.value) == f"held by pid {os.getpid()}"
    lock.release()
    assert not path.exists()
    lock.release()  # a second release is a no-op
    WriterLock(target).release()  # so is releasing a lock never acquired
    again = WriterLock(target)
    again.acquire()  # free again
    again.release()


def test_a_stale_longer_pid_is_replaced_whole(target):
    """A lock file left by a killed run (the kernel dropped its lock) is taken over; its old text
    does not survive behind our shorter pid."""
    lock_path(target).write_text("9" * 30 + "\n")
    lock = WriterLock(target)
    lock.acquire()
    try:
        assert lock_path(target).read_text() == f"{os.getpid()}\n"
    finally:
        lock.release()


def _flock_after(monkeypatch, before_first_lock) -> list[int]:
    """Wrap writer_lock's flock: `before_first_lock(fd)` runs once, just before the first lock."""
    real, calls = fcntl.flock, []

    def flock(fd, op):
        calls.append(fd)
        if len(calls) == 1:
            before_first_lock(fd)
        return real(fd, op)

    monkeypatch.setattr(writer_lock.fcntl, "flock", flock)
    return calls


def test_retry_when_the_previous_holder_unlinked_the_file_we_opened(target, monkeypatch):
    """We opened the lock file; before we locked it its holder released (unlink, close). Our lock
    then covers a file no longer at the path: acquire must notice, take the file now at the path,
    and hold that one, so that the next run is refused."""
    path = lock_path(target)
    path.write_text("4242\n")  # the previous holder's file
    calls = _flock_after(monkeypatch, lambda fd: path.unlink())
    fds = open_fds()
    lock = WriterLock(target)
    lock.acquire()
    try:
        assert len(calls) == 2  # locked the orphan, noticed, locked the file at the path
        assert open_fds() == fds + 1  # the orphan's descriptor was closed
        assert path.read_text() == f"{os.getpid()}\n"
        assert os.fstat(lock._fd).st_ino == path.stat().st_ino
        monkeypatch.undo()
        with pytest.raises(LockHeld) as held:
            WriterLock(target).acquire()
        assert held.value.pid == os.getpid()
    finally:
        lock.release()


def test_retry_finds_a_third_run_holding_the_new_file(target, monkeypatch):
    """The same race, but a third run took a fresh lock file at the path meanwhile: refused, with
    the third run's pid, and nothing of ours left open."""
    path = lock_path(target)
    path.write_text("4242\n")
    third: list[int] = []

    def third_run_takes_it(_fd):
        path.unlink()
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # its own open file: conflicts with ours
        os.write(fd, b"777\n")
        third.append(fd)

    _flock_after(monkeypatch, third_run_takes_it)
    fds = open_fds()
    try:
        with pytest.raises(LockHeld) as held:
            WriterLock(target).acquire()
        assert held.value.pid == 777
        assert open_fds() == fds + 1  # only the third run's descriptor
    finally:
        for fd in third:
            os.close(fd)


def test_a_flock_failure_closes_the_descriptor_and_propagates(target, monkeypatch):
    def fail(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(writer_lock.fcntl, "flock", fail)
    fds = open_fds()
    with pytest.raises(OSError) as raised:
        WriterLock(target).acquire()
    assert raised.value.errno == errno.ENOLCK
    assert open_fds() == fds


def test_holder_pid_reads_what_the_holder_wrote(tmp_path):
    path = tmp_path / "lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        assert _holder_pid(fd, tries=1) is None  # nothing written yet
        os.write(fd, b"  31337 \n")
        assert _holder_pid(fd, tries=1) == 31337
        os.ftruncate(fd, 0)
        os.pwrite(fd, b"\xff\xfe12\n", 0)  # not ASCII: not a pid, and no exception either
        assert _holder_pid(fd, tries=2) is None
    finally:
        os.close(fd)
