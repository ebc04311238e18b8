"""`specdec eval DIR [--labels labels.jsonl]`: every mode on the same clips, in one process; without
labels, quality is agreement with cloud-only (accuracy needs labels).

Thin: parse options, load the pair once, run `evaluate.run_eval` under a progress bar, print the
tables (stdout; stderr with --json, whose report is then stdout's only content), write the report
and the plot.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from .. import evaluate
from ..errors import InputError
from ..inputs import Skipped, check_clips, clips_for_resolution, plural, resolution_points, some_failed
from ..models import presets_file_for
from ..presets import check_presets_file, load_presets
from . import ui
from .app import Interrupted
from .describe import load, spec_of
from .options import EVAL_GENERATION, MODELS, Models, with_options


def _tables(report: dict[str, Any]) -> list[Table]:
    rtt = bool(report["settings"].get("cloud_rtt_ms"))
    tables = []
    for title, cols in evaluate.summary_tables(rtt, evaluate.has_link(report), evaluate.labelled(report),
                                               evaluate.partly_labelled(report)):
        table = Table(title=f"{title} · {ui.clips(report['clips'])}", title_style="bold", box=box.SIMPLE_HEAD)
        for i, (header, _) in enumerate(cols):
            table.add_column(header, justify="left" if i == 0 else "right", no_wrap=i == 0)
        for s in report["modes"]:
            table.add_row(*(cell(s) for _, cell in cols))
        tables.append(table)
    if evaluate.partly_labelled(report):  # each attribute over the clips labelled for it: say how many
        headers, rows = evaluate.attribute_table(report)
        table = Table(title=f"accuracy per attribute · {ui.clips(report['clips'])}", title_style="bold",
                      box=box.SIMPLE_HEAD)
        for i, header in enumerate(headers):
            table.add_column(header, justify="left" if i == 0 else "right", no_wrap=i == 0)
        for i, row in enumerate(rows):
            table.add_row(*row, end_section=i == len(report["modes"]) - 1)
        tables.append(table)
    return tables


def _frontier_table(report: dict[str, Any]) -> Table | None:
    fr = report.get("frontier")
    if not fr:
        return None
    table = Table(title=f"threshold sweep (k = {fr['k']})", title_style="bold", box=box.SIMPLE_HEAD)
    headers, cells = evaluate.frontier_columns(evaluate.labelled(report))
    for header in headers:
        table.add_column(header, justify="right")
    for p in fr["points"]:
        table.add_row(*cells(p))
    return table


@with_options(EVAL_GENERATION, MODELS)
def evaluate_command(
    directory: Annotated[Path, typer.Argument(help="Folder of clips; the labels file names them relative to it.",
                                              metavar="DIR", show_default=False)],
    labels: Annotated[Path | None, typer.Option(
        help="labels.jsonl: one {\"file\": ..., \"labels\": {gender, rate, pitch, volume, pauses, emotion}} "
             "per line; an attribute left out (as demo.measure leaves an ambiguous one) is scored over the clips "
             "labelled for it. Default: DIR/labels.jsonl; without one, every audio file of DIR is scored by agreement "
             "with cloud-only instead of accuracy.", show_default=False)] = None,
    modes: Annotated[str, typer.Option(
        help="Comma list of modes to run: edge, cloud, fluent, quality, always (spec with every block verified), "
             "or any other preset by name (e.g. frugal, on the meaning gate).")
    ] = ",".join(evaluate.MODE_NAMES),
    report: Annotated[Path | None, typer.Option(
        help="Write the report here as JSON, and as Markdown beside it (same stem, .md).", show_default=False)] = None,
    sweep: Annotated[str | None, typer.Option(
        help="Also run the spec mode over a threshold range, e.g. threshold=1:8:8 (START:STOP:COUNT); "
             "the cost-quality frontier goes into the report.", show_default=False)] = None,
    k: Annotated[int | None, typer.Option(
        help="Draft block length for every spec mode and the sweep (default: from the presets; "
             "always and the sweep use the quality preset's).", show_default=False)] = None,
    plot: Annotated[Path | None, typer.Option(
        help="Draw the frontier (cloud calls per token vs accuracy) to this PNG. Needs matplotlib "
             "(the plot extra of specdec).", show_default=False)] = None,
    cloud_rtt_ms: Annotated[float, typer.Option(
        help="Modelled edge-cloud round trip: added once per cloud call to spec modes and once per clip "
             "to cloud-only in the modelled latency (computed, never slept).")] = 0.0,
    limit: Annotated[int | None, typer.Option(help="Only the first N labelled clips.", show_default=False)] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as one JSON object on stdout "
                                           "(the tables then go to stderr).")] = False,
    presets_file: Annotated[Path | None, typer.Option(
        "--presets", help="A presets file (e.g. from `specdec calibrate`) for the fluent, quality and always modes.",
        show_default=False)] = None,
    batch_size: Annotated[int, typer.Option(
        "--batch-size", min=1, help="Clips decoded together by the speculative modes (same tokens; a clip's latency "
        "then includes its batch-mates' share of each forward, so keep 1 to compare latencies).")] = 1,
    *, generation: dict[str, Any], models: Models,
) -> None:
    """Score edge-only, cloud-only and the speculative modes on clips: accuracy per attribute (with
    labels; without, agreement with cloud-only), sentence validity, cloud calls, latency and speedup."""
    from ..settings import explicit

    err = ui.console()
    # Validate everything the user typed before spending time on loading models.
    if cloud_rtt_ms < 0:
        raise InputError(f"--cloud-rtt-ms must be >= 0, got {cloud_rtt_ms:g}")
    if limit is not None and limit < 1:
        raise InputError(f"--limit must be at least 1, got {limit}")
    if report is not None and report.suffix == ".md":
        raise InputError(f"--report {report} must not end in .md: the Markdown version is written beside it")
    mode_names = evaluate.parse_modes(modes, load_presets([presets_file_for(models.edge),
                                                          check_presets_file(presets_file)]))
    thresholds = evaluate.parse_sweep(sweep) if sweep else []
    base = explicit(**generation)
    max_new_tokens = base.pop("max_new_tokens", 64)
    labels_path: Path | None = labels if labels is not None else directory / "labels.jsonl"
    if labels is None and not (directory / "labels.jsonl").is_file():
        labels_path = None
        clips, skipped = evaluate.unlabelled_clips(directory)
        clips = clips[:limit]
        if plot is not None:
            raise InputError("--plot draws accuracy against cloud calls, which needs --labels")
        agree = ("quality is agreement with cloud-only's sentence" if "cloud" in mode_names else
                 "add cloud to --modes for agreement with cloud-only's sentence")
        err.print(f"no labels ({directory / 'labels.jsonl'} not found): accuracy needs --labels; {agree}",
                  markup=False)
    else:
        assert labels_path is not None
        read = evaluate.labels_file(labels_path, directory)
        clips, skipped = read.clips[:limit], []
        if read.unlabelled:  # what demo.measure writes for a clip whose every attribute is ambiguous
            err.print(f"note: {labels_path} labels no attribute of {ui.clips(len(read.unlabelled))}, left out: "
                      f"{ui.names_of(read.unlabelled)}", markup=False)
    # The input policy (inputs.py): every clip checked now, before the models load; each bad one
    # named with its reason, left out and counted; the run goes on with the others and exits 1.
    checked = check_clips(clips, lambda c: c.path)
    skipped += checked.skipped
    clips = checked.clips
    for skip in skipped:
        err.print(skip.line(), markup=False, style="yellow", soft_wrap=True)
    if not clips:
        raise InputError(f"no clip to evaluate: the {len(skipped)} files named above were skipped")
    if plot is not None:
        from . import plots

        plots.require_matplotlib()  # fail now, not after an hour of decoding, if matplotlib is missing
    spec = spec_of(models, presets_file)
    eval_modes = evaluate.mode_configs(mode_names, list(spec.presets_files), max_new_tokens, k, thresholds, base)
    try:
        pair = load(spec, err)
    except KeyboardInterrupt:
        raise Interrupted("while the models loaded: nothing was evaluated") from None

    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeRemainingColumn(), console=err, transient=True)
    with progress:
        task = progress.add_task("evaluating", total=len(clips) * len(eval_modes))

        def on_record(record: dict[str, Any]) -> None:
            progress.update(task, advance=1, description=f"{record['eval_mode']:>8} {record['file']}")
            if record["error"]:
                progress.console.print(Text.assemble(("warning: ", "yellow"),
                                                     f"{record['eval_mode']} {record['file']}: {record['error']}"))

        def on_skip(skip: Skipped) -> None:
            skipped.append(skip)
            progress.console.print(skip.line(), markup=False, style="yellow", soft_wrap=True)

        try:
            records = evaluate.run_eval(pair, clips, eval_modes, cloud_rtt_ms, on_record, batch_size, on_skip)
        except KeyboardInterrupt:
            done = int(progress.tasks[0].completed)
            raise Interrupted(f"after {done} of {len(clips) * len(eval_modes)} decodes: no table or report was "
                              "written (eval scores every mode at the end); --limit N or fewer --modes make a "
                              "shorter run") from None

    settings = {"modes": mode_names, "sweep": sweep, "k": k, "max_new_tokens": max_new_tokens,
                "cloud_rtt_ms": cloud_rtt_ms, "device": models.device, "dtype": models.dtype,
                "batch_size": batch_size, "configs": {m.name: m.cfg.as_dict() for m in eval_modes}}
    result = evaluate.build_report(records, eval_modes, edge=pair.models.edge_id, cloud=pair.models.cloud_id,
                                   samples=str(directory), labels=str(labels_path) if labels_path else None,
                                   settings=settings)

    result["skipped"] = [{"file": str(s.path), "reason": s.reason} for s in skipped]
    scored = result["clips"]
    err.print(f"eval: scored {plural(scored, 'clip')}" + (f"; {len(skipped)} skipped (named above)" if skipped else ""),
              markup=False)
    if result["attributes"] and (left := evaluate.left_out_line(result["attributes"])):
        err.print(f"labels: each attribute scored over the clips labelled for it; left out: {left}", markup=False)
    if evaluate.partly_labelled(result):  # each attribute over its own clips: the least-labelled sets the step
        step, need = evaluate.partial_resolution(result)
        if step > 1.0:
            err.print(f"warning: one attribute changed on one clip moves a mode's accuracy by up to {step:.1f} "
                      "points (the least-labelled attribute's clips), so differences smaller than that are noise; "
                      f"score at least {need} clips labelled for each attribute to tell 1 point apart",
                      markup=False, style="bold yellow")
    elif scored < clips_for_resolution(1.0):
        # Said loudly, not refused: a few clips still answer "does it run, roughly how fast".
        err.print(f"warning: only {plural(scored, 'clip')}: one attribute changed on one clip moves a mode's "
                  f"accuracy by {resolution_points(scored):.1f} points, so differences smaller than that are noise; "
                  f"score at least {clips_for_resolution(1.0)} clips to tell 1 point apart", markup=False,
                  style="bold yellow")
    out = err if json_out else Console(highlight=False)  # the tables are the output, unless the report is
    for table in _tables(result):
        out.print(table)
    if (fr_table := _frontier_table(result)) is not None:
        out.print(fr_table)
    if report is not None:
        json_path, md_path = evaluate.write_report(result, report)
        err.print(f"report: {json_path} · {md_path}", markup=False)
    if plot is not None:
        from . import plots

        err.print(f"plot: {plots.plot_frontier(result, plot)}", markup=False)
    if json_out:
        sys.stdout.write(evaluate.report_json(result, indent=None) + "\n")  # one line, for jq and pipes
    if skipped:  # the same end as every multi-clip command: exit 1, after the output for the others
        raise some_failed(len(skipped), scored + len(skipped))
