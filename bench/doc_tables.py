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
    "value_confidence": "`value_confidence`: Σ log max p over the attribute-value tokens only",
    "value_min": "`value_min`: the least sure attribute's value log-likelihood",
    "meaning": "`meaning`: −Σ m over the answer (the pair's `[gate]`)",
    "consistency": "`consistency`: same outcome on 4 perturbed copies",
    "probe": "`probe`: linear head on the answer's hidden states (cal: 8-fold cross-validated)",
    "value_probe": "`value_probe`: linear head on per-attribute value log-likelihoods and entropies "
                   "(cal: 8-fold cross-validated)",
}
GATE_SIGNAL_SHORT = {"confidence": "`confidence`", "value_confidence": "`value_confidence`",
                     "value_min": "`value_min`", "meaning": "`meaning` (the pair's `[gate]`)",
                     "consistency": "`consistency`", "probe": "`probe`", "value_probe": "`value_probe`"}
DASH = "—"


def _auc(x: float | None) -> str:
    return DASH if x is None else f"{x:.2f}"


def _signal_rows(run: dict[str, Any], labels: dict[str, str]) -> list[str]:
    cal, meas = run["calibration"]["signals"], run["measurement"]["signals"]
    rows = []
    for name, label in labels.items():
        if name in cal and name in meas:
            kept = [f"{signed(cal[name]['kept_vs_cloud_points'][s])} / {signed(meas[name]['kept_vs_cloud_points'][s])}"
                    for s in ("20%", "30%")]
            rows.append(f"| {label} | {_auc(cal[name]['auc'])} / {_auc(meas[name]['auc'])} | {kept[0]} | {kept[1]} |")
    return rows


def _signal_head(pair: str, meas: str = "meas") -> list[str]:
    return [f"| signal ({pair}) | AUC cal / {meas} | 20 % kept: cal / {meas} | 30 % kept: cal / {meas} |",
            "|---|---|---|---|"]


def _oracle_row(run: dict[str, Any]) -> str:
    o = [run[s]["oracle"]["kept_vs_cloud_points"] for s in ("calibration", "measurement")]
    return (f"| oracle (the truth) | 1 / 1 | {signed(o[0]['20%'])} / {signed(o[1]['20%'])} | "
            f"{signed(o[0]['30%'])} / {signed(o[1]['30%'])} |")


def gate_signal(run: dict[str, Any]) -> list[str]:
    """docs/meaning-gate.md section 11: every signal of bench/gate_signal.py on the bundled (v3)
    pair, calibration set / fresh measurement set, and the oracle."""
    return _signal_head("the bundled pair, v3", "fresh") + _signal_rows(run, GATE_SIGNAL_LABELS) + [_oracle_row(run)]


def gate_signal_v2(run: dict[str, Any], probe600: dict[str, Any] | None = None) -> list[str]:
    """docs/meaning-gate.md section 11, the v2 pair kept for comparison: every signal, the probe
    fitted on other clips (a second run's measurement set, if given), and the oracle."""
    rows = _signal_head("v2 pair") + _signal_rows(run, GATE_SIGNAL_LABELS)
    if probe600 is not None:
        p = probe600["measurement"]["signals"]["probe"]
        rows.append(f"| the same probe fitted on 600 other held-out clips | {DASH} / {p['auc']:.2f} | "
                    f"{DASH} / {signed(p['kept_vs_cloud_points']['20%'])} | "
                    f"{DASH} / {signed(p['kept_vs_cloud_points']['30%'])} |")
    return rows + [_oracle_row(run)]


def gate_signal_noised(run: dict[str, Any]) -> list[str]:
    """docs/meaning-gate.md section 11, the positive control (`--noised-edge`)."""
    return _signal_head("noised pair") + _signal_rows(run, GATE_SIGNAL_SHORT)


def gate_signal_before_after(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """docs/meaning-gate.md section 11, issue 34 item 3: the same fresh measurement set under the
    v2 edge (`before`) and the v3 edge (`after`), every signal both runs have."""
    b, a = before["measurement"], after["measurement"]
    rows = ["| on the fresh set | v2 edge | v3 edge |", "|---|---|---|",
            f"| mean attribute accuracy (cloud-only: {a['cloud_accuracy']:.1f} %) | {b['edge_accuracy']:.1f} % | "
            f"{a['edge_accuracy']:.1f} % |",
            f"| clips whose edge answer is as good as cloud-only's | {b['edge_as_good_as_cloud']} / {b['clips']} | "
            f"{a['edge_as_good_as_cloud']} / {a['clips']} |"]
    for name, label in GATE_SIGNAL_SHORT.items():
        if name in b["signals"] and name in a["signals"]:
            cells = [f"AUC {_auc(x['signals'][name]['auc'])}, 20 % kept "
                     f"{signed(x['signals'][name]['kept_vs_cloud_points']['20%'])}" for x in (b, a)]
            rows.append(f"| {label} | {cells[0]} | {cells[1]} |")
    return rows


def gate_signal_attributes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """docs/meaning-gate.md section 11: per attribute, on the fresh set, the edge's accuracy and how
    well its value log-likelihood tells its right answers (v2 -> v3), and what `value_confidence`
    would reach had the v3 edge known exactly when that attribute is wrong (cal / fresh)."""
    b, a, ac = before["measurement"], after["measurement"], after["calibration"]
    rows = ["| attribute | edge accuracy: v2 → v3 | AUC of its value log-likelihood for \"right\": v2 → v3 | "
            "`value_confidence` AUC had the v3 edge known this attribute's errors: cal / fresh |",
            "|---|---|---|---|"]
    for attr, now in a["attributes"].items():
        was = b["attributes"][attr]
        rows.append(f"| {attr} | {was['edge_accuracy']:.1f} → {now['edge_accuracy']:.1f} % | "
                    f"{_auc(was['value_confidence_auc'])} → {_auc(now['value_confidence_auc'])} | "
                    f"{_auc(ac['attributes'][attr]['value_confidence_auc_if_known'])} / "
                    f"{_auc(now['value_confidence_auc_if_known'])} |")
    return rows


GATE_SIGNAL_GOAL = 0.85  # issue 34, item 3


def gate_signal_goal(run: dict[str, Any]) -> list[str]:
    """docs/meaning-gate.md section 11: issue 34's item 3 against the fresh set: the best edge-side
    signal's AUC there, with its standard error and its calibration-set figure."""
    meas, cal = run["measurement"]["signals"], run["calibration"]["signals"]
    name = max((n for n in meas if meas[n]["auc"] is not None), key=lambda n: meas[n]["auc"])
    best = meas[name]
    return ["| best edge-side signal on the fresh set | AUC ± standard error | on the calibration set | goal | met |",
            "|---|---|---|---|---|",
            f"| {GATE_SIGNAL_SHORT.get(name, name)} | {best['auc']:.2f} ± {best['auc_se']:.2f} | "
            f"{_auc(cal[name]['auc'])} | ≥ {GATE_SIGNAL_GOAL} | {'yes' if best['auc'] >= GATE_SIGNAL_GOAL else '**no**'} |"]


def _choice_rows(run: dict[str, Any], part: str) -> list[str]:
    rows_in = run[part]
    cloud = rows_in["cloud-only"]["accuracy"]
    rows = [f"| setting ({part} set) | zero-cloud | accuracy | vs cloud-only | calls / token | bytes up / clip | "
            "server work / clip |", "|---|---|---|---|---|---|---|"]
    for name, r in rows_in.items():
        vs = DASH if name == "cloud-only" else signed(r["accuracy"] - cloud)
        rows.append(f"| {name} | {pct(r['zero_cloud_share'])} % | {r['accuracy']:.1f} % | {vs} | "
                    f"{r['calls_per_token']:.3f} | {r['bytes_up_per_clip']:,.0f} | {r['cloud_work_tokens_per_clip']:.1f} |")
    return rows


def gate_choices(run: dict[str, Any]) -> list[str]:
    """docs/meaning-gate.md section 12: bench/gate.py's measurement set, every baseline and every
    setting chosen on the calibration set, in the JSON's order."""
    return _choice_rows(run, "measurement")


def gate_choices_calibration(run: dict[str, Any]) -> list[str]:
    """The same rows on the calibration set the settings were chosen on."""
    return _choice_rows(run, "calibration")


def frugal_origin(report: dict[str, Any]) -> list[str]:
    """docs/meaning-gate.md section 7: the bundled `frugal` preset as `make presets` (specdec
    calibrate --report) chose it: its setting and its scores on calibrate's two halves against
    cloud-only's."""
    head = ["| `frugal`, as `make presets` chose it | clips | zero-cloud | quality | vs cloud-only | "
            "calls / token | cloud work / clip |", "|---|---|---|---|---|---|---|"]
    g = report.get("gate")
    if g is None:
        return head + [f"| no meaning gate fitted (`--no-gate`) | {DASH} | {DASH} | {DASH} | {DASH} | {DASH} | {DASH} |"]
    settings = {s["name"]: s for s in report["settings"]}
    cloud, chosen = settings["cloud-only"], settings[g["setting"]]
    points = f"{g['points']:g} point" + ("" if g["points"] == 1 else "s")
    what = (f"k {chosen['k']}, upload {chosen['gate_upload']:.3f}, verify {chosen['gate_verify']:.3f}; within "
            f"{points}, margin z = {g['margin']:g}")
    if not g["met"]:
        what = f"none qualified ({what}: the best; no `frugal`, no `[gate]` written)"
    rows = []
    for half, n, label in (("calibration", report["n_calib"], f"calibration half: {what}"),
                           ("check", report["n_check"], "check half (not chosen on)")):
        h = g[half]
        rows.append(f"| {label} | {n} | {pct(h['zero_cloud_share'])} % | {h['quality']:.1f} | "
                    f"{signed(h['quality'] - cloud[half]['quality'])} | {h['call_rate']:.3f} | {h['work_per_clip']:.1f} |")
    return head + rows


RENDERERS: dict[str, Callable[..., list[str]]] = {
    "demo_models": demo_models,
    "gate_signal": gate_signal,
    "gate_signal_v2": gate_signal_v2,
    "gate_signal_noised": gate_signal_noised,
    "gate_signal_before_after": gate_signal_before_after,
    "gate_signal_attributes": gate_signal_attributes,
    "gate_signal_goal": gate_signal_goal,
    "frugal_origin": frugal_origin,
    "gate_choices": gate_choices,
    "gate_choices_calibration": gate_choices_calibration,
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
