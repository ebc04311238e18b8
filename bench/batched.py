"""Batched speculative decoding (issue 20): clips/s at batch sizes 1, 2, 4, 8, 16 against batch 1.

Run by hand:

    python bench/batched.py [--json] [--sizes 1,2,4,8,16] [--copies 4] [--rounds 3] [--vocab152k] [--device cuda]

The clips are the bundled samples/ (9 clips), each used `--copies` times under its own key, so a
batch of 16 has enough clips to stay full. Per batch size, the whole set is decoded with
`speculative_decode_batch` (`--preset`, the bundled pair's calibrated fluent by default); the
reference is the single-clip loop (`speculative_decode`, one clip at a time, as `specdec batch
--batch-size 1`). Rounds interleave the sizes, so a load spike from the other users of the machine
hits them alike; medians are reported.

Both clocks: wall time, and this process's CPU time (the one to trust on a shared machine: waiting
for a core is not our work). The prefill (every forward that carries audio features: the edge's
at join, the cloud's lazy prefill) is timed apart by hooks, because it is compute-bound on the CPU
and batching cannot shrink it: `decode_*` is everything else, what batching is for.

Each size's tokens are checked against the reference per clip (`identical`); a difference is only
acceptable at a near-tie (tests/test_batch_loop.py checks that on every sample).

`--vocab152k`: the same on random thinkers at the real widths (151,936 / 152,064 rows, the real
Qwen tokenizer rebuilt offline: bench/vocab152k.py), verify=always k=4, `--max-new-tokens` tokens,
where the per-row rules at V≈152k are what remains per token.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python bench/batched.py` from a checkout that is not installed
    sys.path.insert(0, str(REPO))

from specdec_cli.audio import load_audio  # noqa: E402
from specdec_cli.decoding import DecodingConfig, speculative_decode  # noqa: E402
from specdec_cli.decoding.batch_loop import speculative_decode_batch  # noqa: E402
from specdec_cli.models import ModelPair, load_pair  # noqa: E402
from specdec_cli.presets import resolve  # noqa: E402


class PrefillClock:
    """CPU and wall seconds inside forwards that carry audio features (prefills), on both models."""

    def __init__(self, *models: torch.nn.Module) -> None:
        self.cpu = self.wall = 0.0
        self._t: tuple[float, float] | None = None
        self._handles = []
        for m in models:
            self._handles += [m.register_forward_pre_hook(self._pre, with_kwargs=True),
                              m.register_forward_hook(self._post, with_kwargs=True)]

    def _pre(self, module, args, kwargs) -> None:
        self._t = (time.process_time(), time.perf_counter()) if kwargs.get("input_features") is not None else None

    def _post(self, module, args, kwargs, output) -> None:
        if self._t is not None:
            self.cpu += time.process_time() - self._t[0]
            self.wall += time.perf_counter() - self._t[1]
            self._t = None

    def close(self) -> None:
        for h in self._handles:
            h.remove()


def clip_set(pair: ModelPair, copies: int) -> list[tuple[str, Any]]:
    proc = pair.processor
    files = sorted((REPO / "samples").glob("*.wav"))
    inputs = [proc(load_audio(f, proc.sampling_rate, proc.max_seconds)).to(pair.edge.device) for f in files]
    return [(f"{c}/{f.name}", x) for c in range(copies) for f, x in zip(files, inputs, strict=True)]


def one_run(pair: ModelPair, clips: list, cfg: DecodingConfig, size: int | None) -> tuple[dict, dict[str, list[int]]]:
    """size None: the single-clip loop, one clip after another."""
    clock = PrefillClock(pair.edge, pair.cloud)
    wall, cpu = time.perf_counter(), time.process_time()
    if size is None:
        out = {k: speculative_decode(pair.edge, pair.cloud, x, cfg, pair.masks, pair.eos_ids).tokens for k, x in clips}
    else:
        out = {k: r.tokens for k, r in speculative_decode_batch(pair.edge, pair.cloud, clips, cfg, pair.masks,
                                                                pair.eos_ids, size)}
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    clock.close()
    return {"wall_s": wall, "cpu_s": cpu, "prefill_cpu_s": clock.cpu, "prefill_wall_s": clock.wall}, out


def measure(pair: ModelPair, clips: list, cfg: DecodingConfig, sizes: list[int], rounds: int) -> dict[str, Any]:
    one_run(pair, clips[:4], cfg, None)  # warm-up, untimed
    runs: dict[str, list[dict]] = {"loop": [], **{str(s): [] for s in sizes}}
    tokens: dict[str, dict[str, list[int]]] = {}
    for _ in range(rounds):
        for name in runs:
            times, out = one_run(pair, clips, cfg, None if name == "loop" else int(name))
            runs[name].append(times)
            tokens.setdefault(name, out)
    n = len(clips)
    med = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
    ref = med["loop"]
    table = {}
    for name, m in med.items():
        decode_cpu, ref_decode = m["cpu_s"] - m["prefill_cpu_s"], ref["cpu_s"] - ref["prefill_cpu_s"]
        table[name] = {
            "clips_per_s_wall": n / m["wall_s"],
            "clips_per_s_cpu": n / m["cpu_s"],
            "speedup_wall": ref["wall_s"] / m["wall_s"],
            "speedup_cpu": ref["cpu_s"] / m["cpu_s"],
            "prefill_cpu_share": m["prefill_cpu_s"] / m["cpu_s"],
            "decode_cpu_ms_per_clip": 1000 * decode_cpu / n,
            "decode_speedup_cpu": ref_decode / decode_cpu,
            "identical": sum(tokens[name][k] == tokens["loop"][k] for k in tokens["loop"]),
            **{k: round(v, 4) for k, v in m.items()},
        }
    return {"clips": n, "rounds": rounds, "tokens": sum(len(t) for t in tokens["loop"].values()),
            "config": cfg.as_dict(), "by_batch_size": table}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ap.add_argument("--sizes", default="1,2,4,8,16")
    ap.add_argument("--copies", type=int, default=4, help="times each sample is decoded (distinct rows)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--preset", default="fluent")
    ap.add_argument("--device", default="cpu", help="torch device for the bundled pair (e.g. cuda)")
    ap.add_argument("--vocab152k", action="store_true", help="also random thinkers at the real widths")
    ap.add_argument("--max-new-tokens", type=int, default=24, help="(--vocab152k) tokens per clip")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    sizes = [int(s) for s in args.sizes.split(",")]
    pair = load_pair(device=args.device)
    cfg = DecodingConfig().with_(**resolve(args.preset, [pair.presets_file]).values)
    report: dict[str, Any] = {"torch_threads": torch.get_num_threads(), "preset": args.preset,
                              "bundled_pair": measure(pair, clip_set(pair, args.copies), cfg, sizes, args.rounds)}
    if args.vocab152k:
        sys.path.insert(0, str(REPO / "bench"))
        from vocab152k import real_width_pair

        big = real_width_pair()
        big_cfg = DecodingConfig(k=4, verify="always", max_new_tokens=args.max_new_tokens)
        report["vocab152k"] = measure(big, clip_set(big, args.copies), big_cfg, sizes, max(1, args.rounds - 1))
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        for section in ("bundled_pair", "vocab152k"):
            if section not in report:
                continue
            r = report[section]
            print(f"{section}: {r['clips']} clips, {r['tokens']} tokens, median of {r['rounds']} rounds")
            print("  batch   clips/s wall  clips/s cpu  x wall  x cpu  prefill share  decode ms/clip  x decode  identical")
            for name, t in r["by_batch_size"].items():
                print(f"  {name:>5}  {t['clips_per_s_wall']:12.1f} {t['clips_per_s_cpu']:12.1f} {t['speedup_wall']:7.2f}"
                      f" {t['speedup_cpu']:6.2f} {t['prefill_cpu_share']:14.0%} {t['decode_cpu_ms_per_clip']:15.1f}"
                      f" {t['decode_speedup_cpu']:9.2f}  {t['identical']}/{r['clips']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
