"""Benchmarks of the speculative engine against HF assisted generation and cloud-only `generate`.

Run by hand (not part of the tests):

    python bench/run.py [--json] [--edge DIR --cloud DIR] [--samples DIR --labels FILE]

Three questions, answered as ratios on the same clips in one process (models loaded once):

1. identity: our `verify=always` vs HF assisted generation (`cloud.generate(assistant_model=edge)`)
   vs cloud-only `generate`, all plain greedy (constraints off): same tokens? how many cloud and
   edge forwards? wall time? Does HF's assistant ever run its audio tower (does it hear the clip)?
2. gated: the entropy-gated presets (fluent, quality) vs cloud-only and vs verify=always, with the
   decoding rules on: cloud calls saved, accuracy kept, throughput; next to U-HLM's published
   figures (arXiv 2412.12687).
3. overhead: per-token time spent in Python outside model forwards (wall - forward time).

`--json` prints one JSON object on stdout; otherwise a short human summary.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python bench/run.py` from a checkout that is not installed
    sys.path.insert(0, str(REPO))

from specdec_cli.audio import audio_suffixes, load_audio  # noqa: E402
from specdec_cli.decoding import DecodingConfig, DecodingRules, generate_baseline, speculative_decode  # noqa: E402
from specdec_cli.decoding.baselines import generation_config  # noqa: E402
from specdec_cli.errors import SpecdecError  # noqa: E402
from specdec_cli.evaluate import mode_configs, read_labels, score  # noqa: E402
from specdec_cli.models import ModelPair, load_pair  # noqa: E402

# U-HLM (arXiv 2412.12687), abstract: uncertainty-aware hybrid LM skips 45.9% of LLM
# verifications, keeps 97.5% of the LLM's accuracy, and reaches 2.54x throughput.
U_HLM = {"source": "arXiv 2412.12687 (U-HLM)", "llm_verifications_saved": 0.459, "accuracy_kept": 0.975,
         "throughput_x": 2.54}


# -- instruments -----------------------------------------------------------------------------------

class ForwardMeter:
    """Forward passes, the tokens fed and the time spent inside them, for one model, via pre/post
    forward hooks on the top-level module (nested modules' forwards are inside that time)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.calls = 0
        self.tokens = 0
        self.seconds = 0.0
        self._start: float | None = None
        # On a GPU a forward returns before its kernels finish: wait for them, or forward time
        # would shrink to launch time and show up as "overhead".
        self._sync = torch.cuda.synchronize if next(model.parameters()).is_cuda else (lambda: None)
        self._handles = [model.register_forward_pre_hook(self._pre, with_kwargs=True),
                         model.register_forward_hook(self._post)]

    def _pre(self, module, args, kwargs) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.tokens += int(ids.shape[-1]) if ids is not None else 0
        self._sync()
        self._start = time.perf_counter()

    def _post(self, module, args, output) -> None:
        assert self._start is not None
        self._sync()
        self.seconds += time.perf_counter() - self._start
        self.calls += 1
        self._start = None

    def reset(self) -> None:
        self.calls, self.tokens, self.seconds = 0, 0, 0.0

    def close(self) -> None:
        for h in self._handles:
            h.remove()


class CallCounter:
    """How many times a submodule runs (here: each model's audio tower)."""

    def __init__(self, module: torch.nn.Module | None) -> None:
        self.calls = 0
        self._handle = module.register_forward_hook(self._hook) if module is not None else None

    def _hook(self, module, args, output) -> None:
        self.calls += 1

    def close(self) -> None:
        if self._handle is not None:
            self._handle.remove()


def audio_tower(model: torch.nn.Module) -> torch.nn.Module | None:
    """Qwen2.5-Omni thinker: `model.model.audio_tower` (Qwen2_5OmniThinkerModel in transformers'
    modeling_qwen2_5_omni.py). None for models without one."""
    return getattr(getattr(model, "model", None), "audio_tower", None)


@dataclass
class Run:
    tokens: list[int]
    wall_s: float
    forwards: dict[str, int]          # model -> forward passes, prefill included
    forward_s: dict[str, float]       # model -> seconds inside forwards
    audio_tower_calls: dict[str, int]
    tokens_fed: dict[str, int] = field(default_factory=dict)  # model -> tokens fed, prompt included
    prompt_tokens: int = 0
    cpu_s: float = 0.0                # process CPU time (1 torch thread: wall time on a core of its own)
    overrun: int = 0                  # tokens generated past our stop rule (HF assisted only)
    text: str = ""
    accuracy: float | None = None     # mean over the six attributes (None without labels)
    error: str | None = None

    @property
    def after_prefill(self) -> dict[str, int]:
        """Forwards after each model's first (its prefill), as the result record counts them."""
        return {m: max(n - 1, 0) for m, n in self.forwards.items()}


@dataclass
class Instruments:
    edge: ForwardMeter
    cloud: ForwardMeter
    towers: dict[str, CallCounter] = field(default_factory=dict)

    @classmethod
    def attach(cls, pair: ModelPair) -> Instruments:
        return cls(ForwardMeter(pair.edge), ForwardMeter(pair.cloud),
                   {"edge": CallCounter(audio_tower(pair.edge)), "cloud": CallCounter(audio_tower(pair.cloud))})

    def measure(self, fn: Callable[[], tuple[list[int], int]]) -> Run:
        self.edge.reset()
        self.cloud.reset()
        for t in self.towers.values():
            t.calls = 0
        start, cpu = time.perf_counter(), time.process_time()
        try:
            (tokens, overrun), error = fn(), None
        except Exception as exc:  # a failing baseline (HF assisted on a multimodal model) is a finding
            tokens, overrun = [], 0
            error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        return Run(tokens, wall, {"edge": self.edge.calls, "cloud": self.cloud.calls},
                   {"edge": self.edge.seconds, "cloud": self.cloud.seconds},
                   {m: t.calls for m, t in self.towers.items()},
                   {"edge": self.edge.tokens, "cloud": self.cloud.tokens}, cpu_s=cpu, overrun=overrun, error=error)

    def close(self) -> None:
        for x in (self.edge, self.cloud, *self.towers.values()):
            x.close()


# -- the runs --------------------------------------------------------------------------------------

def _reset_rope(*models: torch.nn.Module) -> None:
    """HF `generate` reads the thinker's module-level rope_deltas; a previous clip's must not leak."""
    for m in models:
        if hasattr(getattr(m, "model", None), "rope_deltas"):
            m.model.rope_deltas = None


@contextlib.contextmanager
def assistant_settings(edge: torch.nn.Module, k: int) -> Iterator[None]:
    """HF reads the draft length from the *assistant's* generation_config. Pin it to our k, with a
    constant schedule and no confidence early-exit, so both engines draft k tokens per block."""
    saved = copy.deepcopy(edge.generation_config)
    edge.generation_config.num_assistant_tokens = k
    edge.generation_config.num_assistant_tokens_schedule = "constant"
    edge.generation_config.assistant_confidence_threshold = 0.0  # 0 disables the early exit
    try:
        yield
    finally:
        edge.generation_config = saved


def hf_assisted(pair: ModelPair, inputs, cfg: DecodingConfig) -> tuple[list[int], int]:
    """`cloud.generate(..., assistant_model=edge)` with our processors and sentence-end stop.

    HF evaluates stopping criteria once per verified block, and our sentence-end criterion looks
    at the last token only, so a sentence end accepted mid-block is followed by the rest of the
    block. We cut HF's output where our stop rule fires token by token, and return how many tokens
    it ran past (reported as a finding, not counted as a mismatch)."""
    prompt_len = int(inputs["input_ids"].shape[1])
    rules = DecodingRules.build(cfg, pair.masks, prompt_len, pair.eos_ids)
    _reset_rope(pair.edge, pair.cloud)
    with assistant_settings(pair.edge, cfg.k), torch.inference_mode():
        out = pair.cloud.generate(
            **inputs, assistant_model=pair.edge,
            generation_config=generation_config(cfg, pair.eos_ids, pair.tokenizer.pad_token_id),
            logits_processor=rules.processors, stopping_criteria=[rules.sentence_end],
        )
    prompt, tokens = out[0, :prompt_len].tolist(), out[0, prompt_len:].tolist()
    cut = next((i + 1 for i in range(len(tokens)) if rules.stops(prompt + tokens[:i + 1])), len(tokens))
    return tokens[:cut], len(tokens) - cut


def plan(pair: ModelPair, max_new_tokens: int) -> dict[str, tuple[str, DecodingConfig]]:
    """name -> (engine, config). Identity runs are plain greedy (constraints off) so HF assisted
    and cloud-only generate are the exact oracle; gated runs use the eval modes (rules on).
    Both speculative engines draft k tokens, k from the quality preset (as eval's `always`)."""
    evalm = {m.name: m.cfg for m in mode_configs(["edge", "cloud", "fluent", "quality", "always"],
                                                 pair.presets_file, max_new_tokens)}
    plain = evalm["always"].with_(constraints=False)
    return {
        "plain_cloud_generate": ("baseline", plain.with_(mode="cloud")),
        "plain_ours_always": ("spec", plain),
        "plain_hf_assisted": ("hf_assisted", plain),
        **{name: ("baseline" if cfg.mode != "spec" else "spec", cfg) for name, cfg in evalm.items()},
    }


def run_one(pair: ModelPair, inputs, engine: str, cfg: DecodingConfig) -> tuple[list[int], int]:
    """(answer tokens, tokens generated past our stop rule) for one clip on one engine."""
    if engine == "hf_assisted":
        return hf_assisted(pair, inputs, cfg)
    if engine == "spec":
        return speculative_decode(pair.edge, pair.cloud, inputs, cfg, pair.masks, pair.eos_ids).tokens, 0
    model = pair.cloud if cfg.mode == "cloud" else pair.edge
    return generate_baseline(model, inputs, cfg, pair.masks, pair.eos_ids, pair.tokenizer.pad_token_id).tokens, 0


# -- aggregation -----------------------------------------------------------------------------------

def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _r(x: float | None, nd: int = 4) -> float | None:
    return round(x, nd) if x is not None and math.isfinite(x) else None


def per_mode(runs: list[Run], rtt_ms: float, cloud_only: bool = False) -> dict[str, Any]:
    ok = [r for r in runs if r.error is None]
    tokens = sum(len(r.tokens) for r in ok)
    wall = sum(r.wall_s for r in ok)
    fwd_s = sum(sum(r.forward_s.values()) for r in ok)
    cloud_calls = sum(r.after_prefill["cloud"] for r in ok)
    # Link model as in metrics.modelled_latency: a round trip per cloud call after prefill for the
    # speculative engines, one per clip for cloud-only (upload, stream back).
    link_s = (len(ok) if cloud_only else cloud_calls) * rtt_ms / 1000.0
    accs = [r.accuracy for r in ok if r.accuracy is not None]
    return {
        "clips": len(runs), "errors": len(runs) - len(ok),
        "error": next((r.error for r in runs if r.error), None),
        "tokens_per_clip": _r(_mean([len(r.tokens) for r in ok]), 2),
        "cloud_forwards_per_clip": _r(_mean([r.after_prefill["cloud"] for r in ok]), 2),
        "edge_forwards_per_clip": _r(_mean([r.after_prefill["edge"] for r in ok]), 2),
        "cloud_calls_per_token": _r(cloud_calls / tokens if tokens else None),
        # All the cloud's work, from the hooks (independent of the engine's own counters): every
        # forward and every token fed, prefill included; the prompt tokens it prefilled (0 when it
        # never ran: lazy prefill); the share of clips on which the cloud never ran.
        "cloud_work_forwards_per_clip": _r(_mean([r.forwards["cloud"] for r in ok]), 2),
        "cloud_work_tokens_per_clip": _r(_mean([r.tokens_fed.get("cloud", 0) for r in ok]), 2),
        "cloud_prefill_tokens_per_clip": _r(_mean([r.prompt_tokens * (r.forwards["cloud"] > 0) for r in ok]), 2),
        "no_cloud_share": _r(sum(r.forwards["cloud"] == 0 for r in ok) / len(ok) if ok else None),
        "edge_audio_tower_calls_per_clip": _r(_mean([r.audio_tower_calls["edge"] for r in ok]), 2),
        "mean_accuracy": _r(_mean(accs)),
        "wall_s_per_clip": _r(wall / len(ok) if ok else None, 5),
        "cpu_s_per_clip": _r(sum(r.cpu_s for r in ok) / len(ok) if ok else None, 5),
        "tokens_per_s": _r(tokens / wall if wall else None, 2),
        "modelled_tokens_per_s": _r(tokens / (wall + link_s) if wall + link_s else None, 2),
        "wall_ms_per_token": _r(1000 * wall / tokens if tokens else None, 3),
        "forward_ms_per_token": _r(1000 * fwd_s / tokens if tokens else None, 3),
        "overhead_ms_per_token": _r(1000 * (wall - fwd_s) / tokens if tokens else None, 3),
        "overhead_share": _r((wall - fwd_s) / wall if wall else None),
    }


def identity_section(runs: dict[str, list[Run]], modes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    cloud, ours, hf = (runs[n] for n in ("plain_cloud_generate", "plain_ours_always", "plain_hf_assisted"))

    def same(xs: list[Run]) -> str:
        n = sum(a.error is None and b.error is None and a.tokens == b.tokens for a, b in zip(xs, cloud, strict=True))
        return f"{n}/{len(cloud)}"

    m = {k: modes[f"plain_{k}"] for k in ("cloud_generate", "ours_always", "hf_assisted")}
    hf_towers, our_towers = m["hf_assisted"]["edge_audio_tower_calls_per_clip"], m["ours_always"]["edge_audio_tower_calls_per_clip"]
    if m["hf_assisted"]["errors"]:
        finding = f"HF assisted generation failed: {m['hf_assisted']['error']}"
    elif hf_towers == 0:
        finding = (f"HF's assistant never ran its audio tower (0 calls per clip; ours: {our_towers:g}): it drafts "
                   "without hearing the clip, so its drafts can only guess the speaker's attributes.")
    else:
        finding = f"HF's assistant ran its audio tower {hf_towers:g} times per clip (ours: {our_towers:g})."
    return {
        "settings": "greedy, constraints off, same k, same stop rules; forwards counted after each model's prefill",
        "tokens_identical_to_cloud_generate": {"ours_always": same(ours), "hf_assisted": same(hf)},
        # HF checks stop rules once per block: clips where it kept tokens after the sentence end
        # (cut off before comparing; see hf_assisted).
        "hf_assisted_ran_past_stop": f"{sum(r.overrun > 0 for r in hf)}/{len(hf)}",
        "per_mode": m,
        # Cloud forwards counted whole (prefill included): our lazy prefill rides in a verification.
        "ratios": {
            "cloud_forwards_ours_vs_hf": _r(_ratio(m["ours_always"]["cloud_work_forwards_per_clip"], m["hf_assisted"]["cloud_work_forwards_per_clip"])),
            "cloud_forwards_ours_vs_cloud_only": _r(_ratio(m["ours_always"]["cloud_work_forwards_per_clip"], m["cloud_generate"]["cloud_work_forwards_per_clip"])),
            "cloud_work_forwards_ours_vs_cloud_only": _r(_ratio(m["ours_always"]["cloud_work_forwards_per_clip"], m["cloud_generate"]["cloud_work_forwards_per_clip"])),
            "cloud_work_tokens_ours_vs_cloud_only": _r(_ratio(m["ours_always"]["cloud_work_tokens_per_clip"], m["cloud_generate"]["cloud_work_tokens_per_clip"])),
            "cloud_forwards_hf_vs_cloud_only": _r(_ratio(m["hf_assisted"]["cloud_work_forwards_per_clip"], m["cloud_generate"]["cloud_work_forwards_per_clip"])),
            "edge_forwards_ours_vs_hf": _r(_ratio(m["ours_always"]["edge_forwards_per_clip"], m["hf_assisted"]["edge_forwards_per_clip"])),
            "wall_ours_vs_cloud_only": _r(_ratio(m["ours_always"]["wall_s_per_clip"], m["cloud_generate"]["wall_s_per_clip"])),
            "wall_hf_vs_cloud_only": _r(_ratio(m["hf_assisted"]["wall_s_per_clip"], m["cloud_generate"]["wall_s_per_clip"])),
            "wall_ours_vs_hf": _r(_ratio(m["ours_always"]["wall_s_per_clip"], m["hf_assisted"]["wall_s_per_clip"])),
        },
        "edge_audio_tower_calls_per_clip": {"ours_always": our_towers, "hf_assisted": hf_towers},
        "finding": finding,
    }


def gated_section(modes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    cloud, always, edge = modes["cloud"], modes["always"], modes["edge"]
    out: dict[str, Any] = {}
    for name in ("fluent", "quality"):
        m = modes[name]
        out[name] = {
            # Latency against the limit (edge-only: cloud quality at edge cost) and cloud-only.
            "latency_x_vs_edge_only": _r(_ratio(m["wall_s_per_clip"], edge["wall_s_per_clip"]), 3),
            "latency_x_vs_cloud_only": _r(_ratio(m["wall_s_per_clip"], cloud["wall_s_per_clip"]), 3),
            # The same on process CPU time, which a loaded machine's scheduling does not inflate.
            "cpu_x_vs_edge_only": _r(_ratio(m["cpu_s_per_clip"], edge["cpu_s_per_clip"]), 3),
            "cpu_x_vs_cloud_only": _r(_ratio(m["cpu_s_per_clip"], cloud["cpu_s_per_clip"]), 3),
            "cloud_work_tokens_vs_cloud_only": _r(_ratio(m["cloud_work_tokens_per_clip"], cloud["cloud_work_tokens_per_clip"])),
            "no_cloud_share": m["no_cloud_share"],
            # Every cloud forward, prefill included: with the lazy prefill each spec-mode forward is
            # one verification (the first carries the prefill), so "after prefill" would drop one.
            "cloud_calls_per_clip": m["cloud_work_forwards_per_clip"],
            "mean_accuracy": m["mean_accuracy"],
            # U-HLM counts verifications skipped against verifying every draft: our verify=always.
            "cloud_calls_saved_vs_always": _r(1 - _ratio(m["cloud_work_forwards_per_clip"],
                                                         always["cloud_work_forwards_per_clip"])
                                              if always["cloud_work_forwards_per_clip"] else None),
            "cloud_calls_saved_vs_cloud_only": _r(1 - _ratio(m["cloud_work_forwards_per_clip"],
                                                             cloud["cloud_work_forwards_per_clip"])
                                                  if cloud["cloud_work_forwards_per_clip"] else None),
            "accuracy_kept_vs_cloud_only": _r(_ratio(m["mean_accuracy"], cloud["mean_accuracy"])),
            "throughput_x_vs_cloud_only": _r(_ratio(m["tokens_per_s"], cloud["tokens_per_s"]), 3),
            "modelled_throughput_x_vs_cloud_only": _r(_ratio(m["modelled_tokens_per_s"], cloud["modelled_tokens_per_s"]), 3),
        }
    ref = ("cloud_work_forwards_per_clip", "mean_accuracy", "tokens_per_s")
    out["reference"] = {"cloud_only": {k: cloud[k] for k in ref}, "always": {k: always[k] for k in ref},
                        "edge_only": {k: modes["edge"][k] for k in ("mean_accuracy", "tokens_per_s")}}
    out["u_hlm_published"] = U_HLM
    return out


# -- main ------------------------------------------------------------------------------------------

def clips_of(samples: Path, labels: Path | None) -> list[tuple[str, Path, dict[str, str] | None]]:
    """(name, path, labels or None). Without a labels file every audio file in `samples` is used
    and accuracy is left out."""
    if labels is not None and labels.is_file():
        return [(c.file, c.path, c.labels) for c in read_labels(labels, samples)]
    files = sorted(p for p in samples.iterdir() if p.suffix.lower() in audio_suffixes())
    return [(p.name, p, None) for p in files]


def bench(pair: ModelPair, clips: list[tuple[str, Path, dict[str, str] | None]], max_new_tokens: int,
          rtt_ms: float, progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    proc = pair.processor
    inputs = [proc(load_audio(path, proc.sampling_rate, proc.max_seconds)) for _, path, _ in clips]
    runs_plan = plan(pair, max_new_tokens)
    inst = Instruments.attach(pair)
    runs: dict[str, list[Run]] = {name: [] for name in runs_plan}
    try:
        # Warm-up (untimed): one-off allocation and kernel setup must not land on the first mode.
        for engine, cfg in runs_plan.values():
            inst.measure(partial(run_one, pair, inputs[0], engine, cfg.with_(max_new_tokens=2)))
        # Clip-major order: every mode sees each clip back to back, so a background load spike
        # hits all modes alike rather than one mode's whole series.
        for (name, _, labels), x in zip(clips, inputs, strict=True):
            progress(name)
            for mode, (engine, cfg) in runs_plan.items():
                run = inst.measure(partial(run_one, pair, x, engine, cfg))
                run.prompt_tokens = int(x["input_ids"].shape[1])
                run.text = pair.tokenizer.decode(run.tokens, skip_special_tokens=True).strip()
                if labels is not None and run.error is None:
                    correct = score(run.text, labels)["correct"]
                    run.accuracy = sum(correct.values()) / len(correct)
                runs[mode].append(run)
    finally:
        inst.close()
    modes = {name: per_mode(rs, rtt_ms, cloud_only=runs_plan[name][1].mode == "cloud") for name, rs in runs.items()}
    return {
        "pair": {"edge": pair.edge_id, "cloud": pair.cloud_id,
                 "edge_params": sum(p.numel() for p in pair.edge.parameters()),
                 "cloud_params": sum(p.numel() for p in pair.cloud.parameters())},
        "clips": len(clips),
        "labelled": all(lab is not None for _, _, lab in clips),
        "max_new_tokens": max_new_tokens,
        "k": runs_plan["plain_ours_always"][1].k,
        "cloud_rtt_ms": rtt_ms,
        "device": str(pair.edge.device),
        "torch_threads": torch.get_num_threads(),
        "identity": identity_section(runs, modes),
        "gated": gated_section(modes),
        "overhead": {name: {k: m[k] for k in ("wall_ms_per_token", "forward_ms_per_token",
                                                "overhead_ms_per_token", "overhead_share")}
                     for name, m in modes.items()},
        "modes": modes,
    }


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.0%}"


def summary(result: dict[str, Any]) -> str:
    idt, gated = result["identity"], result["gated"]
    lines = [f"pair: {result['pair']['edge']} -> {result['pair']['cloud']}  ({result['clips']} clips, k={result['k']})",
             "", "identity (greedy, constraints off):"]
    lines += [f"  tokens identical to cloud-only generate: {k} {v}" for k, v in idt["tokens_identical_to_cloud_generate"].items()]
    lines.append(f"  HF assisted kept tokens past the sentence end (cut before comparing): {idt['hf_assisted_ran_past_stop']}")
    lines += [f"  {k}: {v}" for k, v in idt["ratios"].items()]
    lines += [f"  finding: {idt['finding']}", "", "gated (rules on):"]
    for name in ("fluent", "quality"):
        lines.append(f"  {name}: " + ", ".join(f"{k}={v}" for k, v in gated[name].items()))
    u = gated["u_hlm_published"]
    lines += [f"  U-HLM published: verifications saved {u['llm_verifications_saved']:.1%}, accuracy kept "
              f"{u['accuracy_kept']:.1%}, throughput {u['throughput_x']}x", "", "engine overhead per token (ms):"]
    lines += [f"  {name:22s} wall {o['wall_ms_per_token']}  forward {o['forward_ms_per_token']}  "
              f"overhead {o['overhead_ms_per_token']} ({_pct(o['overhead_share'])})" for name, o in result["overhead"].items()]
    if "synthetic" in result:
        lines += ["", "synthetic pairs, verify=always (speedup over cloud-only, measured vs predicted):"]
        lines += [f"  c={c['cost_ratio']:5.2f} k={c['k']} alpha={c['acceptance']:.2f}  measured {c['speedup_measured']:.2f}x"
                  f"  predicted {c['speedup_predicted']:.2f}x  ({c['measured_over_predicted']:.2f})" for c in result["synthetic"]]
        mem = result["prefill_memory"]
        lines.append(f"prefill of a 30 s clip at {mem['vocab']} vocab: peak +{mem['prefill_extra_mb_all_logits']} MB with "
                     f"all logits, +{mem['prefill_extra_mb_last_logits']} MB with the last row only")
    if "vocab152k" in result:
        from vocab152k import summary_lines

        lines += ["", *summary_lines(result["vocab152k"])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--edge", help="edge model folder or Hub id (default: bundled demo edge)")
    ap.add_argument("--cloud", help="cloud model folder or Hub id (default: bundled demo cloud)")
    ap.add_argument("--samples", type=Path, default=REPO / "samples", help="folder of clips (default: samples/)")
    ap.add_argument("--labels", type=Path, help="labels.jsonl (default: SAMPLES/labels.jsonl if present)")
    ap.add_argument("--limit", type=int, help="only the first N clips")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--cloud-rtt-ms", type=float, default=0.0, help="modelled round trip per cloud call")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: steadier timings)")
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    ap.add_argument("--no-vocab152k", action="store_true",
                    help="skip bench/vocab152k.py (overhead per token at the real Qwen2.5 vocabulary, mask build, "
                         "bf16 numerics on a random real-width pair)")
    ap.add_argument("--synthetic", action="store_true",
                    help="also run bench/synthetic.py: speedup vs its limit on synthetic pairs (cost ratio 2-10, "
                         "k 2-8, acceptance 0.6-1) and peak memory of a 30 s prefill at a 152k vocabulary")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # HF's notes about assisted generation would drown the output
    hf_logging.disable_progress_bar()
    try:
        labels = args.labels or (args.samples / "labels.jsonl")
        clips = clips_of(args.samples, labels)[: args.limit]
        if not clips:
            raise SpecdecError(f"no clips in {args.samples}")
        pair = load_pair(args.edge, args.cloud, args.device, args.dtype)
        result = bench(pair, clips, args.max_new_tokens, args.cloud_rtt_ms,
                       progress=lambda name: print(f"  {name}", file=sys.stderr))
        if not args.no_vocab152k:
            from vocab152k import run as vocab152k_section  # bench/ is sys.path[0] when run as a script

            result["vocab152k"] = vocab152k_section(progress=lambda msg: print(f"  {msg}", file=sys.stderr))
        if args.synthetic:
            from synthetic import synthetic_section  # bench/ is sys.path[0] when run as a script

            result.update(synthetic_section(progress=lambda msg: print(f"  synthetic: {msg}", file=sys.stderr)))
    except SpecdecError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return exc.exit_code
    print(json.dumps(result, ensure_ascii=False) if args.json else summary(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
