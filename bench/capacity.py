"""Clips per second one `specdec serve` sustains, per mode, under open-loop Poisson arrivals (issue 27).

    python bench/capacity.py [--quick] [--json] [--plot FILE] [--modes cloud,fluent,quality]
                             [--clips N] [--workers W] [--per-step M] [--slo-x 3] [--no-pin] [--edge DIR]

What runs. One real `specdec serve` (the bundled demo cloud, `--threads 1`, its defaults: verifications
batched with a 10 ms window, cloud-only generations continuously batched up to 16 rows) on
127.0.0.1, and a pool of W edge client processes, each a `specdec.Pair(cloud=URL)` (the edge in
process, the cloud through the real HTTP client, remote/client.py) describing labelled held-out
demo clips (`specdec_cli.demo.heldout`, never trained on). With --pin (the default where the machine
has 2+ cores) the server is pinned to CPU 0 and the clients to the others (`os.sched_setaffinity`),
so the server's capacity is one core's and the edges' drafting does not eat into it.

Per mode (`cloud` = cloud-only through /v1/generate; any other name is a preset of the pair's
presets file, e.g. fluent, quality, or a meaning-gate preset):

1. unloaded: every clip once, one at a time (after one warm-up clip): the time per clip, and the
   accuracy (mean attribute accuracy against the labels, `evaluate.score`, as `specdec eval`).
2. load steps: clips arrive as a Poisson process at rate λ (exponential gaps, a seeded stream; the
   clip of each arrival taken round-robin from the pool), each handed to a free client process; its
   time counts from its arrival (queueing for a free client included, and reported apart as
   `edge_wait`). λ climbs a geometric ladder (×`--step`) from a start shared by all modes until
   the p95 time per clip passes the SLO or a clip fails. `max_clips_per_s` is the highest λ whose
   p95 stayed within the SLO (0 when even the first did not).

The SLO is `--slo-x` × the unloaded cloud-only median time per clip, measured in the same run.
Server CPU is the server process's utime + stime from /proc (all its threads) before and after
each step, per clip done: the server-side cost a deployment pays, whatever the wall clock on a
shared machine does. `server_cpu_capacity_clips_per_s` = 1 / that (one core saturated).
`uplink_bytes_per_clip` is what the client counted going up (HTTP/1.1 as sent).

JSON: {"modes": {NAME: {"max_clips_per_s", "p50_s", "p95_s", "accuracy", "server_cpu_s_per_clip",
"uplink_bytes_per_clip", "unloaded_s", "steps": [...], "clips_sent", "clips_done", "clips_failed"}},
"slo_s", "load_avg", ...}. `--quick` fits in 10 minutes on 2 loaded cores.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import queue
import random
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from specdec_cli.remote.local_server import LocalServer  # noqa: E402

CLOUD = "cloud"


# -- the edge client processes ------------------------------------------------------------------

def settings_of(mode: str) -> tuple[str, dict[str, Any]]:
    """(preset, overrides) for `Pair.describe`: cloud-only is any preset with mode=cloud."""
    return ("fluent", {"mode": "cloud"}) if mode == CLOUD else (mode, {})


def client_process(url: str, cpus: list[int] | None, jobs: Any, results: Any, edge: str | None = None) -> None:
    """One edge device: the edge loaded once, then one clip at a time from `jobs` until None."""
    if cpus:
        os.sched_setaffinity(0, cpus)
    import torch

    torch.set_num_threads(1)
    import specdec
    from specdec_cli.evaluate import score

    pair = specdec.Pair(edge=edge, cloud=url)
    results.put(("ready", os.getpid()))
    while (job := jobs.get()) is not None:
        key, path, labels, mode = job
        started = time.monotonic()
        preset, overrides = settings_of(mode)
        try:
            record = pair.describe(path, preset=preset, **overrides).record
            error = record.get("error")
        except Exception as exc:  # noqa: BLE001 - counted as a failed clip, the bench goes on
            record, error = {}, f"{type(exc).__name__}: {exc}"
        done = time.monotonic()
        correct = None
        if error is None and labels is not None:
            correct = score(record.get("description"), labels)["correct"]
        results.put(("done", key, started, done, error, int(record.get("uplink_bytes") or 0),
                     None if correct is None else sum(correct.values()) / len(correct)))


class Pool:
    """W client processes sharing one job queue (a free one takes the next clip)."""

    def __init__(self, url: str, workers: int, cpus: list[int] | None, timeout_s: float = 300,
                 edge: str | None = None) -> None:
        ctx = mp.get_context("spawn")  # torch and fork do not mix
        self.jobs, self.results = ctx.Queue(), ctx.Queue()
        self.procs = [ctx.Process(target=client_process, args=(url, cpus, self.jobs, self.results, edge),
                                 daemon=True)
                      for _ in range(workers)]
        for p in self.procs:
            p.start()
        self.pids = []
        for _ in self.procs:
            tag, pid = self.results.get(timeout=timeout_s)
            assert tag == "ready", tag
            self.pids.append(pid)

    def cpu_s(self) -> float:
        """CPU time of all the client processes so far (the edges' work, with their HTTP)."""
        return sum(cpu_s(pid) for pid in self.pids)

    def run(self, arrivals: list[tuple[float, str, dict | None]], mode: str, timeout_s: float) -> list[dict]:
        """Hand each clip to the pool at its arrival time (seconds from now); one outcome per clip."""
        t0 = time.monotonic()
        at = {}
        for key, (offset, path, labels) in enumerate(arrivals):
            delay = t0 + offset - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            at[key] = t0 + offset
            self.jobs.put((key, path, labels, mode))
        out: dict[int, dict] = {}
        deadline = time.monotonic() + timeout_s
        while len(out) < len(arrivals) and (left := deadline - time.monotonic()) > 0:
            try:
                _, key, started, done, error, up, acc = self.results.get(timeout=left)
            except queue.Empty:
                break
            out[key] = {"latency_s": done - at[key], "edge_wait_s": max(0.0, started - at[key]), "error": error,
                        "uplink_bytes": up, "accuracy": acc, "done_at": done - t0}
        for key in range(len(arrivals)):
            out.setdefault(key, {"latency_s": math.inf, "edge_wait_s": 0.0, "error": "timed out",
                                 "uplink_bytes": 0, "accuracy": None, "done_at": math.inf})
        return [out[k] for k in range(len(arrivals))]

    def close(self) -> None:
        for _ in self.procs:
            self.jobs.put(None)
        for p in self.procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()  # our own child, by its handle


# -- measuring ----------------------------------------------------------------------------------

def cpu_s(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    """The q-th percentile, nearest rank (no interpolation: with few clips it is one of them)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def poisson(rate: float, n: int, rng: random.Random) -> list[float]:
    """n arrival times (s) of a Poisson process at `rate` per second, the first at 0."""
    times, t = [], 0.0
    for _ in range(n):
        times.append(t)
        t += rng.expovariate(rate)
    return times


def summary(outcomes: list[dict]) -> dict[str, Any]:
    ok = [o for o in outcomes if o["error"] is None]
    lat = [o["latency_s"] for o in ok]
    return {"clips": len(outcomes), "done": len(ok), "failed": len(outcomes) - len(ok),
            "p50_s": round(pct(lat, 50), 4), "p95_s": round(pct(lat, 95), 4) if len(ok) == len(outcomes) else math.inf,
            "edge_wait_p95_s": round(pct([o["edge_wait_s"] for o in ok], 95), 4),
            "uplink_bytes_per_clip": round(sum(o["uplink_bytes"] for o in ok) / max(1, len(ok)), 1),
            "errors": sorted({o["error"] for o in outcomes if o["error"] is not None})[:3]}


def unloaded(pool: Pool, server_pid: int, mode: str, clips: list[tuple[str, dict]], say: Any) -> dict[str, Any]:
    """A warm-up clip, then every clip once, one at a time: time per clip and accuracy."""
    pool.run([(0.0, clips[0][0], clips[0][1])], mode, 300)
    cpu0 = cpu_s(server_pid)
    alone = [pool.run([(0.0, path, labels)], mode, 300)[0] for path, labels in clips]
    cpu = (cpu_s(server_pid) - cpu0) / len(clips)
    acc = [o["accuracy"] for o in alone if o["accuracy"] is not None]
    got = {
        "unloaded_s": round(pct([o["latency_s"] for o in alone], 50), 4),
        "unloaded_p95_s": round(pct([o["latency_s"] for o in alone], 95), 4),
        "unloaded_server_cpu_s_per_clip": round(cpu, 5),
        "accuracy": round(100 * sum(acc) / len(acc), 2) if acc else None,
        "accuracy_clips": len(acc),
        "unloaded_failed": sum(o["error"] is not None for o in alone),
    }
    say(f"{mode}: unloaded {got['unloaded_s']:.3f} s/clip, server CPU {cpu * 1000:.1f} ms/clip, "
        f"accuracy {got['accuracy']}")
    return got


def step(pool: Pool, server_pid: int, mode: str, clips: list[tuple[str, dict]], rate: float, per_step: int,
         slo_s: float, rng: random.Random, say: Any) -> dict[str, Any]:
    """One load step: `per_step` Poisson arrivals at `rate`."""
    times = poisson(rate, per_step, rng)
    arrivals = [(t, *clips[i % len(clips)]) for i, t in enumerate(times)]
    cpu0, client0 = cpu_s(server_pid), pool.cpu_s()
    outcomes = pool.run(arrivals, mode, timeout_s=times[-1] + 20 * slo_s + 60)
    cpu, client = cpu_s(server_pid) - cpu0, pool.cpu_s() - client0
    s = summary(outcomes)
    finite = [o["done_at"] for o in outcomes if math.isfinite(o["done_at"])]
    s.update(rate_clips_per_s=round(rate, 4), server_cpu_s=round(cpu, 3),
             server_cpu_s_per_clip=round(cpu / max(1, s["done"]), 5),
             client_cpu_s_per_clip=round(client / max(1, s["done"]), 5),
             achieved_clips_per_s=round(s["done"] / max(finite), 4) if finite else 0.0,
             within_slo=s["failed"] == 0 and s["p95_s"] <= slo_s)
    say(f"{mode}: λ {rate:.2f}/s: p50 {s['p50_s']:.3f} s, p95 {s['p95_s']:.3f} s (SLO {slo_s:.3f}), "
        f"server CPU {s['server_cpu_s_per_clip'] * 1000:.1f} ms/clip, clients {s['client_cpu_s_per_clip'] * 1000:.1f} "
        f"ms/clip, failed {s['failed']}")
    return s


def run_mode(pool: Pool, server_pid: int, mode: str, clips: list[tuple[str, dict]], ladder: list[float],
             bisect: int, per_step: int, slo_s: float, seed: int, deadline: float, say: Any,
             alone: dict[str, Any] | None = None) -> dict[str, Any]:
    """The unloaded pass (or `alone`, done already), then the rate ladder until the SLO breaks at
    two rates in a row (one breach alone may be a load spike of the shared machine: the rates
    above it are still tried once), then `bisect` steps between the highest rate within it and
    the lowest rate above that past it (geometric means)."""
    result = dict(alone or unloaded(pool, server_pid, mode, clips, say))
    rng = random.Random(seed)
    steps: list[dict] = []
    good: dict | None = None
    bad: dict | None = None
    ended, misses = "top of the ladder", 0
    for rate in ladder:
        if time.monotonic() > deadline:
            ended = "time budget"
            break
        s = step(pool, server_pid, mode, clips, rate, per_step, slo_s, rng, say)
        steps.append(s)
        if s["within_slo"]:
            good, bad, misses = s, None, 0
            continue
        bad = bad or s
        misses += 1
        if misses == 2:
            ended = "SLO"
            break
    for _ in range(bisect if good and bad else 0):
        if time.monotonic() > deadline:
            break
        s = step(pool, server_pid, mode, clips, math.sqrt(good["rate_clips_per_s"] * bad["rate_clips_per_s"]),
                 per_step, slo_s, rng, say)
        steps.append(s)
        if s["within_slo"]:
            good = s
        else:
            bad = s
    # What a mode is credited with: its highest rate within the SLO (its latencies and CPU there).
    pick = good or steps[0]
    result.update(
        max_clips_per_s=good["rate_clips_per_s"] if good else 0.0,
        first_rate_past_slo=bad["rate_clips_per_s"] if bad else None,
        ladder_ended=ended,
        achieved_clips_per_s=pick["achieved_clips_per_s"],
        p50_s=pick["p50_s"], p95_s=pick["p95_s"],
        server_cpu_s_per_clip=pick["server_cpu_s_per_clip"],
        server_cpu_capacity_clips_per_s=round(1 / pick["server_cpu_s_per_clip"], 2) if pick["server_cpu_s_per_clip"] else None,
        client_cpu_s_per_clip=pick["client_cpu_s_per_clip"],
        uplink_bytes_per_clip=pick["uplink_bytes_per_clip"],
        clips_sent=sum(s["clips"] for s in steps), clips_done=sum(s["done"] for s in steps),
        clips_failed=sum(s["failed"] for s in steps), steps=sorted(steps, key=lambda s: s["rate_clips_per_s"]))
    return result


# -- the run ------------------------------------------------------------------------------------

def heldout_clips(folder: Path, n: int, start: int) -> list[tuple[str, dict]]:
    if shutil.which("espeak-ng") is None:
        sys.exit("capacity: espeak-ng is needed to synthesise the held-out demo clips (apt-get install espeak-ng)")
    from specdec_cli.demo.heldout import write_heldout

    labels = write_heldout(folder, n, start=start)
    out = []
    for line in labels.read_text(encoding="utf-8").splitlines():
        entry = json.loads(line)
        out.append((str(folder / entry["file"]), entry["labels"]))
    return out


def default_modes(edge: str | None = None) -> list[str]:
    """cloud, fluent, quality, then every preset of the pair's presets that gates by meaning."""
    from specdec_cli.models import presets_file_for
    from specdec_cli.presets import load_presets

    gated = [name for name, preset in load_presets(presets_file_for(edge)).items()
             if preset.values.get("verify") == "meaning" and name not in ("fluent", "quality")]
    return [CLOUD, "fluent", "quality", *sorted(gated)]


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, m in report["modes"].items():
        steps = m.get("steps", [])
        xs = [s["rate_clips_per_s"] for s in steps]
        ys = [4 * report["slo_s"] if s["p95_s"] is None else min(s["p95_s"], 4 * report["slo_s"])
              for s in steps]  # a step whose clips did not all come back drawn at the top
        ax.plot(xs, ys, marker="o", label=f"{name} (max {m.get('max_clips_per_s') or 0:.2f}/s)")
    ax.axhline(report["slo_s"], color="grey", linestyle="--", label=f"SLO {report['slo_s']:.2f} s")
    ax.set_xscale("log")
    ax.set_xlabel("offered clips per second (Poisson)")
    ax.set_ylabel("p95 time per clip (s)")
    ax.set_title(f"one specdec serve, demo pair, {'1 core' if report['pinned'] else 'unpinned'}; "
                 f"load avg {report['load_avg']['start'][0]:.1f}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped bench still stops its server and clients
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small settings that finish within 10 minutes on 2 cores")
    ap.add_argument("--json", action="store_true", help="print the report as one JSON object on stdout")
    ap.add_argument("--plot", type=Path, help="write clips/s against p95 (PNG)")
    ap.add_argument("--modes", help="cloud (cloud-only) and preset names, comma-separated; cloud first sets the "
                                    "SLO (default: cloud, fluent, quality and any meaning-gate preset of the pair)")
    ap.add_argument("--clips", type=int, help="labelled held-out clips in the pool (default 24; quick 8)")
    ap.add_argument("--start", type=int, default=1500, help="first held-out clip index")
    ap.add_argument("--workers", type=int, help="edge client processes (default 8; quick 6)")
    ap.add_argument("--per-step", type=int, help="arrivals per load step (default 40; quick 30)")
    ap.add_argument("--step", type=float, default=1.6, help="the rate ladder's factor")
    ap.add_argument("--bisect", type=int, help="steps between the last rate within the SLO and the first past it "
                                               "(default 3; quick 2)")
    ap.add_argument("--budget-s", type=float, help="stop climbing after this long (default 3600; quick 480)")
    ap.add_argument("--max-steps", type=int, default=12)
    ap.add_argument("--slo-x", type=float, default=3.0, help="SLO: this × the unloaded cloud-only median s/clip")
    ap.add_argument("--pin", action=argparse.BooleanOptionalAction, default=(os.cpu_count() or 1) >= 2,
                    help="pin the server to CPU 0 and the clients to the other CPUs")
    ap.add_argument("--serve-arg", action="append", default=[], help="an extra `specdec serve` argument")
    ap.add_argument("--seed", type=int, default=27)
    ap.add_argument("--edge", help="the edge model folder (default: the bundled demo edge; its presets file with "
                                   "it), e.g. an earlier demo edge against the same bundled cloud")
    args = ap.parse_args(argv)
    clips_n = args.clips or (8 if args.quick else 24)
    workers = args.workers or (6 if args.quick else 8)
    per_step = args.per_step or (30 if args.quick else 40)
    bisect = args.bisect if args.bisect is not None else (2 if args.quick else 3)
    args.budget_s = args.budget_s or (480.0 if args.quick else 3600.0)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()] if args.modes else default_modes(args.edge)
    if not modes or modes[0] != CLOUD:
        sys.exit("capacity: --modes must start with cloud (its unloaded time sets the SLO)")
    from specdec_cli.errors import InputError
    from specdec_cli.models import presets_file_for
    from specdec_cli.presets import resolve

    for mode in modes[1:]:
        try:
            resolve(mode, presets_file_for(args.edge))
        except InputError as exc:
            sys.exit(f"capacity: --modes: {exc}")

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)
    started = time.monotonic()
    load_start = os.getloadavg()
    cpus = sorted(os.sched_getaffinity(0))
    server_cpus, client_cpus = ([cpus[0]], cpus[1:]) if args.pin and len(cpus) >= 2 else (None, None)

    with tempfile.TemporaryDirectory(prefix="specdec-capacity-") as tmp:
        clips = heldout_clips(Path(tmp), clips_n, args.start)
        server = LocalServer(*args.serve_arg).start()
        pool = None
        try:
            if server_cpus:
                os.sched_setaffinity(server.proc.pid, server_cpus)
                for tid in os.listdir(f"/proc/{server.proc.pid}/task"):  # threads started already
                    os.sched_setaffinity(int(tid), server_cpus)
            pool = Pool(server.url, workers, client_cpus, edge=args.edge)
            report: dict[str, Any] = {"modes": {}}
            cloud = unloaded(pool, server.proc.pid, CLOUD, clips, say)
            slo = args.slo_x * cloud["unloaded_s"]
            # The ladder: from a quarter of what one clip at a time (unloaded, cloud-only) would carry, up.
            first = 0.25 / cloud["unloaded_s"]
            ladder = [first * args.step ** i for i in range(args.max_steps)]
            for i, mode in enumerate(modes):
                # Each mode gets an equal share of the time left (--budget-s), so --quick ends in time.
                deadline = time.monotonic() + (args.budget_s - (time.monotonic() - started)) / (len(modes) - i)
                report["modes"][mode] = run_mode(pool, server.proc.pid, mode, clips, ladder, bisect, per_step, slo,
                                                 args.seed, deadline, say, cloud if mode == CLOUD else None)
        finally:
            if pool is not None:
                pool.close()
            server.kill()

    base = report["modes"][CLOUD]
    for m in report["modes"].values():
        m["clips_per_s_x_cloud"] = (round(m["max_clips_per_s"] / base["max_clips_per_s"], 3)
                                    if base.get("max_clips_per_s") else None)
        m["accuracy_minus_cloud"] = (round(m["accuracy"] - base["accuracy"], 2)
                                     if m.get("accuracy") is not None and base.get("accuracy") is not None else None)
    report.update(slo_s=round(slo, 4), slo_x=args.slo_x, ladder=[round(r, 4) for r in ladder], per_step=per_step,
                  clips=clips_n, workers=workers, pinned=bool(server_cpus), server_cpus=server_cpus,
                  client_cpus=client_cpus, load_avg={"start": load_start, "end": os.getloadavg()},
                  cpus=os.cpu_count(), wall_s=round(time.monotonic() - started, 1), quick=args.quick,
                  serve_args=args.serve_arg, edge=args.edge)
    if args.plot:
        plot(report, args.plot)
    if args.json:
        print(json.dumps(_finite(report), indent=1, allow_nan=False))
    else:
        say(f"SLO {slo:.3f} s · load avg {load_start[0]:.2f} → {os.getloadavg()[0]:.2f}")
        for name, m in report["modes"].items():
            say(f"{name:>10}: {m['max_clips_per_s']:.2f} clips/s (×{m['clips_per_s_x_cloud']}), p95 {m['p95_s']:.3f} s, "
                f"accuracy {m['accuracy']}, server CPU {m['server_cpu_s_per_clip'] * 1000:.1f} ms/clip, "
                f"uplink {m['uplink_bytes_per_clip']:.0f} B/clip")


def _finite(x: Any) -> Any:
    """JSON without NaN/Infinity: a p95 that never came back (a failed step) is null."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return x


if __name__ == "__main__":
    main()
