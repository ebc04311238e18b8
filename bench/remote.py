"""The remote cloud on loopback: what crosses the link and what it costs, against the in-process run.

    python bench/remote.py [--json] [--repeats 3] [--delays 0,10,50] [--threads 1]

Starts a real `specdec serve` process on 127.0.0.1 (a free port; stopped by its pid at the end)
hosting the bundled demo cloud, and describes the bundled samples in every mode twice per
repeat, in this process (the bundled pair in process) and through the server (the edge here, the
cloud there), back to back per clip so a load spike hits both. Per mode it reports bytes up and
down, round trips and cloud wait per clip (counted by the client), whether the tokens are the
same, and wall time per clip. With an added client-side link delay of D ms per round trip
(`RemoteClient.link_delay_s`, slept before each request) it sets the measured wall time next to
what `--cloud-rtt-ms D` predicts from the in-process run (metrics.modelled_latency: D per cloud
call for spec modes, once per clip for cloud-only).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from specdec_cli.audio import load_audio  # noqa: E402
from specdec_cli.decoding import DecodingConfig  # noqa: E402
from specdec_cli.describe import Describer  # noqa: E402
from specdec_cli.models import load_pair  # noqa: E402
from specdec_cli.presets import resolve  # noqa: E402
from specdec_cli.records import modelled_latency  # noqa: E402
from specdec_cli.remote.local_server import LocalServer as Server  # noqa: E402

PRESETS = REPO / "specdec_cli/demo/models/edge/specdec_presets.toml"


def modes() -> dict[str, DecodingConfig]:
    def preset(name: str) -> DecodingConfig:
        return DecodingConfig().with_(**resolve(name, [PRESETS]).values)
    return {"edge": DecodingConfig(mode="edge"), "cloud": DecodingConfig(mode="cloud"), "fluent": preset("fluent"),
            "quality": preset("quality"), "always": preset("quality").with_(verify="always")}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--delays", default="0,10,50", help="client-side link delays (ms per round trip)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    delays = [float(x) for x in args.delays.split(",")]
    samples = sorted((REPO / "samples").glob("*.wav"))
    audios = [load_audio(p, 16000, 30.0) for p in samples]
    local = Describer(load_pair())
    with Server() as server:
        remote = Describer(load_pair(None, server.url))
        for mode_cfg in modes().values():  # warm-up, untimed
            local.run(audios[0], mode_cfg)
            remote.run(audios[0], mode_cfg)
        out: dict[str, Any] = {"server": server.lines[-1].strip(), "clips": len(samples), "repeats": args.repeats,
                               "threads": args.threads, "delays_ms": delays, "modes": {}}
        for name, cfg in modes().items():
            rows: dict[str, list[float]] = {"local_s": [], "up": [], "down": [], "trips": [], "wait_s": [],
                                            "calls": []}
            by_delay: dict[float, list[float]] = {d: [] for d in delays}
            predicted: dict[float, list[float]] = {d: [] for d in delays}
            same = 0
            for _ in range(args.repeats):
                for audio in audios:
                    here = local.run(audio, cfg)
                    rows["local_s"].append(here.latency_s)
                    rows["calls"].append(here.result.stats.cloud_calls)
                    for d in delays:
                        remote.pair.remote.link_delay_s = d / 1000
                        there = remote.run(audio, cfg)
                        by_delay[d].append(there.latency_s)
                        predicted[d].append(modelled_latency(here.latency_s, cfg.mode, here.result.stats.cloud_calls, d))
                        if d == delays[0]:
                            same += there.result.tokens == here.result.tokens
                            rows["up"].append(there.link.uplink_bytes)
                            rows["down"].append(there.link.downlink_bytes)
                            rows["trips"].append(there.link.round_trips)
                            rows["wait_s"].append(there.link.cloud_wait_s)
            remote.pair.remote.link_delay_s = 0.0
            mean = statistics.fmean
            out["modes"][name] = {
                "same_tokens": f"{same}/{len(audios) * args.repeats}",
                "uplink_bytes": mean(rows["up"]), "downlink_bytes": mean(rows["down"]),
                "round_trips": mean(rows["trips"]), "cloud_calls": mean(rows["calls"]),
                "cloud_wait_s": mean(rows["wait_s"]),
                "sent_nothing_share": sum(u == 0 for u in rows["up"]) / len(rows["up"]),
                "in_process_s": mean(rows["local_s"]),
                "remote_s": {f"{d:g}ms": mean(v) for d, v in by_delay.items()},
                "predicted_s": {f"{d:g}ms": mean(v) for d, v in predicted.items()},
                "remote_vs_in_process": mean(by_delay[delays[0]]) / mean(rows["local_s"]),
            }
        remote.pair.remote.close()
    if args.json:
        print(json.dumps(out, ensure_ascii=False, indent=2))
    else:
        print(table(out))
    return out


def table(out: dict[str, Any]) -> str:
    delays = [f"{d:g}ms" for d in out["delays_ms"]]
    head = ["mode", "same", "up kB", "down kB", "trips", "in-proc s", *[f"remote {d}" for d in delays],
            *[f"predicted {d}" for d in delays[1:]]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, m in out["modes"].items():
        cells = [name, m["same_tokens"], f"{m['uplink_bytes'] / 1000:.1f}", f"{m['downlink_bytes'] / 1000:.2f}",
                 f"{m['round_trips']:.1f}", f"{m['in_process_s']:.3f}",
                 *[f"{m['remote_s'][d]:.3f}" for d in delays], *[f"{m['predicted_s'][d]:.3f}" for d in delays[1:]]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
