"""The README's Python API example, run on the bundled pair: its printed output, rewritten into the
README by script (issue 34, item 4: no demo-pair figure by hand).

    python bench/doc_examples.py          # check: exit 1 when the README's output block differs
    python bench/doc_examples.py --write  # run the example and rewrite its output block

The example is the ```python block of README.md's "Python API" section (between its
`<!-- --8<-- [start:api] -->` / `[end:api]` markers, which docs/api.md includes); its output is the
```text block after it. The example decodes greedily, so on one CPU it prints the same every run;
tests/test_api.py runs it in the suite and compares (numbers within 0.01, for another CPU's float
kernels). The guide's `console` transcripts (README's trace included) are rewritten by
`python tests/test_docs.py --write FILE` and checked by tests/test_docs.py.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python bench/doc_examples.py` from a checkout that is not installed
    sys.path.insert(0, str(REPO))

SECTION = re.compile(r"\n## Python API\n(.*?)(?=\n## |\Z)", re.S)
CODE = re.compile(r"```python\n(.*?)```", re.S)
OUTPUT = re.compile(r"```text\n(.*?)```", re.S)


def api_example(readme: str) -> tuple[str, tuple[int, int]]:
    """The example's code and the span (offsets in `readme`) of its output block's body."""
    section = SECTION.search(readme)
    if section is None:
        raise SystemExit("README.md has no '## Python API' section")
    code = CODE.search(readme, section.start(1), section.end(1))
    out = OUTPUT.search(readme, code.end() if code else section.start(1), section.end(1)) if code else None
    if code is None or out is None:
        raise SystemExit("README.md's Python API section lost its ```python example or the ```text output after it")
    return code.group(1), out.span(1)


def run_api_example(code: str, root: Path = REPO) -> str:
    """What the example prints, run from `root` (its clip paths are relative to the checkout)."""
    here = Path.cwd()
    printed = io.StringIO()
    os.chdir(root)
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(code, "README.md (Python API)", "exec"), {"__name__": "readme_example"})
    finally:
        os.chdir(here)
    return printed.getvalue()


def check(root: Path = REPO) -> str | None:
    """None when the README shows what the example prints; else a one-line problem."""
    readme = (root / "README.md").read_text(encoding="utf-8")
    code, (start, end) = api_example(readme)
    if run_api_example(code, root) != readme[start:end]:
        return "README.md: the Python API example's output differs from a run: rerun `python bench/doc_examples.py --write`"
    return None


def write(root: Path = REPO) -> bool:
    """Rewrite the output block from a run; whether it changed."""
    path = root / "README.md"
    readme = path.read_text(encoding="utf-8")
    code, (start, end) = api_example(readme)
    got = run_api_example(code, root)
    if got == readme[start:end]:
        return False
    path.write_text(readme[:start] + got + readme[end:], encoding="utf-8")
    return True


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="rewrite the README's output block")
    args = ap.parse_args(argv)
    if args.write:
        print("rewrote README.md's Python API output" if write() else "README.md's Python API output is current")
        return
    problem = check()
    if problem:
        print(problem, file=sys.stderr)
        raise SystemExit(1)
    print("README.md's Python API output matches a run")


if __name__ == "__main__":
    main()
