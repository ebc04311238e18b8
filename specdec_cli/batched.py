"""`specdec batch --batch-size N`: N clips in flight in one process, through the batched engine
(`decoding/batch_loop.py`), each clip's record handed to `run_batch`'s one writer as that clip
ends (so records, resume and crash safety are batch.py's, unchanged). `describe_many` is the same
for a list of clips in memory (`specdec calibrate --batch-size`).

A clip whose audio cannot be read gets its error record at once and never takes a row. A failure
inside the engine (a shared forward) cannot be pinned on one row, so the clips in flight are then
described one at a time (each gets its own record: its description or its own error) and the rest
go on batched."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .batch import DescribeAll
from .errors import one_line

if TYPE_CHECKING:
    import numpy as np

    from .cli import Session
    from .decoding.config import DecodingConfig
    from .pipeline import Describer, Description


def batchable(pair: Any, cfg: DecodingConfig) -> bool:
    """Whether this run can put clips in rows: every mode in this process, but not sampled edge-only
    or cloud-only (HF `generate` draws them from torch's global generator, whose stream would depend
    on the batch-mates), nor a remote cloud (its sessions are the server's to batch)."""
    return getattr(pair, "remote", None) is None and (cfg.mode == "spec" or not cfg.sample)


def _engine(pair: Any, cfg: DecodingConfig, clips: Iterator[tuple[Any, Any]], batch_size: int) -> Iterator:
    """(key, DecodeResult) as each clip ends: the batched speculative loop, or one model alone."""
    from .decoding.batch_loop import generate_batch, speculative_decode_batch  # torch: loaded with the models

    if cfg.mode == "spec":
        return speculative_decode_batch(pair.edge, pair.cloud, clips, cfg, pair.masks, pair.eos_ids, batch_size)
    model = pair.cloud if cfg.mode == "cloud" else pair.edge
    return generate_batch(model, clips, cfg, pair.masks, pair.eos_ids, batch_size)


def describe_many(describer: Describer, audios: Sequence[np.ndarray], cfg: DecodingConfig, batch_size: int,
                  on_done: Callable[[int], None] | None = None) -> list[Description]:
    """Descriptions of `audios`, in their order: `batch_size` rows in flight for the speculative
    mode in this process, else one clip at a time through `Describer.run`. `on_done(i)` as clip i
    ends. A batched clip's latency runs from its features to its end, so it includes the other
    rows' share of each forward (callers timing single clips should use batch size 1)."""
    from .pipeline import Description

    pair = describer.pair
    out: list[Description | None] = [None] * len(audios)
    if batch_size <= 1 or not batchable(pair, cfg):
        for i, audio in enumerate(audios):
            out[i] = describer.run(audio, cfg)
            if on_done is not None:
                on_done(i)
        return out  # type: ignore[return-value]
    started: dict[int, float] = {}

    def clips() -> Iterator[tuple[int, Any]]:
        for i, audio in enumerate(audios):
            started[i] = time.perf_counter()
            yield i, describer.inputs(audio, cfg)

    for i, result in _engine(pair, cfg, clips(), batch_size):
        text = pair.tokenizer.decode(result.tokens, skip_special_tokens=True).strip()
        out[i] = Description(text, result, time.perf_counter() - started.pop(i))
        if on_done is not None:
            on_done(i)
    return out  # type: ignore[return-value]


def batched_describe_all(session: Session, batch_size: int) -> DescribeAll | None:
    """run_batch's `describe_all` for `batch_size` rows in flight; None when this run decodes one
    clip at a time (batch size 1, or `batchable` says no)."""
    if batch_size <= 1 or not batchable(session.pair, session.cfg):
        return None

    def describe_all(todo: list[Path]) -> Iterator[tuple[Path, dict[str, Any]]]:
        return _describe_rows(session, todo, batch_size)

    return describe_all


def _describe_rows(session: Session, todo: list[Path], batch_size: int) -> Iterator[tuple[Path, dict[str, Any]]]:
    from .pipeline import Description

    pair, cfg, describer = session.pair, session.cfg, session.describer
    waiting = iter(todo)                       # shared by every engine started below
    failed: list[tuple[Path, dict[str, Any]]] = []  # unreadable clips, written at the next chance
    in_flight: dict[Path, tuple[float, Any]] = {}   # path -> (start time, audio)

    def clips() -> Iterator[tuple[Path, Any]]:
        for path in waiting:
            try:
                audio = session.load(path)
                start = time.perf_counter()  # a record's latency: features + decoding, as Describer.run's
                inputs = describer.inputs(audio, cfg)
            except Exception as exc:  # one bad clip must not stop the batch; its record says why
                failed.append((path, session.error_record(path, one_line(exc))))
                continue
            in_flight[path] = (start, audio)
            yield path, inputs

    finished = False
    while not finished:
        engine = _engine(pair, cfg, clips(), batch_size)
        try:
            for path, result in engine:
                yield from _drain(failed)
                start, audio = in_flight.pop(path)
                text = pair.tokenizer.decode(result.tokens, skip_special_tokens=True).strip()
                yield path, session.record(str(path), audio, Description(text, result, time.perf_counter() - start))
            finished = True
        except Exception:
            # Not one row's fault that we could tell: each clip in flight is described alone.
            stranded = list(in_flight)
            in_flight.clear()
            for path in stranded:
                try:
                    record = session.describe_file(path)
                except Exception as exc:  # its own error, in its own record
                    record = session.error_record(path, one_line(exc))
                yield path, record
        finally:
            engine.close()
        yield from _drain(failed)


def _drain(failed: list[tuple[Path, dict[str, Any]]]) -> Iterator[tuple[Path, dict[str, Any]]]:
    while failed:
        yield failed.pop(0)
