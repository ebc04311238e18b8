"""Issue 53, item 6: rows/s of Parquet -> Parquet against the folder-of-WAV -> JSON Lines path, on the
same clips, and the disk each run takes beyond its output.

    python bench/corpus.py [--rows 1000] [--rounds 1] [--batch-size 8] [--json]

The clips are the bundled samples, cycled to `--rows` rows (each copy its own file in the WAV folder,
made distinct by a comment chunk, and its bytes in a row of a Parquet file written by `datasets`, as
a Hub corpus embeds them). Each
route is the real command in its own process (`specdec --threads 1 batch …`), timed whole (imports,
loading the pair, describing, writing): wall time, and the child's CPU time (user + sys, from
getrusage), the fairer figure on a loaded machine. The routes alternate within a round (A B, then B A
the next) so a change in the machine's load hits both.

Disk: each run writes into a folder of its own, with TMPDIR and HF_DATASETS_CACHE pointed at fresh
folders beside it; every 0.2 s a thread sums the bytes of the files under the three that are not the
output as it stands then (nor the output being written under its temporary name, `.NAME.tmp`, to be
renamed over it). `peak_extra` is the most seen (the Parquet route's journal of records counts here);
`final_extra` what is left after the run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "samples"


def tree_bytes(*roots: Path) -> int:
    total = 0
    for root in roots:
        for folder, _, names in os.walk(root):
            for name in names:
                try:
                    total += (Path(folder) / name).stat().st_size
                except OSError:
                    pass  # renamed or removed while walking
    return total


def tagged(wav: bytes, tag: str) -> bytes:
    """The WAV with a LIST/INFO comment chunk appended (its RIFF size updated): the same samples, but
    bytes of its own, as each clip of a real corpus has (a copy repeated byte for byte would be
    stored once by Parquet's dictionary encoding, and the output would look smaller than it is)."""
    import struct

    text = tag.encode() + b"\0" * (2 - len(tag) % 2)  # NUL-terminated, to an even length
    chunk = b"LIST" + struct.pack("<I", 4 + 8 + len(text)) + b"INFO" + b"ICMT" + struct.pack("<I", len(text)) + text
    body = wav + chunk
    return body[:4] + struct.pack("<I", len(body) - 8) + body[8:]


def build(work: Path, rows: int) -> tuple[Path, Path]:
    """The same `rows` clips as a folder of WAV files and as a Parquet file with their bytes."""
    import datasets

    datasets.disable_progress_bars()
    clips = sorted(SAMPLES.glob("*.wav"))
    folder = work / "wavs"
    folder.mkdir()
    names = []
    for i in range(rows):
        source = clips[i % len(clips)]
        names.append(f"{i:05d}_{source.name}")
        (folder / names[-1]).write_bytes(tagged(source.read_bytes(), f"copy {i}"))
    audio = [{"bytes": (folder / n).read_bytes(), "path": n} for n in names]
    parquet = work / "corpus.parquet"
    table = datasets.Dataset.from_dict({"audio": audio, "id": list(range(rows))}).cast_column("audio", datasets.Audio())
    table.to_parquet(str(parquet))
    return folder, parquet


def run(route: str, source: Path, work: Path, batch_size: int, tag: str) -> dict[str, Any]:
    """One route's command, timed, its disk watched."""
    place = work / f"run-{tag}"
    out_dir, tmp, cache = place / "out", place / "tmp", place / "hf-cache"
    for d in (out_dir, tmp, cache):
        d.mkdir(parents=True)
    out = out_dir / ("r.jsonl" if route == "wav_jsonl" else "captions.parquet")
    env = dict(os.environ, TMPDIR=str(tmp), HF_DATASETS_CACHE=str(cache), HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", SPECDEC_PROGRESS_S="3600")
    command = [str(Path(sys.executable).parent / "specdec"), "--threads", "1", "batch", str(source), "--out", str(out),
               "--batch-size", str(batch_size)]
    peak, stop = [0], threading.Event()

    def beyond_output() -> int:
        """Bytes under the run's folders that are not the output as it stands now (nor the output
        being written under its temporary name, to be renamed over it)."""
        now = 0
        for name in (out, out.with_name(f".{out.name}.tmp")):
            try:
                now += name.stat().st_size
            except OSError:
                pass
        return tree_bytes(out_dir, tmp, cache) - now

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], beyond_output())
            stop.wait(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    watcher.start()
    proc = subprocess.run(command, env=env, capture_output=True, text=True, encoding="utf-8")
    wall = time.perf_counter() - start
    stop.set()
    watcher.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{route} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    final = beyond_output()
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "output_bytes": out.stat().st_size,
            "peak_extra_bytes": max(peak[0], final), "final_extra_bytes": final,
            "summary": proc.stderr.strip().splitlines()[-3:], "out": str(out)}


def descriptions(route: str, out: Path) -> dict[str, str]:
    """Each clip's description, by its file name (both routes name the clip file)."""
    if route == "wav_jsonl":
        lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
        return {Path(r["file"]).name: r["description"] for r in lines}
    import pyarrow.parquet as pq

    return {r["file"]: r["description"] for r in pq.read_table(out, columns=["file", "description"]).to_pylist()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-corpus-") as name:
        work = Path(name)
        folder, parquet = build(work, args.rows)
        runs: dict[str, list[dict[str, Any]]] = {"wav_jsonl": [], "parquet_parquet": []}
        load = [os.getloadavg()[0]]
        for r in range(args.rounds):
            order = ["wav_jsonl", "parquet_parquet"] if r % 2 == 0 else ["parquet_parquet", "wav_jsonl"]
            for route in order:
                source = folder if route == "wav_jsonl" else parquet
                runs[route].append(run(route, source, work, args.batch_size, f"{route}-{r}"))
                load.append(os.getloadavg()[0])
        same = sum(descriptions("wav_jsonl", Path(runs["wav_jsonl"][0]["out"])).get(k) == v
                   for k, v in descriptions("parquet_parquet", Path(runs["parquet_parquet"][0]["out"])).items())
        report: dict[str, Any] = {"rows": args.rows, "rounds": args.rounds, "batch_size": args.batch_size,
                                  "input_bytes": {"wav_folder": tree_bytes(folder), "parquet": parquet.stat().st_size},
                                  "load_avg_1min": [round(x, 2) for x in load], "same_descriptions": same,
                                  "routes": {}}
        for route, results in runs.items():
            wall, cpu = sum(x["wall_s"] for x in results), sum(x["cpu_s"] for x in results)
            n = args.rows * len(results)
            report["routes"][route] = {"runs": [{k: v for k, v in x.items() if k != "out"} for x in results],
                                       "rows_per_s": round(n / wall, 3), "rows_per_cpu_s": round(n / cpu, 3),
                                       "peak_extra_bytes": max(x["peak_extra_bytes"] for x in results),
                                       "final_extra_bytes": max(x["final_extra_bytes"] for x in results),
                                       "output_bytes": results[0]["output_bytes"]}
        a, b = report["routes"]["wav_jsonl"], report["routes"]["parquet_parquet"]
        report["ratio_wall"] = round(b["rows_per_s"] / a["rows_per_s"], 3)
        report["ratio_cpu"] = round(b["rows_per_cpu_s"] / a["rows_per_cpu_s"], 3)
    if args.json:
        print(json.dumps(report, indent=2, ensure_ascii=False))
        return
    print(f"{args.rows} rows × {args.rounds} round(s), batch size {args.batch_size}; "
          f"same descriptions {same}/{args.rows}")
    print("| route | rows/s (wall) | rows/CPU-s | output MB | peak extra MB | extra MB after |")
    print("|---|---|---|---|---|---|")
    for route, r in report["routes"].items():
        print(f"| {route} | {r['rows_per_s']:.3f} | {r['rows_per_cpu_s']:.3f} | {r['output_bytes'] / 1e6:.1f} | "
              f"{r['peak_extra_bytes'] / 1e6:.3f} | {r['final_extra_bytes'] / 1e6:.3f} |")
    print(f"Parquet/WAV: {report['ratio_wall']:.3f}× wall, {report['ratio_cpu']:.3f}× CPU")


if __name__ == "__main__":
    main()
