"""The meaning gate: escalate a block where the edge is unsure about what the sentence *says*, not
about how it is worded.

Token entropy cannot tell 说话人/说话者 or 为/是 (wording) from 较快/较慢 (the speaker), and on the
demo pair the opening block's wording alone (about 2.7 nats on 说话/人) sends every clip to the
cloud. The gate replaces entropy by a *meaning mass*: at each draft position, the probability the
edge gives to alternatives whose choice would change what the sentence says,

    m_j = w[a] · Σ_{v ≠ a} p_j(v) · w[v]

with `a` the drafted token, `p_j` the edge's distribution there (after the rules, before the
sampling warpers: what the entropy reads), and `w` a learned per-token-id *meaning weight* in
[0, 1]: near 0 for tokens whose swaps never change the outcome (wording, attribute order), near 1
for tokens whose swaps do. The product says a swap matters when both sides carry meaning (较快 for
适中); a swap with a wording token (平静 for 听起来) only delays what is said. The weights are fitted per
pair by `specdec_cli.gate_fit` (AutoJudge-style self-labelling: swap the edge's token for its
runner-up, let the edge finish the sentence, see whether the outcome changed), so nothing here knows
any word of any language. Ids the fit never saw keep `default` (1: their alternatives count in
full, the safe side).

The block's score aggregates m_j like the entropy gate aggregates entropies (cfg.uncertainty: sum,
max or mean), and is compared with one of two thresholds: `cfg.gate_upload` while the cloud has not
heard the clip (escalating then uploads the audio and runs the cloud's prefill), `cfg.gate_verify`
once it has (a verification is then one forward over a few tokens).

Cost: `w` is sparse around the default, so with L the ids that differ from it,

    Σ_{v ≠ a} p(v) w[v] = d · (1 - p(a)) + Σ_{v ∈ L} p(v) (w[v] - d) - [a ∈ L] p(a) (w[a] - d)

one gather of |L| probabilities per position from the row the drafter already softmaxed (no
tokenizer decode, no pass over the vocabulary); the arrays are built once per vocabulary width.

The gate applies only to the task (instruction and system turn) and the tokenizer it was fitted on:
for any other `cfg.instruction` the loop falls back to the entropy gate (`applies`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from .config import DecodingConfig

# The prompt's defaults, as prompt.py renders them (None in a config means these). Repeated here
# rather than imported so that the engine does not depend on the CLI's modules; a test checks they
# are prompt.py's.
DEFAULT_INSTRUCTION = "请用一句中文描述说话人的语速、音调、音量、停顿、音色和情绪。"
DEFAULT_SYSTEM = "You are a helpful assistant."


@dataclass(frozen=True)
class MeaningGate:
    """The learned part of the meaning gate for one pair: plain data (presets TOML holds it, see
    specdec_cli/gate_presets.py), fitted by specdec_cli/gate_fit.py.

    weights:     token id -> meaning weight in [0, 1]; ids not listed have `default`
    default:     the weight of every id the fit never saw (1.0: count their alternatives in full)
    instruction: the task's user instruction it was fitted on (prompt.py's default when fitted on
                 the default task)
    system:      the system turn it was fitted on
    tokenizer:   fingerprint of the tokenizer it was fitted with (remote.wire.tokenizer_fingerprint;
                 "" = not recorded): token ids mean nothing across tokenizers
    """

    weights: Mapping[int, float]
    default: float = 1.0
    instruction: str = DEFAULT_INSTRUCTION
    system: str = DEFAULT_SYSTEM
    tokenizer: str = ""
    _scorers: dict = field(default_factory=dict, compare=False, repr=False, hash=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.default <= 1.0:
            raise ValueError(f"gate default weight must lie in [0, 1], got {self.default}")
        for token, w in self.weights.items():
            if not isinstance(token, int) or token < 0:
                raise ValueError(f"gate weights are keyed by non-negative token ids, got {token!r}")
            if not (isinstance(w, int | float) and 0.0 <= w <= 1.0):
                raise ValueError(f"gate weight of token {token} must lie in [0, 1], got {w!r}")

    def applies(self, cfg: DecodingConfig, tokenizer: str | None = None) -> bool:
        """Whether this gate was fitted on `cfg`'s task (and, when both are known, this tokenizer).
        Otherwise the loop uses the entropy gate: a weight learned on one task says nothing about
        which tokens carry meaning in another."""
        same_task = ((cfg.instruction or DEFAULT_INSTRUCTION) == self.instruction
                     and (cfg.system or DEFAULT_SYSTEM) == self.system)
        same_vocab = not (tokenizer and self.tokenizer) or tokenizer == self.tokenizer
        return same_task and same_vocab

    def weight(self, token: int) -> float:
        return float(self.weights.get(token, self.default))

    def score(self, p: np.ndarray, token: int) -> float:
        """m_j for the edge's probabilities `p` (a numpy row) and the drafted `token`."""
        return self.scorer(p.shape[-1]).score(p, token)

    def scorer(self, width: int) -> PositionScorer:
        """The per-position scorer for rows of `width` (built once per width, then shared)."""
        got = self._scorers.get(width)
        if got is None:
            got = self._scorers[width] = PositionScorer(self, width)
        return got


class PositionScorer:
    """m_j for one vocabulary width: `score(p, a)` with `p` the edge's probabilities (a float
    numpy row of that width) and `a` the drafted token. Precomputed: the listed ids below the width
    (L), their w - default, and a dict for w[a]."""

    def __init__(self, gate: MeaningGate, width: int) -> None:
        listed = sorted((t, w) for t, w in gate.weights.items() if t < width and w != gate.default)
        self.default = float(gate.default)
        self.ids = np.array([t for t, _ in listed], dtype=np.int64)
        self.delta = np.array([w - gate.default for _, w in listed], dtype=np.float64)
        self.lookup = {t: float(w) for t, w in gate.weights.items()}
        self.width = width

    def score(self, p: np.ndarray, token: int) -> float:
        wa = self.lookup.get(token, self.default)
        if wa == 0.0:
            return 0.0
        pa = float(p[token])
        others = self.default * (1.0 - pa)
        if self.ids.size:
            others += float(np.dot(p[self.ids].astype(np.float64), self.delta))
            if token in self.lookup and wa != self.default:
                others -= pa * (wa - self.default)
        return wa * min(max(others, 0.0), 1.0)  # clamp float rounding into [0, 1]


@dataclass(frozen=True)
class GateReading:
    """What the gate read for one block, for the decision and the trace: which gate decided
    ("meaning", or "entropy": the default, and the fallback), the block's score it compared and the
    threshold it compared it with (the block escalates when score > limit)."""

    gate: str
    score: float
    limit: float


def aggregate(values: list[float], how: str) -> float:
    """sum / max / mean of per-position values (the block's uncertainty, or its meaning score)."""
    if not values:
        return 0.0
    if how == "max":
        return max(values)
    if how == "mean":
        return sum(values) / len(values)
    return sum(values)


def read(cfg: DecodingConfig, entropies: list[float], meaning: list[float] | None, held: bool) -> GateReading:
    """The block's reading: the meaning gate's when the block carries meaning scores (the loop
    computes them only when the gate applies), else the entropy gate's."""
    if meaning is not None:
        limit = cfg.gate_verify if held else cfg.gate_upload
        return GateReading("meaning", aggregate(meaning, cfg.uncertainty), limit)
    return GateReading("entropy", aggregate(entropies, cfg.uncertainty), cfg.threshold)


def active(cfg: DecodingConfig, gate: MeaningGate | None, tokenizer: str | None = None) -> MeaningGate | None:
    """The gate a clip decodes with: `gate` when `cfg` asks for the meaning gate (verify="meaning")
    and the gate was fitted on this task; None (the entropy gate) otherwise."""
    if cfg.verify != "meaning" or gate is None or math.isinf(cfg.threshold):
        return None
    return gate if gate.applies(cfg, tokenizer) else None
