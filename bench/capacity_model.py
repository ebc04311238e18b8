"""MODELLED, not measured: clips/s one GPU server would carry at the Qwen2.5-Omni 3B / 7B thinker
shapes, cloud-only (continuously batched) against speculative presets (verifications batched).

    python bench/capacity_model.py [--json]

No GPU was lent to issue 27, so this is a roofline model of each forward, fed with the work per
clip the demo pair measured (docs/eval-samples.md: cloud forwards and tokens per clip, prefill
included) and stated hardware figures. A saturated server runs forwards back to back; each clip
costs its share of the forwards it is a row of:

    cloud-only:  prefill(P) + (F_c - 1) · step(B, 1) / B
    speculative: prefill(P + d) + (F_s - 1) · step(B, k + 1) / B

where P = prompt tokens (audio placeholders included), F = cloud forwards per clip (the prefill
one of them), d = the first draft scored with the lazy prefill, B = rows per forward (the
server's batch), and a forward of n tokens in each of B rows costs

    step(B, n) = max(weights / BW, 2 · params · B · n / FLOPS) + KV reads + launch

(memory-bound at small B·n, compute-bound past it). The audio tower's forward is added to each
prefill. Where the model is optimistic for both alike: perfect overlap inside a forward, no
scheduler gaps; for speculative decoding, a verification batch as full as the decode batch.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

# H100 SXM, bf16: 3.35 TB/s HBM3 (70 % reached), 989 TFLOP/s dense (50 % reached).
BW = 3.35e12 * 0.7
FLOPS = 989e12 * 0.5
LAUNCH_S = 0.5e-3   # per forward: kernel launches with CUDA graphs, sampling, scheduling


@dataclass(frozen=True)
class Shape:
    name: str
    params: float       # thinker LLM parameters
    audio_params: float  # audio tower
    kv_bytes_per_token: float  # layers · 2 · kv_heads · head_dim · 2 bytes


# Qwen2.5-Omni thinkers (config.json: 3B: 36 layers, 2 KV heads of 128; 7B: 28 layers, 4 KV heads
# of 128); the audio tower is Whisper-large-v3's encoder shape (~0.64 B).
SHAPES = (Shape("3B", 3.1e9, 0.64e9, 36 * 2 * 2 * 128 * 2), Shape("7B", 7.6e9, 0.64e9, 28 * 2 * 4 * 128 * 2))

# Work per clip on the demo pair (docs/eval-samples.md, 9 samples): prefill tokens, cloud forwards
# (prefill included), and the block length (k) of each preset.
PREFILL_TOKENS = 209.1
AUDIO_FRAMES = 400   # encoder frames of a ~8 s clip (50 per second after the conv stem)
WORK = {"cloud": (28.6, 1), "fluent": (3.3, 10 + 1), "quality": (4.0, 12 + 1)}
ANSWER_TOKENS = 28.6


def forward_s(shape: Shape, rows: int, tokens: int, context: float) -> float:
    weights = 2 * shape.params  # bf16
    compute = 2 * shape.params * rows * tokens / FLOPS
    kv = shape.kv_bytes_per_token * context * rows / BW
    return max(weights / BW, compute) + kv + LAUNCH_S


def per_clip_s(shape: Shape, mode: str, rows: int) -> float:
    forwards, n = WORK[mode]
    context = PREFILL_TOKENS + ANSWER_TOKENS / 2
    prefill_tokens = PREFILL_TOKENS + (n if mode != "cloud" else 0)
    audio = 2 * shape.audio_params * AUDIO_FRAMES / FLOPS
    prefill = max(2 * shape.params / BW, 2 * shape.params * prefill_tokens / FLOPS) + audio + LAUNCH_S
    return prefill + (forwards - 1) * forward_s(shape, rows, n, context) / rows


def table(batches: tuple[int, ...] = (8, 16, 64)) -> list[dict]:
    rows = []
    for shape in SHAPES:
        for b in batches:
            cloud = 1 / per_clip_s(shape, "cloud", b)
            row = {"shape": shape.name, "rows_per_forward": b, "cloud_clips_per_s": round(cloud, 1)}
            for mode in ("fluent", "quality"):
                spec = 1 / per_clip_s(shape, mode, b)
                row[f"{mode}_clips_per_s"] = round(spec, 1)
                row[f"{mode}_x_cloud"] = round(spec / cloud, 2)
            rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    got = {"modelled": True, "hardware": "H100 SXM bf16, 70 % of 3.35 TB/s, 50 % of 989 TFLOP/s, 0.5 ms/forward",
           "rows": table()}
    if args.json:
        print(json.dumps(got, indent=1))
        return
    print("| shape | rows per forward | cloud-only clips/s | fluent clips/s (×) | quality clips/s (×) |")
    print("|---|---|---|---|---|")
    for r in got["rows"]:
        print(f"| {r['shape']} | {r['rows_per_forward']} | {r['cloud_clips_per_s']} | "
              f"{r['fluent_clips_per_s']} ({r['fluent_x_cloud']}×) | {r['quality_clips_per_s']} ({r['quality_x_cloud']}×) |")


if __name__ == "__main__":
    main()
