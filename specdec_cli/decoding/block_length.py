"""Block length for a link: the k that gives the most accepted tokens per second, from the round
trip, the two models' per-token times and the acceptance (docs/pipelining.md, "Block length per
link").

The model is the standard one of speculative decoding (Leviathan et al. 2023, §3.3): each draft
token is accepted with probability `acceptance`, independently, so a verified block of k tokens
yields E(k) = (1 - a^(k+1)) / (1 - a) tokens (the accepted prefix plus the recovered or bonus
token), and costs k edge steps plus one wait on the cloud (the round trip and one cloud forward):

    k* = argmax over 1 <= k <= k_max of  E(k) / (k * t_edge + rtt + t_cloud)

With a slow link the wait dominates and k* grows like log(wait / t_edge) / log(1 / a): only
logarithmically in the delay, as the delay-adaptive speculation work (arXiv 2606.20591) finds;
below a critical wait one-token blocks are best (k* = 1 while rtt + t_cloud <= t_edge (1 + a - a^2) / a^2).
It is the blocking loop's cost: drafting ahead while a verdict is in flight (loop.py) hides edge
steps behind the wait, so the rule errs towards shorter blocks than a pipelined client could use.
Pure arithmetic, no torch.
"""

from __future__ import annotations

import math

K_MAX = 16                 # the longest block the rule proposes (wire.MAX_DRAFT is far above)
PRIOR_ACCEPTANCE = 0.6     # per-token acceptance assumed before any is measured


def expected_tokens(k: int, acceptance: float) -> float:
    """Tokens one verified block of k draft tokens yields on average: 1 + a + ... + a^k."""
    if acceptance >= 1.0:
        return float(k + 1)
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


def tokens_per_s(k: int, acceptance: float, rtt_s: float, edge_token_s: float, cloud_forward_s: float) -> float:
    return expected_tokens(k, acceptance) / (k * edge_token_s + rtt_s + cloud_forward_s)


def best_k(rtt_s: float, edge_token_s: float, cloud_forward_s: float = 0.0,
           acceptance: float = PRIOR_ACCEPTANCE, k_max: int = K_MAX) -> int:
    """The block length with the most tokens per second on this link (the smallest on a tie)."""
    for name, value in (("rtt_s", rtt_s), ("cloud_forward_s", cloud_forward_s)):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a non-negative number of seconds, got {value}")
    if not (math.isfinite(edge_token_s) and edge_token_s > 0):
        raise ValueError(f"edge_token_s must be a positive number of seconds, got {edge_token_s}")
    if not 0.0 <= acceptance <= 1.0:
        raise ValueError(f"acceptance must be in [0, 1], got {acceptance}")
    rates = [tokens_per_s(k, acceptance, rtt_s, edge_token_s, cloud_forward_s) for k in range(1, k_max + 1)]
    return 1 + max(range(len(rates)), key=lambda i: (rates[i], -i))
