"""Which voice-activity detector decides whether a clip holds speech (issue 52, point 1): Silero VAD
(the `silero-vad` wheel's model, what specdec uses: specdec_cli/speech.py) against WebRTC's
(`webrtcvad-wheels`, the light one; measured only where it is installed), on clips that hold no
speech and clips that do.

    python bench/vad.py [--heldout DIR] [--json OUT]

No speech: tones (0.1 s at 200 Hz, as issue 52 found described), a 350+440 Hz dial tone, a busy
signal, DTMF digits, a sweep, synthesized chords and a melody (harmonic notes with decaying
envelopes), white, pink and brown noise, laughter-like bursts ("ha" at 5 a second: band-passed
breath noise and a voiced part), clicks. Speech: every bundled sample (samples/), short espeak-ng
words of 0.4-1.4 s (where espeak-ng is installed), a sample over chords at 0, 6 and 12 dB, and the
clips of DIR (e.g. `python -m specdec_cli.demo.heldout DIR --clips 40`). For each clip: seconds of
speech each detector finds (Silero: 32 ms frames with probability >= 0.5, counted as specdec counts
them; WebRTC: 30 ms frames, its most aggressive mode 3), and each detector's CPU seconds. The
signals are made here with numpy and fixed seeds; tests/test_speech_check.py uses them too.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SR = 16000


def _t(seconds: float) -> np.ndarray:
    return np.arange(int(SR * seconds)) / SR


def _sine(hz: float, seconds: float, amplitude: float = 0.3) -> np.ndarray:
    return amplitude * np.sin(2 * np.pi * hz * _t(seconds))


def _note(hz: float, seconds: float, amplitude: float = 0.2, harmonics: int = 6) -> np.ndarray:
    """A plucked note: harmonics falling 0.6 each, 10 ms attack, exponential decay."""
    t = _t(seconds)
    x = sum((0.6 ** k) * np.sin(2 * np.pi * hz * (k + 1) * t) for k in range(harmonics))
    envelope = np.minimum(1.0, t / 0.01) * np.exp(-t / (seconds / 2))
    return amplitude / 2 * x * envelope


def chords(seconds: float = 4.0) -> np.ndarray:
    """C, Am, F, G: four triads of plucked notes."""
    progression = [(262, 330, 392), (220, 262, 330), (175, 220, 262), (196, 247, 294)]
    return np.concatenate([sum(_note(f, seconds / 4, 0.2 / 1.5) for f in c) for c in progression])


def melody(seconds: float = 4.0, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    scale = [262, 294, 330, 349, 392, 440, 494, 523]
    return np.concatenate([_note(scale[rng.integers(8)], 0.5) for _ in range(int(seconds / 0.5))])


def laughter(seconds: float = 2.0, voiced: float = 0.5, seed: int = 0) -> np.ndarray:
    """'ha-ha-ha': 120 ms bursts 5 times a second, breath noise band-passed to 600-2500 Hz mixed
    with a voiced part (F0 ~280 Hz, 8 harmonics), each under a Hann window."""
    from scipy.signal import butter, lfilter

    rng = np.random.default_rng(seed)
    out = np.zeros(int(SR * seconds))
    burst = int(0.12 * SR)
    b, a = butter(2, [600 / (SR / 2), 2500 / (SR / 2)], btype="band")
    tt = np.arange(burst) / SR
    for i in range(0, len(out) - burst, SR // 5):
        noise = lfilter(b, a, rng.standard_normal(burst))
        f0 = 280 + 30 * rng.standard_normal()
        tone = sum((0.5 ** k) * np.sin(2 * np.pi * f0 * (k + 1) * tt) for k in range(8))
        part = (1 - voiced) * noise / np.abs(noise).max() + voiced * tone / np.abs(tone).max()
        out[i:i + burst] += 0.3 * part * np.hanning(burst)
    return out


def no_speech() -> dict[str, np.ndarray]:
    """Clips that hold no speech, name -> 16 kHz mono float32."""
    rng = np.random.default_rng(0)
    dtmf = []
    for _ in range(10):
        low, high = [(697, 1209), (770, 1336), (852, 1477), (941, 1336)][rng.integers(4)]
        dtmf += [_sine(low, 0.1, 0.15) + _sine(high, 0.1, 0.15), np.zeros(SR // 10)]
    white = rng.standard_normal(3 * SR)
    spectrum = np.fft.rfft(rng.standard_normal(3 * SR))
    pink = np.fft.irfft(spectrum / np.sqrt(np.maximum(np.arange(len(spectrum)), 1)), 3 * SR)
    brown = np.cumsum(rng.standard_normal(3 * SR))
    t3 = _t(3)
    clips = {
        "tone 200 Hz 0.1 s": _sine(200, 0.1),
        "tone 440 Hz 1 s": _sine(440, 1),
        "tone 1 kHz 3 s": _sine(1000, 3),
        "tone 140 Hz + noise 1 s": _sine(140, 1) + 0.03 * rng.standard_normal(SR),
        "sweep 100-3100 Hz 3 s": 0.3 * np.sin(2 * np.pi * (100 * t3 + 500 * t3**2)),
        "dial tone 350+440 Hz 3 s": _sine(350, 3, 0.15) + _sine(440, 3, 0.15),
        "busy signal 480+620 Hz 3 s": (_sine(480, 3, 0.15) + _sine(620, 3, 0.15)) * (np.floor(t3 / 0.5) % 2 == 0),
        "DTMF digits 2 s": np.concatenate(dtmf),
        "chords 4 s": chords(4),
        "chords 8 s": chords(8),
        "melody 4 s": melody(4),
        "melody 8 s": melody(8, seed=1),
        "white noise 3 s": 0.1 * white,
        "pink noise 3 s": 0.2 * pink / np.abs(pink).max(),
        "brown noise 3 s": 0.3 * brown / np.abs(brown).max(),
        "laughter-like, breathy 2 s": laughter(voiced=0.2),
        "laughter-like, voiced 2 s": laughter(voiced=0.7, seed=1),
        "clicks 2 s": np.where(rng.random(2 * SR) < 0.002, 0.5, 0.0),
    }
    return {name: x.astype(np.float32) for name, x in clips.items()}


def read16k(path: Path) -> np.ndarray:
    import soundfile as sf
    import soxr

    x, rate = sf.read(str(path), dtype="float32", always_2d=True)
    x = x.mean(axis=1)
    return (soxr.resample(x, rate, SR) if rate != SR else x).astype(np.float32)


def espeak(text: str, voice: str = "cmn", speed: int = 175) -> np.ndarray | None:
    """A short espeak-ng clip at 16 kHz, or None without espeak-ng."""
    if shutil.which("espeak-ng") is None:
        return None
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "say.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-w", str(out), text], check=True)
        return read16k(out)


# Short words (0.4-1.4 s), as a person answering a question would say them.
WORDS = [("你好", "cmn", 175), ("是", "cmn", 175), ("谢谢", "cmn", 220), ("yes", "en", 175),
         ("hello", "en", 175), ("okay", "en", 260), ("下午好", "cmn+m3", 175)]


def speech(heldout: Path | None = None) -> dict[str, np.ndarray]:
    """Clips that hold speech, name -> 16 kHz mono float32."""
    clips = {f"sample {p.name}": read16k(p) for p in sorted((REPO / "samples").glob("*.wav"))}
    for text, voice, speed in WORDS:
        said = espeak(text, voice, speed)
        if said is not None:
            clips[f"espeak-ng {voice} {text!r}"] = said
    voice = read16k(REPO / "samples" / "m_slow_mid.wav")
    music = np.resize(chords(8), len(voice))
    for snr in (0, 6, 12):
        scale = np.sqrt(np.mean(voice**2) / np.mean(music**2)) * 10 ** (-snr / 20)
        clips[f"sample over chords, {snr} dB"] = (voice + scale * music).astype(np.float32)
    if heldout is not None:
        clips.update({f"{heldout.name}/{p.name}": read16k(p) for p in sorted(heldout.glob("*.wav"))})
    return clips


def webrtc_seconds(x: np.ndarray, mode: int = 3) -> float | None:
    try:
        import webrtcvad
    except ImportError:
        return None
    vad, frame = webrtcvad.Vad(mode), int(0.03 * SR)
    pcm = (np.clip(x, -1, 1) * 32767).astype(np.int16)
    return 0.03 * sum(vad.is_speech(pcm[i:i + frame].tobytes(), SR) for i in range(0, len(pcm) - frame + 1, frame))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heldout", type=Path, help="a folder of more speech clips (WAV)")
    parser.add_argument("--json", type=Path, help="write the measurements here")
    args = parser.parse_args(argv)
    from specdec_cli.speech import MIN_SPEECH_S, speech_seconds

    rows = []
    cost = {"silero": 0.0, "webrtc": 0.0}
    for kind, clips in (("no speech", no_speech()), ("speech", speech(args.heldout))):
        for name, x in clips.items():
            a = time.process_time()
            silero = speech_seconds(x, SR)
            b = time.process_time()
            webrtc = webrtc_seconds(x)
            cost["silero"] += b - a
            cost["webrtc"] += time.process_time() - b
            rows.append({"kind": kind, "clip": name, "seconds": round(len(x) / SR, 3), "silero_s": round(silero, 3),
                         "webrtc_s": None if webrtc is None else round(webrtc, 3)})
            print(f"{kind:9} {name:34} {len(x) / SR:6.2f} s  silero {silero:6.2f}  webrtc "
                  f"{'-' if webrtc is None else f'{webrtc:6.2f}'}")
    audio_s = sum(r["seconds"] for r in rows)
    summary = {
        "min_speech_s": MIN_SPEECH_S,
        "audio_s": round(audio_s, 1),
        "silero_cpu_s": round(cost["silero"], 2),
        "webrtc_cpu_s": round(cost["webrtc"], 2) if rows[0]["webrtc_s"] is not None else None,
        "silero_most_on_no_speech_s": max(r["silero_s"] for r in rows if r["kind"] == "no speech"),
        "silero_least_on_speech_s": min(r["silero_s"] for r in rows if r["kind"] == "speech"),
        "silero_refused_speech": [r["clip"] for r in rows if r["kind"] == "speech" and r["silero_s"] < MIN_SPEECH_S],
        "silero_passed_no_speech": [r["clip"] for r in rows
                                    if r["kind"] == "no speech" and r["silero_s"] >= MIN_SPEECH_S],
    }
    if rows[0]["webrtc_s"] is not None:
        summary["webrtc_passed_no_speech"] = [r["clip"] for r in rows
                                              if r["kind"] == "no speech" and r["webrtc_s"] >= MIN_SPEECH_S]
    print(json.dumps(summary, ensure_ascii=False, indent=1))
    if args.json is not None:
        args.json.write_text(json.dumps({"summary": summary, "clips": rows}, ensure_ascii=False, indent=1) + "\n")
    return summary


if __name__ == "__main__":
    sys.exit(0 if main() is not None else 1)
