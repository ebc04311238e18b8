"""MODELLED, not measured: clips/s one GPU server would carry at the Qwen2.5-Omni 3B / 7B thinker
shapes, cloud-only (continuously batched) against speculative presets (verifications batched).

    python bench/capacity_model.py [--json] [--measured docs/results/bench-gpu.json]

When a GPU run of bench/gpu.py exists (docs/results/bench-gpu.json or bench-gpu-quick.json, or --measured FILE), the same formulas
are also evaluated at the configurations it measured and shown beside the measurements (`versus`):
each forward (decode step, k-token verification) at its batch size, each clip's prefill, and
cloud-only clips/s under continuous batching (with the run's own prompt and answer lengths).

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
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# bench/gpu.py's runs: the full one, else the quick one
RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"  # the result JSON files
MEASURED = tuple(RESULTS / f for f in ("bench-gpu.json", "bench-gpu-quick.json"))

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

# Work per clip on the bundled demo pair, read from `specdec eval --report` on the 9 samples
# (docs/results/eval-samples.json, regenerated whenever the pair or its presets change; never typed here):
# prefill tokens, cloud forwards per clip (prefill included), answer tokens, each preset's block
# length (k).
EVAL_REPORT = RESULTS / "eval-samples.json"
AUDIO_FRAMES = 400   # encoder frames of a ~8 s clip (50 per second after the conv stem)


def demo_work(path: Path = EVAL_REPORT) -> tuple[float, float, dict[str, tuple[float, int]]]:
    """(prefill tokens, cloud-only answer tokens, {mode: (cloud forwards per clip, tokens per
    forward)}) from an eval report's modes cloud, fluent and quality."""
    modes = {m["mode"]: m for m in json.loads(path.read_text(encoding="utf-8"))["modes"]}
    cloud = modes["cloud"]
    work = {"cloud": (cloud["cloud_work_forwards"], 1)}
    for name in ("fluent", "quality"):
        work[name] = (modes[name]["cloud_work_forwards"], int(modes[name]["k"]) + 1)
    return cloud["cloud_prefill_tokens"], cloud["tokens"], work


PREFILL_TOKENS, ANSWER_TOKENS, WORK = demo_work()


def forward_s(shape: Shape, rows: int, tokens: int, context: float) -> float:
    weights = 2 * shape.params  # bf16
    compute = 2 * shape.params * rows * tokens / FLOPS
    kv = shape.kv_bytes_per_token * context * rows / BW
    return max(weights / BW, compute) + kv + LAUNCH_S


def prefill_s(shape: Shape, tokens: float, audio_frames: float) -> float:
    """One clip's prefill: the LLM over its prompt plus the audio tower over its encoder frames."""
    audio = 2 * shape.audio_params * audio_frames / FLOPS
    return max(2 * shape.params / BW, 2 * shape.params * tokens / FLOPS) + audio + LAUNCH_S


def per_clip_s(shape: Shape, mode: str, rows: int, prompt_tokens: float = PREFILL_TOKENS,
               answer_tokens: float = ANSWER_TOKENS, audio_frames: float = AUDIO_FRAMES) -> float:
    forwards, n = WORK[mode]
    if mode == "cloud":
        forwards = answer_tokens  # one forward per token, the prefill's included
    context = prompt_tokens + answer_tokens / 2
    prefill_tokens = prompt_tokens + (n if mode != "cloud" else 0)
    return prefill_s(shape, prefill_tokens, audio_frames) + (forwards - 1) * forward_s(shape, rows, n, context) / rows


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


def _ratio(measured: float | None, modelled: float) -> float | None:
    return round(measured / modelled, 2) if measured else None


def versus(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The model beside a bench/gpu.py run: one row per measured quantity, modelled and measured
    in the same unit (ms per forward, ms per prefill, clips/s), and measured / modelled."""
    shapes = {s.name: s for s in SHAPES}
    rows: list[dict[str, Any]] = []
    context = report.get("context_tokens", PREFILL_TOKENS + ANSWER_TOKENS / 2)
    for name, by_batch in report.get("steps", {}).items():
        shape = shapes[name.upper()]
        for batch, got in by_batch.items():
            for key, cell in got.items():
                if not isinstance(cell, dict) or "ms" not in cell:
                    continue
                n = 1 if key == "step" else int(key.removeprefix("verify_"))
                modelled = 1000 * forward_s(shape, int(batch), n, context)
                rows.append({"what": "forward", "shape": shape.name, "batch": int(batch), "tokens": n, "unit": "ms",
                             "modelled": round(modelled, 3), "measured": cell["ms"], "x": _ratio(cell["ms"], modelled)})
    for name, by_clip in report.get("prefill", {}).items():
        shape = shapes[name.upper()]
        for clip, got in by_clip.items():
            # encoder frames: 2 mel frames each after the conv stem (AUDIO_FRAMES' 50 a second)
            modelled = 1000 * prefill_s(shape, got["prompt_tokens"], got["mel_frames"] / 2)
            rows.append({"what": "prefill", "shape": shape.name, "clip": clip, "tokens": got["prompt_tokens"],
                         "unit": "ms", "modelled": round(modelled, 3), "measured": got["bare"]["ms"],
                         "x": _ratio(got["bare"]["ms"], modelled)})
    batched = report.get("batched", {})
    prompt = batched.get("prompt_tokens")
    for batch, got in batched.get("cloud_only", {}).items():
        if "clips_per_s" not in got or not got["clips"] or prompt is None:
            continue
        answer = got["tokens"] / got["clips"]
        frames = batched.get("mel_frames", 2 * AUDIO_FRAMES) / 2  # encoder frames: 2 mel frames each
        modelled = 1 / per_clip_s(shapes["7B"], "cloud", int(batch), prompt, answer, frames)
        rows.append({"what": "cloud-only clips/s", "shape": "7B", "batch": int(batch), "tokens": round(answer, 1),
                     "unit": "clips/s", "modelled": round(modelled, 3), "measured": got["clips_per_s"],
                     "x": _ratio(got["clips_per_s"], modelled)})
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--measured", type=Path, default=None,
                    help="a bench/gpu.py JSON to set beside the model (default: docs/results/bench-gpu.json, else "
                         "docs/results/bench-gpu-quick.json, when present)")
    args = ap.parse_args(argv)
    got: dict[str, Any] = {"modelled": True, "work_from": str(EVAL_REPORT.relative_to(RESULTS.parents[1])),
                           "work": {"prefill_tokens": round(PREFILL_TOKENS, 1), "answer_tokens": round(ANSWER_TOKENS, 1),
                                    **{m: {"cloud_forwards": round(f, 2), "k": n - 1} for m, (f, n) in WORK.items()
                                       if m != "cloud"}},
                           "hardware": "H100 SXM bf16, 70 % of 3.35 TB/s, 50 % of 989 TFLOP/s, 0.5 ms/forward",
                           "rows": table()}
    path = args.measured or next((p for p in MEASURED if p.is_file()), None)
    if path is not None:
        if not path.is_file():
            sys.exit(f"error: {path} does not exist; run `python bench/gpu.py --out {path}` on a GPU first")
        report = json.loads(path.read_text())
        env = report.get("environment", {})
        got["measured"] = {"file": str(path), "device": env.get("gpu", env.get("device")), "dtype": env.get("dtype"),
                           "tiny": bool(report.get("tiny")), "versus": versus(report)}
    if args.json:
        print(json.dumps(got, indent=1))
        return
    print("| shape | rows per forward | cloud-only clips/s | fluent clips/s (×) | quality clips/s (×) |")
    print("|---|---|---|---|---|")
    for r in got["rows"]:
        print(f"| {r['shape']} | {r['rows_per_forward']} | {r['cloud_clips_per_s']} | "
              f"{r['fluent_clips_per_s']} ({r['fluent_x_cloud']}×) | {r['quality_clips_per_s']} ({r['quality_x_cloud']}×) |")
    if "measured" in got:
        m = got["measured"]
        print(f"\nModelled vs measured ({m['file']}: {m['device']}, {m['dtype']}"
              + (", TOY SHAPES: the plumbing only, not the real models" if m["tiny"] else "") + ")")
        print("| what | shape | batch / clip | tokens | modelled | measured | measured / modelled |")
        print("|---|---|---|---|---|---|---|")
        for r in m["versus"]:
            where = r.get("batch", r.get("clip"))
            print(f"| {r['what']} | {r['shape']} | {where} | {r['tokens']} | {r['modelled']} {r['unit']} | "
                  f"{r['measured']} {r['unit']} | {r['x']} |")


if __name__ == "__main__":
    main()
