"""`Pair`: a loaded edge-cloud pair and the calls a notebook or a pipeline makes on it.

Nothing here decodes, resolves presets or builds records by itself: a `Pair` holds the CLI's own
`Session` (models loaded once by `models.load_pair`, `pipeline.Describer`), resolves each call's
settings the way the flags are resolved (`cli._flags` + `cli.run_settings`: built-in defaults <
preset < explicit settings), and builds the record with `Session.record` (`metrics.build_record`),
so a result holds exactly the fields `specdec describe --json` prints.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specdec_cli import cli
from specdec_cli.audio import prepare_waveform
from specdec_cli.decoding import BlockEvent, DecodingConfig

Audio = str | Path | np.ndarray


@dataclass
class Result:
    """One description: `record` is the record `specdec describe --json` prints (its fields are
    also attributes: `result.description`, `result.cloud_calls`, `result.settings`…), `events` the
    decoding's blocks in order (speculative mode; empty for edge / cloud)."""

    record: dict[str, Any]
    events: list[BlockEvent] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)

    def __getattr__(self, name: str) -> Any:
        record = self.__dict__.get("record", {})
        if name in record:
            return record[name]
        raise AttributeError(f"{type(self).__name__} has no field {name!r}; record fields: {', '.join(record)}")

    def __getitem__(self, key: str) -> Any:
        return self.record[key]


class Pair:
    """An edge and a cloud loaded once. `edge`/`cloud`: model folders or Hub ids (default: the
    bundled demo pair; `cloud` may be http://HOST:PORT of a `specdec serve`); `device` for both, or
    `edge_device` / `cloud_device` for each; `presets`: a presets file layered over the built-in
    ones. One call at a time per Pair (the models' caches are per call, the settings are not)."""

    def __init__(self, edge: str | None = None, cloud: str | None = None, device: str = "cpu",
                 dtype: str = "float32", presets: str | Path | None = None, *,
                 edge_device: str | None = None, cloud_device: str | None = None) -> None:
        from rich.console import Console

        cli._quiet_libraries()  # as the CLI: no weight-loading bars (SPECDEC_DEBUG=1 keeps them)
        self._base = dict(edge=edge, cloud=cloud, device=device, dtype=dtype,
                          presets_file=Path(presets) if presets is not None else None,
                          edge_device=edge_device, cloud_device=cloud_device)
        self._session = cli.Session(self._flags("fluent", {}), Console(stderr=True, quiet=True))
        self._resolved: dict[tuple, tuple] = {}

    # -- settings ---------------------------------------------------------------------------------

    def _flags(self, preset: str, settings: dict[str, Any]) -> cli.Flags:
        b = self._base
        return cli._flags(preset, b["edge"], b["cloud"], b["device"], b["dtype"], None, presets_file=b["presets_file"],
                          edge_device=b["edge_device"], cloud_device=b["cloud_device"], **settings)

    def settings(self, preset: str = "fluent", **settings: Any) -> DecodingConfig:
        """The decoding config a call with these arguments uses (defaults < preset < `settings`,
        any `DecodingConfig` field: mode, k, threshold, sample, seed, temperature, top_p, top_k,
        instruction, system, max_new_tokens, constraints…)."""
        return self._resolve(preset, settings)[0]

    def _resolve(self, preset: str, settings: dict[str, Any]) -> tuple:
        key = (preset, tuple(sorted(settings.items())))
        if key not in self._resolved:
            self._resolved[key] = cli.run_settings(self._flags(preset, settings))
        return self._resolved[key]

    # -- describing -------------------------------------------------------------------------------

    @property
    def tokenizer(self):
        return self._session.pair.tokenizer

    def text(self, token_ids: list[int]) -> str:
        """Token ids (a block's draft, an answer) as text."""
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def _audio(self, audio: Audio, rate: int | None) -> tuple[str, np.ndarray]:
        p = self._session.pair.processor
        if isinstance(audio, (str, Path)):
            if rate is not None:
                raise ValueError("rate is for waveforms; a file says its own rate")
            return str(audio), self._session.load(Path(audio))
        if rate is None:
            raise ValueError("a waveform needs its sampling rate: describe(samples, rate=...)")
        return "<waveform>", prepare_waveform(audio, rate, p.sampling_rate, p.max_seconds)

    def describe(self, audio: Audio, rate: int | None = None, preset: str = "fluent",
                 on_block: Callable[[BlockEvent], None] | None = None, **settings: Any) -> Result:
        """Describe one clip: a file path, or a waveform ([frames] or [frames, channels] floats)
        with its `rate`. `on_block(event)` is called as each block is decided."""
        cfg, name, run = self._resolve(preset, settings)
        file, samples = self._audio(audio, rate)
        session = self._session
        session.cfg, session.preset, session.settings = cfg, name, run  # what Session.record reports
        desc = session.describer.run(samples, cfg, on_block=on_block)
        return Result(session.record(file, samples, desc), list(desc.result.events), list(desc.result.tokens))

    def stream(self, audio: Audio, rate: int | None = None, preset: str = "fluent", **settings: Any) -> Stream:
        """`describe`, as an iterator over the blocks as they are decided; the Result is
        `stream.result` once the iteration ends."""
        return Stream(self, audio, rate, preset, settings)


class Stream:
    """Iterates the BlockEvents of one description while it decodes (in a worker thread: the loop
    reports blocks through a callback); errors are raised here, in the caller's thread."""

    _DONE = object()

    def __init__(self, pair: Pair, audio: Audio, rate: int | None, preset: str, settings: dict[str, Any]) -> None:
        self.result: Result | None = None
        self._queue: queue.Queue = queue.Queue()
        pair._resolve(preset, settings)  # a bad setting fails here, before any thread starts

        def work() -> None:
            try:
                self.result = pair.describe(audio, rate, preset, on_block=self._queue.put, **settings)
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
