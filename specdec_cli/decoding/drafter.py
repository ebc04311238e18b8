"""The edge's proposals: up to k tokens, their entropies, and (when sampling) the distributions
they were sampled from."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .processors import DecodingRules
from .state import ModelState


@dataclass
class Proposal:
    tokens: list[int]
    entropies: list[float]             # nats, of the edge's processed distribution at each token
    draft_probs: torch.Tensor | None   # [n, V] when sampling: exactly what each token was drawn from


def entropy(scores: torch.Tensor) -> float:
    """Entropy in nats of softmax(scores); banned (-inf) entries contribute 0."""
    logp = torch.log_softmax(scores, dim=-1)
    return float(-(logp.exp() * logp.nan_to_num(neginf=0.0)).sum())


def pick(scores: torch.Tensor, generator: torch.Generator | None) -> tuple[int, torch.Tensor | None]:
    """Greedy (generator None): argmax. Sampling: draw from softmax(scores), return those probs."""
    if generator is None:
        return int(scores.argmax()), None
    probs = torch.softmax(scores, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator)), probs


def propose(edge: ModelState, sequence: list[int], k: int, rules: DecodingRules,
            generator: torch.Generator | None) -> Proposal:
    """Draft up to k tokens after `sequence` (prompt + accepted answer). Each position is processed
    with its own prefix (sequence + draft so far), exactly as the cloud will judge it. Drafting stops
    early at a token that ends generation. The last draft token is not fed to the edge: it is
    consumed with the next block's catch-up, whatever the verdict."""
    tokens: list[int] = []
    entropies: list[float] = []
    probs: list[torch.Tensor] = []
    logits = edge.logits_after(sequence)  # [V]
    for i in range(k):
        context = torch.tensor([sequence + tokens])  # [1, L]
        scores = rules.process(context, logits)
        token, p = pick(scores, generator)
        tokens.append(token)
        entropies.append(entropy(scores))
        if p is not None:
            probs.append(p)
        if i == k - 1 or rules.stops(sequence + tokens):
            break
        logits = edge.advance([token])[-1]
    return Proposal(tokens, entropies, torch.stack(probs) if probs else None)
