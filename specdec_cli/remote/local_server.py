"""A real `specdec serve` in a child process on 127.0.0.1, for benchmarks and notebooks: started on
a port the system picks (`--port 0`; the start line says which), stopped by its own pid.
(tests/remote_helpers.py holds the tests' copy.)"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPECDEC = str(Path(sys.executable).with_name("specdec"))
LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")


class LocalServer:
    """`specdec --threads 1 serve --port PORT ARGS…`, its start line read for the port it got."""

    def __init__(self, *args: str, port: int = 0, env: dict[str, str] | None = None, log: Path | None = None) -> None:
        self.args, self.port, self.env, self.log = list(args), port, env, log
        self.proc: subprocess.Popen | None = None
        self.lines: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120.0) -> LocalServer:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        env.pop("SPECDEC_TOKEN", None)  # only the token a test gives
        env.update(self.env or {})
        self.proc = subprocess.Popen([SPECDEC, "--threads", "1", "serve", "--port", str(self.port), *self.args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"specdec serve exited {self.proc.returncode}: {''.join(self.lines)}")
                continue
            self.lines.append(line)
            m = LISTENING.search(line)
            if m:
                self.port = int(m.group(1))
                return self
        self.kill()
        raise RuntimeError(f"specdec serve did not start in {timeout} s: {''.join(self.lines)}")

    def rss_kb(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS")

    def kill(self) -> None:
        """SIGKILL by our own pid: a crash, not a shutdown."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self, sig: int = signal.SIGTERM) -> tuple[int, str]:
        """Stop by our own pid and return (exit code, what it printed after starting)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
        try:
            rest = self.proc.stderr.read()
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        return code, rest

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()
