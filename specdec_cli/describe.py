"""Clips in, descriptions out: one clip (`Describer.run`), or many with one fallback policy
(`describe_many`), the one every caller uses (the API, describe, batch, eval, calibrate, the Ray
workers), so every mode is measured the same way everywhere.

Many clips: `batch_size` rows in flight through the batched engine (`decoding/batch_loop.py`)
where this run can batch, else one clip at a time. Each clip's outcome comes back as that clip
ends: its description, or the error that stopped it. A clip whose audio cannot be read gets its
error at once and never takes a row. A failure inside the engine (a shared forward) cannot be
pinned on one row, so the clips in flight are then described one at a time (each gets its own
outcome) and the rest go on batched.

With a remote cloud, `CloudPolicy` says what a clip does when its cloud fails: fail (the clip's
error, as before the policy existed), or finish on the edge (the loop's `fallback`), and the
budget the cloud has for the whole clip (`deadline_s`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .errors import InputError
from .prompt import INSTRUCTION, SYSTEM, render_prompt

if TYPE_CHECKING:
    import numpy as np

    from .decoding import BlockEvent, DecodeResult, DecodingConfig
    from .models import ModelPair
    from .remote.client import LinkStats

K = TypeVar("K", bound=Hashable)


@dataclass
class Description:
    text: str
    result: DecodeResult
    latency_s: float   # wall time for features + decoding (model loading excluded)
    link: LinkStats | None = None  # what crossed the link to a remote cloud (None: in-process)


ON_CLOUD_FAILURE = ("edge", "fail")  # --on-cloud-failure


@dataclass(frozen=True)
class CloudPolicy:
    """What a clip does when its remote cloud fails it (unreachable, refusing, an answer specdec
    cannot use, too slow): `on_failure` "edge" finishes it on the edge from where it stands (the
    record's `fallback` says so), "fail" makes the failure the clip's error. `deadline_s`: the
    cloud's budget for the whole clip, from its start (None: only each request's own deadline);
    past it no request is sent and the one in flight is cut off (a "deadline" failure)."""

    on_failure: str = "fail"
    deadline_s: float | None = None

    def __post_init__(self) -> None:
        import math

        if self.on_failure not in ON_CLOUD_FAILURE:
            raise InputError(f"--on-cloud-failure {self.on_failure} is not a choice; give edge or fail")
        if self.deadline_s is not None and not (math.isfinite(self.deadline_s) and self.deadline_s > 0):
            raise InputError("--cloud-deadline must be a positive number of seconds (the whole clip's budget)")

    @property
    def edge(self) -> bool:
        return self.on_failure == "edge"

    def until(self, started: float) -> float | None:
        """The clip's deadline on time.monotonic()'s clock, for a clip started at `started`."""
        return None if self.deadline_s is None else started + self.deadline_s


class Describer:
    """One loaded pair turning one clip's samples into its description, in any mode; `policy`: what
    a clip does when its remote cloud fails it."""

    def __init__(self, pair: ModelPair, policy: CloudPolicy | None = None) -> None:
        self.pair = pair
        self.policy = policy if policy is not None else CloudPolicy()

    def inputs(self, audio: np.ndarray, cfg: DecodingConfig | None = None):
        """The thinker inputs for `audio`, with `cfg`'s instruction and system prompt (None: the
        default task)."""
        prompt = render_prompt(cfg.instruction or INSTRUCTION, cfg.system or SYSTEM) if cfg is not None else None
        return self.pair.processor(audio, prompt).to(self.pair.edge.device)

    def run(self, audio: np.ndarray, cfg: DecodingConfig,
            on_block: Callable[[BlockEvent], None] | None = None) -> Description:
        from .decoding import generate_baseline, speculative_decode  # torch: loaded with the models

        p = self.pair
        start = time.perf_counter()
        until = self.policy.until(time.monotonic())
        inputs = self.inputs(audio, cfg)
        link = None
        if p.cloud_down is not None:  # the cloud was down at the start: the edge alone, marked
            result, link = self._edge_alone(inputs, cfg)
        elif p.remote is None:
            if cfg.mode == "spec":
                result = speculative_decode(p.edge, p.cloud, inputs, cfg, p.masks, p.eos_ids, on_block, gate=p.gate)
            else:
                model = p.cloud if cfg.mode == "cloud" else p.edge
                result = generate_baseline(model, inputs, cfg, p.masks, p.eos_ids, p.tokenizer.pad_token_id)
        elif cfg.mode == "spec":
            # The same loop; its cloud is this clip's session on the server (opened lazily).
            cloud = p.remote.clip(audio, cfg, until)
            try:
                # The gate runs here, on the edge: the server only scores what it is sent.
                result = speculative_decode(p.edge, cloud, inputs, cfg, p.masks, p.eos_ids, on_block, gate=p.gate,
                                            fallback=self.policy.edge,
                                            depth=p.remote.depth_for(p.edge, cfg.k, until))
            finally:
                cloud.close()
            link = cloud.link
        elif cfg.mode == "cloud":
            from .remote.client import LinkStats

            link = LinkStats()
            try:
                result, link = p.remote.generate(audio, inputs, cfg, p.tokenizer.pad_token_id, link, until)
            except Exception as exc:
                result = self._edge_instead(exc, inputs, cfg)
        else:
            from .remote.client import LinkStats

            result = generate_baseline(p.edge, inputs, cfg, p.masks, p.eos_ids, p.tokenizer.pad_token_id)
            link = LinkStats()
        latency = time.perf_counter() - start
        return Description(self.text(result), result, latency, link)

    def _edge_alone(self, inputs: Any, cfg: DecodingConfig) -> tuple[DecodeResult, LinkStats]:
        """The clip on the edge alone, its cloud down since the run started (ModelPair.cloud_down):
        marked as a fallback with nothing verified, unless the clip asked for the edge (--mode edge)."""
        from .decoding import generate_baseline
        from .decoding.loop import CloudLost
        from .remote.client import CloudUnreachable, LinkStats

        p = self.pair
        result = generate_baseline(p.edge, inputs, cfg.with_(mode="edge"), p.masks, p.eos_ids, p.tokenizer.pad_token_id)
        if cfg.mode != "edge":
            result.lost = CloudLost(CloudUnreachable.cloud_failure, str(p.cloud_down), 0, 0)
        return result, LinkStats()

    def _edge_instead(self, exc: Exception, inputs: Any, cfg: DecodingConfig) -> DecodeResult:
        """Cloud-only, the cloud failed: the edge describes the clip from its start (the loop's
        fallback, with nothing verified), or the failure is the clip's."""
        from .decoding import generate_baseline
        from .decoding.loop import CloudLost, cloud_failure
        from .errors import one_line

        failure = cloud_failure(exc)
        if not self.policy.edge or failure is None:
            raise exc
        p = self.pair
        # Counted as the edge's work: the cloud ran nothing for this description.
        result = generate_baseline(p.edge, inputs, cfg.with_(mode="edge"), p.masks, p.eos_ids, p.tokenizer.pad_token_id)
        result.lost = CloudLost(failure, one_line(exc), 0, 0)
        return result

    def text(self, result: DecodeResult) -> str:
        return self.pair.tokenizer.decode(result.tokens, skip_special_tokens=True).strip()


@dataclass
class Outcome(Generic[K]):
    """One clip of `describe_many`: its description, or the error that stopped it (then `audio`
    is None when the clip could not even be read)."""

    key: K
    audio: np.ndarray | None
    description: Description | None = None
    error: Exception | None = None


# A clip for describe_many: its key, and how to get its samples (read a file, or hand over samples
# already read); a failure to read becomes that clip's outcome.
Clip = tuple[K, Callable[[], "np.ndarray"]]


def batchable(pair: Any, cfg: DecodingConfig) -> bool:
    """Whether this run can put clips in rows: every mode in this process, but not sampled edge-only
    or cloud-only (HF `generate` draws them from torch's global generator, whose stream would depend
    on the batch-mates), nor a remote cloud (its sessions are the server's to batch)."""
    return (getattr(pair, "remote", None) is None and getattr(pair, "cloud_down", None) is None
            and (cfg.mode == "spec" or not cfg.sample))


def rows_for(pair: Any, cfg: DecodingConfig, batch_size: int) -> int:
    """How many clips this run decodes together at `batch_size`."""
    return batch_size if batch_size > 1 and batchable(pair, cfg) else 1


def describe_many(describer: Describer, clips: Iterable[Clip[K]], cfg: DecodingConfig,
                  batch_size: int = 1) -> Iterator[Outcome[K]]:
    """Each clip's outcome as that clip ends (in any order; each clip exactly once). A batched
    clip's latency runs from its features to its end, so it includes the other rows' share of each
    forward (callers timing single clips use batch size 1). KeyboardInterrupt is not caught."""
    if batch_size <= 1 or rows_for(describer.pair, cfg, batch_size) == 1:
        for key, read in clips:
            yield _alone(describer, key, read, cfg)
        return
    yield from _rows(describer, clips, cfg, batch_size)


def _alone(describer: Describer, key: K, read: Callable[[], np.ndarray] | None, cfg: DecodingConfig,
           audio: np.ndarray | None = None) -> Outcome[K]:
    try:
        if audio is None:
            assert read is not None
            audio = read()
        return Outcome(key, audio, describer.run(audio, cfg))
    except Exception as exc:  # one bad clip must not stop the others; its outcome says why
        return Outcome(key, audio, error=exc)


def _engine(pair: Any, cfg: DecodingConfig, clips: Iterator[tuple[Any, Any]], batch_size: int) -> Iterator:
    """(key, DecodeResult) as each clip ends: the batched speculative loop, or one model alone."""
    from .decoding.batch_loop import generate_batch, speculative_decode_batch  # torch: loaded with the models

    if cfg.mode == "spec":
        return speculative_decode_batch(pair.edge, pair.cloud, clips, cfg, pair.masks, pair.eos_ids, batch_size,
                                        gate=getattr(pair, "gate", None))
    model = pair.cloud if cfg.mode == "cloud" else pair.edge
    return generate_batch(model, clips, cfg, pair.masks, pair.eos_ids, batch_size)


def _rows(describer: Describer, clips: Iterable[Clip[K]], cfg: DecodingConfig,
          batch_size: int) -> Iterator[Outcome[K]]:
    waiting = iter(clips)                           # shared by every engine started below
    unreadable: deque[Outcome[K]] = deque()         # handed back at the next chance
    in_flight: dict[K, tuple[float, np.ndarray]] = {}  # key -> (start time, samples)

    def feed() -> Iterator[tuple[K, Any]]:
        for key, read in waiting:
            audio = None
            try:
                audio = read()
                start = time.perf_counter()  # a clip's latency: features + decoding, as Describer.run's
                inputs = describer.inputs(audio, cfg)
            except Exception as exc:  # one bad clip must not stop the batch
                unreadable.append(Outcome(key, audio, error=exc))
                continue
            in_flight[key] = (start, audio)
            yield key, inputs

    finished = False
    while not finished:
        engine = _engine(describer.pair, cfg, feed(), batch_size)
        try:
            for key, result in engine:
                while unreadable:
                    yield unreadable.popleft()
                start, audio = in_flight.pop(key)
                yield Outcome(key, audio, Description(describer.text(result), result, time.perf_counter() - start))
            finished = True
        except Exception:
            # Not one row's fault that we could tell: each clip in flight is described alone.
            stranded = list(in_flight.items())
            in_flight.clear()
            for key, (_, audio) in stranded:
                yield _alone(describer, key, None, cfg, audio)
        finally:
            engine.close()
        while unreadable:
            yield unreadable.popleft()
