"""Does `specdec serve` give memory back? Rounds of sessions with 30 s clips opened and closed.

    python bench/server_memory.py [--json] [--rounds 3] [--sessions 48] [--seconds 30]
                                  [--concurrency 8] [-- SERVE FLAGS…]

A real server process (`specdec --threads 1 serve --port 0`, the bundled demo cloud, plus any
flags after `--`). Per round: `--sessions` sessions are opened by `--concurrency` client threads,
each with its own 30 s clip (the samples played end to end until 30 s, then a different circular
shift per session, so no two clips are equal), a first verification that runs the lazy prefill; then
every session is closed (DELETE). After each round the server's resident set (VmRSS from
/proc/PID/status) is read; VmHWM is the peak. Issue 25's target: the RSS after round 3 within 300 MB
of the RSS after round 1 (it grew 1.76 -> 2.34 -> 2.57 -> 2.72 GB over rounds of 64 before).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import httpx  # noqa: E402
import msgspec  # noqa: E402
import numpy as np  # noqa: E402

from specdec_cli.audio import load_audio  # noqa: E402
from specdec_cli.decoding import DecodingConfig  # noqa: E402
from specdec_cli.models import load_pair  # noqa: E402
from specdec_cli.remote import wire  # noqa: E402
from specdec_cli.remote.local_server import LocalServer as Server  # noqa: E402


def proc_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field}")


def clips(n: int, seconds: float) -> list[bytes]:
    """n distinct first-verification requests, each with a `seconds`-long clip (16-bit exact: FLAC)."""
    pair = load_pair()
    joined = np.concatenate([load_audio(p, 16000, 30.0) for p in sorted((REPO / "samples").glob("*.wav"))])
    length = int(seconds * 16000)
    base = np.resize(joined, length)
    config = DecodingConfig().as_dict()
    bodies = []
    prompt = pair.processor(base)["input_ids"][0].tolist()  # every clip has the same length: the same prompt
    for i in range(n):
        audio = np.roll(base, i * 977).astype(np.float32)
        data, codec = wire.encode_audio(audio, 16000)
        bodies.append(wire.encode(wire.VerifyRequest([5, 6, 7, 8], clip=wire.Clip(data, codec, 16000, prompt),
                                                     config=config)))
    return bodies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=48)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("serve_flags", nargs="*", help="extra `specdec serve` flags (after --)")
    args = parser.parse_args()

    bodies = clips(args.sessions, args.seconds)
    out: dict = {"rounds": [], "sessions": args.sessions, "seconds": args.seconds, "concurrency": args.concurrency,
                 "serve_flags": args.serve_flags}
    with Server("--max-sessions", str(max(64, args.sessions)), *args.serve_flags) as server:
        pid = server.proc.pid
        clients = [httpx.Client(base_url=server.url, timeout=600) for _ in range(args.concurrency)]
        clients[0].get("/health")
        out["rss_start_mb"] = proc_kb(pid, "VmRSS") / 1024

        def open_one(i: int) -> str:
            r = clients[i % args.concurrency].post("/v1/verify", content=bodies[i],
                                                   headers={"Content-Type": wire.MSGPACK})
            assert r.status_code == 200, r.text
            return msgspec.msgpack.decode(r.content)["session"]

        for rnd in range(args.rounds):
            t0 = time.perf_counter()
            with ThreadPoolExecutor(args.concurrency) as pool:
                ids = list(pool.map(open_one, range(args.sessions)))
            open_rss = proc_kb(pid, "VmRSS") / 1024
            for i, sid in enumerate(ids):
                r = clients[i % args.concurrency].delete(f"/v1/sessions/{sid}")
                assert r.status_code in (200, 404), r.text  # 404: the verdict ended the clip already
            time.sleep(2.5)  # the server gives freed memory back 1 s after the last session ends
            row = {"round": rnd + 1, "rss_open_mb": round(open_rss, 1),
                   "rss_closed_mb": round(proc_kb(pid, "VmRSS") / 1024, 1),
                   "hwm_mb": round(proc_kb(pid, "VmHWM") / 1024, 1),
                   "sessions_open_after": clients[0].get("/health").json()["sessions"],
                   "seconds": round(time.perf_counter() - t0, 1)}
            out["rounds"].append(row)
            if not args.json:
                print(f"round {row['round']}: RSS with {args.sessions} sessions open {row['rss_open_mb']:.0f} MB, "
                      f"after closing them {row['rss_closed_mb']:.0f} MB (peak {row['hwm_mb']:.0f} MB, "
                      f"{row['seconds']:.0f} s)", flush=True)
        for c in clients:
            c.close()
    first, last = out["rounds"][0]["rss_closed_mb"], out["rounds"][-1]["rss_closed_mb"]
    out["growth_round1_to_last_mb"] = round(last - first, 1)
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"start {out['rss_start_mb']:.0f} MB; after round 1 {first:.0f} MB, after round {args.rounds} "
              f"{last:.0f} MB: {last - first:+.0f} MB (target: within 300 MB)")


if __name__ == "__main__":
    main()
