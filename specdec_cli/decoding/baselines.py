"""Edge-only and cloud-only baselines through plain HF `generate`, with the same processors and
stop rules as the speculative loop (F13), so the three modes differ only in who decides tokens."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from transformers import GenerationConfig, PreTrainedModel, StoppingCriteria

from .config import DecodingConfig
from .loop import DecodeResult, DecodeStats
from .processors import DecodingRules, VocabMasks
from .state import logits_for_last


class ForwardCounter:
    """Counts a model's forward passes and the tokens fed, via a forward pre-hook."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.calls = 0
        self.tokens = 0
        self._handle = model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.calls += 1
        self.tokens += int(ids.shape[-1]) if ids is not None else 0

    def close(self) -> None:
        self._handle.remove()


class _Stop(StoppingCriteria):
    """Ends every row at the next step once `stop()` says so (the server: the requester has gone)."""

    def __init__(self, stop: Callable[[], bool]) -> None:
        self.stop = stop

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: object) -> torch.Tensor:
        return torch.full((input_ids.shape[0],), self.stop(), dtype=torch.bool, device=input_ids.device)


def generation_config(cfg: DecodingConfig, eos_ids: list[int], pad_id: int | None) -> GenerationConfig:
    """A clean config: nothing from the checkpoint's generation_config.json (top_p, penalties…)
    sneaks in; our processors carry every rule."""
    return GenerationConfig(
        do_sample=cfg.sample,
        max_new_tokens=cfg.max_new_tokens,
        eos_token_id=eos_ids,
        pad_token_id=pad_id if pad_id is not None else eos_ids[0],
        temperature=None, top_k=None, top_p=None,
    )


@torch.inference_mode()
def generate_baseline(
    model: PreTrainedModel,
    inputs: Mapping[str, torch.Tensor],
    cfg: DecodingConfig,
    masks: VocabMasks,
    eos_ids: list[int],
    pad_id: int | None = None,
    stop: Callable[[], bool] | None = None,
) -> DecodeResult:
    """One model alone, HF `generate`, our processors and stop rules. Its forwards after prefill
    are reported as cloud calls (cloud mode) or edge forwards (edge mode); in cloud mode the
    prefill is cloud work too (`cloud_prefill_tokens`, `cloud_work_forwards`). The prefill
    computes logits for the last position only (`logits_for_last`: generate reads no other)."""
    prompt_len = int(inputs["input_ids"].shape[1])
    rules = DecodingRules.build(cfg, masks, prompt_len, eos_ids)
    device = model.device  # the prompt may have been built for the other model's device
    inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    if hasattr(getattr(model, "model", None), "rope_deltas"):
        model.model.rope_deltas = None  # never let a previous clip's M-RoPE offset leak in
    counter = ForwardCounter(model)
    try:
        with logits_for_last(model, 1):
            out = model.generate(
                **inputs,
                generation_config=generation_config(cfg, eos_ids, pad_id),
                logits_processor=rules.processors,
                stopping_criteria=[rules.sentence_end] + ([_Stop(stop)] if stop is not None else []),
            )
    finally:
        counter.close()
    tokens = out[0, prompt_len:].tolist()
    stats = DecodeStats(tokens=len(tokens))
    after_prefill_calls, after_prefill_tokens = counter.calls - 1, counter.tokens - prompt_len
    if cfg.mode == "cloud":
        stats.cloud_calls, stats.cloud_tokens = after_prefill_calls, after_prefill_tokens
        stats.cloud_prefill_tokens, stats.cloud_work_forwards = prompt_len, counter.calls
    else:
        stats.edge_forwards = after_prefill_calls
    return DecodeResult(tokens, stats)
