"""`specdec batch DIR --out FILE`: every clip of a folder into a results file (or stdout), resumable."""

from __future__ import annotations

import shlex
import sys
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..errors import RETRYABLE, InputError, SpecdecError, error_kind, one_line, printable
from . import ui
from .app import Interrupted
from .describe import cloud_down_note, load, spec_of
from .options import (
    BATCH_DEADLINE_S,
    DECODING,
    DECODING_PANEL,
    INPUT,
    MODELS,
    OUTPUT,
    BatchDeadlineOpt,
    Decoding,
    Models,
    OnCloudFailure,
    OnCloudFailureOpt,
    SegmentOpt,
    cloud_deadline,
    with_options,
)

if TYPE_CHECKING:
    from rich.console import Console

    from ..corpus import Corpus
    from ..scale.ray_batch import DescribeAll, RayOptions, WorkerEvent
    from ..settings import PairSpec, Settings

# Measured on the bundled pair, 2 CPU cores (docs/benchmarks.md, "Many clips at once").
DEFAULT_BATCH_SIZE = 8
BatchSizeOpt = Annotated[int, typer.Option(
    "--batch-size", min=1, help="Clips decoded together (in this process; a remote cloud and sampled edge/cloud "
    "modes go one at a time).", rich_help_panel=DECODING_PANEL)]

_R = "Ray (many processes or machines)"
RayOpt = Annotated[str | None, typer.Option(
    "--ray", metavar="auto|ADDRESS", help="Spread the clips over Ray workers, each loading the pair once: auto starts "
    "a Ray on this machine for this run; ADDRESS joins a running cluster (what `ray start --head` prints). "
    "Needs pip install 'specdec-omni\\[ray]'.",  # the backslash keeps Rich from reading [ray] as markup
    show_default=False, rich_help_panel=_R)]
WorkersOpt = Annotated[int | None, typer.Option(
    "--workers", min=1, help="Ray workers (default: one per CPU, or per --gpus-per-worker GPUs, of the cluster).",
    show_default=False, rich_help_panel=_R)]
GpusOpt = Annotated[float, typer.Option(
    "--gpus-per-worker", min=0, help="GPUs Ray gives each worker (with --device cuda).", rich_help_panel=_R)]
_D = "Datasets (Hugging Face, Parquet)"
AudioColumnOpt = Annotated[str | None, typer.Option(
    "--audio-column", help="A dataset's column holding the audio (default: its one Audio column).",
    show_default=False, rich_help_panel=_D)]
SplitOpt = Annotated[str | None, typer.Option(
    "--split", help="The split of a dataset holding several (train, test, …).", show_default=False,
    rich_help_panel=_D)]
PrefixOpt = Annotated[str, typer.Option(
    "--column-prefix", help="Put before each record column's name (for a dataset that has a description "
    "column already).", rich_help_panel=_D)]
ShipAudioOpt = Annotated[bool | None, typer.Option(
    "--ship-audio/--shared-path", help="Who reads the clips: this process, sending their bytes to the workers "
    "(default with an ADDRESS), or the workers, from DIR at the same path on every node (default with auto).",
    show_default=False, rich_help_panel=_R)]


@with_options(DECODING, MODELS)
def batch(
    directory: Annotated[Path, typer.Argument(
        help="Folder of audio files; or a dataset: a Dataset.save_to_disk folder, an audiofolder (with "
        "metadata.csv), a .parquet file or a folder of them.", show_default=False)],
    # A string, not a Path: NAME/ (a folder of part files) must keep its slash. ResultsFile and
    # corpus.CorpusResults check it (the folder, the lock) and say what is wrong in one line.
    out: Annotated[str, typer.Option(help="Results, one JSON line per file (appended as each finishes); "
                                     "- writes them to stdout. NAME.parquet, or a folder (NAME/): the "
                                     "dataset's rows with the record's fields as columns.", show_default=False,
                                     rich_help_panel=OUTPUT)],
    recursive: Annotated[bool, typer.Option("--recursive", "-r", help="Include subfolders.",
                                            rich_help_panel=INPUT)] = False,
    hidden: Annotated[bool, typer.Option("--hidden", help="Include dotfiles and dot-folders (._x.wav, .cache/).",
                                         rich_help_panel=INPUT)] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Start over instead of resuming from --out "
                                            "(the old file is kept as OUT.bak).", rich_help_panel=OUTPUT)] = False,
    ray: RayOpt = None,
    workers: WorkersOpt = None,
    gpus_per_worker: GpusOpt = 0.0,
    ship_audio: ShipAudioOpt = None,
    audio_column: AudioColumnOpt = None,
    split: SplitOpt = None,
    column_prefix: PrefixOpt = "",
    batch_size: BatchSizeOpt = DEFAULT_BATCH_SIZE,
    segment: SegmentOpt = False,
    on_cloud_failure: OnCloudFailureOpt = OnCloudFailure.edge,
    deadline_s: BatchDeadlineOpt = None,
    retry_fallback: Annotated[bool, typer.Option(
        "--retry-fallback", help="Resuming: describe again the clips the edge finished alone because the cloud "
        "failed (else they count as done).", rich_help_panel=OUTPUT)] = False,
    *, decoding: Decoding, models: Models,
) -> None:
    """Describe every audio file in DIRECTORY into --out, one JSON line per file.

    Rerunning with the same settings and --out resumes: files recorded without error are skipped,
    failed ones are retried, and a run killed at any moment loses nothing already written. A file
    holding anything else (other settings, another tool's lines) is refused, never rewritten; one
    --out takes one run at a time. Every file the audio library can read is taken, whatever its
    name; what is not audio is listed and left out. With --segment each recording is described in
    segments cut at pauses, one line per segment, and a rerun resumes at the first segment not
    recorded.

    Given a dataset, or with a Parquet --out: one row per clip of the dataset, its columns kept and
    the record's fields added; a rerun resumes the same way."""
    from ..corpus import is_dataset, output_kind
    from ..results import ResultsFile, StreamResults, find_audio
    from ..settings import explicit

    err = ui.console()
    if output_kind(out) != "jsonl" or is_dataset(directory):
        _dataset_options(out, recursive, hidden, ray, workers, gpus_per_worker, ship_audio, segment, directory)
        spec = spec_of(models, decoding.presets_file, on_cloud_failure.value,
                       cloud_deadline(deadline_s, on_cloud_failure, BATCH_DEADLINE_S), decoding.given)
        run = spec.settings(decoding.preset, explicit(**decoding.given), decoding.cloud_rtt_ms)
        return _caption(directory, out, split, audio_column, column_prefix, overwrite, retry_fallback, spec,
                        run, batch_size, err)
    if audio_column is not None or split is not None or column_prefix:
        raise InputError("--audio-column, --split and --column-prefix are for a dataset (a save_to_disk folder, "
                         "an audiofolder, Parquet) written to --out NAME.parquet or a folder")
    out = Path(out)
    found = find_audio(directory, recursive, hidden)
    files = found.files
    overrides = explicit(**decoding.given)
    if segment and ray is not None:
        raise InputError("--segment does not go with --ray yet; run the segmented batch without --ray")
    ray_options = _ray_options(ray, workers, gpus_per_worker, ship_audio, models.device)
    to_stdout = str(out) == "-"
    if to_stdout and overwrite:
        raise InputError("--overwrite starts a results file over; --out - writes to stdout, which has nothing to "
                         "start over")
    spec = spec_of(models, decoding.presets_file, on_cloud_failure.value,
                   cloud_deadline(deadline_s, on_cloud_failure, BATCH_DEADLINE_S), decoding.given)
    run = spec.settings(decoding.preset, overrides, decoding.cloud_rtt_ms)
    if segment:
        run = run.segmented()  # the results file says it holds segments: never mixed with whole clips
    if found.ignored or found.hidden:  # said once every check passed: a refusal stays one line
        err.print(found.ignored_line(), markup=False, style="dim", soft_wrap=True)
    for line in found.skipped_lines():  # a FIFO, a device, a loop, a dangling link, an unreadable folder
        err.print(line, markup=False, style="yellow", soft_wrap=True)
    results = StreamResults(sys.stdout) if to_stdout else ResultsFile(out, run.run, overwrite, retry_fallback)
    with results:
        if results.backup is not None:
            err.print(f"starting over; the old results are kept in {results.backup}", markup=False, soft_wrap=True)
        summary = _run(files, results, spec, run, ray_options, batch_size, err, segment)
    where = "stdout" if to_stdout else str(out)
    err.print(ui.batch_summary(summary.ok, summary.failed, summary.skipped, where))
    if summary.link.clips:
        err.print(summary.link.line(), markup=False, soft_wrap=True)
    elif summary.cloud_free.clips:
        err.print(summary.cloud_free.line(), markup=False, soft_wrap=True)
    if (line := summary.band.line()) is not None:
        err.print(line, markup=False, style="yellow")
    if summary.fallback.fell_back:
        err.print(summary.fallback.line(), markup=False, style="yellow")
        if not to_stdout:
            err.print("rerun with --retry-fallback to describe them with the cloud", markup=False, style="yellow")
    others = f"; {len(found.skipped)} other entries skipped (named above)" if found.skipped else ""
    if summary.failed:
        rerun = f"; their records in {out} say why" if not to_stdout else "; their records say why"
        rerun += ui.failure_advice(summary.kinds, to_stdout)
        if segment:
            raise SpecdecError(f"{summary.failed} of {summary.ok + summary.failed} records (segments, or recordings "
                               f"that could not be cut) failed{rerun}{others}")
        raise SpecdecError(f"{summary.failed} of {len(files)} files failed{rerun}{others}")
    if found.skipped:  # every clip went well, but not every entry was one: exit 1, as anywhere a file is skipped
        raise SpecdecError(f"{len(found.skipped)} entries of {directory} were skipped (named above); the "
                           f"{len(files)} audio files went well")


class _Summary:
    def __init__(self, ok: int = 0, failed: int = 0, skipped: int = 0, segment: bool = False) -> None:
        self.ok, self.failed, self.skipped = ok, failed, skipped
        self.link = ui.LinkTally()
        self.cloud_free = ui.CloudFreeTally()
        self.fallback = ui.FallbackTally("segments" if segment else "clips")
        self.band = ui.BandLimitedTally("segments" if segment else "clips")  # said once, at the end
        self.kinds: dict[str, int] = {}  # failed records by error_kind


def _run(files: list[Path], results: Any, spec: PairSpec, run: Settings, ray_options: RayOptions | None,
         batch_size: int, err: Console, segment: bool = False) -> _Summary:
    from contextlib import nullcontext

    from ..pair import error_record_before_loading
    from ..results import pending, run_batch

    todo, skipped = pending(files, results, segment)
    summary = _Summary(skipped=skipped, segment=segment)
    if not todo:
        return summary
    # Every clip read and checked (length, silence, scale, speech; a recording planned) before the
    # models load, so a refusal costs no load and a folder of refusals loads none (issue 52). Not
    # with Ray: the workers read the clips (from their own disks with --shared-path).
    planned: dict = {}
    refused: dict = {}
    if ray_options is None:
        from ..pair import check_before_loading

        with err.status(f"checking {ui.clips(len(todo))}…") if err.is_terminal else nullcontext():
            planned, refused = check_before_loading(todo, spec, segment)
    checked = [f for f in todo if str(f) not in refused]
    pair = load(spec, err) if ray_options is None and checked else None  # a Ray driver loads no model
    if pair is not None and run.cfg.mode != "edge":
        cloud_down_note(err, pair)
    # Progress counts clips; with --segment, recordings (how many segments each has is known only
    # once it is read), each done when its last segment still to do has ended.
    units = {"unit": "recordings", "skipped_unit": "segments"} if segment else {}
    lines = None if err.is_terminal else ui.ProgressLines(err, len(todo), skipped, **units)
    left: dict[Path, int] = {}  # a recording -> its segments not yet ended (from its first record on)
    spoilt: set[Path] = set()   # recordings with a failed segment
    with ui.batch_progress(err, disable=not err.is_terminal) as progress:
        if pair is not None:  # a cloud that stops answering: said while the clip waits, not after
            pair.on_cloud_wait(lambda line: progress.console.print(f"warning: {line}", markup=False, style="yellow",
                                                                   soft_wrap=True))
        task = progress.add_task(f"describing ({skipped} already done)" if skipped else "describing", total=len(todo))

        def on_done(path: Path, record: dict[str, Any]) -> None:
            summary.link.add(record)
            summary.cloud_free.add(record)
            summary.fallback.add(record)
            summary.band.add(record)
            failed = record["error"] is not None
            where = f" {record['start_s']:.2f}–{record['end_s']:.2f} s" if record.get("segment") is not None else ""
            note = summary.fallback.note(f"{printable(str(path))}{where}", record)
            if note is not None and (pair is None or pair.models.cloud_down is None):  # a down cloud: said at start
                progress.console.print(note, markup=False, style="yellow")
            if failed:
                summary.failed += 1
                kind = record.get("error_kind", RETRYABLE)  # a record from before error_kind: may succeed
                summary.kinds[kind] = summary.kinds.get(kind, 0) + 1
                # one line per file, even in a log; the name printable (a newline or ESC in a file name)
                progress.console.print(f"failed: {printable(str(path))}{where}: {printable(record['error'])}",
                                       markup=False, style="yellow", soft_wrap=True)
            else:
                summary.ok += 1
            if record.get("segment") is not None:
                if path not in left:
                    left[path] = record["segments"] - len(results.skip(path))
                left[path] -= 1
                if failed:
                    spoilt.add(path)
                if left[path] > 0:
                    return  # the recording goes on
                failed = path in spoilt
            progress.advance(task)
            if lines is not None:
                lines.advance(failed)

        if pair is not None:
            def describe_all(clips: list[Path]):
                return ((path, result.record) for path, result in
                        pair.describe_many(clips, run, batch_size, segment=segment, skip=results.skip,
                                           planned=planned))
        elif ray_options is not None:
            describe_all = _ray_describe_all(ray_options, spec, run, batch_size, progress.console)
        try:
            with ui.low_rate_counted(summary.band):  # a clip below the models' rate: said once, at the end
                for path in todo:  # the refusals first, each its record, as a clip that failed is
                    if str(path) in refused:
                        exc = refused[str(path)]
                        record = error_record_before_loading(spec, run, path, one_line(exc), error_kind(exc))
                        results.append(record)
                        on_done(path, record)
                if checked:
                    run_batch(checked, results, None, None, on_done, describe_all=describe_all, segment=segment)
        except KeyboardInterrupt:
            raise Interrupted(_kept(results, summary)) from None
    return summary


def _kept(results: Any, summary: _Summary) -> str:
    """What Ctrl-C leaves: the records kept (as the file holds them: every append is on disk before
    the next clip starts), and the command that goes on from there."""
    from ..results import read_records

    if str(results.path) == "-":
        return f"{summary.ok + summary.failed} records were written to stdout"
    kept = len(read_records(results.path))
    argv = [a for a in sys.argv[1:] if a != "--overwrite"]  # resuming must not start over again
    return (f"{kept} records are kept in {results.path} ({kept - summary.skipped} from this run); "
            f"resume with: {shlex.join(['specdec', *argv])}")


def _ray_options(ray: str | None, workers: int | None, gpus_per_worker: float, ship_audio: bool | None,
                 device: str) -> RayOptions | None:
    """The Ray options, checked before anything is opened or loaded; None without --ray."""
    if ray is None:
        if workers is not None or gpus_per_worker or ship_audio is not None:
            raise InputError("--workers, --gpus-per-worker, --ship-audio and --shared-path go with --ray; "
                             "add --ray auto (or --ray ADDRESS)")
        return None
    from ..scale.ray_batch import RayOptions, check_reachable, require_ray

    require_ray()  # the install hint, exit 2
    if not ray.strip():
        raise InputError("--ray needs auto or a cluster address (e.g. 10.0.0.5:6379 or ray://10.0.0.5:10001)")
    if ray.strip() != "auto":
        check_reachable(ray.strip())  # at once, not after minutes of ray.init retrying
    if gpus_per_worker and device == "cpu":
        raise InputError(f"--gpus-per-worker {gpus_per_worker:g} gives each worker GPUs, but the models would "
                         "stay on the CPU: add --device cuda")
    return RayOptions(ray.strip(), workers, gpus_per_worker, ship_audio)


def _ray_describe_all(options: RayOptions, spec: PairSpec, run: Settings, batch_size: int,
                      console: Console) -> DescribeAll:
    """run_batch's describe_all over Ray workers, each holding a pair.BatchWorker of this run's
    spec and settings and decoding `batch_size` rows at a time where this run can batch."""
    from ..models import pinned_threads
    from ..pair import BatchWorker
    from ..scale.ray_batch import describe_all

    def on_event(event: WorkerEvent) -> None:
        where = f" (pid {event.pid} on {event.host})" if event.pid is not None else ""
        if event.kind != "ready":
            console.print(f"ray: worker {event.index + 1} {event.kind}{where}"
                          f"{': ' + event.detail if event.detail else ''}", markup=False, style="yellow",
                          soft_wrap=True)

    worker = partial(BatchWorker, spec.portable(), run, pinned_threads())
    return describe_all(options, worker, batch_size, on_event)


def _dataset_options(out: str, recursive: bool, hidden: bool, ray: str | None, workers: int | None,
                     gpus_per_worker: float, ship_audio: bool | None, segment: bool, directory: Path) -> None:
    """Refuse what a dataset run does not take, before anything is opened."""
    from ..corpus import output_kind, require_datasets

    if output_kind(out) == "jsonl":
        where = "stdout" if out == "-" else out
        raise InputError(f"{directory} is a dataset: its rows are written with their columns to Parquet, not to "
                         f"{where}; give --out NAME.parquet, or a folder (NAME/)")
    if ray is not None or workers is not None or gpus_per_worker or ship_audio is not None:
        raise InputError("--ray spreads a folder of audio files; a Parquet dataset goes past one machine with Ray "
                         "Data (specdec.caption_with_ray, docs: Caption a corpus)")
    if segment:
        raise InputError("--segment takes a folder of recordings; a dataset's rows are described as clips of at "
                         "most the model's window")
    if recursive or hidden:
        raise InputError("--recursive and --hidden are for a folder of audio files; a dataset says which rows "
                         "it holds")
    require_datasets()  # the install hint, exit 2


def _caption(directory: Path, out_given: str, split: str | None, audio_column: str | None, prefix: str,
             overwrite: bool, retry_fallback: bool, spec: PairSpec, run: Settings, batch_size: int,
             err: Console) -> None:
    """`specdec batch DATASET --out captions.parquet`: the library's corpus route (corpus.py) with
    this command's progress and summary."""
    from ..corpus import CorpusResults, RecordColumns, open_corpus, output_kind
    from ..inputs import plural

    corpus = open_corpus(directory, split, audio_column)
    elapsed = 0.0
    out = Path(out_given)  # NAME/ names a folder; the Path forgets the slash, so the kind is taken first
    with CorpusResults(out, corpus, run.run, overwrite, prefix, retry_fallback,
                       folder=output_kind(out_given) == "folder") as results:
        if results.backup is not None:
            err.print(f"starting over; the old output is kept in {results.backup}", markup=False, soft_wrap=True)
        summary = _Summary(skipped=results.kept)
        todo = results.todo()
        if todo or not results.finished:  # rows to describe, or a journal to write out
            pair = load(spec, err)
            if run.cfg.mode != "edge":
                cloud_down_note(err, pair)
            columns = RecordColumns.of(pair, run, prefix)
            columns.check_clash(corpus.schema.names, str(directory))
            try:
                elapsed = _caption_rows(pair, run, corpus, results, todo, batch_size, summary, err)
            except KeyboardInterrupt:
                argv = [a for a in sys.argv[1:] if a != "--overwrite"]
                raise Interrupted(f"{len(results.lines)} rows are recorded (in {results.journal}); resume with: "
                                  f"{shlex.join(['specdec', *argv])}") from None
            results.write(columns)
    err.print(ui.batch_summary(summary.ok, summary.failed, summary.skipped, str(out)))
    if summary.ok + summary.failed:
        rows = summary.ok + summary.failed
        err.print(f"{plural(rows, 'row')} in {elapsed:.0f} s: {rows / max(elapsed, 1e-9):.2f} rows/s",
                  markup=False, soft_wrap=True)
    if summary.link.clips:
        err.print(summary.link.line(), markup=False, soft_wrap=True)
    elif summary.cloud_free.clips:
        err.print(summary.cloud_free.line(), markup=False, soft_wrap=True)
    if summary.fallback.fell_back:
        err.print(summary.fallback.line(), markup=False, style="yellow")
        err.print("rerun with --retry-fallback to describe them with the cloud", markup=False, style="yellow")
    if summary.failed:
        raise SpecdecError(f"{summary.failed} of {corpus.num_rows} rows failed; their error column in {out} says why"
                           f"{ui.failure_advice(summary.kinds)}")


def _caption_rows(pair: Any, run: Settings, corpus: Corpus, results: Any, todo: list[int], batch_size: int,
                  summary: _Summary, err: Console) -> float:
    """Describe the rows to do with the progress bar (a terminal) or plain lines (off one); the seconds it took."""
    import time

    from ..corpus import caption_corpus

    start = time.monotonic()
    lines = None if err.is_terminal else ui.ProgressLines(err, len(todo), summary.skipped, unit="rows", rate=True)
    with ui.batch_progress(err, disable=not err.is_terminal, rate_unit="rows") as progress:
        already = f" ({summary.skipped} already done)" if summary.skipped else ""
        task = progress.add_task(f"describing{already}", total=len(todo))
        for done in caption_corpus(pair, run, corpus, results, batch_size):
            record = done.record
            summary.link.add(record)
            summary.cloud_free.add(record)
            summary.fallback.add(record)
            failed = record["error"] is not None
            label = f"row {done.row} ({printable(str(record['file']))})"
            note = summary.fallback.note(label, record)
            if note is not None and pair.models.cloud_down is None:
                progress.console.print(note, markup=False, style="yellow")
            if failed:
                summary.failed += 1
                kind = record.get("error_kind", RETRYABLE)
                summary.kinds[kind] = summary.kinds.get(kind, 0) + 1
                progress.console.print(f"failed: {label}: {printable(record['error'])}", markup=False,
                                       style="yellow", soft_wrap=True)
            else:
                summary.ok += 1
            progress.advance(task)
            if lines is not None:
                lines.advance(failed)
    return time.monotonic() - start
