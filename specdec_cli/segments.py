"""Long recordings (`--segment`): a recording longer than the model's window is cut at pauses into
segments of at most the window, each described as a clip of its own.

Where to cut (`plan`): the recording is read once as a stream of mono blocks at its own rate
(audio.mono_blocks: memory stays at about one window, whatever the length). From the start of what
is left, a cut goes at most one window ahead and leaves at least the shortest clip (audio.MIN_SECONDS)
on each side. Within that range it goes in the middle of a pause: a stretch quieter than TOP_DB
below the loudest 10 ms of the window, or one where the voice-activity detector (speech.py) hears no
speech (music, noise, a tone between two sentences); the cut takes the longest pause (of at least
MIN_PAUSE_S) in the second half of the range, else the longest one anywhere in it, else, for a
window of unbroken speech, the quietest 10 ms of the second half. Cuts fall on the 10 ms grid of that
analysis (a segment of a 16 kHz file starts at 12.34 s, not 12.3400625 s). What is left once it fits
the window is the last segment. A segment whose peak is below audio.SILENCE_DBFS, or with less than
speech.MIN_SPEECH_S of speech, holds nothing to describe and is left out (a recording of silence
alone is refused as a silent clip is, one without speech as a clip without speech is). The choice
depends on the samples alone, never on how they were read in blocks, so the same file is always cut
the same way: a batch resumes per segment.

The loudness is measured here with numpy (librosa.effects.split's and librosa.feature.rms's
definitions, written out): librosa's helpers are numba-compiled, and a first `--segment` on a
machine paid the compiling (issue 52: 44 s cold against 16 s warm for a 45 s file; bench/segment_cold.py).

Each segment is then read again, from a second forward pass, as the frames [start, end) of the file
turned mono and resampled to the model's rate: exactly what describing the file cut at
`start_s`..`end_s` reads (frames round(start_s x rate) to round(end_s x rate)).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Container, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .audio import (
    MAX_RECORDING_SECONDS,
    MIN_SECONDS,
    SILENCE_DBFS,
    mono_blocks,
    prepare_mono,
    recording_info,
    waveform_mono,
)
from .errors import InputError
from .speech import FRAME_S, MIN_SPEECH_S, THRESHOLD, NoSpeech, probabilities

if TYPE_CHECKING:
    import numpy as np

# A pause is where the sound is this far below the loudest 10 ms of the window (librosa's top_db):
# room noise under speech is usually 40-60 dB down; -40 dB keeps quiet speech (30 dB under a loud
# voice in the demo corpus) on the sound side.
TOP_DB = 40.0
# The pauses preferred for a cut: a breath between words is shorter (the demo clips' longest is 0.33 s).
MIN_PAUSE_S = 0.5
# The analysis step (10 ms) and frame (40 ms) in seconds.
HOP_S = 0.01
FRAME_HOPS = 4


def _seconds(frame: int, rate: int) -> float:
    """A cut's time: its 10 ms grid time when the cut is the grid's frame there (every cut but a
    recording's end; at 22.05 kHz 20.95 s is frame 461948, not 20.952380952 s), else frame / rate.
    Either way round(seconds x rate) is the frame."""
    grid = round(frame / rate, 2)
    return grid if round(grid * rate) == frame else frame / rate


@dataclass(frozen=True)
class Segment:
    """One segment of a recording: the `index`-th of `count`, frames [start, end) at the file's
    `rate`; `start_s` and `end_s` in seconds from the start of the file."""

    index: int
    count: int
    start: int
    end: int
    rate: int

    @property
    def start_s(self) -> float:
        return _seconds(self.start, self.rate)

    @property
    def end_s(self) -> float:
        return _seconds(self.end, self.rate)

    def fields(self) -> dict[str, int | float]:
        """What a record says about its segment (records.py)."""
        return {"segment": self.index, "segments": self.count, "start_s": self.start_s, "end_s": self.end_s}


@dataclass(frozen=True)
class Piece:
    """A segment ready to describe: the recording's name (`file`), where it is, and its samples at
    the model's rate. `Pair.describe(piece)` describes it; its record says which segment it is."""

    file: str
    segment: Segment
    samples: np.ndarray


# -- where to cut -------------------------------------------------------------------------------------

def plan(blocks: Iterable[np.ndarray], rate: int, window_s: float, min_s: float = MIN_SECONDS,
         name: str = "recording") -> list[tuple[int, int]]:
    """The frames [start, end) of each segment to describe, in order (see the module doc): none
    longer than `window_s`, none shorter than `min_s`; silent ones left out. `blocks`: consecutive
    mono samples at `rate`, in blocks of any size."""
    import numpy as np

    window, least = math.floor(window_s * rate), math.ceil(min_s * rate)
    hop = max(1, round(HOP_S * rate))
    if window < 2 * least:
        raise ValueError(f"a window of {window_s:g} s cannot hold two segments of {min_s:g} s")
    source = iter(blocks)
    held: list[np.ndarray] = []   # the samples not yet cut, from `start` on
    count, start, ended = 0, 0, False
    spans: list[tuple[int, int]] = []
    heard = False
    spoken = 0.0  # seconds of speech found in the stretches that were not silent

    while True:
        while not ended and count < window + least:
            block = next(source, None)
            if block is None:
                ended = True
            elif len(block):
                held.append(block)
                count += len(block)
        rest = held[0] if len(held) == 1 else np.concatenate(held) if held else np.zeros(0, dtype=np.float32)
        region = rest[:window]
        speech = _speech(region, rate) if len(region) else np.zeros(0, dtype=bool)
        if ended and count <= window:
            cut = count
        else:
            # Not the end: at least `least` follows anyway; at the end, leave `least` for the last.
            last = min(window, count - least) if ended else window
            cut = _cut(region, rate, least, last, hop, start, speech)
        if cut == 0:
            break
        if cut < least:  # only a whole recording shorter than a clip
            raise InputError(f"{name} is {cut / rate:.3f} s long; give a clip of at least {min_s:g} s")
        if float(np.abs(rest[:cut]).max()) >= 10 ** (SILENCE_DBFS / 20):
            heard = True
            said = float(speech[:math.ceil(cut / rate / FRAME_S)].sum()) * FRAME_S
            spoken += said
            if said >= MIN_SPEECH_S:
                spans.append((start, start + cut))
        start, count = start + cut, count - cut
        held = [rest[cut:]] if count else []
        if ended and not count:
            break
    if start == 0:
        raise InputError(f"{name} holds no audio samples; give a clip of at least {min_s:g} s")
    if not heard:
        raise InputError(f"{name} is silent (peak below {SILENCE_DBFS:g} dBFS); nothing to describe: check the "
                         "recording")
    if not spans:
        raise NoSpeech(f"{name} holds no speech to describe: a voice-activity detector found {spoken:.2f} s of "
                       f"speech in its {start / rate:.1f} s, never {MIN_SPEECH_S:g} s in one segment (music, "
                       "tones and noise hold none); give a recording of someone speaking")
    return spans


def _speech(region: np.ndarray, rate: int) -> np.ndarray:
    """Whether each 32 ms frame of `region` (speech.FRAME_S, from its start) is speech."""
    return probabilities(region, rate) >= THRESHOLD


def _loudness_db(region: np.ndarray, frame: int, hop: int) -> np.ndarray:
    """Each 10 ms frame's RMS in dB below the loudest one's: librosa.feature.rms (centred frames,
    zero-padded) and amplitude_to_db(ref=np.max, amin=1e-5), in numpy (see the module doc)."""
    import numpy as np

    padded = np.pad(region.astype(np.float64), frame // 2)
    # Each frame's sum of squares from one running sum: no [frames x frame] array (at 384 kHz, 180 MB).
    total = np.concatenate([[0.0], np.cumsum(np.square(padded))])
    starts = np.arange(0, len(padded) - frame + 1, hop)
    rms = np.sqrt(np.maximum(total[starts + frame] - total[starts], 0.0) / frame)
    level = 20.0 * np.log10(np.maximum(1e-5, rms))
    return level - 20.0 * np.log10(max(1e-5, float(rms.max()) if len(rms) else 0.0))


def _cut(region: np.ndarray, rate: int, lo: int, hi: int, hop: int, offset: int = 0,
         speech: np.ndarray | None = None) -> int:
    """Where to cut `region` (the window from the current start, frame `offset` of the file), in [lo, hi];
    `speech`: whether each 32 ms frame of it is speech (None: all of it, so only quiet makes a pause)."""
    import numpy as np

    frame = FRAME_HOPS * hop
    level = _loudness_db(region, frame, hop)
    sounding = level > -TOP_DB
    if speech is not None and len(speech):
        # A 10 ms frame sounds when it is loud enough and inside a 32 ms frame of speech.
        at = np.minimum((np.arange(len(sounding)) * hop / rate / FRAME_S).astype(int), len(speech) - 1)
        sounding &= speech[at]
    # The stretches that sound, as librosa.effects.split gives them: [start, end) in samples.
    changes = np.flatnonzero(np.diff(sounding.astype(np.int8))) + 1
    bounds = np.concatenate([[0] if len(sounding) and sounding[0] else [], changes,
                             [len(sounding)] if len(sounding) and sounding[-1] else []]).astype(int)
    sound = np.minimum(bounds * hop, len(region)).reshape(-1, 2)
    edges = [0, *sound.ravel().tolist(), len(region)]
    pauses = [(b - a, (a + b) // 2) for a, b in zip(edges[::2], edges[1::2], strict=True) if b > a]
    in_range = [(length, middle) for length, middle in pauses if lo <= middle <= hi]
    half = max(lo, hi // 2)
    long_enough = [p for p in in_range if p[0] >= MIN_PAUSE_S * rate]
    for pool in ([p for p in long_enough if p[1] >= half], long_enough, in_range):
        if pool:
            return _on_grid(max(pool)[1], lo, hi, rate, offset)  # the longest pause; of equals, the later
    # Unbroken sound: the quietest 10 ms of the second half (of equals, the later).
    rms = level  # the same order as the RMS itself
    frames = np.arange(len(rms))
    allowed = (frames * hop >= half) & (frames * hop <= hi)
    candidates = frames[allowed]
    if not len(candidates):
        return hi
    best = candidates[np.lexsort((-candidates, rms[candidates]))[0]]
    return _on_grid(int(best) * hop, lo, hi, rate, offset)


def _on_grid(cut: int, lo: int, hi: int, rate: int, offset: int) -> int:
    """`cut` (frames after `offset`) moved to the file's nearest 10 ms grid point within [lo, hi]:
    the grid of the file, not of the window, so every cut's time is a whole number of hundredths
    whatever the rate (a hop of round(0.01 x rate) frames drifts off it at 22.05 kHz)."""
    per_s = round(1 / HOP_S)  # grid points per second (100), in integers: no float drift
    step = round((offset + cut) * per_s / rate)
    for n in sorted(range(step - 2, step + 3), key=lambda m: abs(m - step)):
        snapped = round(n * rate / per_s) - offset
        if lo <= snapped <= hi:
            return snapped
    return min(max(cut, lo), hi)


# -- a recording, planned and read ------------------------------------------------------------------

class Recording:
    """A long recording, planned: its `segments`, and their samples read forward from one more
    pass over it (`read`, `pieces`); `close` ends that pass."""

    def __init__(self, name: str, rate: int, spans: list[tuple[int, int]],
                 blocks: Callable[[], Iterator[np.ndarray]], model_rate: int) -> None:
        self.name, self.rate, self.model_rate = name, rate, model_rate
        self.segments = [Segment(i, len(spans), a, b, rate) for i, (a, b) in enumerate(spans)]
        self._blocks = blocks
        self._stream: Iterator[np.ndarray] | None = None
        self._position = 0            # the frame index of the first sample of `_block`
        self._block: np.ndarray | None = None
        self._failed: Exception | None = None

    def read(self, segment: Segment) -> np.ndarray:
        """The segment's samples at the model's rate. Cheapest in order (one forward pass); an
        earlier segment starts the pass again. A read that failed fails again, with the same error."""
        if self._failed is not None:
            raise self._failed
        try:
            return self._read(segment)
        except Exception as exc:
            self._failed = exc
            self.close()
            raise

    def _read(self, segment: Segment) -> np.ndarray:
        import numpy as np

        if self._stream is None or self._block is None or segment.start < self._position:
            self.close()
            self._stream, self._position, self._block = self._blocks(), 0, np.zeros(0, dtype=np.float32)
        block = self._block
        while self._position + len(block) <= segment.start:  # blocks wholly before the segment
            self._position += len(block)
            block = self._block = self._next()
        parts = []
        while True:
            lo, hi = max(segment.start - self._position, 0), min(segment.end - self._position, len(block))
            parts.append(block[lo:hi])
            if self._position + len(block) >= segment.end:
                break  # the block may hold the next segment's start: kept
            self._position += len(block)
            block = self._block = self._next()
        mono = np.concatenate(parts) if len(parts) > 1 else parts[0]
        return prepare_mono(mono, self.rate, self.model_rate, self.name)

    def _next(self) -> np.ndarray:
        assert self._stream is not None
        block = next(self._stream, None)
        if block is None:  # the second pass read less than the first: the file changed meanwhile
            raise InputError(f"{self.name} ended early on a second read; was it changed while specdec read it?")
        return block

    def close(self) -> None:
        stream, self._stream, self._block = self._stream, None, None
        if stream is not None and hasattr(stream, "close"):
            stream.close()  # a generator over an open file: closes it

    def pieces(self, skip: Container[int] = ()) -> Iterator[Piece]:
        """Each segment not in `skip` (indices), in order, read as it is reached."""
        try:
            for segment in self.segments:
                if segment.index not in skip:
                    yield Piece(self.name, segment, self.read(segment))
        finally:
            self.close()


def open_recording(audio: str | Path | np.ndarray, model_rate: int, window_s: float, *, rate: int | None = None,
                   data: bytes | None = None, cap_seconds: float = MAX_RECORDING_SECONDS) -> Recording:
    """Plan a recording (a file, its `data` when read elsewhere, or a waveform at `rate`): one pass
    over it, bounded by `cap_seconds` (audio.MAX_RECORDING_SECONDS, 4 h)."""
    if isinstance(audio, (str, Path)):
        path = Path(audio)
        info = recording_info(path, data, cap_seconds)

        def blocks() -> Iterator[np.ndarray]:
            return mono_blocks(path, data, info, cap_seconds)

        name, native = str(audio), int(info.samplerate)
    else:
        if rate is None:
            raise ValueError("a waveform needs its sampling rate: segments(samples, rate=...)")
        mono = waveform_mono(audio, int(rate), cap_seconds=cap_seconds)

        def blocks() -> Iterator[np.ndarray]:
            return iter((mono,))

        name, native = "<waveform>", int(rate)
    with contextlib.closing(blocks()) as stream:
        spans = plan(stream, native, window_s, name=name)
    return Recording(name, native, spans, blocks, model_rate)
