"""`specdec batch --ray` against the single-process batch: clips/s with one and two Ray workers.

Run by hand (not part of the tests; needs `pip install 'specdec-omni[ray]'`):

    python bench/ray_batch.py [--clips 96] [--rounds 2] [--workers 1,2] [--batch-size 8] [--no-cli] [--json]

The bundled samples are copied into a temporary folder under distinct names until there are
--clips of them (the demo pair, default preset).

`runs` (in this process, `rounds` times, the configurations interleaved so a load spike from the
machine's other users hits all alike): the single-process batch (Pair.describe_many + results.run_batch, as
`specdec batch` runs it) one clip at a time (`single`) and with --batch-size rows in flight
(`single_b8`); then the Ray batch with each --workers count, one clip at a time per worker
(`ray_2`) and with rows in flight in each worker (`ray_2_b8`), on one local Ray started once (its
start-up is `ray_start_s`). Every run writes its own results file through batch.ResultsFile, the
one writer, and its records are checked equal to `single`'s (timing fields aside). This process
imports torch and transformers once, untimed, before the rounds.
  wall_s              call to last record: the single process loads its pair in it; the Ray runs
                      start their worker processes, which import torch and load theirs
  loaded_s            call until decoding could start: the pair loaded (single), the first worker ready (Ray)
  loaded_clips_per_s  clips / (last record - loaded_s): the rate a long corpus sees, start-up aside.
                      For Ray it counts from the FIRST worker ready, so a second worker still
                      starting counts against it (a lower bound), and it does not depend on records
                      coming back a chunk at a time
  decode_cpu_ms_per_clip  CPU time of the decoding processes (this one, or the Ray workers read
                      from /proc) from each one's ready moment to the last record, per clip: what
                      a clip costs wherever it runs, whatever else the machine is doing
  this_process_cpu_s  CPU of this process during the run (for Ray: the driver's whole share)
`cli` (unless --no-cli): the real commands in fresh processes, once each, wall seconds from start
to exit: `specdec batch DIR --out F` at --batch-size 1 and the default, and with `--ray auto
--workers N` (the default batch size in each worker), Ray start-up and worker start-up included.

Ratios (`x_vs_single`) are medians over rounds of per-round ratios against `single`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python bench/ray_batch.py` from a checkout that is not installed
    sys.path.insert(0, str(REPO))

from specdec_cli.commands.batch import DEFAULT_BATCH_SIZE  # noqa: E402
from specdec_cli.pair import BatchWorker, Pair  # noqa: E402
from specdec_cli.results import ResultsFile, read_records, run_batch  # noqa: E402
from specdec_cli.scale import ray_batch  # noqa: E402
from specdec_cli.settings import PairSpec  # noqa: E402

TIMING = {"latency_s", "tokens_per_s"}


def make_clips(folder: Path, count: int) -> list[Path]:
    samples = sorted((REPO / "samples").glob("*.wav"))
    clips = []
    for i in range(count):
        src = samples[i % len(samples)]
        dst = folder / f"{i // len(samples):02d}_{src.name}"
        shutil.copy(src, dst)
        clips.append(dst)
    return clips


class CpuMeter:
    """CPU seconds of the processes that decode (this one, or the Ray workers by /proc/PID/stat),
    counted from the moment each is ready, so start-up is left out."""

    TICK = os.sysconf("SC_CLK_TCK")

    def __init__(self) -> None:
        self.base: dict[int, float] = {}  # pid -> CPU seconds when it became ready
        self.last: dict[int, float] = {}

    @classmethod
    def of(cls, pid: int) -> float:
        if pid == os.getpid():
            return time.process_time()
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / cls.TICK  # utime + stime

    def ready(self, pid: int) -> None:
        self.base[pid] = self.of(pid)

    def sample(self) -> None:  # while the processes live (Ray workers end with the run)
        for pid in self.base:
            self.last[pid] = self.of(pid)

    def seconds(self) -> float:
        return sum(self.last[pid] - self.base[pid] for pid in self.base)


def timed_run(clips: list[Path], out: Path, settings, make: Callable[[Callable[[int], None]], Any]) -> dict[str, Any]:
    """`make(loaded)` gives run_batch's describe_all; it calls `loaded(pid)` as each process that
    decodes becomes ready."""
    stamps: list[float] = []
    loaded: list[float] = []
    cpu = CpuMeter()

    def on_loaded(pid: int) -> None:
        loaded.append(time.perf_counter())
        cpu.ready(pid)

    def on_done(path: Path, record: dict) -> None:
        stamps.append(time.perf_counter())
        cpu.sample()

    start = time.perf_counter()
    describe_all = make(on_loaded)
    driver_cpu = time.process_time()
    with ResultsFile(out, settings, overwrite=True) as results:
        summary = run_batch(clips, results, None, None, on_done, describe_all=describe_all)
    driver_cpu = time.process_time() - driver_cpu
    assert summary.ok == len(clips) and summary.failed == 0, summary
    n, ready = len(stamps), min(loaded)
    return {"clips": n, "wall_s": round(stamps[-1] - start, 3), "loaded_s": round(ready - start, 3),
            "clips_per_s": round(n / (stamps[-1] - start), 3),
            "loaded_clips_per_s": round(n / (stamps[-1] - ready), 3),
            "decode_cpu_ms_per_clip": round(1000 * cpu.seconds() / n, 2),
            "this_process_cpu_s": round(driver_cpu, 3)}


def comparable(out: Path) -> dict[str, dict]:
    return {Path(r["file"]).name: {k: v for k, v in r.items() if k not in TIMING} for r in read_records(out)}


def cli_runs(folder: Path, tmp: Path, counts: list[int]) -> dict[str, dict[str, Any]]:
    exe = str(Path(sys.executable).with_name("specdec"))
    configs = {"single_b1": ["--batch-size", "1"], f"single_b{DEFAULT_BATCH_SIZE}": [],
               **{f"ray_{w}_b{DEFAULT_BATCH_SIZE}": ["--ray", "auto", "--workers", str(w)] for w in counts}}
    found = {}
    for name, extra in configs.items():
        out = tmp / f"cli_{name}.jsonl"
        start = time.perf_counter()
        done = subprocess.run([exe, "batch", str(folder), "--out", str(out), *extra], capture_output=True,
                              text=True, timeout=600)
        wall = time.perf_counter() - start
        assert done.returncode == 0, done.stderr
        n = len(read_records(out))
        found[name] = {"wall_s": round(wall, 3), "clips_per_s": round(n / wall, 3)}
    base = found["single_b1"]["wall_s"]
    for row in found.values():
        row["x_vs_single_b1"] = round(base / row["wall_s"], 3)
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clips", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workers", default="1,2", help="comma list of Ray worker counts")
    ap.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE,
                    help="rows in flight for the *_bN runs (specdec batch's default)")
    ap.add_argument("--no-cli", action="store_true", help="skip the real commands in fresh processes")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    counts = [int(w) for w in args.workers.split(",")]
    sizes = [1, args.batch_size] if args.batch_size > 1 else [1]

    import ray

    spec = PairSpec.of()
    resolved = spec.settings("fluent")
    settings = resolved.run
    Pair.from_spec(spec)  # untimed: this process's imports and first load

    def single(batch_size: int, loaded: Callable[[int], None]):
        def describe_all(todo: list[Path]):
            pair = Pair.from_spec(spec)
            loaded(os.getpid())
            for path, result in pair.describe_many(todo, resolved, batch_size):
                yield path, result.record

        return describe_all

    def on_ray(workers: int, batch_size: int, loaded: Callable[[int], None]):
        def on_event(event: ray_batch.WorkerEvent) -> None:
            if event.kind == "ready":
                assert event.pid is not None
                loaded(event.pid)

        return ray_batch.describe_all(ray_batch.RayOptions("auto", workers=workers),
                                      partial(BatchWorker, spec, resolved, None), batch_size, on_event)

    def name(kind: str, batch_size: int) -> str:
        return kind + (f"_b{batch_size}" if batch_size > 1 else "")

    configs = {name("single", b): partial(single, b) for b in sizes}
    configs.update({name(f"ray_{w}", b): partial(on_ray, w, b) for w in counts for b in sizes})
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in configs}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="specdec-ray-bench-") as tmp:
        folder = Path(tmp) / "clips"
        folder.mkdir()
        clips = make_clips(folder, args.clips)
        t = time.perf_counter()
        ray.init(address="local", num_cpus=max(max(counts), os.cpu_count() or 1), include_dashboard=False,
                 object_store_memory=ray_batch.OBJECT_STORE_BYTES, logging_level=logging.ERROR, log_to_driver=False)
        ray_start_s = time.perf_counter() - t
        try:
            for _ in range(args.rounds):
                reference = None
                for config, make in configs.items():
                    out = Path(tmp) / f"{config}.jsonl"
                    runs[config].append(timed_run(clips, out, settings, make))
                    records = comparable(out)
                    reference = reference or records
                    assert records == reference, f"{config}: records differ from the single process's"
        finally:
            ray.shutdown()
        load_after_runs = os.getloadavg()
        cli = {} if args.no_cli else cli_runs(folder, Path(tmp), counts)

    def ratio(config: str, key: str) -> float:
        return round(statistics.median(r[key] / s[key] for r, s in zip(runs[config], runs["single"], strict=True)), 3)

    keys = ("wall_s", "loaded_s", "clips_per_s", "loaded_clips_per_s", "decode_cpu_ms_per_clip", "this_process_cpu_s")
    report = {
        "machine": {"cpus": os.cpu_count(), "loadavg_before": [round(x, 2) for x in load_before],
                    "loadavg_after_runs": [round(x, 2) for x in load_after_runs],
                    "loadavg_after": [round(x, 2) for x in os.getloadavg()]},
        "clips": args.clips, "rounds": args.rounds, "ray_start_s": round(ray_start_s, 3),
        "median": {c: {k: round(statistics.median(r[k] for r in rs), 3) for k in keys} for c, rs in runs.items()},
        "x_vs_single": {c: {k: ratio(c, k) for k in ("clips_per_s", "loaded_clips_per_s", "decode_cpu_ms_per_clip")}
                        for c in runs if c != "single"},
        "records_equal_to_single": True,
        "cli": cli,
        "runs": runs,
    }
    if args.json:
        print(json.dumps(report, indent=1))
        return
    print(f"{args.clips} clips, {args.rounds} rounds, {os.cpu_count()} CPUs, load {report['machine']['loadavg_before']}")
    print(f"{'run':<12} {'wall s':>8} {'loaded s':>9} {'clips/s':>8} {'loaded':>8} {'x':>6} {'x loaded':>9} "
          f"{'cpu ms/clip':>12}")
    for c, m in report["median"].items():
        x = report["x_vs_single"].get(c, {"clips_per_s": 1.0, "loaded_clips_per_s": 1.0})
        print(f"{c:<12} {m['wall_s']:>8.2f} {m['loaded_s']:>9.2f} {m['clips_per_s']:>8.2f} "
              f"{m['loaded_clips_per_s']:>8.2f} {x['clips_per_s']:>6.2f} {x['loaded_clips_per_s']:>9.2f} "
              f"{m['decode_cpu_ms_per_clip']:>12.1f}")
    for c, row in cli.items():
        print(f"cli {c:<14} {row['wall_s']:>8.2f} s {row['clips_per_s']:>7.2f} clips/s  x{row['x_vs_single_b1']:.2f}")


if __name__ == "__main__":
    main()
