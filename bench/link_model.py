"""MODELLED, not measured: time per clip over a link at the Qwen2.5-Omni 3B (edge) / 7B (cloud)
thinker shapes, cloud-only against speculative decoding with one verdict in flight (today's
pipelined client) and with D verifications in flight (protocol 3, issue 43).

    python bench/link_model.py [--json] [--out docs/results/bench-link-model.json]

Each forward's cost is bench/capacity_model.py's roofline, at batch 1 (one clip's latency, not a
server's capacity):

    step(n tokens) = max(weight bytes / bandwidth, 2 · params · n / FLOPS) + KV reads + launch

- cloud: the 7B thinker on an H100 SXM, capacity_model's figures (70 % of 3.35 TB/s, 50 % of 989
  bf16 TFLOP/s, 0.5 ms per forward). docs/gpu.md has no measured GPU run yet (its tables say "Not
  yet measured"), so no measured figure replaces these.
- edge: the 3B thinker on a laptop-class GPU, ASSUMED: an RTX 4090 Laptop GPU, 576 GB/s GDDR6
  (NVIDIA's specification: 256-bit bus, 18 Gbps) at 70 % reached, and 80 bf16 TFLOP/s dense (an
  assumption: the desktop AD103 card's ~97 TFLOP/s with FP32 accumulation at laptop clocks) at 50 %
  reached, 0.5 ms per forward. Two weight formats: bf16 (2 bytes per parameter, 6.2 GB: it fits the
  card's 16 GB) and 4-bit (0.53 bytes per parameter: 4 bits plus a 16-bit scale and zero per group of
  128, the usual on-device quantisation; its tokens would differ from the bf16 edge's, which only
  changes the acceptance, stated apart).
- work per clip: the demo pair's, as capacity_model reads it from docs/results/eval-samples.json (P prompt
  tokens, N answer tokens); context for the KV reads P + N / 2. The acceptance a is per drafted
  position, independent (the model of Leviathan et al. 2023): the demo pair's `verify=always`
  run measured 0.60 of drafted tokens accepted (docs/results/eval-samples.json, mode `always`), and the
  self pair 1.0; both are shown.
- the link: a round trip of R adds R to each request (R/2 each way); the bytes' transfer time is
  not modelled (the clip goes up once in both modes: cloud-only with its request, the split lazily
  with the first verification).

Cloud-only: one request, the cloud's prefill, then N − 1 decode steps (the prefill gives the first
token), one round trip:

    T_cloud = R + prefill_7B(P) + (N − 1) · step_7B(1)

Speculative, every block verified (verify=always), block length k: the edge prefills the clip
(prefill_3B(P)), then drafts blocks; a block is k drafted tokens plus the edge's guess of the bonus
token (its greedy choice at position k + 1: the pipelined client drafts the next block after it),
k + 1 edge steps, t_d = (k + 1) · step_3B(1). Its verification costs the cloud t_v = step_7B(k + 1)
(the first one of a clip: prefill_7B(P + k + 1) instead, the lazy prefill scoring the first draft).
Each of the k + 1 positions holds with probability a; a verdict is **clean** when all k + 1 hold
(prob a^(k+1)): then the edge's next block, drafted after exactly that prefix, is still valid. A
verdict whose first failure is at position j gives j tokens (j − 1 kept, plus the cloud's token) and
ends an **episode**: every block drafted or sent after it is discarded (protocol 3's server refuses
the ones queued behind it as out of sync, without a forward), and the edge starts again from the
cloud's token.

Within an episode, from its start at time 0, block b (1, 2, ...) with the window D (verifications
in flight at most) and V_b its verdict's arrival (V_b = 0 for b ≤ 0):

    drafted   r_b = max(r_{b−1}, V_{b−D−1}) + t_d     (the edge drafts at most one block past the window)
    sent      s_b = max(r_b, V_{b−D})
    verified  c_b = max(s_b + R/2, c_{b−1}) + t_v     (the cloud runs one session's verifications in order)
    verdict   V_b = c_b + R/2

D = 1 is today's pipelined client: the next block is drafted while the verdict is in flight and sent
after it. The expected time for n tokens still to come is a recursion over the episodes (exact, no
sampling): with B = ⌈n / (k + 1)⌉ blocks needed if every verdict is clean,

    T(n) = Σ_{b=1..B} a^((k+1)(b−1)) Σ_{j=1..k+1} a^(j−1) (1 − a) · (V_b + T(n − (k+1)(b−1) − j))
           + a^((k+1)B) · V_B,        T(n ≤ 0) = 0,

and T_split = prefill_3B(P) + T(N) (the first episode's first verification carrying the prefill).
k is chosen per row (1..16) to minimise T_split, shown beside each time.

Optimistic for the split alike at every D: no queueing at the cloud behind other clips, the edge's
guess as likely to hold as a draft, no per-request overhead beyond the launch. Optimistic for
cloud-only: the answer's tokens come back in one response (no streaming cost).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import capacity_model as cm  # noqa: E402  (bench/ beside this file, as when run)
from doc_tables import link_model as markdown  # noqa: E402  (the docs table's one renderer)

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Gpu:
    name: str
    bandwidth: float  # bytes/s reached
    flops: float      # FLOP/s reached
    launch_s: float


# The cloud: capacity_model's H100 (its constants, not copied).
H100 = Gpu("H100 SXM (capacity_model: 70 % of 3.35 TB/s, 50 % of 989 TFLOP/s)", cm.BW, cm.FLOPS, cm.LAUNCH_S)
# The edge: assumed, see the module docstring.
LAPTOP = Gpu("RTX 4090 Laptop GPU (assumed: 70 % of 576 GB/s, 50 % of 80 TFLOP/s)", 576e9 * 0.7, 80e12 * 0.5, 0.5e-3)

EDGE_FORMATS = {"bf16": 2.0, "int4": 0.53}  # bytes per parameter


def step_s(shape: cm.Shape, gpu: Gpu, tokens: int, context: float, bytes_per_param: float = 2.0) -> float:
    """One batch-1 forward of `tokens` tokens after `context` cached ones (the roofline)."""
    weights = bytes_per_param * shape.params / gpu.bandwidth
    compute = 2 * shape.params * tokens / gpu.flops
    kv = shape.kv_bytes_per_token * context / gpu.bandwidth
    return max(weights, compute) + kv + gpu.launch_s


def prefill_s(shape: cm.Shape, gpu: Gpu, tokens: float, audio_frames: float, bytes_per_param: float = 2.0) -> float:
    """One clip's prefill: the LLM over its prompt plus the audio tower over its encoder frames."""
    audio = 2 * shape.audio_params * audio_frames / gpu.flops
    weights = bytes_per_param * shape.params / gpu.bandwidth
    return max(weights, 2 * shape.params * tokens / gpu.flops) + audio + gpu.launch_s


def verdict_times(blocks: int, depth: int, t_draft: float, t_verify: float, rtt: float,
                  first_verify: float | None = None) -> list[float]:
    """V_1..V_blocks of one episode (the docstring's recursion): when each block's verdict reaches
    the edge, with at most `depth` verifications in flight. `first_verify` replaces t_verify for
    block 1 (the clip's first verification carries the cloud's prefill)."""
    verdict = [0.0] * (blocks + 1)  # verdict[0]: the episode's start
    drafted = cloud = 0.0

    def v(b: int) -> float:
        return verdict[b] if b >= 1 else 0.0

    for b in range(1, blocks + 1):
        drafted = max(drafted, v(b - depth - 1)) + t_draft
        sent = max(drafted, v(b - depth))
        cost = first_verify if b == 1 and first_verify is not None else t_verify
        cloud = max(sent + rtt / 2, cloud) + cost
        verdict[b] = cloud + rtt / 2
    return verdict[1:]


def expected_time(tokens: int, k: int, depth: int, a: float, t_draft: float, t_verify: float, rtt: float,
                  first_verify: float | None = None) -> float:
    """Expected seconds from the edge's first draft to the clip's last verdict, `tokens` answer
    tokens, every block of k drafts (plus the bonus guess) verified (the docstring's T(N))."""
    width = k + 1

    @cache
    def rest(n: int, first: bool) -> float:
        if n <= 0:
            return 0.0
        blocks = math.ceil(n / width)
        times = verdict_times(blocks, depth, t_draft, t_verify, rtt, first_verify if first else None)
        total = 0.0
        for b in range(1, blocks + 1):
            reach = a ** (width * (b - 1))  # blocks 1..b-1 clean
            if reach == 0.0:
                break
            for j in range(1, width + 1):
                p = reach * a ** (j - 1) * (1 - a)
                if p:
                    total += p * (times[b - 1] + rest(n - width * (b - 1) - j, False))
        return total + a ** (width * blocks) * times[-1]

    return rest(tokens, True)


def cloud_only_s(rtt: float, prompt: float = cm.PREFILL_TOKENS, answer: float = cm.ANSWER_TOKENS) -> float:
    cloud = cm.SHAPES[1]
    context = prompt + answer / 2
    return rtt + prefill_s(cloud, H100, prompt, cm.AUDIO_FRAMES) + (answer - 1) * step_s(cloud, H100, 1, context)


def split_s(rtt: float, depth: int, a: float, edge_format: str, k: int, prompt: float = cm.PREFILL_TOKENS,
            answer: float = cm.ANSWER_TOKENS) -> float:
    edge, cloud = cm.SHAPES
    bpp = EDGE_FORMATS[edge_format]
    context = prompt + answer / 2
    t_draft = (k + 1) * step_s(edge, LAPTOP, 1, context, bpp)
    t_verify = step_s(cloud, H100, k + 1, context)
    first = prefill_s(cloud, H100, prompt + k + 1, cm.AUDIO_FRAMES)
    return (prefill_s(edge, LAPTOP, prompt, cm.AUDIO_FRAMES, bpp)
            + expected_time(round(answer), k, depth, a, t_draft, t_verify, rtt, first))


def best_split(rtt: float, depth: int, a: float, edge_format: str) -> tuple[float, int]:
    """(seconds, k) at the k of 1..16 that minimises the clip's time."""
    return min((split_s(rtt, depth, a, edge_format, k), k) for k in range(1, 17))


def measured_acceptance(path: Path = cm.EVAL_REPORT) -> float:
    """The demo pair's acceptance with every block verified (eval report, mode `always`)."""
    modes = {m["mode"]: m for m in json.loads(path.read_text(encoding="utf-8"))["modes"]}
    return float(modes["always"]["acceptance_rate"])


def table(rtts_ms: tuple[int, ...] = (10, 50, 150), depths: tuple[int, ...] = (1, 2, 3, 4)) -> list[dict[str, Any]]:
    rows = []
    for a in (round(measured_acceptance(), 2), 1.0):
        for fmt in EDGE_FORMATS:
            for ms in rtts_ms:
                rtt = ms / 1000
                cloud = cloud_only_s(rtt)
                row: dict[str, Any] = {"acceptance": a, "edge": fmt, "rtt_ms": ms, "cloud_only_ms": round(1000 * cloud, 1)}
                for d in depths:
                    s, k = best_split(rtt, d, a, fmt)
                    row[f"d{d}_ms"], row[f"d{d}_k"] = round(1000 * s, 1), k
                best = min(depths, key=lambda d: row[f"d{d}_ms"])
                row["best_d"] = best
                row["best_x_cloud"] = round(row[f"d{best}_ms"] / row["cloud_only_ms"], 2)
                rows.append(row)
    return rows


def report() -> dict[str, Any]:
    edge, cloud = cm.SHAPES
    context = cm.PREFILL_TOKENS + cm.ANSWER_TOKENS / 2
    return {
        "modelled": True,
        "work_from": str(cm.EVAL_REPORT.relative_to(ROOT)),
        "work": {"prompt_tokens": round(cm.PREFILL_TOKENS, 1), "answer_tokens": round(cm.ANSWER_TOKENS, 1),
                 "audio_frames": cm.AUDIO_FRAMES},
        "cloud_gpu": H100.name, "edge_gpu": LAPTOP.name,
        "per_forward_ms": {
            "cloud_7b_step": round(1000 * step_s(cloud, H100, 1, context), 2),
            "cloud_7b_prefill": round(1000 * prefill_s(cloud, H100, cm.PREFILL_TOKENS, cm.AUDIO_FRAMES), 2),
            **{f"edge_3b_{f}_step": round(1000 * step_s(edge, LAPTOP, 1, context, b), 2) for f, b in EDGE_FORMATS.items()},
            **{f"edge_3b_{f}_prefill": round(1000 * prefill_s(edge, LAPTOP, cm.PREFILL_TOKENS, cm.AUDIO_FRAMES, b), 2)
               for f, b in EDGE_FORMATS.items()},
        },
        "rows": table(),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", type=Path, default=None, help="write the JSON here")
    args = ap.parse_args(argv)
    run = report()
    if args.out:
        args.out.write_text(json.dumps(run, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(run, indent=1) if args.json else "\n".join(markdown(run)))


if __name__ == "__main__":
    main()
