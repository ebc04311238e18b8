"""Blocks sent ahead that reach the server early: how many valid ones are refused (issue 55, finding 5).

    python bench/early_blocks.py [--sessions 1,6] [--depth 4] [--clips 3] [--k 4] [--server-path DIR] [--json]

A real server process (`specdec --threads 1 serve --port 0`, the bundled demo cloud) and, per
entry of `--sessions`, that many clips described at once (one thread and one client each) through
it, with `--depth` verifications in flight per clip and the demo cloud as the edge too: every
greedy draft is the cloud's own, so every block sent ahead assumes what the verdicts will say, and
each one refused as out of sync (409) is waste (a round trip, and the block sent again in turn).
Blocks are drafted ahead whatever the timings (as tests/test_depth.py does), with `--verify always`
and `--k`. The blocks of one clip travel on different connections, so they can reach the server
out of order; a server that refuses an early block instead of holding it until its predecessor's
verdict refuses valid blocks. Reported per entry: verifications, out-of-sync refusals, their share,
blocks the loop used (escalations), and whether every clip's tokens equal the in-process run's.
`--server-path DIR` runs the server from another checkout (the code before a change); the clients
are this checkout's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from specdec_cli.remote.local_server import LocalServer as Server  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", default="1,6", help="clips described at once, per run (comma-separated)")
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--clips", type=int, default=3, help="clips each session describes, one after the other")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--server-path", help="run the server from this checkout (PYTHONPATH)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from specdec_cli.audio import load_audio
    from specdec_cli.decoding import DecodingConfig, loop
    from specdec_cli.describe import Describer
    from specdec_cli.models import demo_pair, load_pair

    loop.AheadPays.now = lambda self: True  # draft ahead whatever the timings
    cloud = demo_pair()[1]
    samples = sorted((REPO / "samples").glob("*.wav"))
    cfg = DecodingConfig(verify="always", k=args.k, max_new_tokens=args.max_new_tokens, sample=False)
    local = Describer(load_pair(cloud, cloud))
    out: dict = {k: v for k, v in vars(args).items() if k != "json"}
    out["loadavg_start"] = [round(x, 2) for x in os.getloadavg()]
    env = {"PYTHONPATH": str(Path(args.server_path).resolve())} if args.server_path else None
    runs = []
    with Server(env=env, log=Path(tempfile.mkdtemp()) / "serve.log") as server:
        for sessions in [int(s) for s in args.sessions.split(",")]:
            totals = {"verifications": 0, "out_of_sync": 0, "escalations": 0, "clips": 0, "same_tokens": 0}
            lock = threading.Lock()

            def one(i: int, totals: dict = totals, lock: threading.Lock = lock) -> None:
                describer = Describer(load_pair(cloud, server.url))
                describer.pair.remote.depth = args.depth
                try:
                    for j in range(args.clips):
                        path = samples[(i * args.clips + j) % len(samples)]
                        audio = load_audio(path, 16000, 30.0)
                        there = describer.run(audio, cfg)
                        here = local.run(audio, cfg)
                        with lock:
                            totals["verifications"] += there.link.verifications
                            totals["out_of_sync"] += there.link.out_of_sync
                            totals["escalations"] += there.result.stats.escalations
                            totals["clips"] += 1
                            totals["same_tokens"] += there.result.tokens == here.result.tokens
                finally:
                    describer.pair.remote.close()
            threads = [threading.Thread(target=one, args=(i,)) for i in range(sessions)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            totals["sessions"] = sessions
            totals["out_of_sync_share"] = round(totals["out_of_sync"] / max(1, totals["verifications"]), 3)
            runs.append(totals)
        server.stop()
    out["runs"] = runs
    out["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for run in runs:
            print(f"{run['sessions']} at once: {run['verifications']} verifications, {run['out_of_sync']} out of sync "
                  f"({100 * run['out_of_sync_share']:.1f} %), {run['escalations']} blocks used, "
                  f"{run['same_tokens']}/{run['clips']} clips as in process")


if __name__ == "__main__":
    main()
