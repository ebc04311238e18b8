"""Whether `--segment`'s first run pays a JIT (issue 52, point 4): whole-process `specdec describe
--segment` wall time for a 45 s recording, the first run with an empty numba cache against warm
runs that share one.

    python bench/segment_cold.py [--rounds 3] [--specdec PATH] [--json]

The recording is the bundled samples joined end to end (45 s of speech, 16-bit WAV). The cold run
gets a fresh, empty NUMBA_CACHE_DIR, so anything numba-compiled on the path (librosa's helpers did,
issue 52: 44.0 s cold against 16.3 s warm) compiles in it; the warm runs then share one cache that
the first of them fills (a first warm-up run, not counted). Cold and warm runs alternate, so a load
spike on the machine hits both alike. It prints the cold run's and the warm runs' median seconds
(wall, and CPU: user + system, steadier on a shared machine) and their ratios (the goal: at most 1.10). Runs inherit the environment (PYTHONPATH picks the code
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


def run_once(specdec: str, recording: Path, cache: str) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system, the process and its children) of one `specdec
    describe --segment --quiet` process, start to exit. On a shared machine the CPU seconds are
    the steadier figure: other jobs stretch the wall time, not the work."""
    import resource

    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", NUMBA_CACHE_DIR=cache)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([specdec, "describe", str(recording), "--segment", "--quiet"], env=env,
                          capture_output=True, text=True, timeout=1800)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"specdec describe --segment failed ({done.returncode}): {done.stderr.strip()}")
    return seconds, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--specdec", default=shutil.which("specdec") or str(Path(sys.executable).parent / "specdec"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    cold: list[tuple[float, float]] = []
    warm: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory(prefix="segment-bench-") as folder:
        recording = make_recording(Path(folder))
        shared = str(Path(folder) / "numba-shared")
        run_once(args.specdec, recording, shared)  # fills the shared cache (not counted)
        for i in range(args.rounds):
            cold.append(run_once(args.specdec, recording, str(Path(folder) / f"numba-empty-{i}")))
            warm.append(run_once(args.specdec, recording, shared))

    def median(runs: list[tuple[float, float]], i: int) -> float:
        return statistics.median(r[i] for r in runs)

    report = {"seconds": SECONDS, "rounds": args.rounds, "pythonpath": os.environ.get("PYTHONPATH", ""),
              "load_average": list(os.getloadavg()),
              "cold_s": [round(t, 2) for t, _ in cold], "warm_s": [round(t, 2) for t, _ in warm],
              "cold_cpu_s": [round(c, 2) for _, c in cold], "warm_cpu_s": [round(c, 2) for _, c in warm],
              "cold_median_s": round(median(cold, 0), 2), "warm_median_s": round(median(warm, 0), 2),
              "ratio": round(median(cold, 0) / median(warm, 0), 3),
              "cpu_ratio": round(median(cold, 1) / median(warm, 1), 3)}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"specdec describe --segment --quiet, a {SECONDS:g} s recording, {args.rounds} rounds")
        print(f"cold (empty numba cache) median {report['cold_median_s']:.2f} s {report['cold_s']} "
              f"cpu {report['cold_cpu_s']}")
        print(f"warm (shared cache)      median {report['warm_median_s']:.2f} s {report['warm_s']} "
              f"cpu {report['warm_cpu_s']}")
        print(f"cold / warm {report['ratio']:.3f} wall, {report['cpu_ratio']:.3f} CPU (goal: at most 1.10)")
    return report


if __name__ == "__main__":
    main()
