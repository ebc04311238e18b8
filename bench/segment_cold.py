"""Whether `--segment`'s first run pays a JIT (issue 52, point 4): whole-process `specdec describe
--segment` wall time for a 45 s recording, the first run with an empty numba cache against warm
runs that share one.

    python bench/segment_cold.py [--rounds 3] [--specdec PATH] [--json]

The recording is the bundled samples joined end to end (45 s of speech, 16-bit WAV). The cold run
gets a fresh, empty NUMBA_CACHE_DIR, so anything numba-compiled on the path (librosa's helpers did,
issue 52: 44.0 s cold against 16.3 s warm) compiles in it; the warm runs then share one cache that
the first of them fills (a first warm-up run, not counted). Cold and warm runs alternate, so a load
spike on the machine hits both alike. It prints the cold run's and the warm runs' median seconds
and their ratio (the goal: at most 1.10). Runs inherit the environment (PYTHONPATH picks the code
measured).
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
SECONDS = 45.0


def make_recording(folder: Path) -> Path:
    """45 s of the bundled samples, end to end, looped as needed (16-bit WAV at 16 kHz)."""
    import numpy as np
    import soundfile as sf

    parts = [sf.read(str(p), dtype="float32")[0] for p in sorted((REPO / "samples").glob("*.wav"))]
    path = folder / "recording45.wav"
    sf.write(str(path), np.resize(np.concatenate(parts), int(SECONDS * 16000)), 16000, subtype="PCM_16")
    return path


def run_once(specdec: str, recording: Path, cache: str) -> float:
    """Wall seconds of one `specdec describe --segment --quiet` process, start to exit."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", NUMBA_CACHE_DIR=cache)
    start = time.perf_counter()
    done = subprocess.run([specdec, "describe", str(recording), "--segment", "--quiet"], env=env,
                          capture_output=True, text=True, timeout=900)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"specdec describe --segment failed ({done.returncode}): {done.stderr.strip()}")
    return seconds


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--specdec", default=shutil.which("specdec") or str(Path(sys.executable).parent / "specdec"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    cold: list[float] = []
    warm: list[float] = []
    with tempfile.TemporaryDirectory(prefix="segment-bench-") as folder:
        recording = make_recording(Path(folder))
        shared = str(Path(folder) / "numba-shared")
        run_once(args.specdec, recording, shared)  # fills the shared cache (not counted)
        for i in range(args.rounds):
            cold.append(run_once(args.specdec, recording, str(Path(folder) / f"numba-empty-{i}")))
            warm.append(run_once(args.specdec, recording, shared))
    report = {"seconds": SECONDS, "rounds": args.rounds, "pythonpath": os.environ.get("PYTHONPATH", ""),
              "cold_s": [round(t, 2) for t in cold], "warm_s": [round(t, 2) for t in warm],
              "cold_median_s": round(statistics.median(cold), 2), "warm_median_s": round(statistics.median(warm), 2),
              "ratio": round(statistics.median(cold) / statistics.median(warm), 3)}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"specdec describe --segment --quiet, a {SECONDS:g} s recording, {args.rounds} rounds")
        print(f"cold (empty numba cache) median {report['cold_median_s']:.2f} s {report['cold_s']}")
        print(f"warm (shared cache)      median {report['warm_median_s']:.2f} s {report['warm_s']}")
        print(f"cold / warm {report['ratio']:.3f} (goal: at most 1.10)")
    return report


if __name__ == "__main__":
    main()
