"""`specdec calibrate DIR --out presets.toml`: the quality and fluent presets for a pair, on the
user's clips (calibrate.py says how). The table and the choices are the output (stdout); progress
goes to stderr."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from .. import calibrate as calibration
from ..errors import InputError
from ..evaluate import left_out_line
from ..inputs import Skipped, some_failed
from . import ui
from .app import Interrupted
from .describe import load, spec_of
from .options import GENERATION, MODELS, Models, with_options

if TYPE_CHECKING:
    from ..calibrate import Choice, GateChoice, Run, Score


class _Bar:
    """calibrate.Progress drawn as a Rich bar (on a terminal only)."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task = progress.add_task("calibrating", total=None)

    def total(self, clips: int) -> None:
        self.progress.update(self.task, total=clips)

    def running(self, name: str) -> None:
        self.progress.update(self.task, description=f"{name:>14}")

    def advance(self) -> None:
        self.progress.advance(self.task)


class _Lines:
    """calibrate.Progress for a log or a pipe (stderr not a terminal): a plain line at each tenth of
    the decodes (eleven lines at most, the gate fit's included), each saying how far the run is and
    how long the rest may take, so a run of minutes is not silent. The total shrinks once the
    thresholds are known; a tenth is of the total at the time."""

    def __init__(self, console: Console) -> None:
        import time

        self.console, self.clock = console, time.monotonic
        self.start = self.clock()
        self.planned = self.done = self.tenths = 0
        self.name = ""

    def total(self, clips: int) -> None:
        self.planned = clips

    def running(self, name: str) -> None:
        self.name = name
        if name == "gate fit":  # a phase with no decodes to count: said once, as it starts
            self.console.print(f"calibrate: {self.done}/{self.planned} decodes, fitting the meaning gate",
                               markup=False)

    def advance(self) -> None:
        self.done += 1
        tenths = min(10, self.done * 10 // max(self.planned, 1))
        if tenths <= self.tenths:
            return
        self.tenths = tenths
        elapsed = self.clock() - self.start
        left = elapsed / self.done * max(self.planned - self.done, 0)
        self.console.print(f"calibrate: {self.done}/{self.planned} decodes ({self.name}), "
                           f"{elapsed:.0f} s elapsed, about {left:.0f} s left", markup=False)


@with_options(GENERATION, MODELS)
def calibrate(
    directory: Annotated[Path, typer.Argument(help="Folder of clips to calibrate on.", metavar="DIR",
                                              show_default=False)],
    out: Annotated[Path, typer.Option(help="Write the presets here (TOML); use it with --presets.",
                                      show_default=False)],
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace --out if it exists.")] = False,
    labels: Annotated[Path | None, typer.Option(
        help="labels.jsonl (as for eval; demo.measure writes one): score by attribute accuracy, each attribute "
             "over the clips labelled for it. Without it, quality is agreement "
             "with cloud-only's output on the same clips.", show_default=False)] = None,
    quality_points: Annotated[float, typer.Option(
        min=0, help="quality = the cheapest setting within this many points of cloud-only.")] = 1.0,
    fluent_points: Annotated[float, typer.Option(
        min=0, help="fluent = the cheapest setting within this many points of cloud-only.")] = 3.0,
    frugal_points: Annotated[float, typer.Option(
        min=0, help="frugal (the meaning gate: easy clips stay on the device) = the cheapest setting by the "
             "cloud's work per clip within this many points of cloud-only.")] = 1.0,
    ks: Annotated[str, typer.Option("--ks", help="Block lengths to sweep (comma list).")] = "4,6",
    percentiles: Annotated[str, typer.Option(
        help="Thresholds to sweep per k, as percentiles of the edge's block uncertainties (comma list; "
             "0 and inf are always added). More points find cheaper settings at more decodes.")
    ] = ",".join(map(str, calibration.PERCENTILES)),
    uncertainty: Annotated[str, typer.Option(help="Block uncertainty: sum, max or mean.")] = "sum",
    limit: Annotated[int | None, typer.Option(min=2, help="Only the first N clips.", show_default=False)] = None,
    gate: Annotated[bool, typer.Option(
        "--gate/--no-gate", help="Also fit the meaning gate on the calibration half (edge-only work), sweep its "
        "two thresholds and write a frugal preset with the [gate] table when one is within --frugal-points. "
        "--no-gate: the entropy presets only (fewer decodes).")] = True,
    margin: Annotated[float, typer.Option(
        min=0, help="Standard errors of the per-clip gap to cloud-only each preset keeps inside its points "
        "(1: 84% sure, 1.645: 95%), more for more settings tried, on both halves. 0: the plain rule "
        "(no margin).")] = 1.0,
    report: Annotated[Path | None, typer.Option(
        help="Also write every setting's scores on both halves and the choices here as JSON (what docs "
             "tables are drawn from).", show_default=False)] = None,
    batch_size: Annotated[int, typer.Option(
        "--batch-size", min=1, help="Clips decoded together by the speculative runs (the same tokens as one at a "
        "time; see `specdec batch --batch-size`).")] = 8,
    *, generation: dict[str, Any], models: Models,
) -> None:
    """Calibrate the quality and fluent presets for a pair on your clips: cloud-only, edge-only and
    a threshold × k sweep, chosen on one half of the clips and checked on the other."""
    from ..settings import explicit

    err = ui.console()
    # Every cheap check before any model loads.
    k_values = calibration.parse_ks(ks)
    grid_ps = calibration.parse_percentiles(percentiles)
    if uncertainty not in ("sum", "max", "mean"):
        raise InputError(f"bad --uncertainty {uncertainty!r}; use sum, max or mean")
    if out.suffix == ".md" or out.is_dir():
        raise InputError(f"--out {out} must be a .toml file path")
    if out.exists() and not overwrite:
        raise InputError(f"{out} exists; add --overwrite to replace it, or give another --out")
    if report is not None and (report.is_dir() or report.resolve() == out.resolve()):
        raise InputError(f"--report {report} must be a .json file path other than --out")
    base = explicit(**generation)
    max_new_tokens = base.pop("max_new_tokens", 64)
    # The input policy (inputs.py): every clip checked before the models load, each bad one named
    # with its reason and left out; the run goes on with the others and ends with exit 1.
    chosen = calibration.clips_for(directory, labels, limit)
    names, paths, clip_labels, skipped = chosen.names, chosen.paths, chosen.labels, chosen.skipped
    for skip in skipped:
        err.print(skip.line(), markup=False, style="yellow", soft_wrap=True)
    if chosen.unlabelled:  # what demo.measure writes for a clip whose every attribute is ambiguous
        err.print(f"note: {labels} labels no attribute of {ui.clips(len(chosen.unlabelled))}, left out: "
                  f"{ui.names_of(chosen.unlabelled)}", markup=False)
    if len(paths) < 2:
        raise InputError(f"calibration needs at least 2 clips (one per half); {directory} has "
                         f"{len(paths)} readable" + (f" ({len(skipped)} skipped, named above)" if skipped else ""))
    try:
        pair = load(spec_of(models, None), err)
    except KeyboardInterrupt:
        raise Interrupted(f"while the models loaded: nothing was calibrated and {out} was not written") from None

    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeRemainingColumn(), console=err, transient=True, disable=not err.is_terminal)

    def on_skip(skip: Skipped) -> None:
        skipped.append(skip)
        progress.console.print(skip.line(), markup=False, style="yellow", soft_wrap=True)

    try:
        with progress:
            found = calibration.calibrate(pair, names, paths, clip_labels, directory=directory, ks=k_values,
                                          percentiles=grid_ps, uncertainty=uncertainty, max_new_tokens=max_new_tokens,
                                          batch_size=batch_size, settings=base, quality_points=quality_points,
                                          fluent_points=fluent_points, frugal_points=frugal_points, progress=_Bar(progress) if err.is_terminal else _Lines(err), gate=gate,
                                          margin=margin, on_skip=on_skip)
    except KeyboardInterrupt:
        raise Interrupted(f"{out} was not written: the presets are chosen once every setting has run on every "
                          "clip; --limit N, --no-gate or fewer --ks/--percentiles make a shorter run") from None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(found.toml, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot write {out}: {exc.strerror or exc}") from exc

    if report is not None:
        try:
            report.parent.mkdir(parents=True, exist_ok=True)
            report.write_text(json.dumps(found.report(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        except OSError as exc:
            raise InputError(f"cannot write {report}: {exc.strerror or exc}") from exc
    stdout = Console(highlight=False)
    stdout.print(results_table(found.runs, found.scored, found.choices, found.n_calib, found.n_check, found.gate))
    if found.gate is not None:
        stdout.print("k K · U/V: the meaning gate, gate_upload U, gate_verify V", markup=False)
    stdout.print(f"quality measure: {found.measure}", markup=False)
    if found.attributes and (left := left_out_line(found.attributes)):
        stdout.print(f"labels left out: {left}", markup=False)
    for c in found.choices:
        note = "" if c.met else f" (none shown within {c.points:g} points: every block verified)"
        stdout.print(f"{c.name}: k {c.run.cfg.k}, threshold {calibration.toml_float(c.run.cfg.threshold)}{note}",
                     markup=False)
    if found.gate is not None:
        g, cfg = found.gate, found.gate.run.cfg
        if g.met:
            stdout.print(f"{g.name}: k {cfg.k}, gate_upload {calibration.toml_float(cfg.gate_upload)}, gate_verify "
                         f"{calibration.toml_float(cfg.gate_verify)}; no cloud on {100 * g.calib.zero_cloud_share:.0f}% "
                         f"of the calibration half, {100 * g.check.zero_cloud_share:.0f}% of the check half "
                         f"(gate: {g.swaps} swaps, {len(g.gate.weights)} weights)", markup=False, soft_wrap=True)
        else:
            stdout.print(f"{g.name}: no meaning-gate setting shown within {g.points:g} points; not written",
                         markup=False)
    stdout.print(margin_line(found), markup=False)
    stdout.print(f"presets: {out} · use with --presets {out}", markup=False, soft_wrap=True)
    err.print(f"calibrate: chose on {ui.clips(found.n_calib)}, checked on {found.n_check}"
              + (f"; {len(skipped)} skipped (named above)" if skipped else ""), markup=False, soft_wrap=True)
    for line in found.warnings():
        err.print(f"warning: {line}", markup=False, style="bold yellow", soft_wrap=True)
    if skipped:  # the same end as every multi-clip command: exit 1, after the output for the others
        raise some_failed(len(skipped), found.n_calib + found.n_check + len(skipped))


def margin_line(found: calibration.Calibration) -> str:
    """How sure the presets had to be (calibration_objective.select): the z on the calibration half
    (raised for the settings tried) and on the check half."""
    sel = found.choices[0].selection
    if sel is None or sel.margin <= 0:
        return "--margin 0: the plain rule (the calibration half's mean, no margin)"
    gate = found.gate.selection if found.gate is not None else None
    frugal = "" if gate is None else f" (frugal {gate.z:.2f})"
    return f"z {sel.z:.2f}{frugal} on the calibration half, {sel.margin:g} on the check (--margin {sel.margin:g})"


def results_table(runs: Sequence[Run], scored: dict[str, tuple[Score, Score]], choices: Sequence[Choice],
                  n_calib: int, n_check: int, gate: GateChoice | None = None) -> Table:
    chosen: dict[str, str] = {}
    for c in choices:  # one setting may be both presets ("both": keeps the table within 80 columns)
        chosen[c.run.name] = "both" if c.run.name in chosen else c.name
    if gate is not None and gate.met:
        chosen[gate.run.name] = gate.name
    # No outer edge: two columns more for the 80 a terminal (and CliRunner) gives, so that a meaning
    # setting with a 4-digit gate_verify (k 6 · 0.484/0.0849) still leaves the preset column whole.
    table = Table(title=f"calibration half ({ui.clips(n_calib)}) · check half ({ui.clips(n_check)})", title_style="bold",
                  box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for header in ("setting", "calls/tok", "quality", "chk calls/tok", "chk quality", "preset"):
        # The preset column never shrinks: a cut name ("quali…") hides the one thing the table is for.
        table.add_column(header, justify="left" if header in ("setting", "preset") else "right", no_wrap=True,
                         min_width=len("quality") if header == "preset" else None)

    def order(r: Run) -> tuple:
        meaning = r.cfg.verify == "meaning"
        return (r.cfg.mode == "spec", meaning, r.cfg.k, r.cfg.gate_upload if meaning else r.cfg.threshold,
                r.cfg.gate_verify if meaning else 0.0)

    def setting_of(r: Run) -> str:
        f = calibration.toml_float
        if r.cfg.mode != "spec":
            return r.name
        if r.cfg.verify == "meaning":  # the meaning gate's gate_upload/gate_verify (80 columns: no label)
            return f"k {r.cfg.k} · {f(r.cfg.gate_upload)}/{f(r.cfg.gate_verify)}"
        return f"k {r.cfg.k} · t {f(r.cfg.threshold)}"

    for r in sorted(runs, key=order):
        cal, chk = scored[r.name]
        setting = setting_of(r)
        table.add_row(setting, f"{cal.call_rate:.3f}", f"{cal.quality:.1f}", f"{chk.call_rate:.3f}",
                      f"{chk.quality:.1f}", chosen.get(r.name, ""), style="bold" if r.name in chosen else None)
    return table
