"""The guide against the program: every command whose output README.md or docs/*.md shows is run
here through the installed `specdec`, and what it prints is compared with what the guide shows; the
README stays short; the docs site builds with `mkdocs build --strict`.

The convention (docs/testing.md, "The guide's examples"): a fenced block marked `console` is a
transcript. A line starting with `$ ` is a command (a trailing `\\` continues it on the next line);
the lines up to the next command are what it prints, stdout and stderr together in the order they
were written. Each block runs in a fresh temporary folder holding `samples/` (a link to the bundled
clips), through bash, with the venv's `specdec` first on PATH and `--threads 1` added after the
first `specdec` of each command. A command ending in `# exit N` must exit with N, any other with
0. A command ending in `&` (`specdec serve`) runs in the background until the block ends (then it
is stopped by its pid); only as many lines of its output as the block shows are read, and the port
it reports replaces the port the block shows in the commands after it. A command that is not run
goes in a `bash` block, with no output; no other block may show `$ ` lines (checked below).

What legitimately varies is compared loosely, on both sides alike: absolute paths up to
`specdec_cli/` (shown as `…/specdec_cli/`), the temporary folder, a decimal number of seconds
(`0.12 s`, latency and waiting), the seconds of a batch's progress line (`1 s elapsed, about 5 s
left`), `tokens/s` and `rows/s` figures (and a corpus run's `N rows in N s`), pids, the port of a background server, runs of
spaces (a table's padding follows the width of the numbers in it), and in a JSON record the fields
`latency_s`, `tokens_per_s`, `cloud_wait_s` and `latency_modelled_s`. Other decimals may differ by
0.011 (entropies printed to two places may round apart on another CPU's float kernels, as in
test_api.py).

When the program's output changes on purpose, regenerate the examples from a real run and review
the diff:

    .venv/bin/python tests/test_docs.py --write             # every file
    .venv/bin/python tests/test_docs.py --write docs/batch.md
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 200
VOLATILE_FIELDS = ("latency_s", "tokens_per_s", "cloud_wait_s", "latency_modelled_s")
COMMAND_TIMEOUT_S = 600
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
EXIT = re.compile(r"#\s*exit\s+(\d+)\s*$")


def guide_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


# -- reading the examples -------------------------------------------------------------------------

@dataclass
class Step:
    command: str
    expected: list[str] = field(default_factory=list)
    source: list[str] = field(default_factory=list)  # the command's lines as the guide writes them

    @property
    def background(self) -> bool:
        return self.command.rstrip().endswith("&")

    @property
    def exit_code(self) -> int:
        m = EXIT.search(self.command)
        return int(m[1]) if m else 0


@dataclass
class Example:
    file: Path
    line: int  # of the opening fence, 1-based
    start: int  # offset of the block's body in the file
    end: int
    steps: list[Step]

    @property
    def where(self) -> str:
        return f"{self.file.relative_to(ROOT)}:{self.line}"

    def __repr__(self) -> str:  # what pytest prints for the parameter
        return f"Example({self.where}, {len(self.steps)} commands)"


def parse_steps(body: str) -> list[Step]:
    steps: list[Step] = []
    lines = body.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("$ "):
            command, source = line[2:], [line]
            while command.endswith("\\") and i + 1 < len(lines):
                i += 1
                command = command[:-1] + " " + lines[i].strip()
                source.append(lines[i])
            steps.append(Step(command, source=source))
        elif steps:
            steps[-1].expected.append(line)
        else:
            raise ValueError(f"a console block must start with a `$ ` command, not {line!r}")
        i += 1
    return steps


def examples(path: Path) -> list[Example]:
    text = path.read_text(encoding="utf-8")
    found = []
    for m in FENCE.finditer(text):
        if m[1] == "console":
            found.append(Example(path, text.count("\n", 0, m.start()) + 1, m.start(2), m.end(2), parse_steps(m[2])))
    return found


def all_examples() -> list[Example]:
    return [e for path in guide_files() for e in examples(path)]


# -- running them ---------------------------------------------------------------------------------

def shell_env() -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONIOENCODING="utf-8", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    # Off a terminal, as a user's pipe would be: no forced colour or width, no debug tracebacks,
    # no token from the caller's environment.
    for name in ("COLUMNS", "LINES", "FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "SPECDEC_DEBUG", "SPECDEC_TOKEN"):
        env.pop(name, None)
    return env


def prepared(command: str, ports: dict[str, str]) -> str:
    command = re.sub(r"(?<![\w./-])specdec(?=\s)", "specdec --threads 1", command, count=1)
    for shown, real in ports.items():
        command = command.replace(f":{shown}", f":{real}")
    return command.rstrip().removesuffix("&").rstrip()


def _reader(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line.rstrip("\n"))
    lines.put(None)


@dataclass
class Ran:
    step: Step
    output: list[str]
    code: int | None  # None: a background command, still running


def run_example(example: Example, folder: Path) -> list[Ran]:
    """Run the example's commands in `folder`; the port map turns each background server's real
    port back into the one the example shows."""
    (folder / "samples").symlink_to(ROOT / "samples", target_is_directory=True)
    env = shell_env()
    ports: dict[str, str] = {}  # shown -> real
    background: list[subprocess.Popen] = []
    done: list[Ran] = []
    try:
        for step in example.steps:
            command = prepared(step.command, ports)
            if step.background:
                proc = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=folder, env=env, text=True,
                                        encoding="utf-8", stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        start_new_session=True)
                background.append(proc)
                lines: queue.Queue = queue.Queue()
                threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True).start()
                output = []
                for _ in range(max(1, len(step.expected))):
                    try:
                        line = lines.get(timeout=COMMAND_TIMEOUT_S)
                    except queue.Empty:
                        break
                    if line is None:
                        break
                    output.append(line)
                shown = re.search(r"127\.0\.0\.1:(\d+)", "\n".join(step.expected))
                real = re.search(r"127\.0\.0\.1:(\d+)", "\n".join(output))
                if shown and real:
                    ports[shown[1]] = real[1]
                done.append(Ran(step, output, None))
            else:
                proc = subprocess.run(["bash", "-c", command], cwd=folder, env=env, text=True, encoding="utf-8",
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=COMMAND_TIMEOUT_S)
                done.append(Ran(step, proc.stdout.splitlines(), proc.returncode))
    finally:
        for proc in background:  # stopped by its own pid, as `specdec serve` stops on Ctrl-C
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    for ran in done:  # a background server's port, as the example shows it
        ran.output = [_ports_back(line, ports) for line in ran.output]
    return done


def _ports_back(line: str, ports: dict[str, str]) -> str:
    for shown, real in ports.items():
        line = line.replace(f":{real}", f":{shown}")
    return line


# -- comparing ------------------------------------------------------------------------------------

# An absolute path up to the package (the checkout, or site-packages): `…/specdec_cli/...`.
INSTALL_PREFIX = re.compile(r"(?<![\w.…/-])/[^\s\"'│]*?/(?=specdec_cli/)")
DECIMAL = re.compile(r"\d+\.\d+")


def shown_form(line: str, folder: Path | None = None) -> str:
    """A line of real output as the guide shows it."""
    if folder is not None:
        for base in {str(folder), os.path.realpath(folder)}:
            line = line.replace(base + "/", "")
    return INSTALL_PREFIX.sub("…/", line).rstrip()


def normal(line: str) -> str:
    line = shown_form(line)
    stripped = line.strip()
    if stripped.startswith("{"):
        try:
            record = json.loads(stripped)
        except json.JSONDecodeError:
            record = None
        if isinstance(record, dict):
            for name in VOLATILE_FIELDS:
                record.pop(name, None)
            return json.dumps(record, ensure_ascii=False, sort_keys=True)
    line = re.sub(r"\d+\.\d+ s\b", "# s", line)
    line = re.sub(r"\b\d+ s elapsed, about \d+ s left", "# s elapsed, about # s left", line)
    line = re.sub(r"tokens/s(\s+)\d+(\.\d+)?", r"tokens/s\1#", line)
    line = re.sub(r"\d+(\.\d+)? rows/s", "# rows/s", line)  # a corpus run's rate
    line = re.sub(r"\brows in \d+ s\b", "rows in # s", line)
    line = re.sub(r"\bpid \d+", "pid #", line)
    return re.sub(r"\s+", " ", line).strip()


def same_line(got: str, expected: str) -> bool:
    a, b = normal(got), normal(expected)
    if a == b:
        return True
    if DECIMAL.sub("#", a) != DECIMAL.sub("#", b):
        return False
    return all(abs(float(x) - float(y)) <= 0.011 for x, y in zip(DECIMAL.findall(a), DECIMAL.findall(b), strict=True))


def same_output(got: list[str], expected: list[str]) -> bool:
    got = [line for line in got if line.strip()]
    expected = [line for line in expected if line.strip()]
    return len(got) == len(expected) and all(same_line(g, e) for g, e in zip(got, expected, strict=True))


def drift_report(example: Example, ran: list[Ran]) -> str | None:
    problems = []
    for r in ran:
        if r.code is not None and r.code != r.step.exit_code:
            problems.append(f"$ {r.step.command}\n  exited {r.code}, the guide says {r.step.exit_code}")
        if not same_output(r.output, r.step.expected):
            shown = "\n".join(f"    {line}" for line in r.step.expected)
            got = "\n".join(f"    {shown_form(line)}" for line in r.output)
            problems.append(f"$ {r.step.command}\n  the guide shows:\n{shown}\n  it printed:\n{got}")
    if not problems:
        return None
    return (f"the example at {example.where} drifted from what specdec prints (regenerate it with "
            f"`.venv/bin/python tests/test_docs.py --write {example.file.relative_to(ROOT)}` and review the diff):\n"
            + "\n".join(problems))


# -- the tests ------------------------------------------------------------------------------------

EXAMPLES = all_examples()


@pytest.mark.spawns
@pytest.mark.parametrize("example", EXAMPLES, ids=[e.where for e in EXAMPLES])
def test_the_example_prints_what_the_guide_shows(example: Example, tmp_path: Path) -> None:
    if not (Path(sys.executable).parent / "specdec").exists():
        pytest.skip("the specdec console script is not installed (pip install --config-settings editable_mode=compat -e .)")
    report = drift_report(example, run_example(example, tmp_path))
    assert report is None, report


def test_every_shown_command_is_in_a_console_block() -> None:
    """A `$ ` transcript anywhere else would be output nobody checks."""
    stray = []
    for path in guide_files():
        text = path.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            if m[1] != "console" and any(line.startswith("$ ") for line in m[2].splitlines()):
                stray.append(f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1} ({m[1] or 'no language'})")
    assert not stray, f"blocks showing `$ ` commands outside a console block: {', '.join(stray)}"
    assert len(EXAMPLES) >= 5 and all(e.steps for e in EXAMPLES)


def test_the_comparison_catches_drift() -> None:
    """The loose parts are loose only where they should be."""
    assert same_output(["latency 0.12 s", "tokens/s  233.2  │"], ["latency 10.53 s", "tokens/s  52.4   │"])
    assert same_output(["ΣH 3.48 > 0.743"], ["ΣH 3.47 > 0.743"])
    assert not same_output(["ΣH 3.50 > 0.743"], ["ΣH 3.47 > 0.743"])
    assert not same_output(["说话人为女声"], ["说话人为男声"])
    assert not same_output(["batch: 9 ok"], ["batch: 8 ok"])
    assert same_output(["batch: 1/9 clips (0 failed), 1 s elapsed, about 5 s left"],
                       ["batch: 1/9 clips (0 failed), 0 s elapsed, about 12 s left"])
    assert not same_output(["batch: 1/9 clips (0 failed), 1 s elapsed, about 5 s left"],
                           ["batch: 2/9 clips (0 failed), 1 s elapsed, about 5 s left"])
    assert not same_output(["a", "b"], ["a"])
    record = {"file": "x.wav", "edge": "/srv/x/specdec_cli/demo/models/edge", "latency_s": 0.1, "tokens": 28}
    shown = dict(record, edge="…/specdec_cli/demo/models/edge", latency_s=9.9)
    assert same_output([json.dumps(record)], [json.dumps(shown, ensure_ascii=False)])
    assert not same_output([json.dumps(record)], [json.dumps(dict(shown, tokens=29), ensure_ascii=False)])
    assert parse_steps("$ a \\\n  --b\nout\n$ c &\n")[0].command == "a  --b"
    assert parse_steps("$ a \\\n  --b\nout\n")[0].source == ["$ a \\", "  --b"]
    assert [s.background for s in parse_steps("$ a\n$ b &\n")] == [False, True]
    assert parse_steps("$ x  # exit 2\n")[0].exit_code == 2


def test_the_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; keep it to {README_MAX_LINES} (the rest goes in docs/)"


def test_the_docs_build_strictly(tmp_path: Path) -> None:
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    if mkdocs is None:
        pytest.skip("mkdocs is not installed in this environment (pip install --config-settings editable_mode=compat -e '.[docs]'; `make test` does)")
    proc = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                          capture_output=True, text=True, encoding="utf-8", timeout=600,
                          env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "api" / "index.html").is_file()


# -- regenerating ---------------------------------------------------------------------------------

def regenerate(path: Path) -> int:
    """Rewrite the outputs of every console block of `path` from a real run; the number of blocks
    whose output changed."""
    import tempfile

    text = path.read_text(encoding="utf-8")
    changed = 0
    for example in reversed(examples(path)):  # from the end: offsets before a block stay valid
        with tempfile.TemporaryDirectory() as folder:
            ran = run_example(example, Path(folder))
            body = []
            for r in ran:
                body.extend(r.step.source or ["$ " + r.step.command])  # continued lines kept as written
                body.extend(shown_form(line, Path(folder)) for line in r.output)
                if r.code is not None and r.code != r.step.exit_code:
                    print(f"{example.where}: `{r.step.command}` exited {r.code}", file=sys.stderr)
        new = "\n".join(body) + "\n"
        if new != text[example.start:example.end]:
            changed += 1
            text = text[:example.start] + new + text[example.end:]
    path.write_text(text, encoding="utf-8")
    return changed


if __name__ == "__main__":
    args = sys.argv[1:]
    if not args or args[0] != "--write":
        sys.exit("usage: python tests/test_docs.py --write [README.md docs/x.md …]")
    for name in args[1:] or [str(p.relative_to(ROOT)) for p in guide_files()]:
        n = regenerate((ROOT / name).resolve())
        print(f"{name}: {n} example(s) rewritten")
