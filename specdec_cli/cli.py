"""The `specdec` command line: describe, batch, presets, eval.

Commands are thin: parse the options, call the library, print. Data goes to stdout (the sentence,
or one JSON object with --json); everything for humans (live view, progress, summaries, errors)
goes to stderr. Errors are mapped to a message and an exit code in one place, `report_error`:
0 ok, 1 runtime failure, 2 bad usage or input, 130 interrupted.
"""

from __future__ import annotations

import os
import sys
import traceback
from contextlib import nullcontext
from dataclasses import dataclass, replace
from enum import Enum, StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from typer.core import TyperGroup

from . import __version__, models, ui
from .audio import audio_suffixes, check_path, load_audio
from .batch import ResultsFile, dumps_record, find_audio, pending, run_batch
from .batched import batched_describe_all
from .calibrate import calibrate_command
from .decoding.config import DecodingConfig
from .errors import InputError, SpecdecError, one_line
from .eval_command import eval_command
from .metrics import build_record, modelled_latency
from .models import demo_pair, dtype_name, load_pair, presets_file_for
from .presets import Preset, check_presets_file, load_presets, resolve
from .run_settings import RunSettings

if TYPE_CHECKING:
    import numpy as np

    from .batch import DescribeAll
    from .models import ModelPair
    from .pipeline import Description
    from .scale.ray_batch import RayOptions, WorkerEvent

PLOT_HINT = "plotting needs matplotlib: pip install 'specdec[plot]'"


def _debug() -> bool:
    return os.environ.get("SPECDEC_DEBUG", "") not in ("", "0")


def report_error(exc: BaseException) -> int:
    """The one place an exception becomes a line on stderr and an exit code."""
    if _debug():
        traceback.print_exception(exc, file=sys.stderr)
    if isinstance(exc, KeyboardInterrupt):
        sys.stderr.write("interrupted\n")
        return 130
    if isinstance(exc, SpecdecError):
        sys.stderr.write(f"error: {exc.message}\n")
        return exc.exit_code
    detail = one_line(exc)
    hint = "" if _debug() else " (set SPECDEC_DEBUG=1 for the traceback)"
    sys.stderr.write(f"error: unexpected {detail}{hint}\n")
    return 1


class _ErrorMappingGroup(TyperGroup):
    """Routes every exception a command raises through `report_error`. Doing it here rather than
    around `app()` makes CliRunner tests see exactly the exit codes the installed command gives."""

    def invoke(self, ctx: typer.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, typer.TyperException, SystemExit):
            raise  # Typer's own flow: --help, --version, usage errors (exit 2)
        except (KeyboardInterrupt, Exception) as exc:  # KeyboardInterrupt: exit 130, not "Aborted!"
            raise typer.Exit(report_error(exc)) from None


app = typer.Typer(
    name="specdec",
    cls=_ErrorMappingGroup,
    help="Describe a speaker in one Chinese sentence with edge-cloud speculative decoding.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


# -- options shared by describe and batch -------------------------------------------------------

class Mode(StrEnum):
    spec = "spec"
    edge = "edge"
    cloud = "cloud"


class Verify(StrEnum):
    entropy = "entropy"
    always = "always"


class Uncertainty(StrEnum):
    sum = "sum"
    max = "max"
    mean = "mean"


class OnOff(StrEnum):
    on = "on"
    off = "off"


_D = "Decoding"  # help panel for the decoding options
PresetOpt = Annotated[str, typer.Option(help="Preset (see `specdec presets`); flags you give override it.",
                                        rich_help_panel=_D)]
ModeOpt = Annotated[Mode | None, typer.Option(help="spec: edge drafts, cloud verifies; edge / cloud: one model alone.",
                                              show_default=False, rich_help_panel=_D)]
VerifyOpt = Annotated[Verify | None, typer.Option(
    help="entropy: only uncertain blocks go to the cloud; always: every block (lossless).",
    show_default=False, rich_help_panel=_D)]
ThresholdOpt = Annotated[float | None, typer.Option(
    help="Escalate a block when its uncertainty (nats) exceeds this; 'inf' never escalates.",
    show_default=False, rich_help_panel=_D)]
KOpt = Annotated[int | None, typer.Option("--k", min=1, help="Draft block length.", show_default=False,
                                          rich_help_panel=_D)]
UncertaintyOpt = Annotated[Uncertainty | None, typer.Option(help="How per-token entropies make a block's uncertainty.",
                                                            show_default=False, rich_help_panel=_D)]
ConstraintsOpt = Annotated[OnOff | None, typer.Option(
    help="Sentence constraints (CJK vocabulary, punctuation spacing, loop checks); off = plain decoding.",
    show_default=False, rich_help_panel=_D)]
MaxTokensOpt = Annotated[int | None, typer.Option(min=1, help="Most tokens per description (default 64).",
                                                  show_default=False, rich_help_panel=_D)]
SampleOpt = Annotated[bool | None, typer.Option("--sample/--greedy", help="Sample (lossless rejection sampling) "
                                                "or decode greedily (default).", show_default=False, rich_help_panel=_D)]
SeedOpt = Annotated[int | None, typer.Option(help="Random seed for --sample.", show_default=False, rich_help_panel=_D)]
TemperatureOpt = Annotated[float | None, typer.Option(
    help="With --sample: divide the logits by this (HF's TemperatureLogitsWarper; default 1).",
    show_default=False, rich_help_panel=_D)]
TopPOpt = Annotated[float | None, typer.Option(
    "--top-p", help="With --sample: draw from the fewest tokens holding this much probability (default 1: all).",
    show_default=False, rich_help_panel=_D)]
TopKOpt = Annotated[int | None, typer.Option(
    "--top-k", help="With --sample: draw from the k likeliest tokens (default 0: all).",
    show_default=False, rich_help_panel=_D)]
_P = "Prompt"
InstructionOpt = Annotated[str | None, typer.Option(
    help="The instruction the models get with the audio, replacing the default (describe rate, pitch, volume, "
    "pauses, timbre and emotion). The one-sentence Chinese rules stay on unless --constraints off.",
    show_default=False, rich_help_panel=_P)]
SystemOpt = Annotated[str | None, typer.Option(
    help="The system prompt, replacing the default 'You are a helpful assistant.'.",
    show_default=False, rich_help_panel=_P)]
_M = "Models"
EdgeOpt = Annotated[str | None, typer.Option(help="Edge model: folder or Hub id (default: bundled demo edge).",
                                             show_default=False, rich_help_panel=_M)]
CloudOpt = Annotated[str | None, typer.Option(help="Cloud model: folder or Hub id, or http://HOST:PORT of a "
                                              "`specdec serve` (default: bundled demo cloud).",
                                              show_default=False, rich_help_panel=_M)]
DeviceOpt = Annotated[str, typer.Option(help="Torch device for both models.", rich_help_panel=_M)]
EdgeDeviceOpt = Annotated[str | None, typer.Option(help="Torch device for the edge model (default: --device).",
                                                   show_default=False, rich_help_panel=_M)]
CloudDeviceOpt = Annotated[str | None, typer.Option(
    help="Torch device for the cloud model (default: --device), e.g. --edge-device cpu --cloud-device cuda:0.",
    show_default=False, rich_help_panel=_M)]
DtypeOpt = Annotated[str, typer.Option(help="float32, bfloat16, float16 or auto.", rich_help_panel=_M)]
PresetsFileOpt = Annotated[Path | None, typer.Option(
    "--presets", help="A presets file (e.g. from `specdec calibrate`); its presets override the built-in ones.",
    show_default=False, rich_help_panel=_D)]
RttOpt = Annotated[float | None, typer.Option(
    min=0, help="Modelled edge-cloud round trip (ms): adds latency_modelled_s to the record (computed, never slept).",
    show_default=False)]


@dataclass(frozen=True)
class Flags:
    """What the user asked for. `overrides` holds only the decoding flags actually given, so that
    they, and nothing else, override the preset."""

    preset: str
    overrides: dict[str, Any]
    edge: str | None
    cloud: str | None
    device: str
    dtype: str
    rtt_ms: float | None
    presets_file: Path | None = None  # --presets FILE, layered over the model folder's presets
    edge_device: str | None = None    # --edge-device / --cloud-device: one model each (None: --device)
    cloud_device: str | None = None


def _flags(preset: str, edge: str | None, cloud: str | None, device: str, dtype: str, rtt_ms: float | None,
           *, presets_file: Path | None = None, edge_device: str | None = None, cloud_device: str | None = None,
           **given: Any) -> Flags:
    overrides = {}
    for name, value in given.items():
        if value is None:
            continue
        if isinstance(value, OnOff):
            value = value is OnOff.on
        elif isinstance(value, Enum):
            value = value.value
        overrides[name] = value
    # Check the flags now, before any model is loaded (a preset cannot make a bad flag good).
    _config(Preset("defaults", {}, "built-in"), overrides)
    dtype_name(dtype)  # a typo in a flag is bad usage (InputError, exit 2), caught before loading
    return Flags(preset, overrides, edge, cloud, device, dtype, rtt_ms, check_presets_file(presets_file),
                 edge_device, cloud_device)


def _config(preset: Preset, overrides: dict[str, Any]) -> DecodingConfig:
    """Built-in defaults < preset < explicit flags."""
    try:
        cfg = DecodingConfig().with_(**preset.values)
    except (TypeError, ValueError) as exc:
        raise InputError(f"preset {preset.name!r} from {preset.source} is invalid: {exc}") from exc
    try:
        return cfg.with_(**overrides)
    except (TypeError, ValueError) as exc:
        raise InputError(f"bad decoding option: {exc}") from exc


def run_settings(flags: Flags) -> tuple[DecodingConfig, str | None, RunSettings]:
    """The decoding config, the preset name a record shows, and the settings every record carries;
    all found without loading a model (an unknown preset fails here), so a batch can check its
    results file before paying for the load."""
    preset = resolve(flags.preset, [presets_file_for(flags.edge), flags.presets_file])
    cfg = _config(preset, flags.overrides)
    name = preset.name if cfg.mode == "spec" else None
    edge, cloud = flags.edge, flags.cloud
    if edge is None or cloud is None:
        demo_edge, demo_cloud = demo_pair()
        edge, cloud = edge or demo_edge, cloud or demo_cloud
    if models.is_url(cloud):
        # The server says which model it hosts (CloudUnreachable, exit 2, when it is down).
        client = models.remote_client(cloud)
        client.close()
        return cfg, name, RunSettings.of(cfg, name, edge, client.model_id, flags.dtype, client.fingerprint)
    return cfg, name, RunSettings.of(cfg, name, edge, cloud, flags.dtype)


def _quiet_libraries() -> None:
    """Keep stderr to our own lines: no weight-loading bars or advisory warnings from transformers."""
    if _debug():
        return
    from .fast_imports import quiet_transformers  # without importing transformers: --help stays instant

    quiet_transformers()


# -- one loaded pair, used for one clip (describe) or many (batch) ------------------------------

class Session:
    """The loaded pair and the resolved settings; turns a clip into a result record."""

    def __init__(self, flags: Flags, err: Console,
                 resolved: tuple[DecodingConfig, str | None, RunSettings] | None = None) -> None:
        # `resolved`: run_settings(flags) as another process found them (a Ray driver's; see worker_session)
        self.cfg, self.preset, self.settings = resolved or run_settings(flags)  # a bad preset fails before loading
        with err.status("loading models…") if err.is_terminal else nullcontext():
            self.pair: ModelPair = load_pair(flags.edge, flags.cloud, flags.device, flags.dtype,
                                             edge_device=flags.edge_device, cloud_device=flags.cloud_device)
        models.one_thread_if_tiny(self.pair)
        self.rtt_ms = flags.rtt_ms
        from .pipeline import Describer  # torch + transformers, loaded with the models

        self.describer = Describer(self.pair)

    def load(self, path: Path, data: bytes | None = None) -> np.ndarray:
        p = self.pair.processor
        return load_audio(path, p.sampling_rate, p.max_seconds, data)

    def _extra(self) -> dict[str, Any]:
        return {"edge": self.pair.edge_id, "cloud": self.pair.cloud_id, "settings": self.settings.as_record()}

    def record(self, file: str, audio: np.ndarray, desc: Description) -> dict[str, Any]:
        extra = self._extra()
        extra["audio_s"] = round(len(audio) / self.pair.processor.sampling_rate, 3)
        if self.pair.remote is not None and desc.link is not None:
            # Counted at this end of the link: bytes up and down, round trips, time waiting.
            extra.update(desc.link.as_record(), cloud_url=self.pair.remote.url)
        if self.rtt_ms is not None:
            extra["cloud_rtt_ms"] = self.rtt_ms
            extra["latency_modelled_s"] = modelled_latency(desc.latency_s, self.cfg.mode,
                                                           desc.result.stats.cloud_calls, self.rtt_ms)
        return build_record(file, desc.text, desc.result, self.cfg, self.preset, desc.latency_s, None, **extra)

    def describe_file(self, path: Path, data: bytes | None = None) -> dict[str, Any]:
        """`data`: the clip's bytes when they were read elsewhere (`path` then only names it)."""
        audio = self.load(path, data)
        return self.record(str(path), audio, self.describer.run(audio, self.cfg))

    def error_record(self, path: Path, message: str) -> dict[str, Any]:
        return build_record(str(path), None, None, self.cfg, self.preset, None, message, **self._extra())


def worker_session(flags: Flags, resolved: tuple[DecodingConfig, str | None, RunSettings],
                   threads: int | None) -> Session:
    """The Session a Ray worker holds (scale/ray_batch.py): the driver's flags and the settings it
    resolved, so every worker decodes as the driver would (and never re-reads a presets file its node
    may lack); `threads`: the driver's --threads."""
    _quiet_libraries()
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
        models.threads_pinned = True
    return Session(flags, _stderr(), resolved)


def _stderr() -> Console:
    return Console(stderr=True, highlight=False)


def _plot_trace_fn():
    """plots.plot_trace, imported only when asked for; matplotlib is an optional extra."""
    try:
        from . import plots

        plots.require_matplotlib()
    except ImportError as exc:
        if (exc.name or "").split(".")[0] != "matplotlib":
            raise
        raise InputError(PLOT_HINT) from None
    return plots.plot_trace


# -- commands -------------------------------------------------------------------------------------

def _version(value: bool) -> None:
    if value:
        typer.echo(f"specdec {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
    threads: Annotated[int | None, typer.Option("--threads", min=1, show_default=False,
                                                help="CPU threads for torch (default: torch's own choice). "
                                                     "1 is often fastest for the tiny demo pair on a busy machine.")] = None,
) -> None:
    """Describe a speaker in one Chinese sentence with edge-cloud speculative decoding."""
    _quiet_libraries()  # every command (eval included) keeps stderr to our own lines
    if threads is not None:
        import torch  # only when asked: --version and flag errors stay instant

        torch.set_num_threads(threads)
        models.threads_pinned = True  # the user's choice: not reset to 1 for a tiny pair


@app.command()
def describe(
    clip: Annotated[str, typer.Argument(help="Audio file (WAV, FLAC, OGG, MP3), at most 30 s.", show_default=False)],
    preset: PresetOpt = "fluent",
    mode: ModeOpt = None,
    verify: VerifyOpt = None,
    threshold: ThresholdOpt = None,
    k: KOpt = None,
    uncertainty: UncertaintyOpt = None,
    constraints: ConstraintsOpt = None,
    max_new_tokens: MaxTokensOpt = None,
    sample: SampleOpt = None,
    seed: SeedOpt = None,
    temperature: TemperatureOpt = None,
    top_p: TopPOpt = None,
    top_k: TopKOpt = None,
    instruction: InstructionOpt = None,
    system: SystemOpt = None,
    edge: EdgeOpt = None,
    cloud: CloudOpt = None,
    device: DeviceOpt = "cpu",
    edge_device: EdgeDeviceOpt = None,
    cloud_device: CloudDeviceOpt = None,
    dtype: DtypeOpt = "float32",
    presets_file: PresetsFileOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result record as one JSON object on stdout.")] = False,
    no_live: Annotated[bool, typer.Option("--no-live", help="No live view while decoding.")] = False,
    trace: Annotated[bool | None, typer.Option(
        "--trace/--no-trace", help="Keep the decoding trace (one line per block) on stderr when decoding ends. "
        "Default: on a terminal.", show_default=False)] = None,
    cloud_rtt_ms: RttOpt = None,
    plot: Annotated[Path | None, typer.Option(help="Draw the decoding trace (entropies, threshold, verdicts) "
                                              "to this PNG. Needs matplotlib.", show_default=False)] = None,
) -> None:
    """Describe the speaker in CLIP: prints the sentence (or the record with --json)."""
    path = Path(clip)
    check_path(path)
    flags = _flags(preset, edge, cloud, device, dtype, cloud_rtt_ms, presets_file=presets_file,
                   edge_device=edge_device, cloud_device=cloud_device, mode=mode,
                   verify=verify, threshold=threshold, k=k, uncertainty=uncertainty, constraints=constraints,
                   max_new_tokens=max_new_tokens, sample=sample, seed=seed, temperature=temperature, top_p=top_p,
                   top_k=top_k, instruction=instruction, system=system)
    plot_trace = _plot_trace_fn() if plot is not None else None
    err = _stderr()
    session = Session(flags, err)
    if plot is not None and session.cfg.mode != "spec":
        raise InputError(f"--plot draws the speculative trace; it needs --mode spec, not {session.cfg.mode}")
    audio = session.load(path)

    view = ui.LiveView(err, session.pair.tokenizer, session.cfg, title=f"specdec · {clip}",
                       enabled=not no_live and err.is_terminal)
    with view:
        desc = session.describer.run(audio, session.cfg, on_block=view.on_block)
    record = session.record(clip, audio, desc)
    if (err.is_terminal if trace is None else trace) and desc.result.events:
        ui.print_trace(err, desc.result.events, session.pair.tokenizer, session.cfg)
    err.print(ui.summary_panel(record))
    if plot_trace is not None and plot is not None:
        written = plot_trace(desc.result.events, session.cfg.threshold, plot, tokenizer=session.pair.tokenizer)
        err.print(f"trace plot: {written}", markup=False)
    _print_record(record, json_out)


def _print_record(record: dict[str, Any], json_out: bool) -> None:
    line = dumps_record(record) if json_out else (record["description"] or "")
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


# Measured on the bundled pair, 2 CPU cores (README, "specdec batch --batch-size").
DEFAULT_BATCH_SIZE = 8
BatchSizeOpt = Annotated[int, typer.Option(
    "--batch-size", min=1, help="Clips decoded together, one forward per model for all (in this process; a remote "
    "cloud and sampled edge/cloud modes go one at a time). Records are written as each clip ends.")]

_R = "Ray (many processes or machines)"
RayOpt = Annotated[str | None, typer.Option(
    "--ray", metavar="auto|ADDRESS", help="Spread the clips over Ray workers, each loading the pair once: auto starts "
    "a Ray on this machine for this run; ADDRESS joins a running cluster (what `ray start --head` prints). "
    "Needs pip install 'specdec\\[ray]'.",  # the backslash keeps Rich from reading [ray] as markup
    show_default=False, rich_help_panel=_R)]
WorkersOpt = Annotated[int | None, typer.Option(
    "--workers", min=1, help="Ray workers (default: one per CPU, or per --gpus-per-worker GPUs, of the cluster).",
    show_default=False, rich_help_panel=_R)]
GpusOpt = Annotated[float, typer.Option(
    "--gpus-per-worker", min=0, help="GPUs Ray gives each worker (with --device cuda).", rich_help_panel=_R)]
ShipAudioOpt = Annotated[bool | None, typer.Option(
    "--ship-audio/--shared-path", help="Who reads the clips: this process, sending their bytes to the workers "
    "(default with an ADDRESS), or the workers, from DIR at the same path on every node (default with auto).",
    show_default=False, rich_help_panel=_R)]


@app.command()
def batch(
    directory: Annotated[Path, typer.Argument(help="Folder of audio files.", show_default=False)],
    # readable=False: Typer's own check would refuse an unreadable file with a usage box; ResultsFile
    # says it in one line (and checks more: the folder, the lock).
    out: Annotated[Path, typer.Option(help="Results, one JSON line per file (appended as each finishes).",
                                      show_default=False, readable=False)],
    recursive: Annotated[bool, typer.Option("--recursive", "-r", help="Include subfolders.")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Start over instead of resuming from --out "
                                            "(the old file is kept as OUT.bak).")] = False,
    preset: PresetOpt = "fluent",
    mode: ModeOpt = None,
    verify: VerifyOpt = None,
    threshold: ThresholdOpt = None,
    k: KOpt = None,
    uncertainty: UncertaintyOpt = None,
    constraints: ConstraintsOpt = None,
    max_new_tokens: MaxTokensOpt = None,
    sample: SampleOpt = None,
    seed: SeedOpt = None,
    temperature: TemperatureOpt = None,
    top_p: TopPOpt = None,
    top_k: TopKOpt = None,
    instruction: InstructionOpt = None,
    system: SystemOpt = None,
    edge: EdgeOpt = None,
    cloud: CloudOpt = None,
    device: DeviceOpt = "cpu",
    edge_device: EdgeDeviceOpt = None,
    cloud_device: CloudDeviceOpt = None,
    dtype: DtypeOpt = "float32",
    presets_file: PresetsFileOpt = None,
    cloud_rtt_ms: RttOpt = None,
    ray: RayOpt = None,
    workers: WorkersOpt = None,
    gpus_per_worker: GpusOpt = 0.0,
    ship_audio: ShipAudioOpt = None,
    batch_size: BatchSizeOpt = DEFAULT_BATCH_SIZE,
) -> None:
    """Describe every audio file in DIRECTORY into --out, one JSON line per file.

    Rerunning with the same settings and --out resumes: files recorded without error are skipped,
    failed ones are retried, and a run killed at any moment loses nothing already written. A file
    holding anything else (other settings, another tool's lines) is refused, never rewritten; one
    --out takes one run at a time."""
    files = find_audio(directory, audio_suffixes(), recursive)
    flags = _flags(preset, edge, cloud, device, dtype, cloud_rtt_ms, presets_file=presets_file,
                   edge_device=edge_device, cloud_device=cloud_device, mode=mode,
                   verify=verify, threshold=threshold, k=k, uncertainty=uncertainty, constraints=constraints,
                   max_new_tokens=max_new_tokens, sample=sample, seed=seed, temperature=temperature, top_p=top_p,
                   top_k=top_k, instruction=instruction, system=system)
    ray_options = _ray_options(ray, workers, gpus_per_worker, ship_audio, device)
    err = _stderr()
    with ResultsFile(out, run_settings(flags)[2], overwrite) as results:
        if results.backup is not None:
            err.print(f"starting over; the old results are kept in {results.backup}", markup=False,
                      soft_wrap=True)  # one line, even in a log
        todo, skipped = pending(files, results)
        if not todo:
            err.print(ui.batch_summary(0, 0, skipped, str(out)))
            return
        session = Session(flags, err) if ray_options is None else None  # a Ray driver loads no model
        with ui.batch_progress(err, disable=not err.is_terminal) as progress:
            task = progress.add_task(f"describing ({skipped} already done)" if skipped else "describing",
                                     total=len(todo))

            link = ui.LinkTally()

            def on_done(path: Path, record: dict[str, Any]) -> None:
                progress.advance(task)
                link.add(record)
                if record["error"] is not None:
                    progress.console.print(f"failed: {path}: {record['error']}", markup=False, style="yellow",
                                           soft_wrap=True)  # one line per file, even in a log

            if session is not None:
                summary = run_batch(files, results, session.describe_file, session.error_record, on_done,
                                    describe_all=batched_describe_all(session, batch_size))
            else:
                assert ray_options is not None
                summary = run_batch(files, results, None, None, on_done,
                                    describe_all=_ray_describe_all(ray_options, flags, batch_size, progress.console))
    err.print(ui.batch_summary(summary.ok, summary.failed, summary.skipped, str(out)))
    if link.clips:
        err.print(link.line(), markup=False, soft_wrap=True)
    if summary.failed:
        raise SpecdecError(f"{summary.failed} of {len(files)} files failed; their records in {out} say why "
                           "(rerun to retry them)")


def _ray_options(ray: str | None, workers: int | None, gpus_per_worker: float, ship_audio: bool | None,
                 device: str) -> RayOptions | None:
    """The Ray options, checked before anything is opened or loaded; None without --ray."""
    if ray is None:
        if workers is not None or gpus_per_worker or ship_audio is not None:
            raise InputError("--workers, --gpus-per-worker, --ship-audio and --shared-path go with --ray; "
                             "add --ray auto (or --ray ADDRESS)")
        return None
    from .scale.ray_batch import RayOptions, check_reachable, require_ray

    require_ray()  # the install hint, exit 2
    if not ray.strip():
        raise InputError("--ray needs auto or a cluster address (e.g. 10.0.0.5:6379 or ray://10.0.0.5:10001)")
    if ray.strip() != "auto":
        check_reachable(ray.strip())  # at once, not after minutes of ray.init retrying
    if gpus_per_worker and device == "cpu":
        raise InputError(f"--gpus-per-worker {gpus_per_worker:g} gives each worker GPUs, but the models would "
                         "stay on the CPU: add --device cuda")
    return RayOptions(ray.strip(), workers, gpus_per_worker, ship_audio)


def _ray_describe_all(options: RayOptions, flags: Flags, batch_size: int, console: Console) -> DescribeAll:
    """run_batch's describe_all over Ray workers, each holding a worker_session of these flags and
    decoding `batch_size` rows at a time where this run can batch."""
    from functools import partial

    from .run_settings import model_id
    from .scale.ray_batch import describe_all

    resolved = run_settings(flags)
    # Model folders by absolute path (a worker's current directory need not be ours); Hub ids and a
    # --cloud URL as given; the bundled demo pair (None) is each worker's own copy.
    worker_flags = replace(flags, edge=model_id(flags.edge) if flags.edge else None,
                           cloud=model_id(flags.cloud) if flags.cloud else None)
    threads = None
    if models.threads_pinned:
        import torch

        threads = torch.get_num_threads()

    def on_event(event: WorkerEvent) -> None:
        where = f" (pid {event.pid} on {event.host})" if event.pid is not None else ""
        if event.kind != "ready":
            console.print(f"ray: worker {event.index + 1} {event.kind}{where}"
                          f"{': ' + event.detail if event.detail else ''}", markup=False, style="yellow",
                          soft_wrap=True)

    return describe_all(options, partial(worker_session, worker_flags, resolved, threads), batch_size, on_event)


@app.command("presets")
def presets_command(
    edge: EdgeOpt = None,
    presets_file: PresetsFileOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the presets as one JSON object.")] = False,
) -> None:
    """List the presets, their values and where each comes from (configs/, the model folder or --presets)."""
    merged = load_presets([presets_file_for(edge), check_presets_file(presets_file)])
    if json_out:
        data = {name: {**p.values, "source": p.source, "description": p.description} for name, p in merged.items()}
        sys.stdout.write(dumps_record(data) + "\n")
        return
    Console(highlight=False).print(ui.presets_table(merged, load_presets(None)))


@app.command()
def serve(
    cloud: Annotated[str | None, typer.Option(help="Cloud model to host: folder or Hub id (default: bundled demo cloud).",
                                              show_default=False)] = None,
    host: Annotated[str, typer.Option(help="Address to listen on. Anything but loopback needs a token.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port (0: any free one; the start line says which).")] = 8765,
    device: Annotated[str, typer.Option(help="Torch device for the cloud model.")] = "cpu",
    dtype: DtypeOpt = "float32",
    max_sessions: Annotated[int, typer.Option(min=1, help="Open sessions (one per clip in flight) before the least "
                                              "recently used idle one is closed.")] = 64,
    session_ttl: Annotated[float, typer.Option(min=0.001, help="Seconds an idle session stays open.")] = 300.0,
    token_file: Annotated[Path | None, typer.Option(help="Bearer tokens, one per line; every request must carry one "
                                                    "(default: $SPECDEC_TOKEN, else none).", show_default=False)] = None,
    batch_window_ms: Annotated[float, typer.Option(min=0, help="Milliseconds a verification waits for other "
                                                   "sessions' ones to share its forward (0: one at a time).")] = 10.0,
    max_batch: Annotated[int, typer.Option(min=1, help="Verifications in one forward at most (1: one at a time).")] = 16,
    max_sessions_per_token: Annotated[int, typer.Option(min=0, help="Open sessions one token may hold; room for "
                                                        "more is made from its own least recently used one "
                                                        "(0: --max-sessions / the number of tokens).")] = 0,
    max_connections: Annotated[int, typer.Option(min=1, help="Open connections; beyond it the one idle longest is "
                                                 "closed, or 503 when all are busy (lowered to what the "
                                                 "descriptor limit allows).")] = 1024,
    header_timeout: Annotated[float, typer.Option(min=0.001, help="Seconds a connection may take to send a request's "
                                                  "headers (from connecting, or from the last answer).")] = 10.0,
    body_timeout: Annotated[float, typer.Option(min=0.001, help="Seconds a request may take to send its body.")] = 60.0,
    keep_alive_timeout: Annotated[int, typer.Option(min=1, help="Seconds an idle keep-alive connection stays open.")] = 5,
) -> None:
    """Host the cloud model for edges that run `specdec … --cloud http://HOST:PORT` (limits: docs/security.md)."""
    from .remote import server

    dtype_name(dtype)
    tokens = server.read_tokens(str(token_file) if token_file is not None else None, os.environ.get("SPECDEC_TOKEN"))
    server.check_bind(host, tokens)  # before loading a model
    sock = server.listen(host, port)  # (a port in use: one line, before loading a model)
    err = _stderr()
    with err.status("loading the cloud model…") if err.is_terminal else nullcontext():
        hosted = server.load_hosted(cloud or demo_pair()[1], device, dtype)

    def announce(line: str) -> None:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    options = server.ServeOptions(max_sessions, session_ttl, tokens, batch_window_ms, max_batch, max_sessions_per_token,
                                  max_connections, header_timeout, body_timeout, keep_alive_timeout)
    server.serve(hosted, host, port, options, announce, sock)
    sys.stderr.write("specdec serve: stopped\n")


app.command("eval")(eval_command)
app.command("calibrate")(calibrate_command)


def main() -> None:
    """Console-script entry point (`specdec`)."""
    try:
        app(prog_name="specdec")
    except KeyboardInterrupt as exc:  # during option parsing, before the group's own mapping
        sys.exit(report_error(exc))
