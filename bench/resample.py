"""What a clip that is not at the model's 16 kHz costs (issue 44, point 3): whole-process `specdec
describe` wall time for the same clip at 16, 44.1 and 48 kHz, each run a fresh process.

    python bench/resample.py [--clip samples/f_mid_mid_loud.wav] [--rounds 3] [--specdec PATH] [--json]

The clip is resampled with soxr to 44.1 and 48 kHz and written as 16-bit WAV (what a phone or a
recorder gives), so the three files hold the same seconds of the same speech. Each round describes
the three, in turn, in three fresh `specdec describe --quiet` processes (bundled demo pair, default
preset): the first round is the first run a new user sees. Every process gets an empty numba cache
(NUMBA_CACHE_DIR, a fresh temporary folder), so a resampler that compiles with numba pays its JIT in
every run, as it did once per machine before (`--numba-cache shared` keeps the machine's cache).
It prints, per clip, the first run's and the median wall seconds, and each rate's ratio to 16 kHz
(the goal: at most 1.10). Runs inherit the environment (PYTHONPATH picks the code measured).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RATES = (16000, 44100, 48000)


def make_clips(clip: Path, folder: Path) -> dict[int, Path]:
    """The clip at each of RATES, 16-bit WAV, same length (soxr: no JIT in the bench itself)."""
    import soundfile as sf
    import soxr

    audio, rate = sf.read(str(clip), dtype="float32")
    clips = {}
    for target in RATES:
        path = folder / f"clip_{target}.wav"
        samples = audio if target == rate else soxr.resample(audio, rate, target, quality="HQ")
        sf.write(str(path), samples, target, subtype="PCM_16")
        clips[target] = path
    return clips


def run_once(specdec: str, clip: Path, fresh_numba_cache: bool) -> float:
    """Wall seconds of one `specdec describe --quiet CLIP` process, start to exit."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    with tempfile.TemporaryDirectory(prefix="numba-") as cache:
        if fresh_numba_cache:
            env["NUMBA_CACHE_DIR"] = cache
        start = time.perf_counter()
        done = subprocess.run([specdec, "describe", str(clip), "--quiet"], env=env, capture_output=True,
                              text=True, timeout=900)
        seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"specdec describe {clip} failed ({done.returncode}): {done.stderr.strip()}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clip", type=Path, default=REPO / "samples" / "f_mid_mid_loud.wav")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--specdec", default=shutil.which("specdec") or str(Path(sys.executable).parent / "specdec"))
    parser.add_argument("--numba-cache", choices=["fresh", "shared"], default="fresh")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="resample-bench-") as folder:
        clips = make_clips(args.clip, Path(folder))
        times: dict[int, list[float]] = {rate: [] for rate in RATES}
        for _ in range(args.rounds):  # interleaved: a load spike hits every rate alike
            for rate in RATES:
                times[rate].append(run_once(args.specdec, clips[rate], args.numba_cache == "fresh"))

    base_first, base_median = times[16000][0], statistics.median(times[16000])
    report = {"clip": str(args.clip), "rounds": args.rounds, "numba_cache": args.numba_cache,
              "pythonpath": os.environ.get("PYTHONPATH", ""),
              "rates": {str(rate): {"runs_s": [round(t, 2) for t in ts], "first_s": round(ts[0], 2),
                                    "median_s": round(statistics.median(ts), 2),
                                    "first_ratio": round(ts[0] / base_first, 3),
                                    "median_ratio": round(statistics.median(ts) / base_median, 3)}
                        for rate, ts in times.items()}}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"specdec describe --quiet, whole process, {args.rounds} rounds, numba cache {args.numba_cache}")
    print(f"{'rate':>8}  {'first s':>8}  {'median s':>8}  {'first ×16k':>10}  {'median ×16k':>11}")
    for rate, row in report["rates"].items():
        print(f"{rate:>8}  {row['first_s']:>8.2f}  {row['median_s']:>8.2f}  {row['first_ratio']:>10.3f}  "
              f"{row['median_ratio']:>11.3f}")


if __name__ == "__main__":
    main()
