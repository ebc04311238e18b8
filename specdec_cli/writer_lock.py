"""One writer per results file: an exclusive flock on a sidecar `.NAME.lock`, held for the run.

Why flock on a sidecar: the kernel drops the lock when the process that holds it dies, however it
dies (SIGKILL, a crash, a power cut), so a lock left by a killed run never blocks the next one;
there is no stale-pid guessing. The results file itself cannot carry the lock, because compaction
replaces it with a new file (a new inode) that a lock on the old one would not cover.

The holder writes its pid into the lock file so that a refused run can say who holds it. It
unlinks the file before letting go; a process that opened the old file just before that checks,
once it holds its lock, that the file it locked is still the one at the path, and retries if not.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no flock; runs go unguarded there (the file itself stays crash-safe)
    fcntl = None  # type: ignore[assignment]


class LockHeld(Exception):
    def __init__(self, pid: int | None) -> None:
        super().__init__(f"held by pid {pid}")
        self.pid = pid


def lock_path(target: Path) -> Path:
    return target.with_name(f".{target.name}.lock")


class WriterLock:
    """`acquire()` or raise LockHeld at once (never waits); `release()` when done."""

    def __init__(self, target: Path) -> None:
        self.path = lock_path(target)
        self._fd: int | None = None

    def acquire(self) -> None:
        if fcntl is None:
            return
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pid = _holder_pid(fd)
                os.close(fd)
                raise LockHeld(pid) from None
            except BaseException:
                os.close(fd)
                raise
            if _still_at(fd, self.path):
                break
            os.close(fd)  # locked a file its holder had just unlinked: take the one at the path now
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.unlink(self.path)  # while still holding it; see the module doc
        except OSError:
            pass
        os.close(self._fd)  # closing drops the lock
        self._fd = None


def _still_at(fd: int, path: Path) -> bool:
    try:
        at_path = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (mine.st_dev, mine.st_ino) == (at_path.st_dev, at_path.st_ino)


def _holder_pid(fd: int, tries: int = 20) -> int | None:
    """The pid the holder wrote; it writes right after locking, so give it a moment."""
    for _ in range(tries):
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        if text.isdigit():
            return int(text)
        time.sleep(0.025)
    return None
