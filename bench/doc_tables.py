"""Docs tables drawn from JSON: their renderers, and a check that every such table still says what
its JSON says (issue 34, item 4: a stale figure cannot land).

A generated table in a markdown page is the block of `|` lines after a marker comment (and one
blank line) naming
its renderer and the JSON file(s) it is drawn from (paths from the repository root):

    <!-- table: gate_signal docs/bench-gate-signal.json docs/bench-gate-signal-probe600.json -->

    | signal (the bundled pair) | AUC cal / meas | ...

    python bench/doc_tables.py          # check: exit 1 and list every table that differs
    python bench/doc_tables.py --write  # rewrite every marked table from its JSON

Rerun the bench that writes a JSON, then `--write`: the table follows, and tests/test_doc_tables.py
fails while any marked table differs from what its renderer makes of its JSON. Prose around a
table is not checked; the figures a table holds are.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PAGES = ("README.md", "docs/*.md", "specdec_cli/demo/models/*.md")
MARKER = re.compile(r"^<!-- table: (\S+)((?: \S+)+) -->$")
MINUS = "\u2212"  # the docs write minus signs as U+2212


def signed(x: float, digits: int = 1) -> str:
    """+0.9 / −1.7 / 0.0, as the docs write differences in points."""
    text = f"{x:+.{digits}f}"
    if float(text) == 0:
        return f"{0:.{digits}f}"
    return text.replace("-", MINUS)


def pct(x: float) -> str:
    return f"{100 * x:.1f}"


# ---------------------------------------------------------------------------------------------
# Renderers: JSON documents (in the marker's order) -> the table's lines.
def demo_models(report: dict[str, Any]) -> list[str]:
    """docs/demo-pair.md: the bundled pair at a glance, from evaluate_pair's report.json."""
    e, c = report["models"]["edge"], report["models"]["cloud"]

    def both(cell: Callable[[dict[str, Any]], str]) -> str:
        return f"{cell(e)} | {cell(c)}"

    def attrs(names: tuple[str, ...]) -> Callable[[dict[str, Any]], str]:
        return lambda m: " / ".join(pct(m["accuracy"]["all"][a]) for a in names) + " %"

    buckets = [b for b in ("4-8", "9-20", "21-40") if b in e["accuracy"]]
    return [
        "| | edge | cloud |",
        "|---|---|---|",
        "| parameters (without the unused vision tower) | "
        + both(lambda m: f"{m['params']['total']:,} ({m['params']['no_vision']:,})") + " |",
        "| greedy ms/token (batch 1) | " + both(lambda m: f"{m['ms_per_token']:.2f}") + " |",
        "| gender / rate / pitch | " + both(attrs(("gender", "rate", "pitch"))) + " |",
        "| volume / pauses / emotion | " + both(attrs(("volume", "pauses", "emotion"))) + " |",
        "| **mean attribute accuracy**, clean | " + both(lambda m: f"**{pct(m['accuracy']['all']['mean'])} %**") + " |",
        "| " + " / ".join(b.replace("-", "–") for b in buckets) + " characters | "
        + both(lambda m: " / ".join(pct(m["accuracy"][b]["mean"]) for b in buckets) + " %") + " |",
        "| the same clips at 20–30 dB SNR | " + both(lambda m: f"{pct(m['noisy']['mean'])} %") + " |",
    ]


GATE_SIGNAL_LABELS = {
    "confidence": "`confidence`: Σ log max p over the answer",
    "meaning": "`meaning`: −Σ m over the answer (the bundled `[gate]`)",
    "consistency": "`consistency`: same outcome on 4 perturbed copies",
    "probe": "`probe`: linear head on the answer's hidden states (cal: 8-fold cross-validated)",
}
GATE_SIGNAL_SHORT = {"confidence": "`confidence`", "meaning": "`meaning` (the bundled `[gate]`)",
                     "consistency": "`consistency`", "probe": "`probe`"}


def _signal_rows(run: dict[str, Any], labels: dict[str, str]) -> list[str]:
    cal, meas = run["calibration"]["signals"], run["measurement"]["signals"]
    rows = []
    for name, label in labels.items():
        if name in cal and name in meas:
            kept = [f"{signed(cal[name]['kept_vs_cloud_points'][s])} / {signed(meas[name]['kept_vs_cloud_points'][s])}"
                    for s in ("20%", "30%")]
            rows.append(f"| {label} | {cal[name]['auc']:.2f} / {meas[name]['auc']:.2f} | {kept[0]} | {kept[1]} |")
    return rows


def _signal_head(pair: str) -> list[str]:
    return [f"| signal ({pair}) | AUC cal / meas | 20 % kept: cal / meas | 30 % kept: cal / meas |",
            "|---|---|---|---|"]


def gate_signal(run: dict[str, Any], probe600: dict[str, Any] | None = None) -> list[str]:
    """docs/meaning-gate.md section 11: every signal of bench/gate_signal.py on the bundled pair,
    the probe fitted on other clips (a second run's measurement set, if given), and the oracle."""
    rows = _signal_head("the bundled pair") + _signal_rows(run, GATE_SIGNAL_LABELS)
    if probe600 is not None:
        p = probe600["measurement"]["signals"]["probe"]
        rows.append(f"| the same probe fitted on 600 other held-out clips | — / {p['auc']:.2f} | "
                    f"— / {signed(p['kept_vs_cloud_points']['20%'])} | — / {signed(p['kept_vs_cloud_points']['30%'])} |")
    o = [run[s]["oracle"]["kept_vs_cloud_points"] for s in ("calibration", "measurement")]
    rows.append(f"| oracle (the truth) | 1 / 1 | {signed(o[0]['20%'])} / {signed(o[1]['20%'])} | "
                f"{signed(o[0]['30%'])} / {signed(o[1]['30%'])} |")
    return rows


def gate_signal_noised(run: dict[str, Any]) -> list[str]:
    """docs/meaning-gate.md section 11, the positive control (`--noised-edge`)."""
    return _signal_head("noised pair") + _signal_rows(run, GATE_SIGNAL_SHORT)


def entropy_curve(report: dict[str, Any]) -> list[str]:
    """docs/demo-pair.md: evaluate_pair's entropy-vs-disagreement curve (report.json): teacher-forced
    along the edge's greedy answers, how often the cloud's argmax differs, per edge-entropy decile."""
    curve = report["entropy_curve"]

    def nats(x: float) -> str:
        return f"{x:.3f}" if x >= 0.001 else f"{x:.1e}"

    rows = ["| edge entropy decile | entropy (nats) | tokens | the cloud disagrees |", "|---:|---|---:|---:|"]
    for d in curve["deciles"]:
        rows.append(f"| {d['decile']} | {nats(d['entropy_min'])}–{nats(d['entropy_max'])} | {d['tokens']:,} | "
                    f"{pct(d['disagree_rate'])} % |")
    bottom = sum(d["tokens"] for d in curve["deciles"][:len(curve["deciles"]) // 2])
    rows.append(f"| bottom half / top decile / all | | {bottom:,} / {curve['deciles'][-1]['tokens']:,} / "
                f"{curve['tokens']:,} | {pct(curve['bottom_half_rate'])} / {pct(curve['top_decile_rate'])} / "
                f"{pct(curve['overall_rate'])} % |")
    return rows


# calibrate --report (specdec_cli/calibrate.py Calibration.report): one setting per row.
def _num(x: float | None) -> str:
    """A threshold as calibrate prints it (toml_float: repr, inf); JSON null is inf."""
    return "inf" if x is None or x == float("inf") else repr(float(x))


def setting_label(s: dict[str, Any]) -> str:
    """As calibrate's table names a setting: `k 6 · t 0.327` (entropy), `k 6 · 0.54/0.102` (the
    meaning gate's gate_upload/gate_verify), or the baseline's name."""
    if s["mode"] != "spec":
        return s["name"]
    if s["verify"] == "meaning":
        return f"k {s['k']} · {_num(s['gate_upload'])}/{_num(s['gate_verify'])}"
    return f"k {s['k']} · t {_num(s['threshold'])}"


def _order(s: dict[str, Any]) -> tuple:
    """calibrate's table order: the baselines, then the entropy sweep, then the meaning gate's, each
    by k and threshold(s)."""
    inf = float("inf")
    if s["mode"] != "spec":
        return (0, 0, 0.0, 0.0)
    if s["verify"] == "meaning":
        return (2, s["k"], s["gate_upload"], s["gate_verify"])
    return (1, s["k"], inf if s["threshold"] is None else s["threshold"], 0.0)


def _sweep(report: dict[str, Any], groups: tuple[int, ...]) -> list[str]:
    rows = ["| setting | calls/tok | quality | check calls/tok | check quality | chosen |",
            "|---|---:|---:|---:|---:|---|"]
    for s in sorted(report["settings"], key=_order):
        if _order(s)[0] in groups:
            cal, chk = s["calibration"], s["check"]
            bold = "**" if s["chosen"] else ""
            rows.append(f"| {bold}{setting_label(s)}{bold} | {cal['call_rate']:.3f} | {cal['quality']:.1f} | "
                        f"{chk['call_rate']:.3f} | {chk['quality']:.1f} | {', '.join(s['chosen'])} |")
    return rows


def calibration_sweep(report: dict[str, Any]) -> list[str]:
    """Every setting of a calibrate run (its --report), as the command's table shows them."""
    return _sweep(report, (0, 1, 2))


def calibration_entropy(report: dict[str, Any]) -> list[str]:
    """The baselines and the entropy threshold x k sweep of a calibrate run (quality and fluent)."""
    return _sweep(report, (0, 1))


def calibration_meaning(report: dict[str, Any]) -> list[str]:
    """The baselines and the meaning gate's gate_upload x gate_verify x k sweep (frugal)."""
    return _sweep(report, (0, 2))


def calibration_presets(report: dict[str, Any]) -> list[str]:
    """What a calibrate run chose (its --report): the baselines, each preset written, and the
    setting that verifies every block at quality's k, on both halves; the check half's distance
    from cloud-only (clips the choice never saw), and for frugal the share of clips that never
    reached the cloud."""
    by_name = {s["name"]: s for s in report["settings"]}
    cloud_chk = by_name["cloud-only"]["check"]["quality"]
    gate = report["gate"] if report["gate"] is not None and report["gate"]["met"] else None
    picked = [(c["name"], by_name[c["setting"]], c["met"]) for c in report["choices"]]
    rows = ["| preset | setting | calls/tok (cal / check) | quality (cal / check) | check vs cloud-only, points "
            "| clips with no cloud work (cal / check) |", "|---|---|---|---|---:|---|"]

    def row(label: str, s: dict[str, Any], zero: str = "") -> str:
        cal, chk = s["calibration"], s["check"]
        return (f"| {label} | {setting_label(s) if s['mode'] == 'spec' else '—'} | {cal['call_rate']:.3f} / {chk['call_rate']:.3f} | "
                f"{cal['quality']:.1f} / {chk['quality']:.1f} | {signed(chk['quality'] - cloud_chk)} | {zero} |")

    rows.append(row("cloud-only", by_name["cloud-only"], "0 / 0 %"))
    rows.append(row("edge-only", by_name["edge-only"], "100 / 100 %"))
    for name, s, met in picked:
        rows.append(row(f"**{name}**" + ("" if met else " (none within its points: best quality)"), s))
    if gate is not None:
        rows.append(row(f"**{gate['name']}**", by_name[gate["setting"]],
                        f"{pct(gate['calibration']['zero_cloud_share'])} / {pct(gate['check']['zero_cloud_share'])} %"))
    k = picked[0][1]["k"]
    every = next((s for s in report["settings"] if s["mode"] == "spec" and s["verify"] != "meaning"
                  and s["k"] == k and s["threshold"] == 0.0), None)
    if every is not None:
        rows.append(row("every block verified", every))
    return rows


def bundled_presets(report: dict[str, Any]) -> list[str]:
    """docs/usage.md: the demo pair's presets as `specdec presets` lists them, from the calibrate run
    that wrote them (docs/presets-calibration.json): each preset's setting and its budget."""
    by_name = {s["name"]: s for s in report["settings"]}
    fluent = next(c for c in report["choices"] if c["name"] == "fluent")
    rows = ["| preset | threshold | k | verify | chosen by `specdec calibrate` as |", "|---|---|---|---|---|"]
    for c in report["choices"]:
        s = by_name[c["setting"]]
        how = "cheapest" if c["met"] else "none within the budget: best quality"
        rows.append(f"| {c['name']} | {_num(s['threshold'])} | {s['k']} | entropy | {how} within {c['points']:g} "
                    f"point(s) of cloud-only (calls per token) |")
    g = report["gate"]
    if g is not None and g["met"]:
        s = by_name[g["setting"]]
        rows.append(f"| {g['name']} | {_num(by_name[fluent['setting']]['threshold'])} (fluent's, for another task) | "
                    f"{s['k']} | meaning: `gate_upload` {_num(s['gate_upload'])}, `gate_verify` {_num(s['gate_verify'])} | "
                    f"cheapest within {g['points']:g} point(s) of cloud-only by the cloud's work per clip; "
                    f"{pct(g['calibration']['zero_cloud_share'])} / {pct(g['check']['zero_cloud_share'])} % of "
                    "the calibration / check clips never reached the cloud |")
    return rows


RENDERERS: dict[str, Callable[..., list[str]]] = {
    "demo_models": demo_models,
    "entropy_curve": entropy_curve,
    "calibration_sweep": calibration_sweep,
    "calibration_entropy": calibration_entropy,
    "calibration_meaning": calibration_meaning,
    "calibration_presets": calibration_presets,
    "bundled_presets": bundled_presets,
    "gate_signal": gate_signal,
    "gate_signal_noised": gate_signal_noised,
}


# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Table:
    page: Path
    line: int  # 1-based line of the marker
    start: int  # 0-based index of the table's first line
    renderer: str
    sources: tuple[str, ...]
    lines: tuple[str, ...]  # the table as the page has it

    def where(self) -> str:
        return f"{self.page.relative_to(REPO) if self.page.is_relative_to(REPO) else self.page}:{self.line}"


def tables(page: Path) -> list[Table]:
    """Every marked table of a page."""
    text = page.read_text(encoding="utf-8").splitlines()
    out = []
    for i, line in enumerate(text):
        m = MARKER.match(line.strip())
        if m:
            # one blank line between the marker and the table (so markdown renders the table)
            start = i + 2 if i + 1 < len(text) and not text[i + 1].strip() else i + 1
            j = start
            while j < len(text) and text[j].startswith("|"):
                j += 1
            out.append(Table(page, i + 1, start, m.group(1), tuple(m.group(2).split()), tuple(text[start:j])))
    return out


def render(table: Table, root: Path = REPO) -> list[str]:
    """What the table should say: its renderer applied to its JSON. A one-line error when the
    renderer or a JSON is missing."""
    if table.renderer not in RENDERERS:
        raise SystemExit(f"{table.where()}: no renderer {table.renderer!r} in bench/doc_tables.py "
                         f"(known: {', '.join(RENDERERS)})")
    docs = []
    for source in table.sources:
        path = root / source
        if not path.is_file():
            raise SystemExit(f"{table.where()}: {source} does not exist (paths are from the repository root)")
        docs.append(json.loads(path.read_text(encoding="utf-8")))
    return RENDERERS[table.renderer](*docs)


def pages(root: Path = REPO) -> list[Path]:
    return sorted(p for pattern in PAGES for p in root.glob(pattern))


def stale(root: Path = REPO) -> list[str]:
    """One line per marked table that differs from its rendering."""
    out = []
    for page in pages(root):
        for t in tables(page):
            want = render(t, root)
            if list(t.lines) != want:
                first = next((k for k, (a, b) in enumerate(zip(t.lines, want, strict=False)) if a != b),
                             min(len(t.lines), len(want)))
                out.append(f"{t.where()}: the {t.renderer} table differs from {' + '.join(t.sources)} "
                           f"at its row {first + 1}: rerun `python bench/doc_tables.py --write`")
    return out


def write(root: Path = REPO) -> list[str]:
    """Rewrite every marked table that differs; returns where."""
    changed = []
    for page in pages(root):
        text = page.read_text(encoding="utf-8").splitlines(keepends=True)
        here = []
        for t in reversed(tables(page)):  # bottom-up: earlier line numbers stay valid
            want = render(t, root)
            if list(t.lines) != want:
                text[t.start:t.start + len(t.lines)] = [x + "\n" for x in want]
                here.append(t.where())
        if here:
            page.write_text("".join(text), encoding="utf-8")
            changed += reversed(here)
    return changed


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="rewrite the tables that differ")
    args = ap.parse_args(argv)
    if args.write:
        for where in write():
            print(f"rewrote {where}")
        return
    problems = stale()
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        raise SystemExit(1)
    print(f"{sum(len(tables(p)) for p in pages())} marked tables match their JSON")


if __name__ == "__main__":
    main()
