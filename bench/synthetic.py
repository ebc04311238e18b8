"""Speedup against its limit: synthetic edge/cloud pairs with a controlled cost ratio and acceptance.

The cloud is the edge plus extra decoder layers whose output projections (`o_proj`, `down_proj`)
are zero: each extra layer adds nothing to the residual stream, so the cloud's logits equal the
edge's (acceptance α = 1) while it costs what a deeper model costs (dense matmuls over zeros take
the same time). The per-token cost ratio c = T_cloud(1) / T_edge(1) is set by the depth. α < 1
comes from a bench-only acceptance rule that accepts each draft token with probability α, as
vLLM's synthetic rejection sampler for benchmarking does (`SyntheticAcceptance`, passed to the
loop through its `acceptance=` hook; the recovered/bonus token is still the cloud's choice).

For each pair and k, with `verify=always`, the measured speedup over cloud-only sits next to the
speedup predicted from measured step costs:

    E[tokens per block] · T_cloud(1) / (k · T_edge(1) + T_cloud(k + 1)),
    E[tokens per block] = (1 − α^(k+1)) / (1 − α)   (k + 1 when α = 1)

where T(n) is the measured time of one cached forward (ModelState.advance) over n new tokens and
α the per-token acceptance the cell actually drew. Cloud-only is greedy decoding through the same
ModelState steps (`speedup_measured`, like for like with the T(n)) and HF `generate` as
`--mode cloud` runs it (`speedup_vs_generate`; it spends a few ms per step outside the forward).
Times are process CPU time: with one torch thread that is what a run costs on a core of its own,
whereas wall time on this shared 2-core machine (load average 5-10) is mostly waiting for a core;
wall-time ratios are kept for reference. The models are wide enough (hidden 512) that a forward
is mostly matmul time, not Python.

`prefill_memory()` measures peak memory (peak RSS, each case in a fresh subprocess) of one
prefill of a 30 s clip by a thinker with a 152,064-row vocabulary, with logits for every position
(as the thinker's forward computes them) and for the last position only (ModelState).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from specdec_cli.decoding import DecodingConfig, generate_baseline, speculative_decode  # noqa: E402
from specdec_cli.decoding.acceptance import Verdict, first_argmax  # noqa: E402
from specdec_cli.decoding.processors import VocabMasks  # noqa: E402
from specdec_cli.decoding.state import ModelState  # noqa: E402

HIDDEN, VOCAB, PROMPT = 512, 1024, 16
# About 100 new tokens per run, a whole number of (k + 1)-token blocks for each k (99, 100, 98, 99):
# the formula is a steady-state rate, and a run also pays fixed costs it leaves out (the edge's
# prefill, the prompt riding in the lazy prefill's first verification, a partial last block at
# α = 1). At 45 tokens those were up to ~15 % of a run; twice the tokens halves their share, and
# whole blocks remove the partial one. Cloud-only runs the same count for each k.
NEW_TOKENS_PER_K = {2: 99, 4: 100, 6: 98, 8: 99}
EDGE_LAYERS = 1
EXTRA_LAYERS = (2, 7, 13)         # cloud depth 3, 8, 14 -> c ≈ 2 … 10 (measured, not assumed)
KS = tuple(NEW_TOKENS_PER_K)
KS_TOKENS = tuple(NEW_TOKENS_PER_K.values())
ALPHAS = (1.0, 0.8, 0.6)          # 1.0: the real greedy rule on identical distributions
REPEATS = 3                       # runs per cell (median); cloud-only: median of its runs for that k


# -- the pair ----------------------------------------------------------------------------------------

def _lm(layers: int, seed: int) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=4 * HIDDEN, num_hidden_layers=layers,
                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512,
                      initializer_range=0.2, tie_word_embeddings=False)
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(cfg).eval()


def make_pair(extra_layers: int, seed: int = 0) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(edge, cloud): the cloud holds the edge's weights plus `extra_layers` layers after them
    whose output projections are zero, so both give identical logits."""
    edge = _lm(EDGE_LAYERS, seed)
    with torch.no_grad():
        edge.lm_head.weight[VOCAB - 1].zero_()  # logit 0 among random ones: the end id is never chosen
    cloud = _lm(EDGE_LAYERS + extra_layers, seed + 1)
    state = {k: v for k, v in edge.state_dict().items()}
    missing = cloud.load_state_dict(state, strict=False).missing_keys
    assert all(k.startswith("model.layers.") for k in missing)  # only the extra layers are new
    with torch.no_grad():
        for layer in cloud.model.layers[EDGE_LAYERS:]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    return edge, cloud


class SyntheticAcceptance:
    """Bench-only acceptance rule: accept each draft token with probability α, independently,
    whatever the models say (vLLM's synthetic rejection sampler). The token after the accepted
    prefix is the cloud's argmax there (recovered or bonus), so the text stays the cloud's."""

    def __init__(self, alpha: float, seed: int = 0) -> None:
        self.alpha = alpha
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, draft: list[int], target_scores) -> Verdict:
        # Rows are read as the greedy rule reads them: up to the first rejection only.
        u = torch.rand(len(draft), generator=self.generator).tolist()
        for j, x in enumerate(u):
            if x >= self.alpha:
                return Verdict(j, first_argmax(target_scores[j]), "recovered")
        return Verdict(len(draft), first_argmax(target_scores[len(draft)]), "bonus")


def expected_tokens_per_block(alpha: float, k: int) -> float:
    return k + 1.0 if alpha >= 1.0 else (1 - alpha ** (k + 1)) / (1 - alpha)


# -- measurements --------------------------------------------------------------------------------------

def rules_masks() -> tuple[VocabMasks, list[int]]:
    """Masks for a vocabulary of no text (no sentence ends, no content) and an end-of-turn id the
    models never pick (its output row is zero, see make_pair): only max_new_tokens stops, so every
    run makes exactly the tokens it asks for. Every row is a (textless) token: with no tokens at all,
    every row would be past the tokenizer, and those rows are banned even with the rules off."""
    return VocabMasks.from_texts([""] * VOCAB, VOCAB), [VOCAB - 1]


def cpu_and_wall(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """(result, CPU seconds of this process, wall seconds). With one torch thread the process's
    CPU time is what the run costs on a core of its own; wall time on this shared machine (load
    average several times its 2 cores) is mostly time spent waiting for a core."""
    c, w = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.process_time() - c, time.perf_counter() - w


def step_time(model: torch.nn.Module, prompt: dict, n: int, context: int, reps: int = 9) -> float:
    """Median CPU seconds of one cached forward over n new tokens, after `context` tokens."""
    state = ModelState(model)
    state.prefill(prompt)
    state.advance(list(range(10, 10 + context - len(state))))
    held = len(state)
    times = []
    for _ in range(reps):
        times.append(cpu_and_wall(partial(state.advance, list(range(20, 20 + n)), keep=n))[1])
        state.rollback(held)
    return statistics.median(times)


def greedy_cloud_only(cloud: torch.nn.Module, prompt: dict, n: int) -> list[int]:
    """Cloud-only greedy decoding through the engine's own ModelState (one cached forward per
    token, as the spec loop's cloud steps are made): the like-for-like baseline for the predicted
    speedup, whose T(n) are ModelState forwards too. HF `generate` adds its own per-step work on
    top (reported beside it)."""
    state = ModelState(cloud, "cloud")
    logits = state.prefill(prompt)
    tokens: list[int] = []
    while True:
        tokens.append(int(logits.argmax()))
        if len(tokens) == n:
            return tokens
        logits = state.advance(tokens[-1:])[-1]


def run_cells(progress: Callable[[str], None] = lambda _: None) -> list[dict[str, Any]]:
    masks, eos_ids = rules_masks()
    prompt_ids = torch.randint(100, VOCAB, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    prompt = {"input_ids": prompt_ids, "attention_mask": torch.ones_like(prompt_ids)}
    base = DecodingConfig(constraints=False, verify="always")
    cells: list[dict[str, Any]] = []
    for extra in EXTRA_LAYERS:
        edge, cloud = make_pair(extra)
        context = PROMPT + max(KS_TOKENS) // 2  # a typical cache length during the run
        t_edge1 = step_time(edge, prompt, 1, context)
        t_cloud = {n: step_time(cloud, prompt, n, context) for n in (1, *(k + 1 for k in KS))}
        cost_ratio = t_cloud[1] / t_edge1
        progress(f"c = {cost_ratio:.2f} (cloud depth {EDGE_LAYERS + extra})")

        def cloud_only(n: int, cloud: torch.nn.Module = cloud) -> tuple[float, float, float]:
            """(engine CPU s, generate CPU s, generate wall s) for n tokens; both give the same tokens."""
            mine, cpu_engine, _ = cpu_and_wall(partial(greedy_cloud_only, cloud, prompt, n))
            out, cpu, wall = cpu_and_wall(partial(generate_baseline, cloud, prompt,
                                                  base.with_(mode="cloud", max_new_tokens=n), masks, eos_ids))
            assert out.tokens == mine and len(mine) == n
            return cpu_engine, cpu, wall

        cloud_only(KS_TOKENS[0])  # warm-up
        rows: list[dict[str, Any]] = []
        base_runs: dict[int, list[tuple[float, float, float]]] = {k: [] for k in KS}
        for k in KS:
            n = NEW_TOKENS_PER_K[k]
            for rep in range(REPEATS):
                # Cloud-only does not depend on α: one run per (k, repeat), interleaved with the
                # spec runs so a load spike on this busy machine hits both alike.
                base_runs[k].append(cloud_only(n))
                for alpha in ALPHAS:
                    rule = None if alpha >= 1.0 else SyntheticAcceptance(alpha, seed=1000 * k + rep)
                    res, cpu, wall = cpu_and_wall(partial(speculative_decode, edge, cloud, prompt,
                                                          base.with_(k=k, max_new_tokens=n), masks, eos_ids,
                                                          acceptance=rule))
                    assert len(res.tokens) == n
                    rows.append({"k": k, "alpha": alpha, "cpu": cpu, "wall": wall, "acc": res.stats.verified_accepted,
                                 "drafted": res.stats.verified_drafted,
                                 "rejected": sum(e.correction_kind == "recovered" for e in res.events)})
        for k in KS:
            n = NEW_TOKENS_PER_K[k]
            cloud_cpu = statistics.median(r[0] for r in base_runs[k])
            generate_cpu = statistics.median(r[1] for r in base_runs[k])
            generate_wall = statistics.median(r[2] for r in base_runs[k])
            for alpha in ALPHAS:
                mine = [r for r in rows if r["k"] == k and r["alpha"] == alpha]
                spec_cpu = statistics.median(r["cpu"] for r in mine)
                spec_wall = statistics.median(r["wall"] for r in mine)
                drafted, acc = sum(r["drafted"] for r in mine), sum(r["acc"] for r in mine)
                # Per-token acceptance as realised (accepted / (accepted + rejections), the MLE of α
                # under stop-at-first-rejection): with a few dozen blocks per cell the draws differ
                # from the nominal α, and the loop should be judged against what it was dealt.
                alpha_hat = acc / (acc + sum(r["rejected"] for r in mine)) if acc else 0.0
                measured = cloud_cpu / spec_cpu
                step = t_cloud[1] / (k * t_edge1 + t_cloud[k + 1])
                predicted = expected_tokens_per_block(alpha_hat, k) * step
                cells.append({
                    "cost_ratio": round(cost_ratio, 2), "k": k, "acceptance": alpha,
                    "speedup_measured": round(measured, 3), "speedup_predicted": round(predicted, 3),
                    "measured_over_predicted": round(measured / predicted, 3),
                    "speedup_vs_generate": round(generate_cpu / spec_cpu, 3),
                    "speedup_vs_generate_wall": round(generate_wall / spec_wall, 3),
                    "acceptance_per_token_observed": round(alpha_hat, 3),
                    "speedup_predicted_nominal": round(expected_tokens_per_block(alpha, k) * step, 3),
                    "accepted_over_drafted": round(acc / drafted, 3) if drafted else None,
                    "new_tokens": n, "cloud_layers": EDGE_LAYERS + extra,
                    "t_edge_1_ms": round(1000 * t_edge1, 3), "t_cloud_1_ms": round(1000 * t_cloud[1], 3),
                    "t_cloud_k1_ms": round(1000 * t_cloud[k + 1], 3),
                    "cloud_only_cpu_ms_per_token": round(1000 * cloud_cpu / n, 3),
                    "generate_cpu_ms_per_token": round(1000 * generate_cpu / n, 3),
                    "spec_cpu_ms_per_token": round(1000 * spec_cpu / n, 3),
                })
    return cells


# -- peak memory of a 30 s prefill at a 152k vocabulary ------------------------------------------------

MEMORY_VOCAB = 152_064  # Qwen2.5-Omni-7B thinker


def _memory_probe(case: str) -> dict[str, Any]:
    """Run in a fresh process: build a tiny thinker with a 152,064-row vocabulary and the inputs
    of a 30 s clip, then (case) do nothing / prefill with every position's logits (the thinker's
    own forward, as ModelState did before) / prefill through ModelState (last row only)."""
    import numpy as np
    from transformers import AutoTokenizer, DynamicCache, Qwen2_5OmniThinkerForConditionalGeneration

    from specdec_cli.demo.thinker_config import thinker_config
    from specdec_cli.models import demo_pair
    from specdec_cli.processor import AudioTextProcessor

    torch.set_num_threads(1)
    edge_dir = demo_pair()[0]
    processor = AudioTextProcessor.from_pretrained(edge_dir)
    config = thinker_config(AutoTokenizer.from_pretrained(edge_dir), hidden=64, layers=2, heads=4, kv_heads=2,
                            audio_d=64)
    config.text_config.vocab_size = MEMORY_VOCAB
    torch.manual_seed(0)
    model = Qwen2_5OmniThinkerForConditionalGeneration(config).eval()
    rng = np.random.default_rng(0)
    inputs = processor((0.1 * rng.standard_normal(16000 * 30)).astype(np.float32))
    before = peak_rss_mb()
    if case == "full":
        with torch.inference_mode():
            out = model(**inputs, past_key_values=DynamicCache(), use_cache=True)
            out.logits[0, -1].float().cpu()
    elif case == "last":
        ModelState(model).prefill(inputs)
    return {"case": case, "prompt_tokens": int(inputs["input_ids"].shape[1]),
            "maxrss_before_mb": round(before, 1), "maxrss_mb": round(peak_rss_mb(), 1)}


def peak_rss_mb() -> float:
    """This process's peak resident set, MB. Linux's `VmHWM` (the high-water mark of the current
    address space) where there is one: `ru_maxrss` is carried across fork + exec, so a probe
    started from the large bench process would report the bench's own peak (seen: 965 MB for
    every case). Elsewhere `ru_maxrss` (KB on Linux)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def prefill_memory() -> dict[str, Any]:
    """Peak RSS (VmHWM) of a 30 s clip's prefill at a 152,064-row vocabulary, each case
    in its own process: full logits (before) vs the last row only (after)."""
    runs = {}
    for case in ("none", "full", "last"):
        out = subprocess.run([sys.executable, __file__, "--memory-probe", case], capture_output=True, text=True,
                             check=True)
        runs[case] = json.loads(out.stdout.strip().splitlines()[-1])
    base = runs["none"]["maxrss_mb"]
    return {
        "vocab": MEMORY_VOCAB, "clip_s": 30, "prompt_tokens": runs["full"]["prompt_tokens"],
        "peak_mb_no_forward": base,
        "peak_mb_all_logits": runs["full"]["maxrss_mb"], "peak_mb_last_logits": runs["last"]["maxrss_mb"],
        "prefill_extra_mb_all_logits": round(runs["full"]["maxrss_mb"] - base, 1),
        "prefill_extra_mb_last_logits": round(runs["last"]["maxrss_mb"] - base, 1),
        "logits_tensor_mb_all_positions": round(runs["full"]["prompt_tokens"] * MEMORY_VOCAB * 4 / 2**20, 1),
    }


def synthetic_section(progress=lambda _: None) -> dict[str, Any]:
    """What `bench/run.py --synthetic` adds to the report."""
    start, load_start = time.perf_counter(), os.getloadavg()
    cells = run_cells(progress)
    above = [c for c in cells if c["speedup_predicted"] > 1]
    return {
        "synthetic": cells,
        "synthetic_summary": {
            "cells": len(cells),
            "measured_ge_0_9_predicted": sum(c["measured_over_predicted"] >= 0.9 for c in cells),
            "predicted_above_1": len(above),
            "faster_than_cloud_only_where_predicted_above_1": sum(c["speedup_measured"] > 1 for c in above),
            "min_measured_over_predicted": min(c["measured_over_predicted"] for c in cells),
            "seconds": round(time.perf_counter() - start, 1),
            # 1-, 5-, 15-minute load averages (2 cores here): how busy the machine was.
            "load_average_start": [round(x, 2) for x in load_start],
            "load_average_end": [round(x, 2) for x in os.getloadavg()],
            "clock": "process CPU time; speedup_vs_generate_wall is wall time, for reference",
            "baseline": "speedup_measured: cloud-only greedy through ModelState (like the T(n)); "
                        "speedup_vs_generate: cloud-only HF generate (specdec --mode cloud)",
            "settings": {"hidden": HIDDEN, "vocab": VOCAB, "prompt_tokens": PROMPT, "new_tokens": NEW_TOKENS_PER_K,
                         "edge_layers": EDGE_LAYERS, "cloud_layers": [EDGE_LAYERS + x for x in EXTRA_LAYERS],
                         "repeats": REPEATS, "verify": "always", "constraints": False,
                         "torch_threads": torch.get_num_threads()},
        },
        "prefill_memory": prefill_memory(),
    }


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--memory-probe":
        print(json.dumps(_memory_probe(sys.argv[2])))
    else:
        torch.set_num_threads(1)
        print(json.dumps(synthetic_section(lambda m: print(m, file=sys.stderr)), indent=1))
