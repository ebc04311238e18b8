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


def test_every_documented_editable_install_is_the_plain_one():
    """Issue 52: what most developers type, `pip install -e .`, is the documented route (and the
    Makefile's): setuptools' default editable mode is a path entry here (the next test)."""
    editable = [(w, line) for w, line in install_lines() if re.search(r"(^|\s)-e(\s|$)", line)]
    assert editable
    assert all("editable_mode" not in line for _, line in editable), editable
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "PIP_EDITABLE := $(BIN)/python -m pip install -q -e\n" in makefile


@pytest.mark.spawns
def test_the_default_editable_install_is_a_path_entry_for_the_clone(tmp_path):
    """Issue 52: under setuptools' default editable mode `from specdec import Pair` failed from the
    clone's parent (`cannot import name 'Pair' from 'specdec' (unknown location)`): the package was
    found by an import hook placed after the path search, so the clone folder itself, named
    `specdec`, won as a namespace package. The editable wheel setuptools builds for a plain `pip
    install -e .` (its own build backend, run here on a copy of the project) must hold a .pth path
    entry for the clone and no finder; and with that entry on the path, the package is found from a
    folder holding a `specdec` folder."""
    import shutil

    src, out = tmp_path / "specdec", tmp_path / "wheel"
    src.mkdir()
    out.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("specdec", "specdec_cli", "configs"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run([sys.executable, "-c", f"from setuptools import build_meta; "
                           f"print(build_meta.build_editable({str(out)!r}))"],
                          cwd=src, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    import zipfile

    with zipfile.ZipFile(out / done.stdout.strip().splitlines()[-1]) as wheel:
        names = [n for n in wheel.namelist() if ".dist-info/" not in n]
        assert not [n for n in names if n.endswith("_finder.py")], names
        (pth,) = [n for n in names if n.endswith(".pth")]
        entries = wheel.read(pth).decode().split()
    assert entries == [str(src)], entries
    # The clone's parent (tmp_path holds the copy, named `specdec`, without __init__.py at its top).
    probe = ("import sys; sys.path.append(sys.argv[1]); import importlib.util; "
             "print(importlib.util.find_spec('specdec').origin)")
    # -S: no site-packages, so the path entry is this wheel's alone (this venv's own install is elsewhere).
    found = subprocess.run([sys.executable, "-S", "-c", probe, entries[0]], cwd=tmp_path, capture_output=True,
                           text=True, timeout=120, env={"PATH": "/usr/bin:/bin"})
    assert found.returncode == 0 and found.stdout.strip() == str(src / "specdec" / "__init__.py"), found


def test_make_installs_the_cpu_build_of_torch_unless_told(tmp_path):
    """Issue 52: `make demo` installed PyPI's torch, the CUDA build on Linux (~2.5 GB), for a CPU
    demo. `make -n` shows the command each choice runs, without running it."""
    if shutil_which("make") is None:
        pytest.skip("needs make")

    def torch_line(*extra: str) -> str:
        done = subprocess.run(["make", "-n", "-B", f"VENV={tmp_path / 'venv'}", *extra, "install"], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        (line,) = [x for x in done.stdout.splitlines() if "pip install -q torch==" in x]
        return line

    # the CPU index where its host resolves (localhost always does), none where it cannot (offline:
    # pip would retry it for every package); TORCH=cuda never
    assert torch_line("TORCH_CPU_INDEX=http://localhost/whl/cpu").endswith(
        "torch==2.13.0 --extra-index-url http://localhost/whl/cpu")
    assert torch_line("TORCH_CPU_INDEX=https://no-such-host.invalid/whl/cpu").endswith("torch==2.13.0 ")
    assert torch_line("TORCH=cuda", "TORCH_CPU_INDEX=http://localhost/whl/cpu").endswith("torch==2.13.0 ")


def shutil_which(name: str) -> str | None:
    import shutil

    return shutil.which(name)


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
