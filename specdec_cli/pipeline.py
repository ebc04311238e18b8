"""One clip in, one description out: audio → thinker inputs → the chosen mode → text.

The CLI, batch and eval all go through `Describer.run`, so every mode is measured the same way."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .decoding import BlockEvent, DecodeResult, DecodingConfig, generate_baseline, speculative_decode
from .models import ModelPair
from .prompt import INSTRUCTION, SYSTEM, render_prompt

if TYPE_CHECKING:
    from .remote.client import LinkStats


@dataclass
class Description:
    text: str
    result: DecodeResult
    latency_s: float   # wall time for features + decoding (model loading excluded)
    link: LinkStats | None = None  # what crossed the link to a remote cloud (None: in-process)


class Describer:
    def __init__(self, pair: ModelPair) -> None:
        self.pair = pair

    def inputs(self, audio: np.ndarray, cfg: DecodingConfig | None = None):
        """The thinker inputs for `audio`, with `cfg`'s instruction and system prompt (None: the
        default task)."""
        prompt = render_prompt(cfg.instruction or INSTRUCTION, cfg.system or SYSTEM) if cfg is not None else None
        return self.pair.processor(audio, prompt).to(self.pair.edge.device)

    def run(self, audio: np.ndarray, cfg: DecodingConfig,
            on_block: Callable[[BlockEvent], None] | None = None) -> Description:
        p = self.pair
        start = time.perf_counter()
        inputs = self.inputs(audio, cfg)
        link = None
        if p.remote is None:
            if cfg.mode == "spec":
                result = speculative_decode(p.edge, p.cloud, inputs, cfg, p.masks, p.eos_ids, on_block)
            else:
                model = p.cloud if cfg.mode == "cloud" else p.edge
                result = generate_baseline(model, inputs, cfg, p.masks, p.eos_ids, p.tokenizer.pad_token_id)
        elif cfg.mode == "spec":
            # The same loop; its cloud is this clip's session on the server (opened lazily).
            cloud = p.remote.clip(audio, cfg)
            try:
                result = speculative_decode(p.edge, cloud, inputs, cfg, p.masks, p.eos_ids, on_block)
            finally:
                cloud.close()
            link = cloud.link
        elif cfg.mode == "cloud":
            result, link = p.remote.generate(audio, inputs, cfg, p.tokenizer.pad_token_id)
        else:
            from .remote.client import LinkStats

            result = generate_baseline(p.edge, inputs, cfg, p.masks, p.eos_ids, p.tokenizer.pad_token_id)
            link = LinkStats()
        latency = time.perf_counter() - start
        text = p.tokenizer.decode(result.tokens, skip_special_tokens=True).strip()
        return Description(text, result, latency, link)
