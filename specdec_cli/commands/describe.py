"""`specdec describe CLIP…`: one model load, one sentence (or record) per clip."""

from __future__ import annotations

import sys
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..audio import check_path, probe
from ..errors import InputError, error_kind, one_line
from ..inputs import check_clips, some_failed
from ..segments import Piece
from ..strict_json import dumps_record
from . import ui
from .app import Interrupted
from .options import (
    DECODING,
    DESCRIBE_DEADLINE_S,
    MODELS,
    OUTPUT,
    Decoding,
    DescribeDeadlineOpt,
    Models,
    OnCloudFailure,
    OnCloudFailureOpt,
    SegmentOpt,
    cloud_deadline,
    with_options,
)

if TYPE_CHECKING:
    from ..pair import Pair
    from ..segments import Segment
    from ..settings import PairSpec

PLOT_HINT = "plotting needs matplotlib: pip install 'specdec-omni[plot]'"


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


def spec_of(models: Models, presets_file: Path | None, on_cloud_failure: str = "fail",
            deadline_s: float | None = None, given: dict[str, Any] | None = None) -> PairSpec:
    """The run's pair, resolved without loading (a bad path, dtype or presets file fails here)."""
    from ..settings import PairSpec

    return PairSpec.of(models.edge, models.cloud, models.device, models.dtype, presets_file,
                       edge_device=models.edge_device, cloud_device=models.cloud_device,
                       cloud_timeout=models.cloud_timeout, upload=models.upload, depth=models.depth,
                       on_cloud_failure=on_cloud_failure, cloud_deadline=deadline_s,
                       cloud_needed=_mode_given(given) != "edge")


def _mode_given(given: dict[str, Any] | None) -> str | None:
    """--mode as given (None: not given); --mode edge needs no cloud, so a down one does not stop it."""
    mode = (given or {}).get("mode")
    return None if mode is None else str(getattr(mode, "value", mode))


def cloud_down_note(err: Any, pair: Pair) -> None:
    """Said once, when the run starts: the --cloud URL is down, every clip goes to the edge alone
    (each record's `fallback` is "unreachable")."""
    why = pair.models.cloud_down
    if why is not None:
        err.print(f"warning: {why}; describing every clip on the edge alone (--on-cloud-failure edge): each "
                  "record's fallback is \"unreachable\"", markup=False, style="yellow", soft_wrap=True)


def load(spec: PairSpec, err: Any, spinner: bool = True) -> Pair:
    """The pair, loaded once, with a spinner on a terminal (none with `spinner` False: --quiet and
    --json draw nothing)."""
    from contextlib import nullcontext

    from ..pair import Pair

    with err.status("loading models…") if err.is_terminal and spinner else nullcontext():
        return Pair.from_spec(spec)


@with_options(DECODING, MODELS)
def describe(
    clips: Annotated[list[str], typer.Argument(help="Audio files (WAV, FLAC, OGG, MP3, …), at most 30 s each "
                                               "(longer with --segment).", metavar="CLIP...", show_default=False)],
    json_out: Annotated[bool, typer.Option("--json", help="Each clip's record as a JSON line on stdout (no live "
                                           "view, trace or panel).", rich_help_panel=OUTPUT)] = False,
    no_live: Annotated[bool, typer.Option("--no-live", help="No live view while decoding.",
                                          rich_help_panel=OUTPUT)] = False,
    trace: Annotated[bool | None, typer.Option(
        "--trace/--no-trace", help="The decoding trace on stderr (default: on a terminal, without --json).",
        show_default=False, rich_help_panel=OUTPUT)] = None,
    panel: Annotated[bool | None, typer.Option(
        "--panel/--no-panel", help="Each clip's summary box on stderr (default: on a terminal, without --json).",
        show_default=False, rich_help_panel=OUTPUT)] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="The sentences (and errors) alone.",
                                        rich_help_panel=OUTPUT)] = False,
    plot: Annotated[Path | None, typer.Option(help="Draw one clip's decoding trace to this PNG (needs matplotlib).",
                                              show_default=False, rich_help_panel=OUTPUT)] = None,
    segment: SegmentOpt = False,
    on_cloud_failure: OnCloudFailureOpt = OnCloudFailure.edge,
    deadline_s: DescribeDeadlineOpt = None,
    *, decoding: Decoding, models: Models,
) -> None:
    """Describe the speaker in each CLIP: prints the sentence (or the record with --json).

    The models load once, after every clip is checked; with several clips (or --segment), each
    sentence follows its file name (and the segment's start and end, in seconds)."""
    from ..settings import explicit

    alone = len(clips) == 1 and not segment  # one clip: its error is the command's (message and exit code)
    err = ui.console()
    if len(clips) == 1:  # one file: its problem is the command's error, as it always was
        check_path(Path(clips[0]))
        # Its header too, as check_clips does for many: a text file named .wav is refused at once,
        # not after the ~12 s the models take to load.
        probe(Path(clips[0]))
        bad: dict[str, str] = {}
        bad_kind: dict[str, str] = {}
    else:  # many: every file checked before the models load, every problem listed at once (inputs.py)
        checked = check_clips(clips, lambda c: Path(c))
        for skip in checked.skipped:
            err.print(f"error: {skip.line().removeprefix('skipped: ')} (skipped)", markup=False, soft_wrap=True)
        if not checked.clips:
            raise InputError(f"none of the {len(clips)} clips can be read (each said why above)")
        bad = {str(s.path): s.reason for s in checked.skipped}
        bad_kind = {str(s.path): s.kind for s in checked.skipped}
    if plot is not None and len(clips) > 1:
        raise InputError("--plot draws one clip's trace; give one clip")
    if plot is not None and segment:
        raise InputError("--plot draws one clip's trace; it does not go with --segment")
    overrides = explicit(**decoding.given)
    plot_trace = plot_trace_fn() if plot is not None else None
    spec = spec_of(models, decoding.presets_file, on_cloud_failure.value,
                   cloud_deadline(deadline_s, on_cloud_failure, DESCRIBE_DEADLINE_S), decoding.given)
    run = spec.settings(decoding.preset, overrides, decoding.cloud_rtt_ms)  # an unknown preset fails before loading
    if plot is not None and run.cfg.mode != "spec":
        raise InputError(f"--plot draws the speculative trace; it needs --mode spec, not {run.cfg.mode}")
    # Every clip read and checked (length, silence, scale, speech; a recording planned) before the
    # models load: a refusal costs no load (issue 52).
    from ..pair import check_before_loading

    planned, refused = check_before_loading([c for c in clips if c not in bad], spec, segment)
    if len(clips) == 1 and refused:
        raise refused[clips[0]]
    for clip, exc in refused.items():
        err.print(f"error: {_named(clip, one_line(exc))} (skipped)", markup=False, soft_wrap=True)
        bad[clip], bad_kind[clip] = one_line(exc), error_kind(exc)
    if len(bad) == len(clips):
        raise InputError(f"none of the {len(clips)} clips can be described (each said why above)")
    try:
        pair = load(spec, err, spinner=not json_out and not quiet)
    except KeyboardInterrupt:
        raise Interrupted(f"while the models loaded: none of the {ui.clips(len(clips))} was described") from None
    run = pair.for_link(run, decoding.preset, overrides)  # a remote cloud: k for the link where k is free
    pair.on_cloud_wait(lambda line: err.print(f"warning: {line}", markup=False, style="yellow", soft_wrap=True))
    if run.cfg.mode != "edge":
        cloud_down_note(err, pair)
    views = not json_out and not quiet  # --json: data only; --quiet: sentences only; nothing drawn
    show_trace = (err.is_terminal and views) if trace is None else trace and not quiet
    # The panel is for a person at a terminal: a pipe or a log gets it only when asked (--panel).
    show_panel = (err.is_terminal and views) if panel is None else panel and not quiet
    failed = described = ok = 0
    # A cloud that fails mid-run: explained at the first clip it fails, counted after (batch does the same)
    fallbacks = ui.FallbackTally("segments" if segment else "clips")
    # Band-limited clips, and with several clips the ones below the models' rate: said once, at the end
    band = ui.BandLimitedTally("segments" if segment else "clips")
    counting = ExitStack()
    if len(clips) > 1:
        counting.enter_context(ui.low_rate_counted(band))

    def failure(clip: str, exc: Exception, where: Segment | None = None) -> None:
        nonlocal failed
        failed += 1
        message = one_line(exc)  # names the clip when the library's message does not
        label = clip if where is None else f"{clip} {_span(where)}"
        err.print(f"error: {message if clip in message and where is None else f'{label}: {message}'}",
                  markup=False, soft_wrap=True)
        if json_out:
            _print(dumps_record(pair.error_record(clip, run.segmented() if segment else run, message, where,
                                                  error_kind(exc))))

    try:
        for clip in clips:
            if clip in bad:  # said before loading; counted, and its error record in its place with --json
                failed += 1
                described += 1
                if json_out:
                    _print(dumps_record(pair.error_record(clip, run.segmented() if segment else run, bad[clip],
                                                          kind=bad_kind[clip])))
                continue
            if segment:
                try:
                    recording = pair.recording(clip, planned=planned.get(clip))
                except Exception as exc:
                    if len(clips) == 1:
                        raise  # one recording that cannot be read: the command's error
                    described += 1
                    failure(clip, exc)
                    continue
                parts: list[Segment | None] = list(recording.segments)
            else:
                parts = [None]
            for where in parts:
                described += 1
                title = f"specdec · {clip}" + (f" · {_span(where)}" if where is not None else "")
                view = ui.LiveView(err, pair.tokenizer, run.cfg, title=title,
                                   enabled=views and not no_live and err.is_terminal)
                try:
                    audio = Piece(clip, where, recording.read(where)) if where is not None else clip
                    with view:
                        result = pair.describe(audio, on_block=view.on_block, resolved=run)
                except Exception as exc:
                    if alone:
                        raise
                    failure(clip, exc, where)
                    continue
                fallbacks.add(result.record)
                band.add(result.record)
                note = fallbacks.note(label_of(clip, where), result.record)
                if note is not None and pair.models.cloud_down is None:  # a cloud down from the start: said once
                    err.print(note, markup=False, style="yellow")
                if show_trace and result.events:
                    ui.print_trace(err, result.events, pair.tokenizer, run.cfg)
                if show_panel:
                    err.print(ui.summary_panel(result.record))
                if plot_trace is not None and plot is not None:
                    written = plot_trace(result.events, run.cfg.threshold, plot, tokenizer=pair.tokenizer)
                    err.print(f"trace plot: {written}", markup=False)
                ok += 1
                if json_out:
                    _print(dumps_record(result.record))
                else:  # several clips (or segments): each sentence after its file, as grep names its files
                    text = result.description or ""
                    _print(text if alone else f"{clip}{' ' + _span(where) if where is not None else ''}: {text}")
            if segment:
                recording.close()
    except KeyboardInterrupt:
        # What Ctrl-C leaves: the sentences printed so far are whole; the clip in flight and the rest are not.
        what = "segments" if segment else "clips"
        raise Interrupted(f"{ok} {what} described and {failed} failed before Ctrl-C (their lines are above); "
                          f"{len(clips) - clips.index(clip)} of {ui.clips(len(clips))} not finished, from {clip}") from None
    finally:
        counting.close()
    if (line := band.line()) is not None:
        err.print(line, markup=False, style="yellow")
    if fallbacks.fell_back and fallbacks.clips > 1 and pair.models.cloud_down is None:
        err.print(fallbacks.line(), markup=False, style="yellow")
    if failed:
        what = "segments or clips" if segment else "clips"
        raise some_failed(failed, described, what)


def _named(clip: str, message: str) -> str:
    """`message` naming `clip` (once: the library's messages mostly name it)."""
    return message if clip in message else f"{clip}: {message}"


def label_of(clip: str, where: Segment | None) -> str:
    return clip if where is None else f"{clip} {_span(where)}"


def _span(segment: Segment) -> str:
    """Where a segment is, as its lines name it: '30.00–58.50 s'."""
    return f"{segment.start_s:.2f}–{segment.end_s:.2f} s"


def _print(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
