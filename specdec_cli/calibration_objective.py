"""Calibrate's objective with the cloud's cost counted per clip: the cheapest setting within N
points of cloud-only, where the cost is first the share of clips that go up at all, then cloud calls
per output token.

Why that order: a clip that goes up costs its upload (the whole clip, once), the cloud's prefill
(the prompt with the audio: 200-450 tokens on the demo pair) and a round trip; each further call on
a clip the cloud already holds costs one round trip and about k tokens. Calls per token alone (the
objective before) cannot see the difference between one verification on every clip and two on half
of them, though only the second keeps half the clips on the device. `max_call_rate` bounds the round
trips when a lower share of uploads would otherwise be bought with many more calls.

Pure functions over per-clip numbers, so the objective is tested on hand-computed tables and
calibrate (or a bench) feeds it whatever runs it made.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


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
    """What "cheapest" sorts by: the share of clips that go up, then calls per token, then (ties)
    the better quality first."""
    return (score.up_share, score.call_rate, -score.quality)


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
