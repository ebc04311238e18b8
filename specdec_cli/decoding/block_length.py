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


# -- depth: verifications one clip keeps in flight (issue 43, protocol 3) ---------------------------

# The most a clip may have in flight: the server queues sessions.MAX_QUEUED (4) verifications of one
# session behind the one it runs; more would be refused as session_busy.
MAX_DEPTH = 4
# A block sent ahead is used only when the block before it came back clean: its k drafts all kept
# and the cloud's bonus the edge's guess. Below CLEAN_MIN of the verified blocks clean, sending
# ahead mostly buys refusals (a request each, no forward) and `auto` keeps one verdict in flight.
CLEAN_MIN = 0.3
# Below this round trip (a loopback, a LAN) there is next to nothing to hide, and the requests a
# refused block spends cost about as much: `auto` keeps one verdict in flight.
MIN_WAIT_S = 0.010


# --depth with a remote cloud when none is given (issue 52: `auto` becomes the default only where
# bench/link.py shows it no slower than depth 1 at +0 ms and faster at +50 ms; docs/pipelining.md).
REMOTE_DEPTH: int | str = 1


def parse_depth(value: object) -> int | str:
    """`--depth` as given: an integer 1..MAX_DEPTH, or "auto"; InputError (one line) otherwise."""
    from ..errors import InputError

    if isinstance(value, str):
        text = value.strip().lower()
        if text == "auto":
            return "auto"
        if text.isdigit() and 1 <= int(text) <= MAX_DEPTH:
            return int(text)
    elif isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_DEPTH:
        return value
    raise InputError(f"--depth {value} is not a choice; give an integer 1 to {MAX_DEPTH} or auto")


def clean_block(k: int, acceptance: float) -> float:
    """The probability that a block of k drafts comes back as the edge assumed when it drafted the
    next one, were each draft kept independently with probability a: every draft kept and the
    bonus token the edge's own guess, a^(k+1)."""
    return acceptance ** (k + 1)


def best_depth(wait_s: float, edge_token_s: float, k: int, acceptance: float = PRIOR_ACCEPTANCE,
               clean: float | None = None, max_depth: int = MAX_DEPTH, clean_min: float = CLEAN_MIN,
               min_wait_s: float = MIN_WAIT_S) -> int:
    """`--depth auto`: verifications in flight for this link. While one verdict is out (`wait_s`:
    the round trip plus the cloud's forward) the edge drafts wait / (k t_edge) more blocks; sending
    each as it is drafted, before the verdict it assumes, hides a round trip per clean block:
    D = 1 + ceil(wait / (k t_edge)), at most `max_depth`. D = 1 when a block is seldom clean
    (`clean`: the share of recent verified blocks whose whole draft was kept; not measured yet,
    a^(k+1)) or the wait is below `min_wait_s`."""
    if not (math.isfinite(wait_s) and wait_s >= 0):
        raise ValueError(f"wait_s must be a non-negative number of seconds, got {wait_s}")
    if not (math.isfinite(edge_token_s) and edge_token_s > 0):
        raise ValueError(f"edge_token_s must be a positive number of seconds, got {edge_token_s}")
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if not 0.0 <= acceptance <= 1.0:
        raise ValueError(f"acceptance must be in [0, 1], got {acceptance}")
    if clean is not None and not 0.0 <= clean <= 1.0:
        raise ValueError(f"clean must be in [0, 1], got {clean}")
    if (clean_block(k, acceptance) if clean is None else clean) < clean_min or wait_s < min_wait_s:
        return 1
    return min(max_depth, 1 + math.ceil(wait_s / (k * edge_token_s)))
