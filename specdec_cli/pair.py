"""`Pair`: a loaded edge-cloud pair and everything a run does with it. This is the library's service
layer and the public API (`from specdec import Pair`): the CLI, `specdec serve`'s callers, the Ray
workers, eval, calibrate and bench/ all describe clips through it.

    pair = Pair()                                   # the bundled demo pair
    result = pair.describe("clip.wav", preset="quality")
    print(result.description, result.cloud_calls)   # every field of `specdec describe --json`

A run resolves its settings once (settings.py: defaults < presets files < preset < explicit
settings; a remote cloud's /health read once), loads the pair once (models.load_pair), describes
clips with describe.py (one clip, or many with one fallback policy) and builds each record with
records.py.
"""

from __future__ import annotations

import functools
import queue
import threading
import warnings
from collections.abc import Callable, Container, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from .audio import load_audio, prepare_waveform
from .describe import Describer, Description, Outcome, describe_many, rows_for
from .errors import RETRYABLE, error_kind, one_line
from .fast_imports import quiet_libraries
from .models import ModelPair, load_pair, one_thread_if_tiny, pin_threads
from .records import clip_record, error_record
from .segments import Piece, Recording, Segment, open_recording
from .settings import PairSpec, Settings, explicit
from .speech import check_speech

if TYPE_CHECKING:
    import numpy as np

    from .decoding import BlockEvent, DecodingConfig
    from .decoding.gate import MeaningGate

Audio = Union[str, Path, "np.ndarray", Piece]  # noqa: UP007  (a string names numpy without importing it)


class LowSampleRate(UserWarning):
    """A clip recorded below the model's rate: upsampling adds no detail, and the description may
    differ from one of the same voice recorded at the model's rate."""


@dataclass
class Result:
    """One description: `record` is the record `specdec describe --json` prints (its fields are
    also attributes: `result.description`, `result.cloud_calls`, `result.settings`…), `events` the
    decoding's blocks in order (speculative mode; empty for edge / cloud, and for a clip that
    failed: then `record["error"]` says why)."""

    record: dict[str, Any]
    events: list[BlockEvent] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)

    def __getattr__(self, name: str) -> Any:
        record = self.__dict__.get("record", {})
        if name in record:
            return record[name]
        raise AttributeError(f"{type(self).__name__} has no field {name!r}; record fields: {', '.join(record)}")

    def __dir__(self) -> list[str]:
        """The record's fields beside the attributes of its own, as tab completion and help() show them."""
        return sorted(set(super().__dir__()) | set(self.__dict__.get("record", {})))

    def __getitem__(self, key: str) -> Any:
        return self.record[key]


class Pair:
    """An edge and a cloud loaded once. `edge`/`cloud`: model folders or Hub ids (default: the
    bundled demo pair; `cloud` may be http://HOST:PORT of a `specdec serve`); `device` for both, or
    `edge_device` / `cloud_device` for each; `presets`: a presets file layered over the built-in
    ones. One call at a time per Pair (the models' caches are per call, the settings are not).

    With a remote cloud: `on_cloud_failure` "edge" finishes a clip whose cloud fails it on the edge
    (its record's `fallback` says why and where), "fail" (the default here, as measurements need)
    makes the failure the clip's error; `cloud_deadline`: the cloud's budget in seconds for a whole
    clip (None: each request's own deadline only); `depth`: verifications a clip keeps in flight,
    1..4 or "auto" (each block sent before the verdict it assumes; it changes no token; None:
    block_length.REMOTE_DEPTH), with a remote cloud only."""

    _api = False  # True when built by Pair(...) from Python; the command line's come from from_spec
    # What a message about a file over the models' window tells its reader to do, where the caller
    # knows better than the default (the command line's --segment, or the Python API's
    # pair.segments): the web page's, which takes one clip and has no --segment.
    too_long_hint: str | None = None

    def __init__(self, edge: str | None = None, cloud: str | None = None, device: str = "cpu",
                 dtype: str = "float32", presets: str | Path | None = None, *,
                 edge_device: str | None = None, cloud_device: str | None = None,
                 cloud_timeout: float | None = None, on_cloud_failure: str = "fail",
                 cloud_deadline: float | None = None, depth: int | str | None = None) -> None:
        self._api = True  # built from Python: messages speak of its methods, not of the command line's options
        self._load(PairSpec.of(edge, cloud, device, dtype, presets, edge_device=edge_device,
                               cloud_device=cloud_device, cloud_timeout=cloud_timeout,
                               on_cloud_failure=on_cloud_failure, cloud_deadline=cloud_deadline, depth=depth))

    @classmethod
    def from_spec(cls, spec: PairSpec) -> Pair:
        """The pair `spec` names (resolved already: a remote cloud is not asked again who it is)."""
        pair = cls.__new__(cls)
        pair._load(spec)
        return pair

    def _load(self, spec: PairSpec) -> None:
        quiet_libraries()  # no weight-loading bars (SPECDEC_DEBUG=1 keeps them)
        self.spec = spec
        self.models: ModelPair = load_pair(spec.edge, spec.cloud, spec.device, spec.dtype,
                                           edge_device=spec.edge_device, cloud_device=spec.cloud_device,
                                           cloud_info=spec.cloud_info, cloud_timeout=spec.cloud_timeout,
                                           cloud_down=spec.cloud_down)
        if self.models.remote is not None:
            self.models.remote.upload = spec.upload
            self.models.remote.depth = spec.depth
        one_thread_if_tiny(self.models)
        self.models.gate = self._gate(spec)
        if self.models.gate is None and spec.gate is not None:
            # Fitted on another tokenizer: this pair's records say no gate decided, as none does.
            from dataclasses import replace

            self.spec = replace(spec, gate=None)
        self.describer = Describer(self.models, spec.cloud_policy())
        self._resolved: dict[tuple, Settings] = {}

    def _gate(self, spec: PairSpec) -> MeaningGate | None:
        """The presets files' meaning gate when it was fitted on this tokenizer (else None: a
        verify="meaning" preset decodes with the entropy gate and its threshold)."""
        from .remote.wire import tokenizer_fingerprint

        gate = spec.gate
        if gate is None or (gate.tokenizer and gate.tokenizer != tokenizer_fingerprint(self.models.tokenizer)):
            return None
        return gate

    @property
    def gate(self) -> MeaningGate | None:
        """The meaning gate this pair decodes verify="meaning" presets with (None: the entropy gate)."""
        return self.models.gate

    # -- settings ---------------------------------------------------------------------------------

    def resolve(self, preset: str = "fluent", rtt_ms: float | None = None, **settings: Any) -> Settings:
        """This pair's settings for a call: the decoding config, the preset its records show and
        the settings they carry (defaults < presets files < preset < `settings`)."""
        key = (preset, rtt_ms, tuple(sorted(settings.items())))
        if key not in self._resolved:
            given = explicit(**settings)
            self._resolved[key] = self.for_link(self.spec.settings(preset, given, rtt_ms), preset, given)
        return self._resolved[key]

    def for_link(self, settings: Settings, preset: str, given: dict[str, Any]) -> Settings:
        """With a remote cloud and no k given: the block length for this link (decoding/block_length.py),
        where k is free — verify=always (k changes no token), or a preset that does not set k. A
        calibrated preset keeps its k: its threshold is on the block's uncertainty and was chosen with it."""
        from dataclasses import replace

        from .presets import resolve as preset_named

        cfg = settings.cfg
        remote = self.models.remote
        if remote is None or "k" in given or cfg.mode != "spec":
            return settings
        if cfg.verify != "always" and "k" in preset_named(preset, list(self.spec.presets_files)).values:
            return settings
        k = remote.block_k(self.models.edge)
        if k is None:  # the link could not be measured: the preset's k
            return settings
        return replace(settings, cfg=cfg.with_(k=k), run=replace(settings.run, k=k))

    def settings(self, preset: str = "fluent", **settings: Any) -> DecodingConfig:
        """The decoding config a call with these arguments uses (defaults < preset < `settings`,
        any `DecodingConfig` field: mode, k, threshold, sample, seed, temperature, top_p, top_k,
        instruction, system, max_new_tokens, constraints…)."""
        return self.resolve(preset, **settings).cfg

    # -- clips ------------------------------------------------------------------------------------

    @property
    def tokenizer(self):
        return self.models.tokenizer

    def text(self, token_ids: list[int]) -> str:
        """Token ids (a block's draft, an answer) as text."""
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def read(self, audio: Audio, rate: int | None = None, data: bytes | None = None, *,
             too_long_hint: str | None = None) -> tuple[str, np.ndarray]:
        """A clip's name and its samples as the models hear them: a file (its `data` when read
        elsewhere), a waveform (audio.prepare_waveform: [frames], [frames, channels] or [channels,
        frames]; floats, or integer PCM scaled by its type's range) at `rate`, or a segment of a
        long recording (a Piece from `segments`, whose speech `segments` checked). A clip with too
        little speech to describe a speaker is refused (speech.NoSpeech, an InputError). Warns
        (LowSampleRate) when the clip is below the models' rate. `too_long_hint`: what a file over
        the window should do instead, said in its error (default: the way to describe it in segments)."""
        p = self.models.processor
        if isinstance(audio, Piece):
            return audio.file, audio.samples
        if isinstance(audio, (str, Path)):
            if rate is not None:
                raise ValueError("rate is for waveforms; a file says its own rate")
            # The Python API's terms for a file over the window: its caller has Pair.segments, not --segment.
            hint = too_long_hint or self.too_long_hint or (
                (f"cut it at pauses with pair.segments({str(audio)!r}) and describe each piece (or "
                 "describe_many(files, segment=True))") if self._api else None)
            samples = load_audio(Path(audio), p.sampling_rate, p.max_seconds, data, hint)
            check_speech(samples, p.sampling_rate, audio)
            self._check_rate(str(audio), _file_rate(Path(audio), data))
            return str(audio), samples
        if rate is None:
            raise ValueError("a waveform needs its sampling rate: describe(samples, rate=...)")
        samples = prepare_waveform(audio, rate, p.sampling_rate, p.max_seconds)
        check_speech(samples, p.sampling_rate, "<waveform>")
        self._check_rate("<waveform>", rate)
        return "<waveform>", samples

    def _check_rate(self, name: str, rate: int | None) -> None:
        model_rate = self.models.processor.sampling_rate
        if rate is not None and rate < model_rate:
            warnings.warn(LowSampleRate(f"{name} is recorded at {rate} Hz, below the models' {model_rate} Hz: "
                                        "it is upsampled, which adds no detail, and the description may "
                                        "differ from a recording at the full rate"), stacklevel=3)

    def segments(self, audio: str | Path | np.ndarray, rate: int | None = None, *, data: bytes | None = None,
                 skip: Container[int] = ()) -> Iterator[Piece]:
        """A recording of any length (up to 4 h) cut at pauses into segments of at most the models'
        window (`max_seconds`: 30 s for the demo pair), each a Piece to `describe`, read as it is
        reached; `skip`: indices of segments not wanted. Where it cuts is decided here, before the
        first Piece (segments.py; a bad recording fails here)."""
        return self.recording(audio, rate, data=data).pieces(skip)

    def recording(self, audio: str | Path | np.ndarray, rate: int | None = None, *,
                  data: bytes | None = None, planned: Recording | None = None) -> Recording:
        """The recording planned: its `segments` (index, count, start_s, end_s), and `read(segment)`;
        `planned`: the same recording planned already (check_before_loading), not read again."""
        p = self.models.processor
        if isinstance(audio, (str, Path)) and rate is not None:
            raise ValueError("rate is for waveforms; a file says its own rate")
        recording = planned or open_recording(audio, p.sampling_rate, p.max_seconds, rate=rate, data=data)
        self._check_rate(recording.name, recording.rate)
        return recording

    def on_cloud_wait(self, say: Callable[[str], None] | None) -> None:
        """With a remote cloud: `say(line)` when it stops answering (or is full) and a clip waits out
        the client's retry window (what for, how long), and when it answers again; None: nothing is
        said. Without a remote cloud, nothing waits."""
        if self.models.remote is not None:
            self.models.remote.on_wait = say

    @property
    def max_seconds(self) -> float:
        """The longest clip the models take at once (their feature extractor's window)."""
        return self.models.processor.max_seconds

    # -- describing -------------------------------------------------------------------------------

    def describe(self, audio: Audio, rate: int | None = None, preset: str = "fluent",
                 on_block: Callable[[BlockEvent], None] | None = None, *, resolved: Settings | None = None,
                 data: bytes | None = None, **settings: Any) -> Result:
        """Describe one clip: a file path, a waveform ([frames], [frames, channels] or [channels,
        frames]; floats at full scale 1.0, or integer PCM such as int16, scaled by its type's range) with
        its `rate`, or a segment of a long recording (a Piece from `segments`: its record names the
        recording and where the segment is). `on_block(event)` is called as each block is decided.
        `resolved`: settings from `resolve()` (then `preset` and `settings` are not read). `data`: the
        file's bytes, received elsewhere (an upload); `audio` then only names the clip, in its record
        and its messages, and is never opened."""
        run = resolved or self.resolve(preset, **settings)
        name, samples = self.read(audio, rate, data)
        desc = self.describer.run(samples, run.cfg, on_block=on_block)
        return self._result(run, name, samples, desc, audio.segment if isinstance(audio, Piece) else None)

    def _result(self, run: Settings, name: str, samples: np.ndarray, desc: Description,
                segment: Segment | None = None) -> Result:
        if segment is not None:
            run = run.segmented()
        return Result(clip_record(self.models, run, name, samples, desc, segment), list(desc.result.events),
                      list(desc.result.tokens))

    def describe_many(self, clips: Iterable[str | Path], resolved: Settings | None = None, batch_size: int = 1,
                      read: Callable[[Path], bytes] | None = None, preset: str = "fluent", *,
                      segment: bool = False, skip: Callable[[Path], Container[int]] | None = None,
                      planned: Mapping[str, Recording] | None = None,
                      **settings: Any) -> Iterator[tuple[Path, Result]]:
        """Describe clip files, `batch_size` decoded together where this run can batch; yields
        (clip, Result) as each ends, in any order, each clip once. A clip that fails does not stop
        the others: its Result holds its error record (`result.error` says why). `read(path)`: the
        clip's bytes, read elsewhere (a Ray worker given them by its driver).

        `segment`: each file is a recording cut into segments (`segments`), and each segment is
        described as a clip (yielded once each, with the recording's path); `skip(path)`: the
        indices of a recording's segments not to describe (a resumed batch's); `planned`: recordings
        planned already (check_before_loading), by path as given."""
        run = resolved or self.resolve(preset, **settings)
        paths = [Path(c) for c in clips]
        if segment:
            run = run.segmented()
            segments = self._segment_clips(paths, read, skip, planned or {})
            for outcome in describe_many(self.describer, segments, run.cfg, batch_size):
                path, piece = outcome.key
                yield path, self._outcome(run, outcome, path, piece)
            return

        def reader(path: Path) -> Callable[[], np.ndarray]:
            return lambda: self.read(path, data=read(path) if read is not None else None)[1]

        for outcome in describe_many(self.describer, ((p, reader(p)) for p in paths), run.cfg, batch_size):
            yield outcome.key, self._outcome(run, outcome, outcome.key)

    def describe_rows(self, rows: Iterable[tuple[Hashable, str, Callable[[], np.ndarray]]], resolved: Settings,
                      batch_size: int = 1) -> Iterator[tuple[Hashable, Result]]:
        """Describe clips that are not files of their own (a dataset's rows: corpus.py): `rows` gives
        (key, name, read) for each, `read()` returning its samples at the models' rate (see `read`)
        and `name` naming it in its record's `file` and in messages. Yields (key, Result) as each
        ends, in any order, each key once, `batch_size` decoded together where this run can batch;
        a row that fails to read or decode gets its error record, as in `describe_many`."""
        names: dict[Hashable, str] = {}

        def clips() -> Iterator[tuple[Hashable, Callable[[], np.ndarray]]]:
            for key, name, read in rows:
                names[key] = name
                yield key, read

        for outcome in describe_many(self.describer, clips(), resolved.cfg, batch_size):
            yield outcome.key, self._outcome(resolved, outcome, names.pop(outcome.key))

    def _segment_clips(self, paths: list[Path], read: Callable[[Path], bytes] | None,
                       skip: Callable[[Path], Container[int]] | None, planned: Mapping[str, Recording]) -> Iterator:
        """describe_many's clips for a segmented run: per recording, its segments not skipped, each
        read as the engine reaches it; a recording that cannot be cut is one clip that fails."""
        for path in paths:
            try:
                recording = self.recording(path, data=read(path) if read is not None else None,
                                           planned=planned.get(str(path)))
            except Exception as exc:  # its error record; the other recordings go on
                yield (path, None), functools.partial(_fail, exc)
                continue
            skipped = skip(path) if skip is not None else ()
            try:
                for piece in recording.segments:
                    if piece.index not in skipped:
                        yield (path, piece), functools.partial(recording.read, piece)
            finally:
                recording.close()

    def _outcome(self, run: Settings, outcome: Outcome[Any], path: str | Path,
                 segment: Segment | None = None) -> Result:
        if outcome.error is not None or outcome.description is None or outcome.audio is None:
            message = one_line(outcome.error or RuntimeError("no result"))
            return Result(error_record(self.models, run, str(path), message, segment, error_kind(outcome.error)))
        return self._result(run, str(path), outcome.audio, outcome.description, segment)

    def error_record(self, file: str | Path, resolved: Settings, message: str,
                     segment: Segment | None = None, kind: str = RETRYABLE) -> dict[str, Any]:
        """The record of a clip that failed, with everything this run's records carry; `kind`: its
        errors.error_kind."""
        return error_record(self.models, resolved, str(file), message, segment, kind)

    def rows(self, resolved: Settings, batch_size: int) -> int:
        """How many clips this run decodes together at `batch_size` (1 where it cannot batch:
        sampled edge-only or cloud-only, a remote cloud)."""
        return rows_for(self.models, resolved.cfg, batch_size)

    def stream(self, audio: Audio, rate: int | None = None, preset: str = "fluent", *, data: bytes | None = None,
               **settings: Any) -> Stream:
        """`describe`, as an iterator over the blocks as they are decided; the Result is
        `stream.result` once the iteration ends. `stream.close()` stops the decoding at its next
        block (a caller that no longer wants it: a closed browser tab)."""
        return Stream(self, audio, rate, preset, settings, data)


def check_before_loading(clips: Sequence[str | Path], spec: PairSpec, segment: bool = False
                         ) -> tuple[dict[str, Recording], dict[str, Exception]]:
    """Every check the clips pass that needs no model, made before the models load (issue 52): each
    is read as it will be described (its length without `segment`, silence, NaN, its scale, its
    speech) at the rate and window of the edge's feature extractor (read from its folder); with
    `segment` each recording is planned (its cap, silence, speech). The recordings planned, to hand
    to `describe_many` / `recording` (not read again), and each clip that failed with its error
    (an InputError: error_kind "input" or "too_long"). Warnings (a low rate, a rescaled clip) are
    left to the description, which says them once. Where the edge's window cannot be read without
    loading it (a Hub id not in the cache), nothing is checked here: the clips are checked as read."""
    from .errors import SpecdecError
    from .models import audio_window

    planned: dict[str, Recording] = {}
    failed: dict[str, Exception] = {}
    window = audio_window(spec.edge)
    if window is None:
        return planned, failed
    rate, max_seconds = window
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for clip in clips:
            try:
                if segment:
                    planned[str(clip)] = open_recording(clip, rate, max_seconds)
                else:
                    check_speech(load_audio(Path(clip), rate, max_seconds), rate, clip)
            except SpecdecError as exc:
                failed[str(clip)] = exc
            except Exception as exc:  # a decoder's failure on a damaged body, whatever its type
                from .errors import InputError

                failed[str(clip)] = InputError(one_line(exc))
    return planned, failed


@dataclass(frozen=True)
class _Named:
    """What a record says of the models, before they load (records.error_record reads these)."""

    edge_id: str
    cloud_id: str


def error_record_before_loading(spec: PairSpec, resolved: Settings, file: str | Path, message: str,
                                kind: str = RETRYABLE) -> dict[str, Any]:
    """The record of a clip refused before the models load: the record `Pair.error_record` would
    give, its models named as the loaded pair names them (load_pair: the folders or Hub ids as
    given, a remote cloud by the model its server reports)."""
    from .models import with_demo

    edge, cloud = with_demo(spec.edge, spec.cloud)
    if spec.cloud_info is not None:
        cloud = str(spec.cloud_info.get("model", cloud))
    return error_record(_Named(edge, cloud), resolved, str(file), message, None, kind)  # type: ignore[arg-type]


def _fail(exc: Exception) -> np.ndarray:
    raise exc


def _file_rate(path: Path, data: bytes | None) -> int | None:
    """The rate a readable clip's header states (read again: load_audio keeps it to itself)."""
    from .audio import header_rate

    try:
        return header_rate(path, data)
    except Exception:  # it was just read; whatever this is, the warning is not worth an error
        return None


class StreamClosed(Exception):
    """Raised into a Stream's decoding by `close()`, to end it at the next block."""


class Stream:
    """Iterates the BlockEvents of one description while it decodes (in a worker thread: the loop
    reports blocks through a callback); errors are raised here, in the caller's thread. `close()`
    ends the decoding at its next block (the iteration then ends with no result)."""

    _DONE = object()

    def __init__(self, pair: Pair, audio: Audio, rate: int | None, preset: str, settings: dict[str, Any],
                 data: bytes | None = None) -> None:
        self.result: Result | None = None
        self._queue: queue.Queue = queue.Queue()
        self._closed = threading.Event()
        pair.resolve(preset, **settings)  # a bad setting fails here, before any thread starts

        def on_block(event: BlockEvent) -> None:
            if self._closed.is_set():
                raise StreamClosed  # the decoding loop stops here; work() below ends quietly
            self._queue.put(event)

        def work() -> None:
            try:
                self.result = pair.describe(audio, rate, preset, on_block=on_block, data=data, **settings)
                self._queue.put(self._DONE)
            except StreamClosed:
                self._queue.put(self._DONE)
            except BaseException as exc:  # handed to the consumer's thread
                self._queue.put(exc)

        self._thread = threading.Thread(target=work, name="specdec-describe", daemon=True)
        self._thread.start()

    def __iter__(self) -> Iterator[BlockEvent]:
        while True:
            item = self._queue.get()
            if item is self._DONE:
                self._thread.join()
                return
            if isinstance(item, BaseException):
                self._thread.join()
                raise item
            yield item

    def close(self, wait: float | None = None) -> None:
        """Stop the decoding at its next block; with `wait`, wait up to that many seconds for it to end."""
        self._closed.set()
        if wait is not None:
            self._thread.join(wait)


class BatchWorker:
    """What a Ray worker holds (scale/ray_batch.py): a Pair loaded from the driver's spec and the
    settings the driver resolved, so every worker decodes exactly as the driver would (and never
    re-reads a presets file its node may lack). Built in the worker process from a pickled
    `functools.partial(BatchWorker, spec, settings, threads)`; `threads`: the driver's --threads."""

    def __init__(self, spec: PairSpec, resolved: Settings, threads: int | None = None) -> None:
        quiet_libraries()
        if threads is not None:
            pin_threads(threads)
        self.pair, self.resolved = Pair.from_spec(spec), resolved

    def rows(self, batch_size: int) -> int:
        return self.pair.rows(self.resolved, batch_size)

    def describe(self, files: list[str], read: Callable[[Path], bytes] | None,
                 batch_size: int) -> list[tuple[str, dict[str, Any]]]:
        """Each clip's record (its error record when it failed), in the order they ended."""
        return [(str(path), result.record)
                for path, result in self.pair.describe_many(files, self.resolved, batch_size, read)]

    def error_record(self, file: str, message: str) -> dict[str, Any]:
        return self.pair.error_record(file, self.resolved, message)
