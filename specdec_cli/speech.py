"""Whether a clip holds speech, before a speaker is described (issue 52): Silero VAD, the model its
`silero-vad` wheel ships (no download), run on the CPU in this process.

Why Silero and not WebRTC's VAD (measured here, bench/vad.py, docs/results/vad.json, docs/usage.md
"Bad input"): on 18 non-speech clips (tones, a dial tone, a busy signal, DTMF, chords and melodies,
white/pink/brown noise, laughter-like bursts, clicks) WebRTC's detector called 15 speech (a 350+440 Hz
dial tone and white noise wholly), while Silero found at most 0.06 s of speech in any; on 59 speech
clips (the bundled samples, 40 held-out demo clips, one-word espeak-ng clips of 0.4-1.4 s, speech over
music at 0-12 dB) Silero found at least 0.19 s in each. WebRTC costs almost nothing; Silero about
22 ms of one core per second of audio on this shared machine, and a clip is read only until enough
speech is found (a clip of speech: its first second or so).

A clip holds speech when the detector says so (probability >= THRESHOLD, Silero's default) for at
least MIN_SPEECH_S in all, counted in its 32 ms frames. `--segment` uses the frames too: it cuts in
stretches without speech and leaves out segments without enough of it (segments.py).

The model is TorchScript, read with torch.jit.load (a file load, no compiling); one per thread, as
it keeps state between frames (the server describes in threads). Importing silero_vad sets torch to
one thread for the whole process; that is undone here, and the detector runs on one thread (its
frames are 512 samples: a pool of threads costs more than it saves, and on a busy machine much more).
"""

from __future__ import annotations

import contextlib
import math
import threading
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING

from .errors import InputError

if TYPE_CHECKING:
    import numpy as np

RATE = 16000          # Silero's rate (it also takes 8 kHz); clips at another rate are resampled for it
FRAME = 512           # samples per decision at RATE (32 ms): the only frame Silero takes at 16 kHz
THRESHOLD = 0.5       # Silero's own default for "speech"
# Less speech than this and a clip is not described. Measured (bench/vad.py): at most 0.06 s on the
# non-speech clips (0.10 s on another melody tried while choosing), at least 0.19 s on a one-syllable
# espeak-ng word ("是", 0.58 s).
MIN_SPEECH_S = 0.15
FRAME_S = FRAME / RATE


class NoSpeech(InputError):
    """A clip without enough speech to describe a speaker."""


_local = threading.local()


def _detector():  # -> Silero's TorchScript model, this thread's
    model = getattr(_local, "model", None)
    if model is None:
        import torch

        threads = torch.get_num_threads()
        with warnings.catch_warnings():  # its loader's deprecations (importlib.resources.path, torch.jit.load)
            warnings.simplefilter("ignore", DeprecationWarning)
            try:
                from silero_vad import load_silero_vad  # sets torch.set_num_threads(1) on import
            finally:
                torch.set_num_threads(threads)
            model = _local.model = load_silero_vad()
    return model


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            yield
    finally:
        torch.set_num_threads(threads)


def at_rate(mono: np.ndarray, rate: int) -> np.ndarray:
    """`mono` at the detector's rate (soxr, as audio.resample)."""
    import numpy as np

    if rate == RATE:
        return np.ascontiguousarray(mono, dtype=np.float32)
    import soxr

    return soxr.resample(np.asarray(mono, dtype=np.float32), rate, RATE, quality="soxr_hq").astype(np.float32)


def probabilities(mono: np.ndarray, rate: int = RATE, enough_s: float | None = None) -> np.ndarray:
    """Silero's speech probability for each 32 ms frame of `mono` (at `rate`; the last frame
    zero-padded). With `enough_s`, it stops at the frame where that much speech has been found
    (the rest are not computed: fewer probabilities than frames)."""
    import numpy as np
    import torch

    x = at_rate(mono, rate)
    x = np.pad(x, (0, (-len(x)) % FRAME))
    frames = torch.from_numpy(x).reshape(-1, FRAME)
    need = math.inf if enough_s is None else math.ceil(enough_s / FRAME_S - 1e-9)
    out: list[float] = []
    found = 0
    model = _detector()
    with _one_thread():
        model.reset_states()
        for frame in frames:
            p = float(model(frame[None], RATE))
            out.append(p)
            found += p >= THRESHOLD
            if found >= need:
                break
    return np.asarray(out, dtype=np.float32)


def speech_seconds(mono: np.ndarray, rate: int = RATE, enough_s: float | None = None) -> float:
    """Seconds of speech in `mono` (frames the detector calls speech x 32 ms); with `enough_s`,
    counted only until that much is found."""
    return float((probabilities(mono, rate, enough_s) >= THRESHOLD).sum()) * FRAME_S


def check_speech(mono: np.ndarray, rate: int, name: object) -> None:
    """NoSpeech (one line: how much speech was found, what to do) when `mono` at `rate` holds less
    than MIN_SPEECH_S of speech."""
    found = speech_seconds(mono, rate, MIN_SPEECH_S)
    if found < MIN_SPEECH_S:
        seconds = len(mono) / rate
        raise NoSpeech(f"{name} holds no speech to describe: a voice-activity detector found {found:.2f} s of "
                       f"speech in its {seconds:.2f} s (at least {MIN_SPEECH_S:g} s needed; music, tones and "
                       "noise hold none); give a recording of someone speaking")
