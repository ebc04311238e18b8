"""What a clip sounds like, measured: the demo pair's labels (demo contract version 3).

A clip's label is what is measured in its audio, the same way for a synthetic training clip, a
held-out clip and a user's recording. The measures are Praat's algorithms, called through
`praat-parselmouth` (Praat's own code, not a re-implementation):

- **pitch**: median F0 of the voiced frames (Praat's autocorrelation pitch, `To Pitch (ac)`), in
  semitones from the speaker's gender's reference (男 120 Hz, 女 220 Hz);
- **rate**: syllable nuclei per second of phonation time, the algorithm of de Jong & Wempe (2009,
  "Praat script to detect syllable nuclei and measure speech rate automatically"): peaks of the
  intensity contour above a threshold set from its 99th percentile, each separated from the next by
  a dip of at least 2 dB, kept when voiced and inside speech; phonation time is the speech left
  when the silent intervals of Praat's `To TextGrid (silences)` are taken out;
- **volume**: the level of the speech (the samples of the sounding intervals) in dBFS;
- **pauses**: silent intervals of at least 250 ms between the first and the last syllable nucleus,
  counted and as a share of that span.

Each measure falls in a band or in the gap between two bands (*ambiguous*). The cut points live in
one file, `cut_points.json` beside this module, and every consumer (the corpus, the held-out sets,
this command) reads them from there. Gender is not measured: it is the speaker's declared gender
(F0 alone misorders 10 % of male/female pairs), and is left out where it is not known; pitch, which
is relative to the gender's reference, is then left out too.

    python -m specdec_cli.demo.measure DIR [--gender 女声 | --genders FILE]

writes `DIR/labels.jsonl`: per audio file its measures and the bands that are clear of the gaps
(the `labels` object `specdec eval` and `specdec calibrate` read; ambiguous attributes are listed
under `ambiguous` and left out of `labels`, and both score each attribute over the clips labelled
for it). It needs the measure extra: pip install 'specdec-omni[measure]'.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

import numpy as np

CUT_POINTS = Path(__file__).resolve().parent / "cut_points.json"
AMBIGUOUS = None  # the band of a measure that falls inside a gap

# de Jong & Wempe (2009)'s parameters, except the shortest pause: the contract counts pauses of
# 250 ms (their script's default is 300 ms).
SILENCE_DB = -25.0  # silence threshold below the intensity's 99th percentile
MIN_DIP_DB = 2.0  # dip between two peaks for both to count as nuclei
MIN_PAUSE_S = 0.25
MIN_SOUNDING_S = 0.1
INTENSITY_FLOOR_HZ = 50.0  # "minimum pitch" of To Intensity: sets its analysis window
PITCH_FLOOR_HZ, PITCH_CEILING_HZ = 60.0, 500.0  # F0 range for the pitch measure (both genders, shifted)
MEASURE_RATE = 16_000  # files are measured as the models hear them
MAX_MEASURE_S = 3600.0


@dataclass(frozen=True)
class Measures:
    """One clip's measures (gender-free: pitch is stored in Hz; `semitones` relates it to a gender)."""

    seconds: float
    f0_hz: float | None  # median F0 of voiced frames; None: no voiced frame
    syllables: int  # syllable nuclei (voiced intensity peaks inside speech)
    phonation_s: float  # sounding time (silences of >= MIN_PAUSE_S taken out)
    rate: float | None  # syllables per second of phonation; None: no speech
    level_dbfs: float | None  # level of the sounding samples; None: no speech
    pauses: int  # silent intervals >= MIN_PAUSE_S between the first and the last nucleus
    pause_s: float  # their total length
    span_s: float  # first to last nucleus
    pause_share: float  # pause_s / span_s (0 when span_s is 0)


@cache
def cut_points(path: Path = CUT_POINTS) -> dict:
    """The bands of every measured attribute (cut_points.json): per attribute its measure and, per
    phrase, the closed interval [lo, hi] it holds (null: unbounded); gaps lie between intervals."""
    data = json.loads(path.read_text(encoding="utf-8"))
    for attr, spec in data["bands"].items():
        bounds = [(lo if lo is not None else -math.inf, hi if hi is not None else math.inf)
                  for lo, hi in spec["bands"].values()]
        for (lo, hi), (lo2, _) in zip(bounds, bounds[1:], strict=False):
            if not lo <= hi < lo2:
                raise ValueError(f"{path}: {attr}'s bands overlap or are out of order")
    return data


def _praat():
    try:
        import parselmouth
        from parselmouth.praat import call
    except ImportError as e:  # the measure extra's one dependency (pyproject.toml), not the base install's
        raise SystemExit("error: measuring needs praat-parselmouth, in specdec's measure extra: "
                         "pip install 'specdec-omni[measure]'") from e
    return parselmouth, call


def measure(audio: np.ndarray, rate: int) -> Measures:
    """The clip's measures (mono float samples at `rate` Hz)."""
    parselmouth, call = _praat()
    x = np.asarray(audio, dtype=np.float64)
    seconds = len(x) / rate
    snd = parselmouth.Sound(x, sampling_frequency=rate)
    pitch = snd.to_pitch_ac(time_step=0.01, pitch_floor=PITCH_FLOOR_HZ, pitch_ceiling=PITCH_CEILING_HZ)
    f0 = pitch.selected_array["frequency"]
    f0_hz = float(np.median(f0[f0 > 0])) if np.any(f0 > 0) else None
    empty = Measures(round(seconds, 3), f0_hz, 0, 0.0, None, None, 0, 0.0, 0.0, 0.0)
    if seconds < 0.1 or not np.any(x):
        return empty

    # --- de Jong & Wempe (2009), step by step as their Praat script does it ---
    intensity, threshold, intervals = _silences(snd, call)
    sounding = [(a, b) for a, b, label in intervals if label == "sounding"]
    phonation = sum(b - a for a, b in sounding)

    contour = call(call(intensity, "Down to Matrix"), "To Sound (slice)", 1)
    peaks_pp = call(contour, "To PointProcess (extrema)", "Left", "yes", "no", "Sinc70")
    times = [call(peaks_pp, "Get time from index", k) for k in range(1, call(peaks_pp, "Get number of points") + 1)]
    peaks = [(t, v) for t in times if (v := call(contour, "Get value at time", t, "Cubic")) > threshold]
    # A peak is a nucleus when the intensity dips by more than MIN_DIP_DB between it and the next
    # peak. The 2009 script loops to the second-to-last peak only, so it never counts the last
    # syllable of a clip; here the last peak is judged by the dip between it and the contour's end.
    valid = []
    ends = [t for t, _ in peaks[1:]] + [intensity.xmax]
    for (t, v), t_next in zip(peaks, ends, strict=True):
        dip = call(intensity, "Get minimum", t, t_next, "None")
        if abs(v - dip) > MIN_DIP_DB:
            valid.append(t)
    # the script's own pitch settings for the voicing check (To Pitch (ac), floor 30 Hz, ceiling 450)
    voicing = call(snd, "To Pitch (ac)", 0.02, 30, 4, "no", 0.03, 0.25, 0.01, 0.35, 0.25, 450)
    nuclei = [t for t in valid
              if not math.isnan(call(voicing, "Get value at time", t, "Hertz", "Linear"))
              and any(a <= t <= b for a, b in sounding)]

    level = _level(x, rate, sounding)
    span = (nuclei[-1] - nuclei[0]) if len(nuclei) >= 2 else 0.0
    inner = [(a, b) for a, b, label in intervals
             if label == "silent" and nuclei and nuclei[0] < a and b < nuclei[-1]]
    pause_s = sum(b - a for a, b in inner)
    return Measures(
        seconds=round(seconds, 3), f0_hz=None if f0_hz is None else round(f0_hz, 2), syllables=len(nuclei),
        phonation_s=round(phonation, 3), rate=round(len(nuclei) / phonation, 3) if phonation > 0 else None,
        level_dbfs=None if level is None else round(level, 2), pauses=len(inner), pause_s=round(pause_s, 3),
        span_s=round(span, 3), pause_share=round(pause_s / span, 4) if span > 0 else 0.0,
    )


def _silences(snd, call) -> tuple[object, float, list[tuple[float, float, str]]]:
    """(Praat intensity, de Jong & Wempe's peak threshold, the silent/sounding intervals of Praat's
    `To TextGrid (silences)`), the thresholds set from the intensity's 99th percentile as their
    script does."""
    intensity = call(snd, "To Intensity", INTENSITY_FLOOR_HZ, 0.0, "yes")
    max_int = call(intensity, "Get maximum", 0, 0, "Parabolic")
    q99 = call(intensity, "Get quantile", 0, 0, 0.99)
    min_int = call(intensity, "Get minimum", 0, 0, "Parabolic")
    threshold = max(q99 + SILENCE_DB, min_int)
    threshold_tg = SILENCE_DB - (max_int - q99)  # To TextGrid (silences) is relative to the maximum
    grid = call(intensity, "To TextGrid (silences)", threshold_tg, MIN_PAUSE_S, MIN_SOUNDING_S, "silent", "sounding")
    intervals = [(call(grid, "Get start time of interval", 1, k), call(grid, "Get end time of interval", 1, k),
                  call(grid, "Get label of interval", 1, k))
                 for k in range(1, call(grid, "Get number of intervals", 1) + 1)]
    return intensity, threshold, intervals


def _level(x: np.ndarray, rate: int, sounding: list[tuple[float, float]]) -> float | None:
    """dBFS of the samples inside the sounding intervals (None: none)."""
    if not sounding:
        return None
    idx = np.concatenate([np.arange(int(a * rate), min(len(x), int(math.ceil(b * rate)))) for a, b in sounding])
    if not len(idx):
        return None
    rms = math.sqrt(float(np.mean(x[idx] ** 2)))
    return 20 * math.log10(max(rms, 1e-10))


def measure_level(audio: np.ndarray, rate: int) -> float | None:
    """The volume measure alone (`Measures.level_dbfs`, unrounded): the level of the sounding
    intervals, found as `measure` finds them. A fraction of `measure`'s cost (no pitch, no nuclei):
    demo contract v4 measures volume on the clip as heard, after its channel, and the rest before."""
    parselmouth, call = _praat()
    x = np.asarray(audio, dtype=np.float64)
    if len(x) / rate < 0.1 or not np.any(x):
        return None
    _, _, intervals = _silences(parselmouth.Sound(x, sampling_frequency=rate), call)
    return _level(x, rate, [(a, b) for a, b, label in intervals if label == "sounding"])


def semitones(f0_hz: float, gender: str) -> float:
    """F0 in semitones from the gender's reference (cut_points.json's `references`)."""
    ref = cut_points()["references_hz"][gender]
    return 12.0 * math.log2(f0_hz / ref)


def values(m: Measures, gender: str | None) -> dict[str, float | None]:
    """Per attribute, the number its band is read from (None: not measurable, or pitch without a
    gender)."""
    return {
        "pitch": semitones(m.f0_hz, gender) if (m.f0_hz and gender) else None,
        "rate": m.rate,
        "volume": m.level_dbfs,
        "pauses": m.pause_share if m.syllables >= 2 else None,
    }


def band(attr: str, value: float | None) -> str | None:
    """The phrase whose closed interval holds `value`; None (ambiguous) in a gap or unmeasurable."""
    if value is None:
        return AMBIGUOUS
    for phrase, (lo, hi) in cut_points()["bands"][attr]["bands"].items():
        if (lo is None or value >= lo) and (hi is None or value <= hi):
            return phrase
    return AMBIGUOUS


def emotion_of(rate: str | None, pitch: str | None) -> str | None:
    """Derived from the rate and pitch labels: fast and high -> 激动; slow and low -> 低落;
    otherwise 平静 (None when either is not known)."""
    if rate is None or pitch is None:
        return None
    if rate == "语速较快" and pitch == "音调偏高":
        return "情绪激动"
    if rate == "语速较慢" and pitch == "音调偏低":
        return "情绪低落"
    return "情绪平静"


def labels_of(m: Measures, gender: str | None) -> tuple[dict[str, str], list[str]]:
    """(labels clear of the gaps, ambiguous attributes). Gender is the given one (left out when
    None, and pitch and emotion with it)."""
    got: dict[str, str | None] = {"gender": gender}
    v = values(m, gender)
    for attr in ("rate", "pitch", "volume", "pauses"):
        got[attr] = band(attr, v[attr])
    got["emotion"] = emotion_of(got["rate"], got["pitch"])
    order = ("gender", "rate", "pitch", "volume", "pauses", "emotion")
    labels = {a: got[a] for a in order if got[a] is not None}
    ambiguous = [a for a in order if got[a] is None and not (a == "gender" or (gender is None and a in ("pitch", "emotion")))]
    return labels, ambiguous


def measure_file(path: Path) -> Measures:
    """Measure an audio file (any format soundfile or the project's decoders read; mixed to mono)."""
    from ..audio import load_audio

    return measure(load_audio(path, MEASURE_RATE, MAX_MEASURE_S), MEASURE_RATE)


GENDERS = {"男声": "男声", "女声": "女声", "male": "男声", "female": "女声", "m": "男声", "f": "女声"}


def write_labels(folder: Path, gender: str | None = None, genders: dict[str, str] | None = None,
                 out: Path | None = None) -> Path:
    """Measure every audio file of `folder` and write `labels.jsonl` there (or to `out`)."""
    from ..results import find_audio

    files = find_audio(folder, recursive=True).files
    lines = []
    for f in files:
        rel = f.relative_to(folder).as_posix()
        g = (genders or {}).get(rel, gender)
        m = measure_file(f)
        labels, ambiguous = labels_of(m, g)
        v = values(m, g)
        lines.append(json.dumps({"file": rel, "labels": labels, "ambiguous": ambiguous,
                                 "measures": {**asdict(m), "semitones": None if v["pitch"] is None else round(v["pitch"], 2)}},
                                ensure_ascii=False))
    target = out or folder / "labels.jsonl"
    target.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return target


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdec_cli.demo.measure", description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="a folder of audio files (searched recursively)")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--gender", help="the speakers' declared gender, for every file: 男声/女声 (or male/female)")
    g.add_argument("--genders", type=Path, metavar="FILE",
                   help='JSON Lines of {"file": "a.wav", "gender": "女声"} (files as under FOLDER)')
    ap.add_argument("--out", type=Path, default=None, help="where to write (default FOLDER/labels.jsonl)")
    args = ap.parse_args(argv)
    if not args.folder.is_dir():
        print(f"error: {args.folder} is not a folder: give a folder of audio files", file=sys.stderr)
        return 2
    genders = None
    gender = None
    if args.gender:
        if args.gender not in GENDERS:
            print(f"error: --gender {args.gender!r}: use 男声 or 女声 (male/female)", file=sys.stderr)
            return 2
        gender = GENDERS[args.gender]
    if args.genders:
        genders = {}
        for n, line in enumerate(args.genders.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            entry = json.loads(line)
            if entry.get("gender") not in GENDERS:
                print(f"error: {args.genders}:{n}: gender must be 男声 or 女声", file=sys.stderr)
                return 2
            genders[entry["file"]] = GENDERS[entry["gender"]]
    print(write_labels(args.folder, gender, genders, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
