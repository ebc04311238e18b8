"""bench/doc_tables.py: a docs table drawn from a JSON must still say what the JSON says (issue 34,
item 4). The check over the real pages, and on a page of its own that it fails when the JSON moves
and passes again once the table is rewritten."""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def tables_module():
    spec = importlib.util.spec_from_file_location("doc_tables_bench", ROOT / "bench/doc_tables.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_marked_docs_table_matches_its_json():
    assert tables_module().stale() == []


def test_the_demo_pair_and_gate_signal_tables_are_marked():
    """Removing a marker would switch the check off for that table: the ones issue 34 regenerates
    stay marked."""
    dt = tables_module()
    marked = {(str(t.page.relative_to(ROOT)), t.renderer) for p in dt.pages() for t in dt.tables(p)}
    assert {("docs/demo-pair.md", "demo_models"), ("docs/meaning-gate.md", "gate_signal"),
            ("docs/meaning-gate.md", "gate_signal_noised"), ("docs/demo-pair.md", "entropy_curve"),
            ("docs/demo-pair.md", "calibration_presets"), ("docs/demo-pair.md", "calibration_entropy"),
            ("docs/demo-pair.md", "calibration_meaning"), ("specdec_cli/demo/models/PRESETS.md", "calibration_presets"),
            ("docs/calibrate.md", "calibration_presets"), ("docs/usage.md", "bundled_presets")} <= marked


def test_the_presets_tables_json_is_the_run_that_wrote_the_bundled_presets():
    """docs/presets-calibration.json (what the demo pair's presets tables are drawn from) and the
    bundled presets file come from one `make presets` run: every preset the file holds is the
    setting the JSON marks chosen, with the scores the file's comments give (tests/cli_helpers.py);
    and the two bundled copies are the same file."""
    from cli_helpers import report_matches_presets

    models = ROOT / "specdec_cli/demo/models"
    text = (models / "edge/specdec_presets.toml").read_text(encoding="utf-8")
    assert (models / "cloud/specdec_presets.toml").read_text(encoding="utf-8") == text
    report = json.loads((ROOT / "docs/presets-calibration.json").read_text(encoding="utf-8"))
    report_matches_presets(report, text)


def _setting(name: str, mode: str = "spec", k: int = 6, verify: str = "entropy", chosen: tuple[str, ...] = (),
             q: float = 90.0, rate: float = 0.1, **kw) -> dict:
    return {"name": name, "mode": mode, "k": k, "verify": verify, **kw, "chosen": list(chosen),
            "calibration": {"quality": q, "call_rate": rate}, "check": {"quality": q - 1, "call_rate": rate / 2}}


def test_the_calibration_renderers_order_name_and_mark_settings_as_calibrate_does():
    """A hand-made report: baselines first, then the entropy sweep by k and threshold (JSON null = inf),
    then the meaning sweep; the chosen rows bold with their presets; the presets table takes frugal's
    clips at home from the gate and compares each check half with cloud-only's."""
    dt = tables_module()
    half = {"quality": 95.0, "call_rate": 0.05, "zero_cloud_share": 0.25, "work_per_clip": 10.0}
    report = {"measure": "m", "n_calib": 2, "n_check": 2, "settings": [
        _setting("k=6 t=inf", threshold=None, q=80.0, rate=0.0), _setting("m", verify="meaning", gate_upload=0.5,
                                                                          gate_verify=0.25, chosen=("frugal",)),
        _setting("k=6 t=0.5", threshold=0.5, chosen=("quality", "fluent")), _setting("k=4 t=0", k=4, threshold=0.0),
        _setting("cloud-only", "cloud", q=99.0, rate=0.9), _setting("edge-only", "edge", q=80.0, rate=0.0),
        _setting("k=6 t=0", threshold=0.0, q=99.0, rate=0.2)],
        "choices": [{"name": "quality", "points": 1.0, "met": True, "setting": "k=6 t=0.5"},
                    {"name": "fluent", "points": 3.0, "met": True, "setting": "k=6 t=0.5"}],
        "gate": {"name": "frugal", "met": True, "points": 1.0, "setting": "m", "calibration": half, "check": dict(half, zero_cloud_share=0.5)}}
    sweep = dt.calibration_sweep(report)
    assert [r.split(" | ")[0] for r in sweep[2:]] == [
        "| cloud-only", "| edge-only", "| k 4 · t 0.0", "| k 6 · t 0.0", "| **k 6 · t 0.5**", "| k 6 · t inf",
        "| **k 6 · 0.5/0.25**"]
    assert sweep[6] == "| **k 6 · t 0.5** | 0.100 | 90.0 | 0.050 | 89.0 | quality, fluent |"
    assert len(dt.calibration_entropy(report)) == 2 + 6 and len(dt.calibration_meaning(report)) == 2 + 3
    chosen = dt.calibration_presets(report)
    assert chosen[2:] == [
        "| cloud-only | — | 0.900 / 0.450 | 99.0 / 98.0 | 0.0 | 0 / 0 % |",
        "| edge-only | — | 0.000 / 0.000 | 80.0 / 79.0 | \u221219.0 | 100 / 100 % |",
        "| **quality** | k 6 · t 0.5 | 0.100 / 0.050 | 90.0 / 89.0 | \u22129.0 |  |",
        "| **fluent** | k 6 · t 0.5 | 0.100 / 0.050 | 90.0 / 89.0 | \u22129.0 |  |",
        "| **frugal** | k 6 · 0.5/0.25 | 0.100 / 0.050 | 90.0 / 89.0 | \u22129.0 | 25.0 / 50.0 % |",
        "| every block verified | k 6 · t 0.0 | 0.200 / 0.100 | 99.0 / 98.0 | 0.0 |  |"]
    listed = dt.bundled_presets(report)
    assert [r.split(" | ")[:3] for r in listed[2:]] == [["| quality", "0.5", "6"], ["| fluent", "0.5", "6"],
                                                         ["| frugal", "0.5 (fluent's, for another task)", "6"]]
    assert "`gate_upload` 0.5, `gate_verify` 0.25" in listed[-1] and "25.0 / 50.0 %" in listed[-1]
    report["gate"]["met"] = False  # no frugal written: no frugal row
    assert not any("frugal" in r for r in dt.calibration_presets(report)[2:] + dt.bundled_presets(report)[2:])


def test_the_entropy_curve_table_is_report_jsons():
    dt = tables_module()
    report = json.loads((ROOT / "specdec_cli/demo/models/report.json").read_text(encoding="utf-8"))
    rows = dt.entropy_curve(report)
    curve = report["entropy_curve"]
    assert len(rows) == 2 + len(curve["deciles"]) + 1
    top = curve["deciles"][-1]
    assert rows[-2].startswith(f"| {top['decile']} |") and rows[-2].endswith(f"| {100 * top['disagree_rate']:.1f} % |")
    assert f"{curve['tokens']:,}" in rows[-1]


def _page(root: Path, run: dict) -> Path:
    (root / "docs").mkdir(parents=True, exist_ok=True)
    (root / "docs/run.json").write_text(json.dumps(run), encoding="utf-8")
    page = root / "docs/page.md"
    page.write_text("# A page\n\nSome prose.\n\n<!-- table: gate_signal_noised docs/run.json -->\n\n"
                    "| old |\n|---|\n\nMore prose.\n", encoding="utf-8")
    return page


def test_a_moved_figure_is_caught_and_rewritten(tmp_path, monkeypatch):
    dt = tables_module()
    monkeypatch.setattr(dt, "PAGES", ("docs/*.md",))
    run = json.loads((ROOT / "docs/bench-gate-signal-noised.json").read_text(encoding="utf-8"))
    page = _page(tmp_path, run)
    assert len(dt.stale(tmp_path)) == 1  # the placeholder table is not what the JSON says
    assert dt.write(tmp_path) == [f"{page}:5"]
    assert dt.stale(tmp_path) == []
    text = page.read_text(encoding="utf-8")
    assert text.startswith("# A page\n\nSome prose.\n\n<!-- table:") and text.endswith("|\n\nMore prose.\n")
    # the measurement set's confidence AUC moves: the table no longer matches until rewritten
    moved = copy.deepcopy(run)
    moved["measurement"]["signals"]["confidence"]["auc"] = 0.912
    (tmp_path / "docs/run.json").write_text(json.dumps(moved), encoding="utf-8")
    problems = dt.stale(tmp_path)
    assert len(problems) == 1 and "docs/page.md:5" in problems[0] and "row 3" in problems[0]
    dt.write(tmp_path)
    assert "| `confidence` | 0.86 / 0.91 |" in page.read_text(encoding="utf-8")
    assert dt.stale(tmp_path) == []


def test_an_unknown_renderer_or_missing_json_is_a_one_line_error(tmp_path):
    dt = tables_module()
    page = _page(tmp_path, {})
    table = dt.tables(page)[0]
    with pytest.raises(SystemExit, match="no renderer 'nope'"):
        dt.render(dataclasses.replace(table, renderer="nope"), tmp_path)
    with pytest.raises(SystemExit, match="docs/gone.json does not exist"):
        dt.render(dataclasses.replace(table, sources=("docs/gone.json",)), tmp_path)


def test_signed_writes_the_docs_minus_and_no_negative_zero():
    dt = tables_module()
    assert [dt.signed(x) for x in (0.87, -1.74, -0.04, 0.0)] == ["+0.9", "\u22121.7", "0.0", "0.0"]


def test_the_command_checks_the_repository():
    run = subprocess.run([sys.executable, str(ROOT / "bench/doc_tables.py")], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "marked tables match their JSON" in run.stdout
