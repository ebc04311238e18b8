"""The guide's `Dataset.map` example (docs/corpus.md, "In Python"), run as written in its own process
(datasets forks its num_proc workers from it, which must not inherit this test process's torch
threads), in a folder holding `samples/`: what it prints must be what the guide shows, and each of
its num_proc processes must have loaded the pair once, the parent never."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import subprocess_env
from test_api import same_lines

pytest.importorskip("datasets")

ROOT = Path(__file__).resolve().parents[1]

# Counts every pair loaded, by the pid that loaded it (a fork inherits the patch).
COUNT_LOADS = """
import os
import specdec_cli.pair as _pair
_from_spec = _pair.Pair.from_spec.__func__
def _counted(cls, spec):
    with open(os.environ["SPECDEC_TEST_LOADS"], "a") as f:
        f.write(f"{os.getpid()}\\n")
    return _from_spec(cls, spec)
_pair.Pair.from_spec = classmethod(_counted)
"""


def map_example() -> tuple[str, str]:
    """The python block of the guide's `Dataset.map` section and the text block after it."""
    text = (ROOT / "docs" / "corpus.md").read_text(encoding="utf-8")
    section = text.split("\n## In Python: `Dataset.map`\n", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    out = re.search(r"```text\n(.*?)```", section, re.S)
    assert code and out, "the guide's Dataset.map section lost its example or its output"
    return code.group(1), out.group(1)


def test_the_map_example_prints_what_the_guide_shows_loading_once_per_process(tmp_path):
    code, expected = map_example()
    assert "num_proc=2" in code
    (tmp_path / "samples").symlink_to(ROOT / "samples", target_is_directory=True)
    loads = tmp_path / "loads.txt"
    env = dict(subprocess_env(), SPECDEC_TEST_LOADS=str(loads), HF_DATASETS_CACHE=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-c", COUNT_LOADS + "\nprint(os.getpid(), flush=True)\n" + code],
                          cwd=tmp_path, env=env, capture_output=True, text=True, encoding="utf-8", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    parent, *printed = proc.stdout.splitlines()
    assert same_lines("\n".join(printed), expected), proc.stdout
    pids = loads.read_text().split()
    assert len(pids) == 2 and len(set(pids)) == 2, pids  # two processes, one load each
    assert parent not in pids and str(os.getpid()) not in pids  # the parent pickled it unloaded
