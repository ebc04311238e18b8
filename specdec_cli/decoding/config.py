"""Decoding settings: one frozen value passed from the CLI (or a test) to the engine."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Literal

Mode = Literal["spec", "edge", "cloud"]
Verify = Literal["entropy", "always", "meaning"]
Uncertainty = Literal["sum", "max", "mean"]


@dataclass(frozen=True)
class DecodingConfig:
    mode: Mode = "spec"
    k: int = 4                      # draft block length
    threshold: float = 5.5          # escalate when block uncertainty (nats) exceeds this; inf = never
    uncertainty: Uncertainty = "sum"
    verify: Verify = "entropy"      # "always": every block verified (lossless); "meaning": the meaning gate
    # The meaning gate (decoding/gate.py, verify="meaning"): escalate a block whose meaning score
    # (expected changes to what the sentence says, aggregated by `uncertainty`) exceeds gate_upload
    # while the cloud has not heard the clip (escalating uploads it and runs the cloud's prefill),
    # gate_verify once it has (a verification is then one forward over a few tokens). Without a gate
    # fitted on this task, verify="meaning" is the entropy gate with `threshold`; threshold = inf
    # still means the cloud is never consulted.
    gate_upload: float = 0.5
    gate_verify: float = 0.5
    constraints: bool = True        # False: plain decoding, no processors (comparable with plain HF generate)
    max_new_tokens: int = 64
    sample: bool = False
    # HF's warpers, applied in this order after the rules, once, on both models (F6, F13): they
    # shape what --sample draws from; a greedy choice never changes under them, and the gate's
    # entropy is read before them (drafter.Drafting), so neither do the escalations.
    temperature: float = 1.0
    top_p: float = 1.0              # nucleus: keep the fewest tokens holding this much probability
    top_k: int = 0                  # keep the k likeliest tokens; 0 = all
    seed: int = 0
    # The prompt's user instruction and system turn (prompt.py); None: the default description
    # task. Plain strings, so the config still crosses a wire as a dict. The rules do not read them:
    # the one-sentence and CJK rules hold for any instruction unless `constraints` is off.
    instruction: str | None = None
    system: str | None = None
    # Constraint knobs (seeds 003/004), all over the answer's CJK content *characters*, so they mean
    # the same on every tokenizer (docs/engine.md, "The decoding rules, on characters", says why).
    repetition_penalty: float = 1.2  # HF semantics, on the answer's CJK content tokens
    no_repeat_ngram: int = 4        # no 4-gram of the punctuation-stripped character stream twice
    comma_min_chars: int = 4        # a mark only after this many CJK chars since the last mark
    stop_min_chars: int = 12        # a sentence end only (and then it stops) once this many CJK chars

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"k must be at least 1, got {self.k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if math.isnan(self.threshold) or self.threshold < 0:
            raise ValueError(f"threshold must be a non-negative number or inf, got {self.threshold}")
        for name in ("gate_upload", "gate_verify"):
            value = getattr(self, name)
            if math.isnan(value) or value < 0:
                raise ValueError(f"{name} must be a non-negative number or inf, got {value}")
        if self.no_repeat_ngram < 2:
            raise ValueError(f"no_repeat_ngram must be at least 2, got {self.no_repeat_ngram}")
        if self.comma_min_chars < 0 or self.stop_min_chars < 0:
            raise ValueError("comma_min_chars and stop_min_chars must be non-negative")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be positive, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be 0 (off) or positive, got {self.top_k}")
        for name in ("instruction", "system"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ValueError(f"{name} must be non-empty text, got {value!r}")
            if value is not None and "<|" in value:
                raise ValueError(f"{name} must not hold special tokens such as <|AUDIO|>, got {value!r}")
        if self.mode not in ("spec", "edge", "cloud"):
            raise ValueError(f"mode must be spec, edge or cloud, got {self.mode!r}")
        if self.verify not in ("entropy", "always", "meaning"):
            raise ValueError(f"verify must be entropy, always or meaning, got {self.verify!r}")
        if self.uncertainty not in ("sum", "max", "mean"):
            raise ValueError(f"uncertainty must be sum, max or mean, got {self.uncertainty!r}")

    def with_(self, **changes) -> DecodingConfig:
        return replace(self, **changes)

    def as_dict(self) -> dict:
        return asdict(self)
