"""`specdec describe CLIP…`: one model load, one sentence (or record) per clip."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..audio import check_path
from ..errors import InputError, SpecdecError, one_line
from ..strict_json import dumps_record
from . import ui
from .options import DECODING, MODELS, Decoding, Models, with_options

if TYPE_CHECKING:
    from ..pair import Pair
    from ..settings import PairSpec

PLOT_HINT = "plotting needs matplotlib: pip install 'specdec[plot]'"


def plot_trace_fn():
    """plots.plot_trace, imported only when asked for; matplotlib is an optional extra."""
    try:
        from . import plots

        plots.require_matplotlib()
    except ImportError as exc:
        if (exc.name or "").split(".")[0] != "matplotlib":
            raise
        raise InputError(PLOT_HINT) from None
    return plots.plot_trace


def spec_of(models: Models, presets_file: Path | None) -> PairSpec:
    """The run's pair, resolved without loading (a bad path, dtype or presets file fails here)."""
    from ..settings import PairSpec

    return PairSpec.of(models.edge, models.cloud, models.device, models.dtype, presets_file,
                       edge_device=models.edge_device, cloud_device=models.cloud_device,
                       cloud_timeout=models.cloud_timeout)


def load(spec: PairSpec, err: Any) -> Pair:
    """The pair, loaded once, with a spinner on a terminal."""
    from contextlib import nullcontext

    from ..pair import Pair

    with err.status("loading models…") if err.is_terminal else nullcontext():
        return Pair.from_spec(spec)


@with_options(DECODING, MODELS)
def describe(
    clips: Annotated[list[str], typer.Argument(help="Audio files (WAV, FLAC, OGG, MP3, …), at most 30 s each.",
                                               metavar="CLIP...", show_default=False)],
    json_out: Annotated[bool, typer.Option("--json", help="Print each clip's record as one JSON line on stdout "
                                           "(no live view, trace or panel).")] = False,
    no_live: Annotated[bool, typer.Option("--no-live", help="No live view while decoding.")] = False,
    trace: Annotated[bool | None, typer.Option(
        "--trace/--no-trace", help="Keep the decoding trace (one line per block) on stderr when decoding ends. "
        "Default: on a terminal, without --json.", show_default=False)] = None,
    plot: Annotated[Path | None, typer.Option(help="Draw the decoding trace (entropies, threshold, verdicts) "
                                              "to this PNG (one clip). Needs matplotlib.", show_default=False)] = None,
    *, decoding: Decoding, models: Models,
) -> None:
    """Describe the speaker in each CLIP: prints the sentence (or the record with --json).

    The models load once for all the clips; with several, each sentence follows its file name."""
    from ..settings import explicit

    for clip in clips:
        check_path(Path(clip))
    if plot is not None and len(clips) > 1:
        raise InputError("--plot draws one clip's trace; give one clip")
    overrides = explicit(**decoding.given)
    plot_trace = plot_trace_fn() if plot is not None else None
    err = ui.console()
    spec = spec_of(models, decoding.presets_file)
    run = spec.settings(decoding.preset, overrides, decoding.cloud_rtt_ms)  # an unknown preset fails before loading
    if plot is not None and run.cfg.mode != "spec":
        raise InputError(f"--plot draws the speculative trace; it needs --mode spec, not {run.cfg.mode}")
    pair = load(spec, err)
    views = not json_out  # --json: data only; nothing drawn
    show_trace = (err.is_terminal and views) if trace is None else trace
    failed = 0
    for clip in clips:
        view = ui.LiveView(err, pair.tokenizer, run.cfg, title=f"specdec · {clip}",
                           enabled=views and not no_live and err.is_terminal)
        try:
            with view:
                result = pair.describe(clip, on_block=view.on_block, resolved=run)
        except Exception as exc:
            if len(clips) == 1:
                raise  # one clip: its error is the command's (message and exit code)
            failed += 1
            message = one_line(exc)  # names the clip when the library's message does not
            err.print(f"error: {message if clip in message else f'{clip}: {message}'}", markup=False, soft_wrap=True)
            if json_out:
                _print(dumps_record(pair.error_record(clip, run, one_line(exc))))
            continue
        if show_trace and result.events:
            ui.print_trace(err, result.events, pair.tokenizer, run.cfg)
        if views:
            err.print(ui.summary_panel(result.record))
        if plot_trace is not None and plot is not None:
            written = plot_trace(result.events, run.cfg.threshold, plot, tokenizer=pair.tokenizer)
            err.print(f"trace plot: {written}", markup=False)
        if json_out:
            _print(dumps_record(result.record))
        else:  # several clips: each sentence after its file, as grep names its files
            text = result.description or ""
            _print(text if len(clips) == 1 else f"{clip}: {text}")
    if failed:
        raise SpecdecError(f"{failed} of {len(clips)} clips failed (each said why above)")


def _print(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
