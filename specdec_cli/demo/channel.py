"""The channel a clip comes through (demo contract version 4): the line, codec, room, microphone and
noise between a speaker and the file a user hands us.

A channel is a list of steps, each a small JSON-able dict (recorded in the corpus's clip list), drawn
by `draw(rng, family)` and applied by `apply(x, steps)` to 16 kHz mono float32 audio; the output is
16 kHz mono float32 again, as the models hear it. Every step is done by the field's own tools:

- source rate: soxr (the project's resampler) down to the source rate and back up: what a file
  recorded at 8 / 11.025 / 22.05 / 44.1 / 48 kHz sounds like once resampled to 16 kHz;
- telephone: sox's `sinc 300-3400` band and 8 kHz, then G.711 μ-law or A-law or GSM 6.10 (sox's
  own encoders), decoded back;
- low bit-rate codecs: Opus (8-24 kb/s), MP3 (32-128 kb/s) and AAC (32-96 kb/s) through PyAV's
  ffmpeg (already the project's decoder for m4a), encoded into and decoded from an in-memory file;
- rooms: a shoebox impulse response from pyroomacoustics (image source method, absorption from a
  drawn RT60 by Sabine's formula), convolved;
- microphone colouration: pedalboard's high-pass, peak and shelf filters;
- noise at 5-30 dB SNR relative to the speech: white, pink, or babble made from other clips;
- gain and clipping: pedalboard's `Clipping`.

Only the composition of these parts (which draw, which order, the SNR arithmetic) is written here:
no maintained library draws a whole channel for a speech corpus with labels kept apart.
"""

from __future__ import annotations

import io
import math
import random
import subprocess
from collections.abc import Callable, Sequence

import numpy as np

RATE = 16_000
# The evaluation families (demo contract v4: each measured apart) and what training draws from.
# "source_rate" and "noisy" are training-only families: the evaluation's telephone family holds the
# band limit, its far field the noise.
EVAL_FAMILIES = ("clean", "telephone", "codec", "room", "far_field")
TRAIN_WEIGHTS = {"clean": 0.16, "source_rate": 0.12, "telephone": 0.22, "codec": 0.14, "room": 0.10,
                 "far_field": 0.10, "noisy": 0.10, "mic": 0.06}
SOURCE_RATES = (8_000, 11_025, 22_050, 44_100, 48_000)
TELEPHONE_CODECS = ("u-law", "a-law", "gsm", "pcm")  # pcm: the band and 8 kHz alone
NOISE_KINDS = ("white", "pink", "babble")


# --------------------------------------------------------------------------------------------- draws
def _mic(rng: random.Random) -> dict:
    """A microphone's colouration: a high-pass (small capsules, phones' wind filters), two peaks or
    dips, and a high shelf (presence or dullness)."""
    return {"op": "mic", "highpass_hz": round(rng.uniform(60, 400), 1),
            "peaks": [[round(rng.uniform(300, 6000), 1), round(rng.uniform(-8, 8), 2), round(rng.uniform(0.5, 2.5), 2)]
                      for _ in range(2)],
            "shelf_db": round(rng.uniform(-10, 6), 2)}


def _noise(rng: random.Random, snr: tuple[float, float], kinds: Sequence[str] = NOISE_KINDS) -> dict:
    return {"op": "noise", "kind": rng.choice(kinds), "snr_db": round(rng.uniform(*snr), 2), "seed": rng.randrange(2**31)}


def _room(rng: random.Random) -> dict:
    dims = [round(rng.uniform(3, 10), 2), round(rng.uniform(3, 8), 2), round(rng.uniform(2.4, 4), 2)]
    return {"op": "room", "dims": dims, "rt60_s": round(rng.uniform(0.2, 0.9), 3), "seed": rng.randrange(2**31),
            "distance_m": round(rng.uniform(0.5, 3.0), 2)}


def draw(rng: random.Random, family: str | None = None, *, babble: bool = True) -> list[dict]:
    """A channel of `family` (None: a family drawn with TRAIN_WEIGHTS), as its list of steps.
    `babble`: whether noise may be babble (needs other clips to make it from)."""
    if family is None:
        family = rng.choices(list(TRAIN_WEIGHTS), weights=list(TRAIN_WEIGHTS.values()))[0]
    kinds = NOISE_KINDS if babble else NOISE_KINDS[:2]
    steps: list[dict] = [{"op": "family", "name": family}]
    if family == "clean":
        return steps
    if family == "source_rate":
        steps.append({"op": "source_rate", "hz": rng.choice(SOURCE_RATES)})
    elif family == "telephone":
        if rng.random() < 0.3:  # a noisy line or a noisy room behind the handset
            steps.append(_noise(rng, (10.0, 30.0), kinds))
        steps.append({"op": "telephone", "codec": rng.choice(TELEPHONE_CODECS)})
    elif family == "codec":
        codec = rng.choice(("opus", "mp3", "aac"))
        kbps = {"opus": (8, 24), "mp3": (32, 128), "aac": (32, 96)}[codec]
        steps.append({"op": "codec", "codec": codec, "kbps": rng.randint(*kbps)})
    elif family == "room":
        steps.append(_room(rng))
    elif family == "far_field":
        steps += [_room(rng), _noise(rng, (5.0, 20.0), kinds)]
    elif family == "noisy":
        steps.append(_noise(rng, (5.0, 30.0), kinds))
    elif family == "mic":
        steps.append(_mic(rng))
    else:
        raise ValueError(f"unknown channel family {family!r}")
    if family not in ("mic", "telephone") and rng.random() < 0.2:
        steps.insert(1, _mic(rng))  # any device colours what it records
    if rng.random() < 0.05:
        steps.append({"op": "clip", "drive_db": round(rng.uniform(3, 12), 2)})
    return steps


def family_of(steps: Sequence[dict]) -> str:
    return next((s["name"] for s in steps if s["op"] == "family"), "clean")


def band_limited(steps: Sequence[dict]) -> bool:
    """Whether the channel removes what lies above 4 kHz (a telephone line, a source at <= 8 kHz)."""
    return any(s["op"] == "telephone" or (s["op"] == "source_rate" and s["hz"] <= 8_000) for s in steps)


# --------------------------------------------------------------------------------------------- steps
def _resample(x: np.ndarray, src: int, dst: int) -> np.ndarray:
    from ..audio import resample

    return resample(x, src, dst).astype(np.float32)


def _sox(x: np.ndarray, args_in: list[str], effects_out: list[str]) -> bytes:
    fmt = ["-t", "f32", "-r", str(RATE), "-c", "1"]
    return subprocess.run(["sox", *fmt, "-", *args_in, "-", *effects_out], input=x.astype(np.float32).tobytes(),
                          capture_output=True, check=True).stdout


def telephone(x: np.ndarray, codec: str) -> np.ndarray:
    """300-3400 Hz at 8 kHz through G.711 (μ-law, A-law), GSM 6.10 or plain 16-bit PCM, by sox;
    decoded back to 16 kHz float32."""
    enc = {"u-law": ["-t", "wav", "-e", "u-law", "-b", "8"], "a-law": ["-t", "wav", "-e", "a-law", "-b", "8"],
           "gsm": ["-t", "gsm"], "pcm": ["-t", "wav", "-e", "signed-integer", "-b", "16"]}[codec]
    # -G: sox guards the band filter's output against clipping by lowering the gain where needed
    coded = subprocess.run(["sox", "-G", "-t", "f32", "-r", str(RATE), "-c", "1", "-", "-r", "8000", *enc, "-",
                            "sinc", "300-3400"], input=x.astype(np.float32).tobytes(),
                           capture_output=True, check=True).stdout
    kind = ["-t", "gsm", "-r", "8000", "-c", "1"] if codec == "gsm" else ["-t", "wav"]
    out = subprocess.run(["sox", *kind, "-", "-t", "f32", "-r", str(RATE), "-c", "1", "-"], input=coded,
                         capture_output=True, check=True).stdout
    y = np.frombuffer(out, dtype=np.float32)
    return _fit(y, len(x))


def codec(x: np.ndarray, name: str, kbps: int) -> np.ndarray:
    """Encode with PyAV's ffmpeg (Opus in Ogg, MP3, AAC in ADTS) at `kbps` into memory and decode it
    back, resampled to 16 kHz by ffmpeg's resampler."""
    import av

    codec_name, container, rate = {"opus": ("libopus", "ogg", 48_000), "mp3": ("libmp3lame", "mp3", 16_000),
                                   "aac": ("aac", "adts", 16_000)}[name]
    buf = io.BytesIO()
    with av.open(buf, "w", format=container) as out:
        stream = out.add_stream(codec_name, rate=rate, layout="mono")
        stream.bit_rate = kbps * 1000
        frame = av.AudioFrame.from_ndarray(x.astype(np.float32)[None, :], format="flt", layout="mono")
        frame.sample_rate = RATE
        resampler = av.AudioResampler(format=stream.codec_context.format.name, layout="mono", rate=rate)
        for f in [*resampler.resample(frame), *resampler.resample(None)]:
            for packet in stream.encode(f):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    buf.seek(0)
    pieces = []
    with av.open(buf, "r") as inp:
        back = av.AudioResampler(format="flt", layout="mono", rate=RATE)
        for frame in inp.decode(audio=0):
            pieces += [f.to_ndarray()[0] for f in back.resample(frame)]
        pieces += [f.to_ndarray()[0] for f in back.resample(None)]
    y = np.concatenate(pieces).astype(np.float32) if pieces else np.zeros(0, np.float32)
    # codecs add a priming delay at the start (Opus 312 samples at 48 kHz, MP3/AAC ~1-2k): cut it by
    # the lag of the cross-correlation's peak, so the clip's timing (pauses) is the speaker's
    lag = _lag(x, y)
    return _fit(y[lag:], len(x))


def _lag(x: np.ndarray, y: np.ndarray, max_lag: int = 4096) -> int:
    from scipy.signal import correlate

    n = min(len(x), len(y), 4 * RATE)
    if n <= max_lag:
        return 0
    c = correlate(y[:n + max_lag], x[:n], mode="valid", method="fft")
    return int(np.argmax(np.abs(c[:max_lag + 1])))


def room(x: np.ndarray, dims: list[float], rt60_s: float, seed: int, distance_m: float) -> np.ndarray:
    """Convolve with a shoebox room's impulse response (pyroomacoustics, image source method up to
    the order Sabine's formula asks for, capped): source and microphone at `distance_m` apart,
    placed at random (seeded) inside the room. The direct path's delay is taken out."""
    import pyroomacoustics as pra
    from scipy.signal import fftconvolve

    rng = np.random.default_rng(seed)
    absorption, order = pra.inverse_sabine(rt60_s, dims)
    r = pra.ShoeBox(dims, fs=RATE, materials=pra.Material(absorption), max_order=min(order, 14))
    margin = 0.5
    lo, hi = np.full(3, margin), np.asarray(dims) - margin
    for _ in range(100):
        src = rng.uniform(lo, hi)
        direction = rng.normal(size=3)
        direction[2] *= 0.2
        mic = src + distance_m * direction / np.linalg.norm(direction)
        if np.all(mic > lo) and np.all(mic < hi):
            break
    else:
        mic = (lo + hi) / 2
    r.add_source(src.tolist())
    r.add_microphone(mic.tolist())
    r.compute_rir()
    h = np.asarray(r.rir[0][0], dtype=np.float64)
    start = max(0, int(np.argmax(np.abs(h))) - 40)  # keep a few samples before the direct path
    h = h[start:]
    h /= np.max(np.abs(h)) + 1e-12
    return fftconvolve(x.astype(np.float64), h)[:len(x)].astype(np.float32)


def mic(x: np.ndarray, highpass_hz: float, peaks: list[list[float]], shelf_db: float) -> np.ndarray:
    from pedalboard import HighpassFilter, HighShelfFilter, PeakFilter, Pedalboard

    board = Pedalboard([HighpassFilter(cutoff_frequency_hz=highpass_hz),
                        *[PeakFilter(cutoff_frequency_hz=f, gain_db=g, q=q) for f, g, q in peaks],
                        HighShelfFilter(cutoff_frequency_hz=4000.0, gain_db=shelf_db)])
    return board(x.astype(np.float32)[None, :], RATE)[0]


def clip(x: np.ndarray, drive_db: float) -> np.ndarray:
    """Driven `drive_db` over full scale and hard-clipped at 0 dBFS (a hot input stage)."""
    from pedalboard import Clipping, Gain, Pedalboard

    peak = float(np.max(np.abs(x))) or 1.0
    to_full = -20 * math.log10(peak)
    return Pedalboard([Gain(gain_db=to_full + drive_db), Clipping(threshold_db=0.0)])(x.astype(np.float32)[None, :], RATE)[0]


def noise(x: np.ndarray, speech_power: float, kind: str, snr_db: float, seed: int,
          babble: Callable[[int, np.random.Generator], np.ndarray] | None) -> np.ndarray:
    """Noise `snr_db` below `speech_power` (the speech's mean power over its sounding part)."""
    from .corpus import _noise as coloured

    rng = np.random.default_rng(seed)
    if kind == "babble" and babble is not None:
        n = babble(len(x), rng)
        n = n / (np.sqrt(np.mean(n.astype(np.float64) ** 2)) + 1e-12)
    else:
        n = coloured("pink" if kind == "babble" else kind, len(x), rng)
    return (x + math.sqrt(speech_power / 10 ** (snr_db / 10)) * n).astype(np.float32)


def _fit(y: np.ndarray, n: int) -> np.ndarray:
    y = np.asarray(y, dtype=np.float32)
    return y[:n] if len(y) >= n else np.concatenate([y, np.zeros(n - len(y), np.float32)])


def apply(x: np.ndarray, steps: Sequence[dict], speech_power: float,
          babble: Callable[[int, np.random.Generator], np.ndarray] | None = None) -> np.ndarray:
    """`x` (16 kHz mono float32) through the channel `steps`. `speech_power`: the clean speech's
    mean power (noise SNRs are relative to it); `babble(n, rng)`: n samples of other speakers
    (None: babble falls back to pink noise)."""
    y = np.asarray(x, dtype=np.float32)
    for s in steps:
        op = s["op"]
        if op == "family":
            continue
        if op == "source_rate":
            y = _fit(_resample(_resample(y, RATE, s["hz"]), s["hz"], RATE), len(x))
        elif op == "telephone":
            y = telephone(y, s["codec"])
        elif op == "codec":
            y = codec(y, s["codec"], s["kbps"])
        elif op == "room":
            y = room(y, s["dims"], s["rt60_s"], s["seed"], s["distance_m"])
        elif op == "mic":
            y = mic(y, s["highpass_hz"], s["peaks"], s["shelf_db"])
        elif op == "noise":
            y = noise(y, speech_power, s["kind"], s["snr_db"], s["seed"], babble)
        elif op == "clip":
            y = clip(y, s["drive_db"])
        else:
            raise ValueError(f"unknown channel step {op!r}")
    return y.astype(np.float32)
