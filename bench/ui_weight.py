"""What a browser demo would add to specdec's install (issue 54): Gradio, the field's usual tool for
model demos, against the Starlette and uvicorn that `specdec ui` runs on (already in the base
install, for `specdec serve`).

    python bench/ui_weight.py [--gradio 6.31.0] [--target DIR] [--json docs/results/ui-weight.json]

Installs Gradio with its dependencies into a fresh folder (`pip install --target`: nothing in the
environment changes; `--target DIR` reuses a folder that holds such an install), then counts the
bytes of each distribution there from its RECORD, and splits them into those the base install of
specdec-omni already has (the closure of its [project] dependencies, read from the installed
metadata) and those Gradio alone would add. Needs the package index (PyPI) unless --target is given.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.requirements import Requirement


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def base_closure(distribution: str = "specdec-omni") -> set[str]:
    """Every distribution the base install pulls in (no extras), from the installed metadata."""
    seen: set[str] = set()
    todo = [Requirement(r).name for r in md.requires(distribution) or [] if "extra ==" not in r]
    while todo:
        name = norm(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        for text in requires:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def sizes(target: Path) -> dict[str, int]:
    """Bytes on disk of each distribution installed in `target`, from its RECORD."""
    out = {}
    for info in sorted(target.glob("*.dist-info")):
        name = norm(info.name[: -len(".dist-info")].rsplit("-", 1)[0])
        total = 0
        for line in (info / "RECORD").read_text(encoding="utf-8").splitlines():
            path = (target / line.rsplit(",", 2)[0]).resolve()
            if path.is_file() and target.resolve() in path.parents:
                total += path.stat().st_size
        out[name] = total
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gradio", default="6.31.0", help="Gradio version to measure.")
    parser.add_argument("--target", type=Path, help="A folder holding `pip install --target` of that Gradio.")
    parser.add_argument("--json", type=Path, help="Write the figures here.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        target = args.target or Path(scratch)
        if args.target is None:
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(target),
                            f"gradio=={args.gradio}"], check=True)
        found = sizes(target)
    if norm("gradio") not in found:
        sys.exit(f"no gradio in {target}")
    base = base_closure()
    extra = {name: size for name, size in found.items() if name not in base}
    report = {
        "gradio": args.gradio, "python": sys.version.split()[0],
        "total_mb": round(sum(found.values()) / 1e6, 1), "distributions": len(found),
        "beyond_base_mb": round(sum(extra.values()) / 1e6, 1), "beyond_base_distributions": len(extra),
        "beyond_base": {name: round(size / 1e6, 1) for name, size in sorted(extra.items(), key=lambda x: -x[1])},
        "specdec_ui_beyond_base_mb": 0.0,  # starlette and uvicorn: [project] dependencies already
    }
    print(f"gradio {args.gradio}: {report['total_mb']} MB in {report['distributions']} distributions; beyond "
          f"specdec's base install: {report['beyond_base_mb']} MB in {report['beyond_base_distributions']} "
          f"({', '.join(f'{n} {s}' for n, s in list(report['beyond_base'].items())[:4])} MB, …)")
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
