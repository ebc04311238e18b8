"""The engine at Qwen2.5-Omni's real vocabulary: per-token overhead, mask build, bf16 numerics.

Run by hand, alone or as the `vocab152k` section of `python bench/run.py --json`:

    python bench/vocab152k.py [--json] [--clips N] [--max-new-tokens N] [--bf16-clips N]
    python bench/vocab152k.py --demo-only --json > docs/results/bench-vocab152k-demo.json

`--demo-only` measures the demo pair's overhead alone (the random 152k pair and the numerics do not
depend on the bundled pair, so a new demo pair needs only this part rerun).

The pair is the real Qwen2.5-Omni tokenizer (rebuilt offline, `specdec_cli.qwen_vocab`) with random
thinkers at the real widths: edge 151,936 rows (as -3B), cloud 152,064 (as -7B); small hidden sizes,
so the forwards are cheap and what is left is the engine's own per-token work at V ≈ 152k.

* `overhead`: time outside model forwards per output token, one torch thread, on this pair and on the
  bundled demo pair (target ≤ 1 ms at 152k, ≤ 0.4 ms on the demo pair). Forward time is summed by
  pre/post hooks on each model; overhead = total − forward, taken both on the wall clock and on the
  process CPU clock (the CPU figure is the one to trust on a loaded machine: waiting for a core is
  not the engine's work).
* `masks`: building the vocabulary masks for a fresh tokenizer (cold: empty cache), from the disk
  cache (a new process, same vocabulary), and for the same tokenizer again (memory).
* `bf16`: the pair in bfloat16 on several clips: does verify=always still equal cloud-only `generate`,
  and threshold=inf edge-only `generate`? Where they part: the first divergence position and the
  cloud's (or edge's) top-2 margin there, raw logits and processed scores. float32 on the same clips
  for reference.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python bench/vocab152k.py` from a checkout that is not installed
    sys.path.insert(0, str(REPO))

from specdec_cli.decoding import (  # noqa: E402
    DecodingConfig,
    DecodingRules,
    VocabMasks,
    generate_baseline,
    speculative_decode,
)
from specdec_cli.decoding.baselines import generation_config  # noqa: E402
from specdec_cli.decoding.state import logits_for_last  # noqa: E402
from specdec_cli.models import ModelPair, eos_ids_for, load_pair  # noqa: E402

EDGE_SIZES = {"hidden": 32, "layers": 1, "heads": 2, "kv_heads": 1, "audio_d": 32}
CLOUD_SIZES = {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "audio_d": 32}


# -- the pair --------------------------------------------------------------------------------------

def random_thinker(tokenizer, vocab_size: int, seed: int, sizes: dict[str, int]) -> torch.nn.Module:
    """A random Qwen2.5-Omni thinker with `vocab_size` rows. Untied embeddings and a wide init keep
    greedy output varied (as the tests' make_thinker)."""
    from transformers import Qwen2_5OmniThinkerForConditionalGeneration

    from specdec_cli.demo.thinker_config import thinker_config

    config = thinker_config(tokenizer, **sizes)
    config.text_config.vocab_size = vocab_size
    config.text_config.tie_word_embeddings = config.tie_word_embeddings = False
    config.text_config.initializer_range = 0.2
    torch.manual_seed(seed)
    return Qwen2_5OmniThinkerForConditionalGeneration(config).eval()


def real_width_pair(tokenizer=None) -> ModelPair:
    """Real tokenizer, random edge (151,936 rows) and cloud (152,064 rows), float32, in memory."""
    from transformers import WhisperFeatureExtractor

    from specdec_cli.processor import AudioTextProcessor
    from specdec_cli.qwen_vocab import CLOUD_VOCAB, EDGE_VOCAB, build_qwen_tokenizer

    tok = tokenizer or build_qwen_tokenizer()
    edge = random_thinker(tok, EDGE_VOCAB, 11, EDGE_SIZES)
    cloud = random_thinker(tok, CLOUD_VOCAB, 12, CLOUD_SIZES)
    processor = AudioTextProcessor(tok, WhisperFeatureExtractor(feature_size=128, sampling_rate=16000))
    masks = VocabMasks.for_tokenizer(tok, CLOUD_VOCAB)
    return ModelPair(edge, cloud, processor, masks, eos_ids_for(tok), "random-151936", "random-152064")


def with_dtype(pair: ModelPair, dtype: torch.dtype) -> ModelPair:
    """The same weights in `dtype` (copies; the float32 pair is left as it is)."""
    import copy

    return ModelPair(copy.deepcopy(pair.edge).to(dtype), copy.deepcopy(pair.cloud).to(dtype), pair.processor,
                     pair.masks, pair.eos_ids, pair.edge_id, pair.cloud_id)


def clip_inputs(pair: ModelPair, n: int) -> list:
    """Thinker inputs for the first n clips of samples/ (the random pair does not care what it hears;
    real recordings keep the prompt lengths realistic)."""
    from specdec_cli.audio import load_audio

    proc = pair.processor
    files = sorted((REPO / "samples").glob("*.wav"))[:n]
    return [proc(load_audio(f, proc.sampling_rate, proc.max_seconds)) for f in files]


# -- overhead per token ----------------------------------------------------------------------------

class ForwardClock:
    """Wall and process-CPU seconds spent inside one model's forwards (pre/post hooks on the
    top-level module; the nested forwards are inside)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.wall = self.cpu = 0.0
        self._t: tuple[float, float] | None = None
        self._handles = [model.register_forward_pre_hook(self._pre), model.register_forward_hook(self._post)]

    def _pre(self, module, args) -> None:
        self._t = (time.perf_counter(), time.process_time())

    def _post(self, module, args, output) -> None:
        assert self._t is not None
        self.wall += time.perf_counter() - self._t[0]
        self.cpu += time.process_time() - self._t[1]

    def close(self) -> None:
        for h in self._handles:
            h.remove()


def overhead_modes() -> dict[str, tuple[str, DecodingConfig]]:
    """name -> (engine, config); rules on (they are what costs at 152k), k = 4. The random pair
    disagrees almost always, so each verified block yields ~1 token for k + (k+1) processed rows;
    the twin run (the cloud drafting for itself: every draft accepted, k+1 tokens per block) shows
    the per-token cost when drafts are accepted, as with a trained pair."""
    base = DecodingConfig(k=4)
    return {
        "spec_verify_always": ("spec", base.with_(verify="always")),
        "spec_verify_always_twin": ("twin", base.with_(verify="always")),
        "spec_verify_always_sample": ("spec", base.with_(verify="always", sample=True, seed=0)),
        "spec_edge_only_threshold_inf": ("spec", base.with_(threshold=float("inf"))),
        "hf_generate_cloud_only": ("baseline", base.with_(mode="cloud")),
        "hf_generate_edge_only": ("baseline", base.with_(mode="edge")),
    }


def _decode(pair: ModelPair, inputs, engine: str, cfg: DecodingConfig) -> list[int]:
    if engine in ("spec", "twin"):
        edge = pair.cloud if engine == "twin" else pair.edge
        return speculative_decode(edge, pair.cloud, inputs, cfg, pair.masks, pair.eos_ids).tokens
    model = pair.cloud if cfg.mode == "cloud" else pair.edge
    return generate_baseline(model, inputs, cfg, pair.masks, pair.eos_ids, pair.tokenizer.pad_token_id).tokens


def overhead(pair: ModelPair, inputs: list, max_new_tokens: int) -> dict[str, Any]:
    """Per mode: ms per output token on the wall and CPU clocks, inside forwards and outside."""
    modes = overhead_modes()
    clocks = [ForwardClock(pair.edge), ForwardClock(pair.cloud)]
    totals = {name: np.zeros(5) for name in modes}  # tokens, wall, cpu, fwd wall, fwd cpu
    try:
        for engine, cfg in modes.values():  # warm-up, untimed
            _decode(pair, inputs[0], engine, cfg.with_(max_new_tokens=2))
        for x in inputs:  # clip-major: a load spike hits every mode alike
            for name, (engine, cfg) in modes.items():
                for c in clocks:
                    c.wall = c.cpu = 0.0
                w, p = time.perf_counter(), time.process_time()
                tokens = _decode(pair, x, engine, cfg.with_(max_new_tokens=max_new_tokens))
                totals[name] += (len(tokens), time.perf_counter() - w, time.process_time() - p,
                                 sum(c.wall for c in clocks), sum(c.cpu for c in clocks))
    finally:
        for c in clocks:
            c.close()
    out = {}
    for name, (n, wall, cpu, fwall, fcpu) in totals.items():
        ms = 1000.0 / n if n else float("nan")
        out[name] = {"tokens": int(n), "wall_ms_per_token": round(wall * ms, 3),
                     "forward_wall_ms_per_token": round(fwall * ms, 3),
                     "overhead_wall_ms_per_token": round((wall - fwall) * ms, 3),
                     "cpu_ms_per_token": round(cpu * ms, 3), "forward_cpu_ms_per_token": round(fcpu * ms, 3),
                     "overhead_cpu_ms_per_token": round((cpu - fcpu) * ms, 3)}
    return out


# -- mask build --------------------------------------------------------------------------------------

_MASK_PROBE = """
import json, sys, time
from transformers import AutoTokenizer
from specdec_cli.decoding import VocabMasks
def timed(tok):
    w, c = time.perf_counter(), time.process_time()
    VocabMasks.for_tokenizer(tok, int(sys.argv[2]))
    return [time.perf_counter() - w, time.process_time() - c]
tok = AutoTokenizer.from_pretrained(sys.argv[1])
first = timed(tok)
again = AutoTokenizer.from_pretrained(sys.argv[1])  # a second tokenizer object, same vocabulary
print(json.dumps([first, timed(again), timed(again)]))
"""


def mask_build(tokenizer, vocab_size: int) -> dict[str, float]:
    """Seconds to build the masks (for_tokenizer), each probe in a fresh process with its own empty cache folder
    (SPECDEC_CACHE): cold (nothing cached), then from the disk cache in a second process; within a
    process, a second tokenizer object of the same vocabulary and the same object again."""
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(Path(tmp) / "tok")
        env = dict(os.environ, SPECDEC_CACHE=str(Path(tmp) / "cache"), OMP_NUM_THREADS="1",
                   PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))

        def probe() -> list[list[float]]:
            out = subprocess.run([sys.executable, "-c", _MASK_PROBE, str(Path(tmp) / "tok"), str(vocab_size)],
                                 capture_output=True, text=True, env=env, check=True)
            return json.loads(out.stdout.strip().splitlines()[-1])

        cold = probe()
        disk = probe()
    # [wall, CPU] seconds each: on a loaded machine the CPU figure is the build's own cost.
    return {"cold_s": cold[0][0], "cold_cpu_s": cold[0][1],
            "new_process_disk_cache_s": disk[0][0], "new_process_disk_cache_cpu_s": disk[0][1],
            "same_vocabulary_new_object_s": cold[1][0], "same_object_s": cold[2][0]}


# -- bf16 numerics -------------------------------------------------------------------------------------

def _generate_with_scores(model, inputs, cfg: DecodingConfig, pair: ModelPair):
    """HF generate as the baselines run it, plus each step's raw logits and processed scores."""
    prompt_len = int(inputs["input_ids"].shape[1])
    rules = DecodingRules.build(cfg, pair.masks, prompt_len, pair.eos_ids)
    model.model.rope_deltas = None
    with logits_for_last(model, 1), torch.inference_mode():
        out = model.generate(**inputs, generation_config=generation_config(cfg, pair.eos_ids, pair.tokenizer.pad_token_id),
                             logits_processor=rules.processors, stopping_criteria=[rules.sentence_end],
                             output_scores=True, output_logits=True, return_dict_in_generate=True)
    return out.sequences[0, prompt_len:].tolist(), out.logits, out.scores


def _margin(row: torch.Tensor) -> float:
    top = row.float().topk(2).values
    return round(float(top[0] - top[1]), 5)


def _compare(ours: list[int], theirs: list[int], logits, scores) -> dict[str, Any]:
    first = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), None)
    if first is None and len(ours) != len(theirs):
        first = min(len(ours), len(theirs))
    if first is None:
        return {"identical": True, "tokens": len(ours)}
    out: dict[str, Any] = {"identical": False, "tokens": len(theirs), "first_divergence": first}
    if first < len(logits):
        out["top2_logit_margin"] = _margin(logits[first][0])
        out["top2_processed_score_margin"] = _margin(scores[first][0])
    return out


def numerics(pair: ModelPair, inputs: list, max_new_tokens: int, k: int = 4) -> dict[str, Any]:
    """verify=always vs cloud-only and threshold=inf vs edge-only, per clip, for this pair's dtype."""
    cfg = DecodingConfig(k=k, max_new_tokens=max_new_tokens)
    per_clip = []
    for x in inputs:
        cloud_tokens, c_logits, c_scores = _generate_with_scores(pair.cloud, x, cfg.with_(mode="cloud"), pair)
        edge_tokens, e_logits, e_scores = _generate_with_scores(pair.edge, x, cfg.with_(mode="edge"), pair)
        always = speculative_decode(pair.edge, pair.cloud, x, cfg.with_(verify="always"), pair.masks, pair.eos_ids)
        never = speculative_decode(pair.edge, pair.cloud, x, cfg.with_(threshold=float("inf")), pair.masks,
                                   pair.eos_ids)
        per_clip.append({"verify_always_vs_cloud_only": _compare(always.tokens, cloud_tokens, c_logits, c_scores),
                         "threshold_inf_vs_edge_only": _compare(never.tokens, edge_tokens, e_logits, e_scores)})
    summary = {}
    for key in ("verify_always_vs_cloud_only", "threshold_inf_vs_edge_only"):
        parted = [c[key] for c in per_clip if not c[key]["identical"]]
        summary[key] = {"identical": f"{len(per_clip) - len(parted)}/{len(per_clip)}",
                        "first_divergence": [p["first_divergence"] for p in parted],
                        "top2_logit_margin_there": [p.get("top2_logit_margin") for p in parted],
                        "top2_processed_score_margin_there": [p.get("top2_processed_score_margin") for p in parted]}
    return {"dtype": str(next(pair.cloud.parameters()).dtype).removeprefix("torch."), "k": k,
            "max_new_tokens": max_new_tokens, "summary": summary, "per_clip": per_clip}


# -- main ------------------------------------------------------------------------------------------------

def run_demo(clips: int = 4, max_new_tokens: int = 32, edge: str | None = None,
             cloud: str | None = None) -> dict[str, Any]:
    """The demo pair's overhead only (`--demo-only`; another pair with `edge`/`cloud`, e.g. the
    previous demo pair for a before/after), in the same shape as `run`'s."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        demo_pair = load_pair(edge, cloud)
        result: dict[str, Any] = {"pair": {"edge": demo_pair.edge_id, "cloud": demo_pair.cloud_id}, "clips": clips,
                                  "max_new_tokens": max_new_tokens, "torch_threads": 1,
                                  "load_average": [round(x, 2) for x in os.getloadavg()]}
        result["overhead"] = {"demo": overhead(demo_pair, clip_inputs(demo_pair, clips), max_new_tokens)}
        result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
        return result
    finally:
        torch.set_num_threads(threads)


def run(clips: int = 4, max_new_tokens: int = 32, bf16_clips: int = 8, demo: bool = True,
        progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """The whole section. Pins torch to one thread for its duration."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        from specdec_cli.qwen_vocab import CLOUD_VOCAB, build_qwen_tokenizer

        progress("vocab152k: tokenizer and random real-width pair")
        tok = build_qwen_tokenizer()
        pair = real_width_pair(tok)
        inputs = clip_inputs(pair, max(clips, bf16_clips))
        result: dict[str, Any] = {
            "pair": {"tokenizer_tokens": len(tok), "edge_rows": pair.edge.get_output_embeddings().weight.shape[0],
                     "cloud_rows": pair.cloud.get_output_embeddings().weight.shape[0],
                     "edge_params": sum(p.numel() for p in pair.edge.parameters()),
                     "cloud_params": sum(p.numel() for p in pair.cloud.parameters())},
            "clips": clips, "max_new_tokens": max_new_tokens, "torch_threads": 1,
            "load_average": [round(x, 2) for x in os.getloadavg()],
        }
        progress("vocab152k: mask build")
        result["masks"] = mask_build(tok, CLOUD_VOCAB)
        progress("vocab152k: overhead at 152k")
        result["overhead"] = {"vocab152k": overhead(pair, inputs[:clips], max_new_tokens)}
        if demo:
            progress("vocab152k: overhead on the demo pair")
            demo_pair = load_pair()
            result["overhead"]["demo"] = overhead(demo_pair, clip_inputs(demo_pair, clips), max_new_tokens)
        progress("vocab152k: numerics float32 and bfloat16")
        result["numerics"] = {"float32": numerics(pair, inputs[:bf16_clips], max_new_tokens),
                              "bfloat16": numerics(with_dtype(pair, torch.bfloat16), inputs[:bf16_clips],
                                                   max_new_tokens)}
        result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
        return result
    finally:
        torch.set_num_threads(threads)


def summary_lines(section: dict[str, Any]) -> list[str]:
    """A few lines for bench/run.py's human summary."""
    lines = [f"152k vocabulary (edge {section['pair']['edge_rows']} / cloud {section['pair']['cloud_rows']} rows, "
             f"one thread, load {section['load_average'][0]}): overhead outside forwards, ms/token (CPU clock; wall)"]
    for pair_name, modes in section["overhead"].items():
        lines += [f"  {pair_name:9s} {name:30s} {m['overhead_cpu_ms_per_token']:7.3f}  ({m['overhead_wall_ms_per_token']:.3f})"
                  for name, m in modes.items()]
    masks = section["masks"]
    lines.append(f"  masks: cold {masks['cold_cpu_s']:.3f} s CPU ({masks['cold_s']:.3f} wall), new process from the "
                 f"disk cache {masks['new_process_disk_cache_cpu_s']:.3f} s CPU, same vocabulary new object "
                 f"{masks['same_vocabulary_new_object_s']:.4f} s")
    for dtype, num in section["numerics"].items():
        for key, s in num["summary"].items():
            lines.append(f"  {dtype:8s} {key}: identical {s['identical']}, first divergence {s['first_divergence']}, "
                         f"top-2 logit margin there {s['top2_logit_margin_there']}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clips", type=int, default=4, help="clips for the overhead runs (default 4)")
    ap.add_argument("--bf16-clips", type=int, default=8, help="clips for the numerics runs (default 8)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--no-demo", action="store_true", help="skip the demo pair's overhead")
    ap.add_argument("--demo-only", action="store_true",
                    help="only the demo pair's overhead (what a new demo pair changes)")
    ap.add_argument("--edge", help="(--demo-only) another edge folder than the bundled one")
    ap.add_argument("--cloud", help="(--demo-only) another cloud folder than the bundled one")
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    args = ap.parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    if args.demo_only:
        result = run_demo(args.clips, args.max_new_tokens, args.edge, args.cloud)
        print(json.dumps(result, ensure_ascii=False) if args.json else json.dumps(result["overhead"], indent=1))
        return 0
    result = run(args.clips, args.max_new_tokens, args.bf16_clips, not args.no_demo,
                 progress=lambda msg: print(msg, file=sys.stderr))
    print(json.dumps(result, ensure_ascii=False) if args.json else "\n".join(summary_lines(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
