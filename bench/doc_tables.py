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


# ---------------------------------------------------------------------------------------------
# Issue 34, item 5: the goals, before (v2 pair) and after (v3 pair). The goals are the issue's.
FRUGAL_ZERO_CLOUD, FRUGAL_POINTS, FRUGAL_CALLS = 0.25, 1.0, 0.10
QUALITY_POINTS, QUALITY_CALLS = 0.5, 0.12
CAPACITY_POINTS, CAPACITY_X = 1.0, 1.5
SETTING_NAMES = {"cloud": "cloud-only", "quality": "quality", "fluent": "fluent", "frugal": "frugal"}


def _met(ok: bool | None) -> str:
    return "—" if ok is None else ("**met**" if ok else "**not met**")


def _setting(run: dict[str, Any], name: str) -> dict[str, Any] | None:
    return run["settings"].get(name)


def best_per_core(cap: dict[str, Any]) -> tuple[str, float] | None:
    """The preset within CAPACITY_POINTS of cloud-only's accuracy with the most clips per server
    core, and that figure as a multiple of batched cloud-only's (bench/capacity.py's JSON)."""
    modes = cap["modes"]
    base = modes["cloud"]["server_cpu_capacity_clips_per_s"]
    close = [(name, m["server_cpu_capacity_clips_per_s"] / base) for name, m in modes.items()
             if name != "cloud" and m.get("accuracy_minus_cloud") is not None
             and m["accuracy_minus_cloud"] >= -CAPACITY_POINTS]
    return max(close, key=lambda x: x[1]) if close else None


def demo_goals(before: dict[str, Any], after: dict[str, Any], cap_before: dict[str, Any] | None = None,
               cap_after: dict[str, Any] | None = None, link_before: dict[str, Any] | None = None,
               link_after: dict[str, Any] | None = None) -> list[str]:
    """docs/demo-pair.md "v2 → v3, measured": issue 34's item-5 goals, v2 pair against v3 pair,
    from bench/demo_goals.py (and bench/capacity.py, bench/link.py) JSON; met / not met on v3."""
    rows = ["| goal (issue 34, item 5) | v2 pair (before) | v3 pair (after) | v3: |", "|---|---:|---:|---|"]

    def cell(run: dict[str, Any], name: str, fmt: Callable[[dict[str, Any]], str]) -> str:
        s = _setting(run, name)
        return "no such preset" if s is None else fmt(s)

    def verdict(name: str, ok: Callable[[dict[str, Any]], bool]) -> str:
        s = _setting(after, name)
        return _met(None if s is None else ok(s)) if s is not None else "**not met** (no such preset)"

    goals = [
        ("frugal", f"frugal: ≥ {100 * FRUGAL_ZERO_CLOUD:.0f} % of clips with zero cloud work",
         lambda s: f"{pct(s['no_cloud_share'])} %", lambda s: s["no_cloud_share"] >= FRUGAL_ZERO_CLOUD),
        ("frugal", f"frugal: within {FRUGAL_POINTS:g} point of cloud-only",
         lambda s: signed(s["vs_cloud_points"]), lambda s: s["vs_cloud_points"] >= -FRUGAL_POINTS),
        ("frugal", f"frugal: ≤ {FRUGAL_CALLS:.2f} cloud calls per token",
         lambda s: f"{s['cloud_call_rate']:.3f}", lambda s: s["cloud_call_rate"] <= FRUGAL_CALLS),
        ("quality", f"quality: within {QUALITY_POINTS:g} point of cloud-only",
         lambda s: signed(s["vs_cloud_points"]), lambda s: s["vs_cloud_points"] >= -QUALITY_POINTS),
        ("quality", f"quality: ≤ {QUALITY_CALLS:.2f} cloud calls per token",
         lambda s: f"{s['cloud_call_rate']:.3f}", lambda s: s["cloud_call_rate"] <= QUALITY_CALLS),
    ]
    for name, label, fmt, ok in goals:
        rows.append(f"| {label} | {cell(before, name, fmt)} | {cell(after, name, fmt)} | {verdict(name, ok)} |")
    if cap_after is not None:
        def cap(c: dict[str, Any] | None) -> str:
            if c is None:
                return "—"
            best = best_per_core(c)
            return "none within 1 point" if best is None else f"{best[0]} {best[1]:.2f}×"
        best = best_per_core(cap_after)
        met = best is not None and best[1] >= CAPACITY_X
        verdict = _met(met)
        before = best_per_core(cap_before) if cap_before is not None else None
        if met and before is not None and before[1] >= CAPACITY_X:
            # The per-core ratio moves with the machine's load (a loaded cloud-only server never gets to
            # batch): when the pair the issue says misses the goal passes it in the same conditions,
            # this run cannot show that v3 meets it.
            verdict = "**met in this run, not conclusive**: the v2 pair passes it in the same conditions"
        rows.append(f"| capacity: the best preset within {CAPACITY_POINTS:g} point of cloud-only carries "
                    f"≥ {CAPACITY_X:g}× batched cloud-only's clips per server core | {cap(cap_before)} | "
                    f"{cap(cap_after)} | {verdict} |")
    if link_after is not None:
        rows.append("| link, +50 ms, pipelined client: seconds per clip (round trips, × cloud-only's), "
                    f"quality / frugal / cloud-only | {'—' if link_before is None else link_cells(link_before)} | "
                    f"{link_cells(link_after)} | reported (no goal) |")
    return rows


def link_cells(run: dict[str, Any], delay: str = "50ms", client: str = "pipelined") -> str:
    """bench/link.py's demo pair at one delay: "quality q (t) / frugal f (t) / cloud-only c (1)"."""
    row = run["pairs"]["demo"]["remote"][delay]
    cloud = row["cloud"]["s_per_clip"]
    parts = [f"{m} {row[f'{m}/{client}']['s_per_clip']:.3f} s ({row[f'{m}/{client}']['round_trips']:.1f}, "
             f"{row[f'{m}/{client}']['s_per_clip'] / cloud:.2f}×)" for m in ("quality", "frugal") if f"{m}/{client}" in row]
    return " / ".join(parts + [f"cloud-only {row['cloud']['s_per_clip']:.3f} s (1)"])


def demo_goals_settings(*runs: dict[str, Any]) -> list[str]:
    """docs/demo-pair.md: every setting of each pair's bench/demo_goals.py run, one row each."""
    rows = ["| pair | setting | mean attribute accuracy | vs cloud-only (points) | zero-cloud clips "
            "| cloud calls / token | cloud work / clip (tokens, × cloud-only) |",
            "|---|---|---:|---:|---:|---:|---:|"]
    for run in runs:
        for name, s in run["settings"].items():
            work = s.get("cloud_work_tokens")
            vs = s.get("cloud_work_tokens_vs_cloud")
            rows.append(f"| {run['label']} | {SETTING_NAMES.get(name, name)} | {pct(s['mean_accuracy'])} % | "
                        f"{signed(s['vs_cloud_points'])} | {pct(s['no_cloud_share'])} % | {s['cloud_call_rate']:.3f} | "
                        + ("—" if work is None else f"{work:.1f} ({'—' if vs is None else f'{vs:.2f}'})") + " |")
    return rows


def capacity(run: dict[str, Any]) -> list[str]:
    """docs/capacity.md: bench/capacity.py's per-mode results, at each mode's highest rate within the SLO."""
    modes = run["modes"]
    base = modes["cloud"]
    top = max(m["max_clips_per_s"] for m in modes.values())
    rows = ["| mode | max clips/s within SLO | × cloud-only | p50 / p95 s at it | accuracy (Δ cloud) | "
            "server CPU ms/clip | 1 / server CPU: clips/s per core (×) | edge CPU ms/clip | uplink KB/clip |",
            "|---|---:|---:|---|---|---:|---:|---:|---:|"]
    for name, m in modes.items():
        rate = f"{m['max_clips_per_s']:.2f}"
        delta = "" if name == "cloud" else f" ({signed(m['accuracy_minus_cloud'])})"
        per_core = m["server_cpu_capacity_clips_per_s"]
        rows.append(
            f"| {'cloud-only (batched)' if name == 'cloud' else name} | {f'**{rate}**' if m['max_clips_per_s'] == top else rate} "
            f"| {m['clips_per_s_x_cloud']:.2f} | {m['p50_s']:.3f} / {m['p95_s']:.3f} | {m['accuracy']:.2f} %{delta} "
            f"| {1000 * m['server_cpu_s_per_clip']:.1f} | {per_core:.1f} ({per_core / base['server_cpu_capacity_clips_per_s']:.2f}) "
            f"| {1000 * m['client_cpu_s_per_clip']:.1f} | {m['uplink_bytes_per_clip'] / 1000:.1f} |")
    return rows


def _link_clients(pair: str, mode: str) -> Callable[..., list[str]]:
    """docs/pipelining.md: one pair's one preset over bench/link.py's delays, every client, seconds
    per clip (round trips); with a second JSON, its blocking client as "before (code run)"."""
    def render(run: dict[str, Any], before: dict[str, Any] | None = None) -> list[str]:
        clients = ("legacy", "blocking", "pipelined", "eager")
        head = ["+ms", "cloud-only", *(["before (code run)"] if before else []),
                *(f"{mode} {c}" for c in clients), "pipelined / legacy", "kept ahead / drafted", "same tokens"]
        rows = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]

        def cell(x: dict[str, Any]) -> str:
            return f"{x['s_per_clip']:.3f} ({x['round_trips']:.0f})" if x["round_trips"] == 1 else \
                f"{x['s_per_clip']:.3f} ({x['round_trips']:.1f})"
        for delay, row in run["pairs"][pair]["remote"].items():
            got = {c: row[f"{mode}/{c}"] for c in clients}
            same = [x["same_tokens"].split("/") for x in row.values()]
            n = sum(int(b) for _, b in same)
            cells = [delay, cell(row["cloud"]),
                     *([cell(before["pairs"][pair]["remote"][delay][f"{mode}/blocking"])] if before else []),
                     *(cell(got[c]) for c in clients),
                     f"{got['pipelined']['s_per_clip'] / got['legacy']['s_per_clip']:.2f}",
                     f"{got['pipelined']['ahead_kept_per_clip']:.1f} / {got['pipelined']['ahead_drafted_per_clip']:.1f}",
                     f"all {n}" if all(a == b for a, b in same) else f"{sum(int(a) for a, _ in same)} of {n}"]
            rows.append("| " + " | ".join(cells) + " |")
        return rows
    return render


def link_goal(run: dict[str, Any]) -> list[str]:
    """docs/pipelining.md: the demo pair's presets against cloud-only per clip at +50 ms, each client."""
    row = run["pairs"]["demo"]["remote"]["50ms"]
    cloud = row["cloud"]["s_per_clip"]
    rows = ["| preset | blocking s/clip (trips) | pipelined s/clip (trips) | eager s/clip (trips) | "
            "pipelined / cloud-only | same tokens |", "|---|---:|---:|---:|---:|---|"]
    rows.append(f"| cloud-only | {cloud:.3f} (1) | — | — | 1.00 | {row['cloud']['same_tokens']} |")
    for mode in run.get("modes", ["fluent", "quality"]):
        got = {c: row[f"{mode}/{c}"] for c in ("blocking", "pipelined", "eager")}
        rows.append(f"| {mode} | " + " | ".join(f"{g['s_per_clip']:.3f} ({g['round_trips']:.1f})" for g in got.values())
                    + f" | {got['pipelined']['s_per_clip'] / cloud:.2f} | {got['pipelined']['same_tokens']} |")
    return rows


def capacity_goal(*runs: dict[str, Any]) -> list[str]:
    """docs/capacity.md: per bench/capacity.py run, the best preset within CAPACITY_POINTS of cloud-only's
    accuracy and its clips per server core against batched cloud-only's, met / not met (issue 34). The
    runs in the marker's order: the v2 pair's first, the v3 pair's (the bundled edge) last."""
    rows = ["| pair | load average, start → end | clips | cloud-only accuracy | best preset within 1 point | its clips per server core "
            f"× batched cloud-only (goal ≥ {CAPACITY_X:g}×) | every preset: accuracy Δ, × per core |",
            "|---|---|---:|---:|---|---|---|"]
    for run in runs:
        modes = run["modes"]
        base = modes["cloud"]["server_cpu_capacity_clips_per_s"]
        best = best_per_core(run)
        every = "; ".join(f"{name} {signed(m['accuracy_minus_cloud'])}, "
                          f"{m['server_cpu_capacity_clips_per_s'] / base:.2f}×" for name, m in modes.items()
                          if name != "cloud")
        verdict = ("none" if best is None else f"{best[0]}"), (
            "**not met**" if best is None else f"{best[1]:.2f}× {_met(best[1] >= CAPACITY_X)}")
        pair = "v3 (bundled)" if run is runs[-1] else f"v2{' (`--edge`)' if run.get('edge') else ' (then bundled)'}"
        load = f"{run['load_avg']['start'][0]:.1f} → {run['load_avg']['end'][0]:.1f}"
        rows.append(f"| {pair} | {load} | {run['clips']} | "
                    f"{modes['cloud']['accuracy']:.2f} % | {verdict[0]} | {verdict[1]} | {every} |")
    return rows


RENDERERS: dict[str, Callable[..., list[str]]] = {
    "capacity_goal": capacity_goal,
    **{f"link_{pair}_{mode}": _link_clients(pair, mode) for pair in ("demo", "self", "noised")
       for mode in ("fluent", "quality", "frugal")},
    "link_goal": link_goal,
    "capacity": capacity,
    "demo_goals": demo_goals,
    "demo_goals_settings": demo_goals_settings,
    "demo_models": demo_models,
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
