"""A real `specdec serve` in a child process on loopback, for benchmarks, notebooks and the tests:
started on a port the system picks (`--port 0`; the start line says which), stopped by its own pid.

`log`: stderr goes to that file instead of a pipe (a server made to log a lot must not block on a
full pipe). `prelude`: Python run in the server process before the CLI starts (a test injecting a
fault the server cannot be asked for); the server is then `python -c PRELUDE; main()`. `nofile`:
the server's descriptor limit (soft and hard, as `ulimit -n N` sets them). `quiet` (the default):
`--quiet`, no access-log line per request (a pipe nobody reads past the start line would fill)."""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPECDEC = str(Path(sys.executable).with_name("specdec"))
LISTENING = re.compile(r"listening on http://(127\.0\.0\.1|\[::1\]):(\d+)")


class LocalServer:
    """`specdec --threads 1 serve --port PORT ARGS…`, its start line read for the address it got."""

    def __init__(self, *args: str, port: int = 0, env: dict[str, str] | None = None, log: Path | None = None,
                 prelude: str | None = None, nofile: int | None = None, quiet: bool = True) -> None:
        self.args, self.port, self.env, self.log = list(args), port, env, log
        self.quiet = quiet
        self.prelude, self.nofile = prelude, nofile
        self.proc: subprocess.Popen | None = None
        self.lines: list[str] = []
        self.host = "127.0.0.1"
        self._log_at = 0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        cli = ["--threads", "1", "serve", "--port", str(self.port), *(["--quiet"] if self.quiet else []), *self.args]
        if self.prelude is None:
            return [SPECDEC, *cli]
        return [sys.executable, "-c", f"{self.prelude}\nfrom specdec_cli.commands.app import main\nmain()", *cli]

    def start(self, timeout: float = 300.0) -> LocalServer:  # (a loaded 2-core machine took 111 s)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        env.pop("SPECDEC_TOKEN", None)  # only the token a test gives
        env.update(self.env or {})
        limit = self.nofile
        preexec = (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))) if limit else None
        stderr = open(self.log, "w") if self.log is not None else subprocess.PIPE  # noqa: SIM115
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL, stderr=stderr, text=True, env=env,
                                     cwd=ROOT, preexec_fn=preexec)
        if self.log is not None:
            stderr.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self._next_line()
            if not line:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"specdec serve exited {self.proc.returncode}: {''.join(self.lines)}")
                continue
            self.lines.append(line)
            m = LISTENING.search(line)
            if m:
                self.host, self.port = m.group(1), int(m.group(2))
                return self
        self.kill()
        raise RuntimeError(f"specdec serve did not start in {timeout} s: {''.join(self.lines)}")

    def _next_line(self) -> str:
        if self.log is None:
            return self.proc.stderr.readline()
        text = self.log.read_text()
        end = text.find("\n", self._log_at)
        if end < 0:
            time.sleep(0.1)
            return ""
        line = text[self._log_at:end + 1]
        self._log_at = end + 1
        return line

    def logged(self) -> str:
        """What the server wrote to its log file after its start line (`log` servers)."""
        assert self.log is not None
        return self.log.read_text()[self._log_at:]

    def rss_kb(self, field: str = "VmRSS") -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise RuntimeError(f"no {field}")

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

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
            if self.log is None:
                rest = self.proc.stderr.read()
                code = self.proc.wait(timeout=30)
            else:
                code = self.proc.wait(timeout=30)
                rest = self.logged()
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        return code, rest

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()
