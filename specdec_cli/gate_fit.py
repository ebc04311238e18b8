"""Fitting the meaning gate (decoding/gate.py) for a pair, from the pair's own behaviour.

AutoJudge-style self-labelling (arXiv 2504.20039: label a token by whether swapping it changes the
answer), done with the edge alone, so it costs no cloud work:

1. the edge describes each calibration clip (the edge-only run calibrate already makes);
2. at every position of that answer, each likely alternative v of the edge's own choice a (its
   top candidates under the rules, p(v) >= min_p) is swapped in, and the edge finishes the
   sentence greedily from there;
3. the swap is labelled by whether the *outcome* changed: what the sentence says, as the quality
   measure reads it (`text_outcome`: the attribute values stated by the canonical phrases, the same
   parse `eval` and calibrate score with; a text without any phrase: the text itself).

So 说话人 → 说话者 (the edge then says the same attributes) is labelled "wording", 语速… → 音调…
(the edge then states the same attributes in another order) too, and 较快 → 适中 "meaning", without
anyone listing a synonym: the labels come from the pair and the scorer.

4. `fit_weights` fits one meaning weight per token id to the labels with the gate's own model,
   P(changed | a, v) = w[a] · w[v] (least squares, coordinate descent, w in [0, 1], a prior pulling
   each weight towards 1 — the weight of a token the fit never saw).

The thresholds (cfg.gate_upload / cfg.gate_verify) are not fitted here: calibrate sweeps them like
the entropy threshold and chooses with `calibration_objective.cheapest` (`gate_grid` gives the
sweep's values from the edge-only blocks' meaning scores).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

import torch

from .decoding.acceptance import first_argmax
from .decoding.config import DecodingConfig
from .decoding.gate import DEFAULT_INSTRUCTION, DEFAULT_SYSTEM, MeaningGate, aggregate
from .decoding.processors import DecodingRules, VocabMasks
from .decoding.state import ModelState
from .phrases import predict


@dataclass(frozen=True)
class Swap:
    """One self-labelled swap: at a position where the edge chose `drafted`, it gave `p` to
    `alternative`; `changed` says whether finishing the sentence after the alternative changed
    what it says."""

    drafted: int
    alternative: int
    p: float
    changed: bool


def text_outcome(text: str) -> Hashable:
    """What a description says, as the quality measure reads it: the attribute values its
    canonical phrases state (calibrate's `agreement` and `eval`'s `score` parse the same way);
    a text stating none: the text itself (any change counts, as calibrate's character
    agreement)."""
    said = predict(text)
    if any(v is not None for v in said.values()):
        return tuple(sorted(said.items()))
    return text


@torch.inference_mode()
def swap_labels(edge_model: torch.nn.Module, inputs: Mapping[str, torch.Tensor], answer: Sequence[int],
                cfg: DecodingConfig, masks: VocabMasks, eos_ids: list[int],
                outcome: Callable[[list[int]], Hashable], top: int = 3, min_p: float = 0.02,
                max_swaps: int | None = None) -> list[Swap]:
    """The swaps of one clip. `answer`: the edge's greedy answer ids under `cfg`'s rules (edge-only
    run); `outcome(ids)` what an answer says (decode + `text_outcome`, typically). Each position's
    alternatives are the `top` likeliest tokens other than the answer's under the rules, with
    probability >= `min_p`; each continuation is the edge's greedy decoding under the same rules,
    so the only difference between the two sentences is the swap and what the edge makes of it.
    `max_swaps` bounds the continuations (each is up to max_new_tokens edge forwards): the likeliest
    alternatives are kept (ties: the earlier position), then labelled in position order."""
    answer = [int(t) for t in answer]
    edge = ModelState(edge_model, "edge")
    first = edge.prefill(inputs)
    prompt = list(edge.ids)
    rules = DecodingRules.build(cfg, masks, len(prompt), eos_ids)
    rows = torch.cat([first[None], edge.advance(answer)]) if answer else first[None]  # row j predicts answer[j]
    base = outcome(answer)
    candidates: list[tuple[int, int, float]] = []  # (position, alternative, p), in position order
    for j, drafted in enumerate(answer):
        probs = torch.softmax(rules.process_ids(prompt + answer[:j], rows[j], warp=False), dim=-1)
        values, ids = torch.topk(probs, min(top + 1, probs.shape[-1]))
        for p, v in zip(values.tolist(), ids.tolist(), strict=True):
            if v == drafted or p < min_p or not math.isfinite(p):
                continue
            candidates.append((j, v, p))
    if max_swaps is not None and len(candidates) > max_swaps:
        kept = sorted(range(len(candidates)), key=lambda i: (-candidates[i][2], i))[:max_swaps]
        candidates = [candidates[i] for i in sorted(kept)]
    swaps: list[Swap] = []
    for j, v, p in candidates:
        tail = _continue(edge, rules, prompt, answer[:j] + [v], cfg.max_new_tokens)
        swaps.append(Swap(answer[j], v, p, outcome(answer[:j] + [v] + tail) != base))
    return swaps


def _continue(edge: ModelState, rules: DecodingRules, prompt: list[int], answer: list[int], max_new: int) -> list[int]:
    """The edge's greedy tokens after prompt + answer (its cache moved there first: cut back to the
    common prefix, then fed the rest), until a stop rule or `max_new` answer tokens."""
    sequence = prompt + answer
    common = len(prompt)
    for a, b in zip(edge.ids[len(prompt):], answer, strict=False):
        if a != b:
            break
        common += 1
    tail: list[int] = []
    if rules.stops(sequence):
        return tail
    edge.rollback(min(common, len(sequence) - 1))  # at least one token to feed: its row is the next one
    logits = edge.logits_after(sequence)
    while len(sequence) - len(prompt) < max_new:
        token = int(first_argmax(rules.process_ids(sequence, logits, warp=False)))
        sequence.append(token)
        tail.append(token)
        if rules.stops(sequence):
            break
        logits = edge.advance([token])[-1]
    return tail


def fit_weights(swaps: Sequence[Swap], prior: float = 1.0, iterations: int = 100) -> dict[int, float]:
    """Per-token meaning weights w in [0, 1] minimising

        Σ_swaps (changed − w[a]·w[v])²  +  prior · Σ_tokens (w[t] − 1)²

    by coordinate descent (each step the exact minimiser in one weight, clipped to [0, 1]), tokens
    in id order, from w = 1: deterministic. The prior is `prior` pseudo-swaps that changed the
    outcome, so a token seen once keeps a weight near the middle and an unseen one keeps 1.
    Hand-written: 40 lines of arithmetic, no library fits a clipped bilinear model."""
    pairs = [(s.drafted, s.alternative, 1.0 if s.changed else 0.0) for s in swaps if s.drafted != s.alternative]
    tokens = sorted({t for a, v, _ in pairs for t in (a, v)})
    w = dict.fromkeys(tokens, 1.0)
    touching: dict[int, list[tuple[int, float]]] = {t: [] for t in tokens}
    for a, v, y in pairs:
        touching[a].append((v, y))
        touching[v].append((a, y))
    for _ in range(iterations):
        moved = 0.0
        for t in tokens:
            num = prior + sum(y * w[o] for o, y in touching[t])
            den = prior + sum(w[o] * w[o] for o, _ in touching[t])
            new = min(max(num / den, 0.0), 1.0)
            moved = max(moved, abs(new - w[t]))
            w[t] = new
        if moved < 1e-9:
            break
    return {t: round(x, 4) for t, x in w.items()}


def gate_from_swaps(swaps: Sequence[Swap], cfg: DecodingConfig, tokenizer: str = "", prior: float = 1.0) -> MeaningGate:
    """The gate for `cfg`'s task: the fitted weights (those that differ from the default 1 only)."""
    weights = {t: x for t, x in fit_weights(swaps, prior).items() if x != 1.0}
    return MeaningGate(weights, 1.0, cfg.instruction or DEFAULT_INSTRUCTION, cfg.system or DEFAULT_SYSTEM, tokenizer)


def fit_gate(edge_model: torch.nn.Module, inputs: Sequence[Mapping[str, torch.Tensor]], answers: Sequence[Sequence[int]],
             cfg: DecodingConfig, masks: VocabMasks, eos_ids: list[int], decode: Callable[[list[int]], str],
             tokenizer: str = "", outcome: Callable[[str], Hashable] = text_outcome, top: int = 3,
             min_p: float = 0.02, prior: float = 1.0, max_swaps: int | None = None) -> tuple[MeaningGate, list[Swap]]:
    """The pair's meaning gate from its calibration clips: `inputs` (thinker inputs per clip) and
    `answers` (the edge-only run's token ids per clip, under `cfg`'s rules), `decode` (ids -> text,
    the tokenizer's decode), `outcome` (text -> what it says). Returns the gate and the swaps it was
    fitted on (for the record: how many, how many changed the outcome). `max_swaps`: per clip (see
    `swap_labels`)."""
    swaps: list[Swap] = []
    for clip_inputs, answer in zip(inputs, answers, strict=True):
        swaps += swap_labels(edge_model, clip_inputs, answer, cfg, masks, eos_ids,
                             lambda ids: outcome(decode(ids)), top, min_p, max_swaps)
    return gate_from_swaps(swaps, cfg, tokenizer, prior), swaps


def gate_grid(block_scores: Sequence[float], percentiles: Sequence[float]) -> list[float]:
    """Meaning-gate thresholds to sweep: 0, the percentiles of the blocks' meaning scores (on the
    edge-only path: `block_scores`), rounded to 3 significant digits, and inf."""
    import numpy as np

    values = {0.0, math.inf}
    if len(block_scores):
        for p in np.percentile(np.asarray(block_scores, dtype=float), list(percentiles)):
            values.add(float(f"{float(p):.3g}"))
    return sorted(values)


UPLOAD_PERCENTILES = (50, 60, 70, 80, 85, 90, 95)
VERIFY_PERCENTILES = (10, 25, 50, 75)


def sweep(base: DecodingConfig, k: int, scores: Sequence[float], upload_percentiles: Sequence[float] = UPLOAD_PERCENTILES,
          verify_percentiles: Sequence[float] = VERIFY_PERCENTILES) -> list[DecodingConfig]:
    """The meaning-gate settings to try for block length k: gate_upload from the upper percentiles
    of `scores` (the meaning scores of the blocks a never-escalating run drafts: verify="meaning",
    gate_upload = gate_verify = inf, read from its BlockEvent.score), gate_verify from the lower ones,
    0 and gate_upload itself (one threshold, as the entropy gate has), gate_verify <= gate_upload
    (verifying less once the cloud holds the clip than before would spend the upload and not use
    it). inf/inf (edge-only) is left out: calibrate runs edge-only."""
    never = base.with_(k=k, verify="meaning", gate_upload=math.inf, gate_verify=math.inf)
    uploads = [u for u in gate_grid(scores, upload_percentiles) if u > 0]
    verifies = gate_grid(scores, verify_percentiles)
    return [never.with_(gate_upload=up, gate_verify=ver) for up in uploads
            for ver in sorted({*verifies, up}) if ver <= up and not (math.isinf(up) and math.isinf(ver))]


def setting_name(cfg: DecodingConfig) -> str:
    """A meaning-gate setting's name in tables and reports: "k=6 up=0.485 ver=0.246"."""
    return f"k={cfg.k} up={cfg.gate_upload:g} ver={cfg.gate_verify:g}"


def sweep_named(base: DecodingConfig, k: int, scores: Sequence[float], **percentiles: Sequence[float]
                ) -> dict[str, DecodingConfig]:
    """`sweep`'s settings keyed by `setting_name`."""
    return {setting_name(cfg): cfg for cfg in sweep(base, k, scores, **percentiles)}


def block_scores(gate: MeaningGate, edge_probs: Sequence[torch.Tensor], answer: Sequence[int], k: int,
                 how: str = "sum") -> list[float]:
    """The meaning scores of the blocks of `answer` as an edge-only decode drafts them (blocks of k
    from the start), from the edge's processed distributions per position (`edge_probs[j]`: the
    row answer[j] was chosen from)."""
    per = [gate.score(edge_probs[j].numpy(), int(t)) for j, t in enumerate(answer)]
    return [aggregate(per[i:i + k], how) for i in range(0, len(per), k)]
