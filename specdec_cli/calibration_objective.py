"""Calibrate's objective with the cloud's cost counted per clip: the cheapest setting within N
points of cloud-only, where the cost counts the clips that go up at all, not only calls per token.

The cost (`cost_key`) is the cloud's work per clip in tokens (the record's cloud_work_tokens: the
prefill of every clip that goes up, the prompt with the audio, plus the tokens fed to verify), then
calls per output token. A clip that goes up costs its prefill (200-450 tokens on the demo pair,
about 750 audio tokens for 30 s on Qwen2.5-Omni) and its upload; a further call on a clip the cloud
already holds costs about k tokens and a round trip. Calls per token alone (the objective before)
cannot tell one verification on every clip from two on half of them, though only the second keeps
half the clips on the device. `share_first_key` orders by the share of clips that go up instead;
`max_call_rate` bounds the round trips.

"Within N points" is judged with a margin for the calibration set's size: a setting qualifies
when the mean of its per-clip quality gaps to cloud-only, less `z` standard errors of that mean,
is at least -N (z = 0: the plain rule). Measured on the demo pair (bench/gate.py, 48 clips to
calibrate, 48 to measure): the plain rule's choices, picked as the cheapest of ~150 settings on 48
clips, lost 2-3 points on clips they were not chosen on; a setting that changes many clips' answers
has a wide standard error and needs a larger mean to qualify.

Pure functions over per-clip numbers, so the objective is tested on hand-computed tables and
calibrate (or a bench) feeds it whatever runs it made.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ClipCost:
    """One clip under one setting: its quality (0..1), output tokens, cloud calls after the prompt,
    every cloud forward (the prefill included: 0 = the clip never reached the cloud), and the
    cloud's work in tokens (prefill + tokens fed; the record's cloud_work_tokens)."""

    quality: float
    tokens: int
    calls: int
    cloud_forwards: int
    cloud_work_tokens: int = 0
    upload_bytes: int = 0      # what went up for the clip (its audio once, when it went up at all)


def clip_cost(stats: Any, quality: float, upload_bytes: int = 0) -> ClipCost:
    """One clip's ClipCost from its decoding's stats (decoding.DecodeStats: tokens, cloud_calls,
    cloud_work_forwards, cloud_work_tokens) and its quality; `upload_bytes` counts only when the
    clip reached the cloud."""
    return ClipCost(quality, stats.tokens, stats.cloud_calls, stats.cloud_work_forwards, stats.cloud_work_tokens,
                    upload_bytes if stats.cloud_work_forwards else 0)


@dataclass(frozen=True)
class SettingScore:
    """A setting over a set of clips."""

    quality: float           # points, 0-100 (mean clip quality)
    call_rate: float         # cloud calls per output token, pooled over the clips
    up_share: float          # share of clips with any cloud work (1 - zero-cloud share)
    work_per_clip: float     # cloud work tokens per clip (prefill + fed)
    bytes_per_clip: float    # bytes up per clip

    @property
    def zero_cloud_share(self) -> float:
        return 1.0 - self.up_share


def score_clips(clips: Sequence[ClipCost]) -> SettingScore:
    """Pool one setting's clips into its score (empty: all zeros)."""
    n = len(clips)
    if not n:
        return SettingScore(0.0, 0.0, 0.0, 0.0, 0.0)
    tokens = sum(c.tokens for c in clips)
    return SettingScore(
        quality=100.0 * sum(c.quality for c in clips) / n,
        call_rate=sum(c.calls for c in clips) / tokens if tokens else 0.0,
        up_share=sum(c.cloud_forwards > 0 for c in clips) / n,
        work_per_clip=sum(c.cloud_work_tokens for c in clips) / n,
        bytes_per_clip=sum(c.upload_bytes for c in clips) / n,
    )


def cost_key(score: SettingScore) -> tuple[float, float, float]:
    """What "cheapest" sorts by: the cloud's work per clip (a clip that goes up pays its prefill),
    then calls per token, then (ties) the better quality first."""
    return (score.work_per_clip, score.call_rate, -score.quality)


def share_first_key(score: SettingScore) -> tuple[float, float, float]:
    """The share of clips that go up, then calls per token, then the better quality."""
    return (score.up_share, score.call_rate, -score.quality)


def quality_gap(clips: Sequence[ClipCost], reference: Sequence[ClipCost]) -> tuple[float, float]:
    """The mean per-clip quality gap of `clips` to `reference` (the same clips under cloud-only),
    in points, and the standard error of that mean (sample standard deviation / sqrt(n); 0 for one
    clip)."""
    if len(clips) != len(reference) or not clips:
        raise ValueError("the setting and the reference must score the same, non-empty, clips")
    gaps = [100.0 * (c.quality - r.quality) for c, r in zip(clips, reference, strict=True)]
    n = len(gaps)
    mean = sum(gaps) / n
    if n < 2:
        return mean, 0.0
    var = sum((g - mean) ** 2 for g in gaps) / (n - 1)
    return mean, math.sqrt(var / n)


def choose(candidates: Sequence[tuple[str, Sequence[ClipCost]]], reference: Sequence[ClipCost], points: float,
           z: float = 1.0, max_call_rate: float | None = None,
           key: Callable[[SettingScore], tuple] = cost_key) -> tuple[str, SettingScore, bool]:
    """The cheapest candidate (by `key`) whose quality gap to `reference` (cloud-only on the same
    clips) is at least -`points` with `z` standard errors of margin (and whose call rate is at most
    `max_call_rate`); ties keep the earlier candidate. None qualifies: the best quality, flagged False.
    `candidates`: (name, per-clip costs) pairs, each over the reference's clips."""
    if not candidates:
        raise ValueError("no candidates to choose from")
    scored = [(name, score_clips(clips), quality_gap(clips, reference)) for name, clips in candidates]
    fits = [(n, s) for n, s, (mean, se) in scored
            if mean - z * se >= -points - 1e-9 and (max_call_rate is None or s.call_rate <= max_call_rate + 1e-12)]
    if fits:
        name, score = min(fits, key=lambda ns: key(ns[1]))
        return name, score, True
    name, score, _ = min(scored, key=lambda nsg: (-nsg[1].quality, key(nsg[1])))
    return name, score, False


def cheapest(candidates: Sequence[tuple[str, SettingScore]], target: float, max_call_rate: float | None = None,
             key: Callable[[SettingScore], tuple] = cost_key) -> tuple[str, SettingScore, bool]:
    """The cheapest candidate (by `key`) whose quality reaches `target` points (and whose call rate
    is at most `max_call_rate`, when given); ties keep the earlier candidate. When none qualifies:
    the best quality (then the cheaper), flagged False. `candidates`: (name, score) pairs."""
    if not candidates:
        raise ValueError("no candidates to choose from")
    fits = [(n, s) for n, s in candidates
            if s.quality >= target - 1e-9 and (max_call_rate is None or s.call_rate <= max_call_rate + 1e-12)]
    if fits:
        name, score = min(fits, key=lambda ns: key(ns[1]))
        return name, score, True
    name, score = min(candidates, key=lambda ns: (-ns[1].quality, key(ns[1])))
    return name, score, False
