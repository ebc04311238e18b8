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


def can_batch(session: Session) -> bool:
    """Only the speculative mode in this process batches: edge-only and cloud-only run HF
    `generate` one clip at a time, and a remote cloud's sessions are the server's to batch."""
    return session.cfg.mode == "spec" and getattr(session.pair, "remote", None) is None


def describe_many(describer: Describer, audios: Sequence[np.ndarray], cfg: DecodingConfig, batch_size: int,
                  on_done: Callable[[int], None] | None = None) -> list[Description]:
    """Descriptions of `audios`, in their order: `batch_size` rows in flight for the speculative
    mode in this process, else one clip at a time through `Describer.run`. `on_done(i)` as clip i
    ends. A batched clip's latency runs from its features to its end, so it includes the other
    rows' share of each forward (callers timing single clips should use batch size 1)."""
    from .decoding.batch_loop import speculative_decode_batch
    from .pipeline import Description

    pair = describer.pair
    out: list[Description | None] = [None] * len(audios)
    if batch_size <= 1 or cfg.mode != "spec" or getattr(pair, "remote", None) is not None:
        for i, audio in enumerate(audios):
            out[i] = describer.run(audio, cfg)
            if on_done is not None:
                on_done(i)
        return out  # type: ignore[return-value]
    started: dict[int, float] = {}

    def clips() -> Iterator[tuple[int, Any]]:
        for i, audio in enumerate(audios):
            started[i] = time.perf_counter()
            yield i, describer.inputs(audio)

    for i, result in speculative_decode_batch(pair.edge, pair.cloud, clips(), cfg, pair.masks, pair.eos_ids,
                                              batch_size):
        text = pair.tokenizer.decode(result.tokens, skip_special_tokens=True).strip()
        out[i] = Description(text, result, time.perf_counter() - started.pop(i))
        if on_done is not None:
            on_done(i)
    return out  # type: ignore[return-value]


def batched_describe_all(session: Session, batch_size: int) -> DescribeAll | None:
    """run_batch's `describe_all` for `batch_size` rows in flight; None when this run decodes one
    clip at a time (batch size 1, or `can_batch` says no)."""
    if batch_size <= 1 or not can_batch(session):
        return None

    def describe_all(todo: list[Path]) -> Iterator[tuple[Path, dict[str, Any]]]:
        return _describe_rows(session, todo, batch_size)

    return describe_all


def _describe_rows(session: Session, todo: list[Path], batch_size: int) -> Iterator[tuple[Path, dict[str, Any]]]:
    from .decoding.batch_loop import speculative_decode_batch  # torch: loaded with the models
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
                inputs = describer.inputs(audio)
            except Exception as exc:  # one bad clip must not stop the batch; its record says why
                failed.append((path, session.error_record(path, one_line(exc))))
                continue
            in_flight[path] = (start, audio)
            yield path, inputs

    finished = False
    while not finished:
        engine = speculative_decode_batch(pair.edge, pair.cloud, clips(), cfg, pair.masks, pair.eos_ids, batch_size)
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
