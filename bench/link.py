"""The remote cloud behind a slower link: time and round trips per clip with D ms added per round trip.

    python bench/link.py [--quick] [--json] [--delays 0,10,50,100] [--pairs demo,self,noised]
                         [--modes fluent,quality] [--edge DIR] [--out FILE] [--depth 1,2,3,auto]

For each pair it starts a real `specdec serve` process on 127.0.0.1 (a free port, stopped by its
pid) hosting the pair's cloud, and per delay D a delaying TCP proxy process in front of it: every
chunk the client sends is forwarded D ms after it arrived (answers pass at once), so each round
trip costs D more, whatever its size, and nothing in the client sleeps. Over the bundled samples
(`--quick`: the first three) it times, per mode, one clip after the other:

* in process (the edge and the cloud here): edge-only (the reference), cloud-only, and the presets
  of `--modes` (default fluent, quality; any preset of the bundled presets file, e.g. frugal);
* through the proxy: cloud-only (one round trip) and the same presets, with each remote client this
  specdec has (`variants`): the blocking one of before issue 28 ("legacy"; on a specdec from
  before it, "blocking"), the blocking one whose session close is not waited for, the pipelined
  one (`RemoteClient.pipelined`: the edge drafts ahead while a verdict is in flight) and the
  pipelined one with `RemoteClient.upload = "eager"` (the clip up at the clip's start). With
  `--depth 1,2,3,auto` instead, one client per depth (`RemoteClient.depth`: verifications a clip
  keeps in flight, protocol 3; pipelined, lazy upload), each a row with its out-of-sync refusals
  and the cloud forwards run and not used, per clip.

`--modes` takes any preset, and `always`: the quality preset with every block verified.

It reports the median seconds per clip (and the mean), round trips per clip and whether every
clip's tokens equal the in-process
run's. Three pairs: `demo` (the bundled pair), `self` (the bundled cloud as the edge too: every
greedy draft is accepted) and `noised` (the cloud's weights plus Gaussian noise of
`--noise` x each tensor's standard deviation as the edge: an acceptance in between), written to
a temporary folder and removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

DEMO = REPO / "specdec_cli/demo/models"
PRESETS = DEMO / "edge/specdec_presets.toml"


# -- the delaying proxy (a child process) ---------------------------------------------------------
# Hand-written: a delaying TCP relay is a few lines of asyncio, and no maintained package does just
# this without root (tc netem needs CAP_NET_ADMIN) or a heavy dependency (toxiproxy is a Go server).

async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float) -> None:
    """Copy reader to writer, each chunk written `delay_s` after it was read (chunks in order; a
    long body is delayed once, not once per chunk)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def forward() -> None:
        while True:
            due, data = await queue.get()
            if not data:
                break
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()

    sender = asyncio.create_task(forward())
    try:
        while True:
            data = await reader.read(65536)
            queue.put_nowait((loop.time() + delay_s, data))
            if not data:
                break
        await sender
    except (ConnectionError, asyncio.CancelledError):
        sender.cancel()
    finally:
        writer.close()


async def _proxy(upstream_port: int, delay_s: float) -> None:
    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", upstream_port)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(_pump(client_r, server_w, delay_s), _pump(server_r, client_w, 0.0),
                             return_exceptions=True)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(f"proxy on {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


class Proxy:
    """`python bench/link.py --proxy-to PORT --delay-ms D` as a child process, stopped by its pid."""

    def __init__(self, upstream_port: int, delay_ms: float) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, "--proxy-to", str(upstream_port),
                                      "--delay-ms", str(delay_ms)], stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("proxy on "):
            self.stop()
            raise RuntimeError(f"the proxy did not start: {line!r}")
        self.url = f"http://127.0.0.1:{int(line.split()[-1])}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=10)


# -- pairs ------------------------------------------------------------------------------------------

def noised_copy(cloud: Path, out: Path, scale: float, seed: int = 0) -> Path:
    """The cloud's folder copied to `out` with every floating tensor plus N(0, (scale * its std)^2)."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(cloud, out)
    tensors = load_file(str(cloud / "model.safetensors"))
    gen = torch.Generator().manual_seed(seed)
    for t in tensors.values():
        if t.is_floating_point() and t.numel() > 1:
            t.add_(torch.randn(t.shape, generator=gen, dtype=t.dtype) * (scale * float(t.float().std())))
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


SPEC = ("fluent", "quality")  # the presets timed over the link (--modes)


def modes(names: tuple[str, ...] = SPEC, presets: Path = PRESETS) -> dict[str, Any]:
    from specdec_cli.decoding import DecodingConfig
    from specdec_cli.presets import resolve

    def preset(name: str) -> DecodingConfig:
        return DecodingConfig().with_(**resolve(name, [presets]).values)
    def mode(name: str) -> DecodingConfig:
        return preset("quality").with_(verify="always") if name == "always" else preset(name)
    return {"edge": DecodingConfig(mode="edge"), "cloud": DecodingConfig(mode="cloud"),
            **{name: mode(name) for name in names}}


def variants(client: Any, depths: tuple[str, ...] = ()) -> list[str]:
    """The remote clients this specdec has. Before issue 28 only "blocking" (each verification
    waited for; the session's close one more round trip). After it: "legacy" (that client,
    reproduced here: blocking, the close waited for), "blocking" (the close sent without waiting),
    "pipelined" (the edge drafts ahead while a verdict is in flight; the clip up at the first
    verification) and "eager" (pipelined, the clip up at the clip's start). With `depths`: "d1",
    "d2", ..., "dauto", the pipelined client with that `RemoteClient.depth` (issue 43)."""
    if depths:
        return [f"d{d}" for d in depths]
    if not hasattr(client, "pipelined"):
        return ["blocking"]
    return ["legacy", "blocking", "pipelined", "eager"]


def _waited(client: Any) -> Any:
    """The session's close as before issue 28: the DELETE sent and its answer waited for."""
    from specdec_cli.remote.client import CloudError, CloudUnreachable, SessionLost

    def send(method: str, path: str, link: Any, session: str | None = None) -> bool:
        try:  # the session header as the client sends it since the server keys sessions by it
            client.call(method, path, None, None, link, session=session)
        except (CloudUnreachable, CloudError, SessionLost):
            pass
        return True
    return send


def set_variant(client: Any, variant: str) -> None:
    if not hasattr(client, "pipelined"):
        return
    if variant == "legacy":
        client.send_later = _waited(client)
    else:
        client.__dict__.pop("send_later", None)
    client.pipelined = variant in ("pipelined", "eager") or variant.startswith("d")
    client.upload = "eager" if variant == "eager" else "lazy"
    if hasattr(client, "depth"):
        client.depth = variant[1:] if variant.startswith("d") else 1


AHEAD = {"drafted": 0, "kept": 0}  # blocks drafted ahead (came back whole) and kept, this process


def count_ahead() -> None:
    """Count the loop's blocks drafted ahead and kept (where this specdec drafts ahead)."""
    from specdec_cli.decoding import loop

    if not hasattr(loop, "draft_ahead") or getattr(loop.draft_ahead, "counted", False):
        return
    draft_ahead, discard = loop.draft_ahead, loop.Ahead.discard

    def counting_draft(*args: Any, **kwargs: Any) -> Any:
        got = draft_ahead(*args, **kwargs)
        if got is not None:
            AHEAD["drafted"] += 1
            AHEAD["kept"] += 1
            got.counted = True
        return got

    def counting_discard(self: Any, *args: Any, **kwargs: Any) -> Any:
        AHEAD["kept"] -= getattr(self, "counted", False)
        return discard(self, *args, **kwargs)

    counting_draft.counted = True
    loop.draft_ahead, loop.Ahead.discard = counting_draft, counting_discard


def bench_pair(edge: Path, cloud: Path, audios: list, delays: list[float], repeats: int,
               spec: tuple[str, ...] = SPEC, presets: Path = PRESETS, depths: tuple[str, ...] = ()) -> dict[str, Any]:
    from specdec_cli.describe import Describer
    from specdec_cli.remote.local_server import LocalServer

    cfgs = modes(spec, presets)
    local = Describer(loaded(edge, str(cloud), presets))
    here: dict[str, list] = {m: [local.run(a, cfg) for a in audios] for m, cfg in cfgs.items()}  # warm-up
    here = {m: [local.run(a, cfg) for a in audios] for m, cfg in cfgs.items()}
    out: dict[str, Any] = {"edge": str(edge.relative_to(REPO) if edge.is_relative_to(REPO) else edge.name),
                           "cloud": str(cloud.relative_to(REPO)), "in_process": {}, "remote": {}}
    for m, runs in here.items():
        stats = [r.result.stats for r in runs]
        out["in_process"][m] = {"s_per_clip": statistics.median(r.latency_s for r in runs),
                                "mean_s_per_clip": statistics.fmean(r.latency_s for r in runs),
                                "escalations": statistics.fmean(s.escalations for s in stats),
                                "acceptance": _acceptance(stats)}
    with LocalServer("--cloud", str(cloud)) as server:
        for d in delays:
            proxy = Proxy(server.port, d)
            try:
                remote = Describer(loaded(edge, proxy.url, presets))
                client = remote.pair.remote
                keys = [("cloud", "-")] + [(m, v) for m in spec for v in variants(client, depths)]
                # --depth auto reads the share of recent blocks kept whole: each mode its own record,
                # as a run of one mode would have (the clients of one mode share it).
                recents = {m: client.recent.__class__(maxlen=client.recent.maxlen)
                           for m in cfgs} if hasattr(client, "recent") else {}
                for m, v in keys:  # warm-up: connection, server caches
                    set_variant(client, v)
                    if recents:
                        client.recent = recents[m]
                    remote.run(audios[0], cfgs[m])
                got: dict[tuple[str, str], list] = {key: [] for key in keys}
                ahead: dict[tuple[str, str], list[int]] = {key: [0, 0] for key in keys}
                used: dict[tuple[str, str], list[int]] = {key: [] for key in keys}  # the depth each clip had
                # Clip by clip, every mode and client back to back, so that a load spike hits all.
                for _ in range(repeats):
                    for i, audio in enumerate(audios):
                        for m, v in keys:
                            set_variant(client, v)
                            if recents:
                                client.recent = recents[m]
                            before = dict(AHEAD)
                            if depths and m != "cloud":
                                used[m, v].append(client.depth_for(remote.pair.edge, cfgs[m].k))
                            got[m, v].append((i, remote.run(audio, cfgs[m])))
                            ahead[m, v][0] += AHEAD["drafted"] - before["drafted"]
                            ahead[m, v][1] += AHEAD["kept"] - before["kept"]
                row: dict[str, Any] = {}
                for (m, v), runs in got.items():
                    same = sum(r.result.tokens == here[m][i].result.tokens for i, r in runs)
                    times = [r.latency_s for _, r in runs]
                    row[m if m == "cloud" else f"{m}/{v}"] = {
                        "s_per_clip": statistics.median(times), "mean_s_per_clip": statistics.fmean(times),
                        "round_trips": statistics.fmean(r.link.round_trips for _, r in runs),
                        "same_tokens": f"{same}/{len(runs)}",
                        "ahead_drafted_per_clip": ahead[m, v][0] / len(runs),
                        "ahead_kept_per_clip": ahead[m, v][1] / len(runs)}
                    if depths:
                        links = [r.link for _, r in runs]
                        row[m if m == "cloud" else f"{m}/{v}"].update({
                            "verifications": statistics.fmean(li.verifications for li in links),
                            "out_of_sync": statistics.fmean(li.out_of_sync for li in links),
                            "discarded_forwards": statistics.fmean(li.discarded_forwards for li in links),
                            "escalations": statistics.fmean(r.result.stats.escalations for _, r in runs),
                            "depth_used": statistics.fmean(used[m, v]) if used[m, v] else None})
                if depths:
                    row["rtt_s"] = client.rtt_s if client.rtt_s else None  # measured by --depth auto's probes
                client.close()
                out["remote"][f"{d:g}ms"] = row
            finally:
                proxy.stop()
    return out


def loaded(edge: Path, cloud: str, presets: Path = PRESETS) -> Any:
    """The pair (`load_pair`) with the bundled presets file's meaning gate, as `specdec.Pair` gives
    it, so that a verify = "meaning" preset (frugal) decodes with its gate, not the entropy one."""
    from specdec_cli.gate_presets import load_gates
    from specdec_cli.models import load_pair
    from specdec_cli.remote.wire import tokenizer_fingerprint

    models = load_pair(str(edge), cloud)
    models.gate = load_gates((presets,), tokenizer_fingerprint(models.tokenizer))
    return models


def _acceptance(stats: list) -> float | None:
    drafted = sum(s.verified_drafted for s in stats)
    return sum(s.verified_accepted for s in stats) / drafted if drafted else None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the first three samples only")
    ap.add_argument("--json", action="store_true", help="print JSON, not the table")
    ap.add_argument("--out", type=Path, help="also write the JSON here")
    ap.add_argument("--delays", default="0,10,50,100", help="ms added per round trip")
    ap.add_argument("--pairs", default="demo,self,noised")
    ap.add_argument("--modes", default=",".join(SPEC), help="presets timed besides cloud-only (e.g. quality,frugal)")
    ap.add_argument("--noise", type=float, default=0.4, help="the noised edge: noise std / tensor std")
    ap.add_argument("--edge", type=Path, help="the demo pair's edge, with its presets file (default: the bundled "
                                              "edge), e.g. an earlier demo edge against the same bundled cloud")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=1, help="passes over the clips per delay")
    ap.add_argument("--depth", default="", help="verifications in flight to time, one client each, e.g. 1,2,3,auto "
                                                "(instead of the legacy/blocking/pipelined/eager clients)")
    ap.add_argument("--proxy-to", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--delay-ms", type=float, default=0.0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.proxy_to is not None:
        asyncio.run(_proxy(args.proxy_to, args.delay_ms / 1000))
        return {}
    import torch

    from specdec_cli.audio import load_audio

    torch.set_num_threads(args.threads)
    count_ahead()
    delays = [float(x) for x in args.delays.split(",")]
    samples = sorted((REPO / "samples").glob("*.wav"))[: 3 if args.quick else None]
    audios = [load_audio(p, 16000, 30.0) for p in samples]
    cloud = DEMO / "cloud"
    spec = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    depths = tuple(d.strip() for d in args.depth.split(",") if d.strip())
    if depths:
        from specdec_cli.decoding.block_length import parse_depth

        for d in depths:
            parse_depth(d)  # 1..4 or auto
    out: dict[str, Any] = {"clips": len(samples), "repeats": args.repeats, "modes": list(spec), "threads": args.threads, "delays_ms": delays,
                           "depths": list(depths),
                           "load_average": list(os.getloadavg()), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                           time.gmtime()),
                           "pairs": {}}
    with tempfile.TemporaryDirectory(prefix="specdec-link-") as tmp:
        edges = {"demo": args.edge or DEMO / "edge", "self": cloud}
        for name in args.pairs.split(","):
            if name == "noised":
                edges[name] = noised_copy(cloud, Path(tmp) / "noised", args.noise)
            presets = edges[name] / "specdec_presets.toml" if name == "demo" and args.edge else PRESETS
            out["pairs"][name] = bench_pair(edges[name], cloud, audios, delays, args.repeats, spec, presets,
                                           depths)
            print(f"{name}: done", file=sys.stderr, flush=True)
    out["load_average_after"] = list(os.getloadavg())
    text = json.dumps(out, ensure_ascii=False, indent=2)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(text if args.json else (depth_table(out) if depths else table(out)))
    return out


def depth_table(out: dict[str, Any]) -> str:
    """--depth: a row per pair, delay, mode and depth: median s per clip, and per clip the round
    trips, verifications, out-of-sync refusals, cloud forwards run and not used, the depth used."""
    head = ("| pair | +ms | mode | depth | s/clip | in process | / cloud-only | / depth 1 | trips | verifications "
            "| out of sync | wasted forwards | depth used | same tokens |")
    parts = [head, "|---" * 14 + "|"]
    for name, p in out["pairs"].items():
        for d, row in p["remote"].items():
            cloud = row["cloud"]["s_per_clip"]
            for key, v in row.items():
                if key in ("cloud", "rtt_s"):
                    continue
                mode, variant = key.split("/")
                first = row.get(f"{mode}/d1", {}).get("s_per_clip")
                used = "-" if v.get("depth_used") is None else f"{v['depth_used']:.1f}"
                per_first = "-" if not first else f"{v['s_per_clip'] / first:.2f}"
                here = p.get("in_process", {}).get(mode, {}).get("s_per_clip")
                here_cell = "-" if here is None else f"{here:.3f}"
                parts.append(f"| {name} | {d} | {mode} | {variant[1:]} | {v['s_per_clip']:.3f} | {here_cell} | "
                             f"{v['s_per_clip'] / cloud:.2f} | {per_first} | "
                             f"{v['round_trips']:.1f} | {v['verifications']:.1f} | {v['out_of_sync']:.1f} | "
                             f"{v['discarded_forwards']:.1f} | {used} | {v['same_tokens']} |")
    return "\n".join(parts)


def table(out: dict[str, Any]) -> str:
    """One markdown table per pair: a row per delay, seconds per clip (round trips) per column."""
    parts = []
    for name, p in out["pairs"].items():
        ip = p["in_process"]
        acc = ip.get("quality", {}).get("acceptance")
        times = ", ".join(f"{m} {v['s_per_clip']:.3f}" for m, v in ip.items())
        parts.append(f"**{name}** (edge {p['edge']}; in process s/clip: {times}; quality acceptance "
                     f"{'-' if acc is None else f'{acc:.2f}'})\n")
        cols = list(next(iter(p["remote"].values())).keys())
        parts.append("| +ms | " + " | ".join(f"{c} s (trips)" for c in cols) + " | same |")
        parts.append("|---" * (len(cols) + 2) + "|")
        for d, row in p["remote"].items():
            same = all(v["same_tokens"].split("/")[0] == v["same_tokens"].split("/")[1] for v in row.values())
            cells = [f"{row[c]['s_per_clip']:.3f} ({row[c]['round_trips']:.1f})" for c in cols]
            parts.append(f"| {d} | " + " | ".join(cells) + f" | {'yes' if same else 'NO'} |")
        parts.append("")
    return "\n".join(parts)


if __name__ == "__main__":
    main()
