"""`specdec serve` with and without batching: verifications/s and latency under concurrent sessions.

    python bench/server_batching.py [--json] [--sessions 1,4,8,16] [--seconds 8] [--windows 1,2,5]

1. Record: the bundled samples are described once with the real client (quality preset, and
   verify=always for a cloud-heavy mix) through a one-at-a-time server; every /v1/verify request
   the client sent is kept, per clip, in order (`RemoteClient.call` wrapped).
2. Replay: a load generator (asyncio + httpx, no edge compute: the drafts are the recorded ones)
   runs rounds of N sessions: each takes the next recorded clip; first all N open at once (the
   clip's first request: the audio, the lazy prefill), then each sends the rest of its clip's
   requests, the next as soon as the previous answer is back (the session id the server gave
   substituted). For N = 1, 4, 8, 16, against two servers on the bundled demo cloud, both
   `--threads 1`: batched (--max-batch 16, the default window unless --window-ms) and one at a time
   (--max-batch 1), alternating per N so a load spike hits both.
3. Reported per server and N, for all requests and for each phase (opening: the prefills;
   continuing: the verifications after it): verifications/s (wall), p50/p95 latency per request,
   the server process's CPU time per verification (/proc utime+stime; wall time is noisy on a
   shared machine), the mean batch size (the server's specdec_verify_batch_size histogram), and
   requests answered unlike the recording (`differed`: a near-tie flipped by float rounding, or an
   error). Then a window sweep at 8 sessions (batched server restarted per window).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
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
from specdec_cli.remote import client as client_mod  # noqa: E402
from specdec_cli.remote import wire  # noqa: E402
from specdec_cli.remote.local_server import LocalServer as Server  # noqa: E402

PRESETS = REPO / "specdec_cli/demo/models/edge/specdec_presets.toml"


def record(url: str) -> list[list[tuple[wire.VerifyRequest, Any]]]:
    """Per clip: its verify requests and the answers, as the real client sent and got them."""
    quality = DecodingConfig().with_(**resolve("quality", [PRESETS]).values)
    clips: list[list[tuple[wire.VerifyRequest, Any]]] = []
    current: list[tuple[wire.VerifyRequest, Any]] = []
    original = client_mod.RemoteClient.call

    def call(self, method, path, message, kind, link, *args, **kwargs):  # type: ignore[no-untyped-def]
        # the client's own options (cap, retry_s, session, ...) pass through unchanged
        answer = original(self, method, path, message, kind, link, *args, **kwargs)
        if path == "/v1/verify":
            current.append((message, answer))
        return answer
    client_mod.RemoteClient.call = call  # type: ignore[method-assign]
    try:
        describer = Describer(load_pair(None, url))
        for cfg in (quality, quality.with_(verify="always")):
            for path in sorted((REPO / "samples").glob("*.wav")):
                describer.run(load_audio(path, 16000, 30.0), cfg)
                if current:
                    clips.append(list(current))
                current.clear()
        describer.pair.remote.close()
    finally:
        client_mod.RemoteClient.call = original  # type: ignore[method-assign]
    return clips


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def batch_hist(url: str) -> tuple[float, float]:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    values = {s.name: s.value for f in text_string_to_metric_families(httpx.get(f"{url}/metrics").text)
              for s in f.samples}
    return values["specdec_verify_batch_size_sum"], values["specdec_verify_batch_size_count"]


async def replay(url: str, clips: list[list[tuple[wire.VerifyRequest, Any]]], sessions: int, seconds: float,
                 pid: int | None = None, follow: bool = False) -> dict[str, Any]:
    """Rounds of N sessions until `seconds` have passed: each session takes the next recorded clip;
    first all N open (their first request: the clip, the lazy prefill), then all replay the rest
    of their requests, each as soon as its previous answer is back. Each phase is timed apart
    (wall, latencies, and the server's CPU when `pid` is given); totals cover both. `follow`: for
    another cloud than the recording's, whose verdicts differ: each request carries the recorded
    draft after what the server kept plus its token (the loop's flow, an edge that never catches up
    on its own)."""
    import httpx

    phases = {"opening": {"n": 0, "wall": 0.0, "cpu": 0.0, "lat": []}, "continuing": {"n": 0, "wall": 0.0, "cpu": 0.0,
                                                                                       "lat": []}}
    differed = 0
    last: dict[str, Any] = {}  # follow: session -> its last answer
    limits = httpx.Limits(max_connections=sessions + 2, max_keepalive_connections=sessions + 2)

    async def send(http: httpx.AsyncClient, req: wire.VerifyRequest, answer: Any, phase: str) -> str | None:
        """The request; the session id to go on with (None: ended, refused or answered otherwise)."""
        nonlocal differed
        started = time.perf_counter()
        response = await http.post("/v1/verify", content=wire.encode(req), headers={"Content-Type": wire.MSGPACK})
        phases[phase]["lat"].append(time.perf_counter() - started)
        phases[phase]["n"] += 1
        if response.status_code != 200:
            differed += 1
            return None
        got = wire.decoder(wire.VerifyResponse, wire.MSGPACK).decode(response.content)
        if follow:
            last[got.session] = got
        elif (got.accepted, got.token, got.held) != (answer.accepted, answer.token, answer.held):
            differed += 1  # a verdict unlike the recorded one (near-tie): the rest of the clip would be out of sync
            return None
        return None if got.ended else got.session

    async def go_on(http: httpx.AsyncClient, sid: str | None, rest: list[tuple[wire.VerifyRequest, Any]]) -> None:
        for request, answer in rest:
            if sid is None:
                return
            held, pending = request.held, request.pending
            if follow:
                held, pending = last[sid].held, [last.pop(sid).token]
            sid = await send(http, wire.VerifyRequest(request.draft, session=sid, held=held, pending=pending,
                                                      sampling=request.sampling), answer, "continuing")
        if sid is not None:
            await http.delete(f"/v1/sessions/{sid}")

    async def timed(phase: str, work: Any) -> Any:
        cpu0, began = cpu_s(pid) if pid else 0.0, time.perf_counter()
        out = await work
        phases[phase]["wall"] += time.perf_counter() - began
        phases[phase]["cpu"] += (cpu_s(pid) if pid else 0.0) - cpu0
        return out

    stop = time.perf_counter() + seconds
    nxt = 0
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        while time.perf_counter() < stop:
            chosen = [clips[(nxt + i) % len(clips)] for i in range(sessions)]
            nxt += sessions
            sids = await timed("opening", asyncio.gather(*(send(http, c[0][0], c[0][1], "opening") for c in chosen)))
            await timed("continuing", asyncio.gather(*(go_on(http, sid, c[1:]) for sid, c in zip(sids, chosen,
                                                                                                 strict=True))))
    out: dict[str, Any] = {}
    for name, ph in phases.items():
        lat = sorted(ph["lat"])
        out[name] = {"verifications": ph["n"], "wall_s": round(ph["wall"], 3),
                     "verifications_per_s": round(ph["n"] / ph["wall"], 1) if ph["wall"] else 0.0,
                     "p50_ms": round(1e3 * lat[len(lat) // 2], 2) if lat else None,
                     "p95_ms": round(1e3 * lat[min(len(lat) - 1, int(0.95 * len(lat)))], 2) if lat else None,
                     "server_cpu_ms_per_verification": round(1e3 * ph["cpu"] / ph["n"], 3) if ph["n"] and pid else None}
    n = sum(ph["n"] for ph in phases.values())
    wall = sum(ph["wall"] for ph in phases.values())
    lat = sorted(phases["opening"]["lat"] + phases["continuing"]["lat"])
    out["all"] = {"verifications": n, "wall_s": round(wall, 3), "verifications_per_s": round(n / wall, 1),
                  "p50_ms": round(1e3 * lat[len(lat) // 2], 2),
                  "p95_ms": round(1e3 * lat[min(len(lat) - 1, int(0.95 * len(lat)))], 2),
                  "server_cpu_ms_per_verification": round(1e3 * sum(ph["cpu"] for ph in phases.values()) / n, 3)
                  if pid else None}
    out["differed"] = differed
    return out


def measure(server: Server, clips: list, sessions: int, seconds: float, follow: bool = False) -> dict[str, Any]:
    hist0 = batch_hist(server.url)
    row = asyncio.run(replay(server.url, clips, sessions, seconds, server.proc.pid, follow))
    hist1 = batch_hist(server.url)
    batches = hist1[1] - hist0[1]
    row["mean_batch"] = round((hist1[0] - hist0[0]) / batches, 2) if batches else 0.0
    return row


def compare(single: Server, batched: Server, clips: list, counts: list[int], seconds: float,
            follow: bool = False) -> dict[str, Any]:
    """Both servers at each N, alternating; speedups batched / one at a time per phase."""
    for server in (single, batched):  # warm-up, untimed
        asyncio.run(replay(server.url, clips, 2, 1.0, follow=follow))
    runs: dict[str, Any] = {}
    for n in counts:
        one = measure(single, clips, n, seconds, follow)
        many = measure(batched, clips, n, seconds, follow)
        runs[str(n)] = {"one_at_a_time": one, "batched": many, "speedup": {
            phase: {"verifications_per_s": round(many[phase]["verifications_per_s"]
                                                 / max(1e-9, one[phase]["verifications_per_s"]), 2),
                    "server_cpu": round(one[phase]["server_cpu_ms_per_verification"]
                                        / max(1e-9, many[phase]["server_cpu_ms_per_verification"]), 2)}
            for phase in ("all", "opening", "continuing")}}
        for phase in ("all", "continuing"):
            a, b = one[phase], many[phase]
            print(f"{n:>3} sessions, {phase:>10}: {a['verifications_per_s']:>6.1f} -> "
                  f"{b['verifications_per_s']:>6.1f} verif/s, server cpu {a['server_cpu_ms_per_verification']:.2f}"
                  f" -> {b['server_cpu_ms_per_verification']:.2f} ms/verif, p50 {a['p50_ms']} -> {b['p50_ms']} ms,"
                  f" p95 {a['p95_ms']} -> {b['p95_ms']} ms, mean batch {many['mean_batch']}", file=sys.stderr)
    return runs


def wider_cloud(folder: Path, hidden: int, layers: int) -> Path:
    """The demo cloud's layout (tokenizer, audio tower, vocabulary, token ids) with a wider, deeper
    random text model: a cloud whose forward is weight-bound, as a real one is, where sharing a
    forward among sessions pays. Random weights: only the cost is meant."""
    import shutil

    import torch
    from transformers import AutoConfig, Qwen2_5OmniThinkerForConditionalGeneration

    demo = REPO / "specdec_cli/demo/models/cloud"
    shutil.copytree(demo, folder, ignore=shutil.ignore_patterns("*.safetensors", "config.json"))
    config = AutoConfig.from_pretrained(demo)
    text = config.text_config
    text.hidden_size, text.intermediate_size, text.num_hidden_layers = hidden, hidden * 11 // 4, layers
    text.num_attention_heads, text.num_key_value_heads = hidden // 64, 2
    text.layer_types = ["full_attention"] * layers
    config.audio_config.output_dim = hidden  # the audio tower projects into the text model's width
    text.rope_parameters = {**text.rope_parameters, "mrope_section": [8, 12, 12]}  # head_dim 64
    torch.manual_seed(0)
    Qwen2_5OmniThinkerForConditionalGeneration(config).save_pretrained(folder)
    return folder


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--sessions", default="1,4,8,16")
    ap.add_argument("--seconds", type=float, default=8.0, help="replay time per server and N")
    ap.add_argument("--window-ms", type=float, default=None, help="the batched server's window (default: the CLI's)")
    ap.add_argument("--windows", default="1,2,5", help="windows (ms) swept at 8 sessions ('' to skip)")
    ap.add_argument("--wider", default="512x4", help="also a random cloud of this hidden size x layers ('' to skip)")
    args = ap.parse_args(argv)
    counts = [int(x) for x in args.sessions.split(",")]
    window = ["--batch-window-ms", f"{args.window_ms:g}"] if args.window_ms is not None else []
    with Server("--max-batch", "1") as single:
        clips = record(single.url)
        with Server("--max-batch", "16", *window) as batched:
            out: dict[str, Any] = {
                "machine": f"{os.cpu_count()} CPUs shared with other engineers' jobs, load average "
                           f"{os.getloadavg()[0]:.1f} at start",
                "server_threads": 1, "batched": batched.lines[-1].strip(), "single": single.lines[-1].strip(),
                "recorded_clips": len(clips), "recorded_verifications": sum(len(c) for c in clips),
                "seconds_per_run": args.seconds}
            out["runs"] = compare(single, batched, clips, counts, args.seconds)
    out["windows_at_8"] = {}
    for w in [float(x) for x in args.windows.split(",") if x]:
        with Server("--max-batch", "16", "--batch-window-ms", f"{w:g}") as server:
            asyncio.run(replay(server.url, clips, 2, 1.0))
            row = measure(server, clips, 8, args.seconds)
        out["windows_at_8"][f"{w:g}"] = row
        print(f"window {w:g} ms at 8 sessions: {row['all']['verifications_per_s']} verif/s, p50 "
              f"{row['all']['p50_ms']} ms, cpu {row['all']['server_cpu_ms_per_verification']} ms/verif, "
              f"continuing {row['continuing']['verifications_per_s']} verif/s, mean batch {row['mean_batch']}",
              file=sys.stderr)
    if args.wider:
        import tempfile

        hidden, layers = (int(x) for x in args.wider.split("x"))
        with tempfile.TemporaryDirectory() as tmp:
            folder = wider_cloud(Path(tmp) / "cloud", hidden, layers)
            print(f"random cloud, hidden {hidden}, {layers} layers:", file=sys.stderr)
            with Server("--cloud", str(folder), "--max-batch", "1") as single, \
                    Server("--cloud", str(folder), "--max-batch", "16", *window) as batched:
                out["wider_cloud"] = {"hidden": hidden, "layers": layers, "server": batched.lines[-1].strip(),
                                      "runs": compare(single, batched, clips, counts, args.seconds, follow=True)}
    out["target"] = "batched >= 2.5x verifications/s at 8 sessions"
    out["target_met"] = {name: runs["8"]["speedup"]["all"]["verifications_per_s"] >= 2.5
                         for name, runs in (("demo", out["runs"]), ("wider", out.get("wider_cloud", {}).get("runs", {})))
                         if "8" in runs}
    if args.json:
        print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
