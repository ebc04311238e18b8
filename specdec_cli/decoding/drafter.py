"""The edge's proposals: up to k tokens, their entropies, and (when sampling) the distributions
they were sampled from."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .acceptance import draw
from .gate import MeaningGate
from .processors import DecodingRules
from .state import ModelState


@dataclass
class Proposal:
    tokens: list[int]
    entropies: list[float]             # nats, of the edge's processed distribution at each token
    draft_probs: torch.Tensor | None   # [n, V] when sampling: exactly what each token was drawn from
    loop: bool = False                 # a draft token completes a tandem repeat (rules.shows_loop)
    meaning: list[float] | None = None  # per draft token, the meaning gate's m_j (gate.py); None: no gate


def entropy(scores: torch.Tensor) -> float:
    """Entropy in nats of softmax(scores); banned (-inf) entries contribute 0. The plain formula,
    kept as the reference `pick` is checked against."""
    logp = torch.log_softmax(scores, dim=-1)
    return float(-(logp.exp() * logp.nan_to_num(neginf=0.0)).sum())


def pick(scores: torch.Tensor, generator: torch.Generator | None,
         banned: Sequence[np.ndarray] | np.ndarray = (), raw: torch.Tensor | None = None,
         changed: np.ndarray | None = None, keep: bool = False) -> tuple[int, float, torch.Tensor | None]:
    """The token (greedy when `generator` is None: argmax; else drawn from softmax(scores)), the
    entropy of softmax(scores) in nats, and the probabilities when sampling (or when `keep`: the
    meaning gate reads them, at no extra softmax).

    One softmax per row serves both: H = lse - Σ p·x, with lse = x[a] - log p[a] at the argmax a.
    At 152k rows that is one pass less than log_softmax + exp, and numpy's argmax / dot are ~10x
    faster than torch's on a 1-D CPU row. The banned (-inf) entries have p = 0, but 0 · -inf is nan
    in the dot. With `raw` (the logits the scores were processed from) and `changed` (the ids where
    the processing did more than ban: the repetition penalty's), Σ p·x is taken as Σ p·raw plus
    the correction at `changed`, with no write to the row (at 152k, zeroing and restoring ~20k
    banned entries costs about a third of the pick). Otherwise `banned` holds arrays of the -inf
    entries: they are zeroed for the dot and restored. Any other -inf falls back to the reference
    formula."""
    if isinstance(banned, np.ndarray):
        banned = (banned,)
    probs = torch.softmax(scores, dim=-1)
    x, p = scores.numpy(), probs.numpy()
    best = int(x.argmax())
    if generator is None:
        token = best
    else:
        token = draw(probs, generator)
    if raw is not None and changed is not None:
        r = raw.numpy()
        mean = float(np.dot(p, r))  # p = 0 exactly where banned, and raw is finite there
        if changed.size:
            pc = p[changed]
            live = pc > 0  # a banned id can be in the penalty's history: x = -inf, p = 0
            mean += float(np.dot(pc[live], (x[changed] - r[changed])[live]))
    else:
        for ids in banned:
            x[ids] = 0.0
        mean = float(np.dot(p, x))
        for ids in banned:
            x[ids] = -np.inf  # they were -inf: restored without a copy
    h = float(x[best]) - math.log(float(p[best])) - mean
    if not math.isfinite(h):
        h = entropy(scores)
    return token, max(h, 0.0), (probs if generator is not None or keep else None)


class Drafting:
    """One row's draft in progress, fed one edge logits row at a time: `step(logits)` picks the
    next token and says which token the edge must consume before the next step (None: the draft
    is complete). `propose` drives it for one ModelState; the batched loop drives one per row, the
    edge's forwards shared (batch_loop.py). With a `gate` (the meaning gate, gate.py), each position's
    meaning score is read from the same distribution as its entropy."""

    def __init__(self, sequence: list[int], k: int, rules: DecodingRules, generator: torch.Generator | None,
                 gate: MeaningGate | None = None) -> None:
        self.sequence, self.k, self.rules, self.generator = sequence, k, rules, generator
        self.gate = gate
        self.tokens: list[int] = []
        self.entropies: list[float] = []
        self.meaning: list[float] | None = [] if gate is not None else None
        self.probs: list[torch.Tensor] = []

    def step(self, logits: torch.Tensor) -> int | None:
        """Pick the token after sequence + draft from the edge's `logits` (V,). Each position is
        processed with its own prefix, exactly as the cloud will judge it. Returns the token to
        feed the edge for the next step, or None when the draft stops here (k tokens, or a token
        that ends generation): the last draft token is not fed, it is consumed with the next
        block's catch-up, whatever the verdict."""
        rules, context = self.rules, self.sequence + self.tokens
        # The gate's entropy is that of the rules' distribution *before* HF's warpers: it measures
        # the edge's uncertainty, not the sampling knobs (top-k 1 would read 0 nats and never
        # escalate; thresholds calibrated at temperature 1 keep their meaning). A greedy choice is
        # the same either way (the warpers keep the argmax); a sample is drawn from the warped row,
        # the one the cloud's rows are warped like, so rejection sampling stays exact.
        scores = rules.process_ids(context, logits, warp=False)
        width = scores.shape[-1]
        changed = rules.changed_ids(context, width, warp=False)
        warped = self.generator is not None and rules.warps
        gate_on = self.gate is not None
        token, h, p = pick(scores, None if warped else self.generator,
                           () if changed is not None else rules.banned_parts(context, width),
                           raw=logits if changed is not None else None, changed=changed,
                           keep=gate_on)
        gate_p = p  # the rules' distribution, before the warpers: what the meaning gate reads, as the entropy
        if warped:
            p = torch.softmax(rules.warp(context, scores), dim=-1)
            token = draw(p, self.generator)
        self.tokens.append(token)
        self.entropies.append(h)
        if self.gate is not None and self.meaning is not None and gate_p is not None:
            self.meaning.append(self.gate.score(gate_p.numpy(), token))
        if p is not None and self.generator is not None:
            self.probs.append(p)
        if len(self.tokens) == self.k or rules.stops(self.sequence + self.tokens):
            return None
        return token

    def proposal(self) -> Proposal:
        loop = self.rules.shows_loop(self.sequence + self.tokens, len(self.sequence))
        return Proposal(self.tokens, self.entropies, torch.stack(self.probs) if self.probs else None, loop,
                        self.meaning)


def propose(edge: ModelState, sequence: list[int], k: int, rules: DecodingRules,
            generator: torch.Generator | None, gate: MeaningGate | None = None) -> Proposal:
    """Draft up to k tokens after `sequence` (prompt + accepted answer), one edge forward per
    token after the first (see Drafting)."""
    drafting = Drafting(sequence, k, rules, generator, gate)
    feed = drafting.step(edge.logits_after(sequence))  # [V]
    while feed is not None:
        feed = drafting.step(edge.advance([feed])[-1])
    return drafting.proposal()
