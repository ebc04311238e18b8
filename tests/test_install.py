"""Issue 44, points 1 and 2: every documented install line installs this project under its own
distribution name, and the documented editable route is the one under which `from specdec import
Pair` works from any folder. The oracle is pyproject.toml's [project] name; PyPI's `specdec` (0.2.0,
"Speculative Decoder") is another project, so that name must never be what a line installs."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TAKEN_ON_PYPI = {"specdec"}  # `pip index versions specdec`: 0.2.0, another project


def distribution() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["name"]


def documented() -> list[tuple[str, str]]:
    """(where, text) for every file a user reads an install line in: the README, the guide, the
    messages and help of the package, the benches' usage lines."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "specdec_cli").rglob("*.py")),
             *sorted((ROOT / "bench").glob("*.py"))]
    return [(str(f.relative_to(ROOT)), f.read_text(encoding="utf-8")) for f in files]


# `pip install` and what follows it up to the end of the line or of an inline code span / string:
# a line may wrap inside a span (docs/usage.md), so a newline inside quotes is followed.
INSTALL = re.compile(r"pip install((?:\s*\n?\s*)[^`\"\n)]*(?:\n'[^'\n]*')?)")


def install_lines() -> list[tuple[str, str]]:
    return [(where, m.group(1).strip()) for where, text in documented() for m in INSTALL.finditer(text)]


def test_the_distribution_name_is_not_pypis_other_project():
    assert distribution().lower() not in TAKEN_ON_PYPI
    # the command stays `specdec`, the import names stay specdec / specdec_cli
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert list(project["scripts"]) == ["specdec"]
    assert all(d.split("[")[0] == distribution() for d in (*project["optional-dependencies"]["dev"][:1],
                                                               project["optional-dependencies"]["test"][-1]))


def test_every_install_line_names_this_distribution():
    name = distribution()
    lines = install_lines()
    assert len(lines) > 10  # the scan finds the lines at all
    wrong = []
    for where, full in lines:
        line = full.split("#")[0]  # a comment after the command is not installed
        words = re.findall(r"'?([A-Za-z0-9_.\-]+)(?:\\*\[[^\]]*\])?'?", line)
        for word in words:
            if word.lower().replace("_", "-") in TAKEN_ON_PYPI:
                wrong.append((where, line))
        # an extra of this project: by its distribution name, or from the clone ('.[x]')
        for project in re.findall(r"'?([A-Za-z0-9_.\-]*)\\*\[(?:ray|serve|plot|docs|dev|test|measure)\]", line):
            if project not in (name, "."):
                wrong.append((where, full))
    assert not wrong, wrong


def test_every_documented_editable_install_is_the_compat_route():
    """`pip install -e .` (setuptools' default editable mode) lets a folder named `specdec` in the
    current directory hide the package; the documented route is compat mode (as the Makefile's)."""
    editable = [(w, line) for w, line in install_lines() if re.search(r"(^|\s)-e(\s|$)", line)]
    assert editable
    assert all("--config-settings editable_mode=compat" in line for _, line in editable), editable
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "pip install -q --config-settings editable_mode=compat -e" in makefile


def test_the_messages_name_the_distribution():
    from specdec_cli.commands.describe import PLOT_HINT
    from specdec_cli.scale.ray_batch import INSTALL_HINT as RAY_HINT
    from specdec_cli.scale.serve_fleet import INSTALL_HINT as SERVE_HINT

    for hint, extra in ((PLOT_HINT, "plot"), (RAY_HINT, "ray"), (SERVE_HINT, "serve")):
        assert hint.endswith(f"pip install '{distribution()}[{extra}]'"), hint


@pytest.mark.spawns
def test_from_specdec_import_pair_from_the_clones_parent():
    """The issue's failure: from the folder holding the clone, `from specdec import Pair` found the
    clone as a namespace package under the default editable install. Under the documented route
    (this environment is installed by `make`) the package is found, from any folder."""
    for cwd in (ROOT.parent, ROOT, Path("/")):
        done = subprocess.run([sys.executable, "-c", "import specdec; from specdec import Pair; print(specdec.__file__)"],
                              capture_output=True, text=True, cwd=cwd, timeout=300)
        assert done.returncode == 0, (cwd, done.stderr)
        assert done.stdout.strip().endswith("__init__.py")
