"""Calibrate's objective with the cloud's cost counted per clip: the cheapest setting within N
points of cloud-only, where the cost counts the clips that go up at all, not only calls per token.

The cost (`cost_key`) is the cloud's work per clip in tokens (the record's cloud_work_tokens: the
prefill of every clip that goes up, the prompt with the audio, plus the tokens fed to verify), then
calls per output token. A clip that goes up costs its prefill (200-450 tokens on the demo pair,
about 750 audio tokens for 30 s on Qwen2.5-Omni) and its upload; a further call on a clip the cloud
already holds costs about k tokens and a round trip. Calls per token alone (the objective before)
cannot tell one verification on every clip from two on half of them, though only the second keeps
half the clips on the device. `share_first_key` orders by the share of clips that go up instead;
`call_rate_key` by calls per token (the entropy presets); `max_call_rate` bounds the round trips.

"Within N points" is judged by a lower confidence bound on each setting's mean per-clip quality
gap to cloud-only (`select`; `choose` is its short form), with three parts, because the plain rule
(the mean gap >= -N on the calibration clips) picked settings that lost 2-3 points on clips they
were not chosen on (the cheapest of ~150 settings on 48 clips: the winner's curse), and on 24
clips a setting that matched cloud-only on every clip had a standard error of 0 and no margin:

1. The bound for one setting, `gap_bound`: the mean gap less z standard errors, with Agresti and
   Min's "Wald+2" adjustment for paired data (one clip's worth of pseudo-clips: a half clip one
   attribute up, a half clip one attribute down, one clip unchanged), so that the margin never
   vanishes and grows as the set shrinks: at least z x (one attribute) / (n + 2), 0.64 z points
   on 24 clips, 0.33 z on 48, 0.09 z on 192.
2. The choice among many, `select`: the settings come in chains, each ordered from the safest (a
   block length's thresholds from 0 up) and tested in that order until the first one outside the
   budget (fixed-sequence testing: each test at the full level, no correction within a chain),
   the level split evenly over the chains (Bonferroni): z = Phi^-1(1 - (1 - Phi(margin)) / chains).
3. A check of the one proposal on clips that chose nothing (calibrate's check half): its chain,
   from the safest up to the proposal, tested in order at the plain margin (one chain, chosen on
   other clips: no correction); the cheapest that holds on both halves is chosen. None holds: the
   best quality among the chains' safest settings, flagged False.

`margin` 0 is the plain rule (no margin, no order, no check), kept for comparison.

Pure functions over per-clip numbers, so the objective is tested on hand-computed tables and
calibrate (or a bench) feeds it whatever runs it made.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from statistics import NormalDist
from typing import Any

from .phrases import ATTRIBUTES

# The pseudo-clips' size: one attribute of one clip (1/6 of a clip's quality), the smallest change
# the labels can see, used for every measure (agreement by phrases has the same step).
ONE_ATTRIBUTE = 100.0 / len(ATTRIBUTES)


def attribute_weights(labels: Sequence[Mapping[str, str]]) -> list[dict[str, Fraction]]:
    """Per clip, the weight of each attribute its labels give in its quality, so that the mean of the
    clips' qualities is the mean over attributes of each one's accuracy over the clips labelled for
    it: eval's mean accuracy (evaluate.summarize), also when the labels leave attributes out (the
    labeller, demo.measure, leaves out the ones it finds ambiguous). With n clips, n_a of them
    labelled for attribute a and m attributes labelled on some clip, a clip's weight for a is
    n / (m * n_a), so that the sum over clips of the weights of their right attributes, divided by
    n, is the sum over a of (right on a / n_a) / m. With every attribute labelled on every clip it
    is 1/6 each: a clip's quality is the share of its six it got right. Exact fractions, so that a
    quality is the same float as that share (k/6) and not a sum of rounded sixths. A clip with no
    label gets no weight (quality 0): keep such clips out (evaluate.labels_file does)."""
    n = len(labels)
    counts = {a: sum(1 for lab in labels if a in lab) for a in ATTRIBUTES}
    m = sum(1 for k in counts.values() if k)
    return [{a: Fraction(n, m * counts[a]) for a in ATTRIBUTES if a in lab} for lab in labels]


def weighted_quality(correct: Mapping[str, bool | None], weights: Mapping[str, Fraction]) -> float:
    """One clip's quality in [0, ...]: the weights (`attribute_weights`) of its labelled attributes
    it got right (above 1 only for a clip labelled for an attribute few clips are)."""
    return float(sum((w for a, w in weights.items() if correct.get(a)), Fraction(0)))


def attribute_unit(labels: Sequence[Mapping[str, str]]) -> float:
    """The smallest step one attribute of one clip makes in a clip's quality under
    `attribute_weights`, in points: the pseudo-clips' size (`gap_bound`'s `unit`). ONE_ATTRIBUTE when
    all six attributes are labelled on some clip and one of them on every clip (so always with
    complete labels); more when the labels leave attributes out (only three attributes labelled
    anywhere: a third of a clip each)."""
    n = len(labels)
    counts = [sum(1 for lab in labels if a in lab) for a in ATTRIBUTES]
    m = sum(1 for k in counts if k)
    if not m:
        return ONE_ATTRIBUTE
    return ONE_ATTRIBUTE * (len(ATTRIBUTES) / m) * (n / max(counts))


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


def call_rate_key(score: SettingScore) -> tuple[float, float]:
    """Cloud calls per output token, then the better quality (the entropy presets: every clip goes
    up, so work per clip tells them apart no better)."""
    return (score.call_rate, -score.quality)


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


@dataclass(frozen=True)
class GapBound:
    """One setting's per-clip quality gap to cloud-only on one set of clips, in points, and the
    lower confidence bound it is judged by (`gap_bound`)."""

    n: int              # clips
    mean: float         # the plain mean of the per-clip gaps
    adjusted: float     # Agresti-Min: the sum over n + 2 clips (the pseudo-clips' gaps cancel)
    se: float           # the adjusted mean's standard error (never 0)
    z: float            # standard errors of margin
    lower: float        # adjusted - z * se

    def within(self, points: float) -> bool:
        return self.lower >= -points - 1e-9


def gap_bound(clips: Sequence[ClipCost], reference: Sequence[ClipCost], z: float,
              unit: float = ONE_ATTRIBUTE) -> GapBound:
    """The lower confidence bound on the mean per-clip gap of `clips` to `reference` (the same
    clips under cloud-only), in points, at `z` standard errors.

    Agresti & Min, "Simple improved confidence intervals for comparing matched proportions",
    Statistics in Medicine 24 (2005) 729-740, the "Wald+2" interval: add half a pair to each cell
    of the paired 2 x 2 table, then take the Wald interval over n + 2. Here the per-clip gap is a
    share of attributes, not 0/1, so the pseudo-clips are half a clip at +`unit`, half at -`unit`
    and one at 0 (with 0/1 outcomes and unit 100 it is their interval exactly). It keeps a setting
    that matched cloud-only on every one of few clips from a standard error of 0: the error is
    then `unit` / (n + 2), and the margin grows as the set shrinks. Written here: no maintained
    library computes it for a mean of shares (statsmodels has it for 0/1 pairs only)."""
    if len(clips) != len(reference) or not clips:
        raise ValueError("the setting and the reference must score the same, non-empty, clips")
    gaps = [100.0 * (c.quality - r.quality) for c, r in zip(clips, reference, strict=True)]
    n = len(gaps)
    m = n + 2
    adjusted = sum(gaps) / m
    var = max((sum(g * g for g in gaps) + unit * unit) / m - adjusted * adjusted, 0.0)
    se = math.sqrt(var / m)
    return GapBound(n, sum(gaps) / n, adjusted, se, z, adjusted - z * se)


def family_z(margin: float, families: int) -> float:
    """The z each of `families` chains is tested at so that all of them together keep the level
    `margin` gives one test (one-sided, 1 - Phi(margin)): Bonferroni, the level split evenly.
    margin 1 (84 %): 1.41 for 2 chains, 1.75 for 4, 2.2 for 12."""
    if families <= 1 or margin <= 0:
        return margin
    normal = NormalDist()
    return normal.inv_cdf(1.0 - (1.0 - normal.cdf(margin)) / families)


def clips_to_show(points: float, z: float, unit: float = ONE_ATTRIBUTE) -> int:
    """The fewest clips on which a setting that matches cloud-only on every clip is shown within
    `points` at `z` standard errors (`gap_bound`: z * unit / (n + 2) <= points)."""
    if z <= 0:
        return 1
    return max(1, math.ceil(z * unit / points - 2 - 1e-9)) if points > 0 else math.inf  # type: ignore[return-value]


@dataclass(frozen=True)
class Selection:
    """What `select` found: the setting, whether it was shown within the budget, and every number
    it was judged by (calibrate's --report lists them)."""

    name: str                      # the setting chosen
    met: bool                      # shown within the budget (False: the fallback, see `select`)
    proposed: str | None           # the cheapest accepted on the calibration clips, before the check
    margin: float                  # z of one test (calibrate's --margin; 0: the plain rule)
    z: float                       # z on the calibration clips (`family_z` over the chains)
    chains: list[list[str]]        # the order tested in, safest first
    calibration: dict[str, GapBound]
    accepted: list[str]            # within the budget on the calibration clips, in the chains' order
    check: dict[str, GapBound] = field(default_factory=dict)  # every setting on the check clips (z = margin)
    confirmed: list[str] = field(default_factory=list)        # the proposal's chain that held on the check clips


def _in_order(chain: Sequence[str], bounds: Mapping[str, GapBound], points: float) -> list[str]:
    """Fixed-sequence testing: the chain's settings within `points`, from its head to the first that
    is not (Maurer, Hothorn & Lehmacher 1995; Hsu & Berger, JASA 94 (1999) 468-482, the stepwise
    way to the largest safe dose; Angelopoulos et al., "Learn then Test", 2021, for a threshold
    grid). Each test at the full level: a false acceptance needs the first setting outside the
    budget to pass its own test."""
    out = []
    for name in chain:
        if not bounds[name].within(points):
            break
        out.append(name)
    return out


def _chains(names: Sequence[str], chains: Sequence[Sequence[str]] | None) -> list[list[str]]:
    """`chains` checked against the candidates (each in exactly one); every candidate in none is
    a chain of its own (no order known: Bonferroni over all of them)."""
    known = set(names)
    out = [list(c) for c in (chains or ()) if c]
    seen = [n for c in out for n in c]
    if len(seen) != len(set(seen)) or not set(seen) <= known:
        raise ValueError("each chain lists candidates, and no candidate is in two chains")
    return out + [[n] for n in names if n not in set(seen)]


def select(candidates: Sequence[tuple[str, Sequence[ClipCost]]], reference: Sequence[ClipCost], points: float,
           z: float = 1.0, *, chains: Sequence[Sequence[str]] | None = None,
           check: tuple[Sequence[tuple[str, Sequence[ClipCost]]], Sequence[ClipCost]] | None = None,
           max_call_rate: float | None = None, key: Callable[[SettingScore], tuple] = cost_key,
           unit: float = ONE_ATTRIBUTE) -> Selection:
    """The cheapest candidate (by `key`, on the calibration clips; ties keep the earlier) shown
    within `points` of `reference` (cloud-only on the same clips) and at most `max_call_rate` calls
    per token, as the module doc says: each `chains` list (candidate names, safest first; a
    candidate in none is a chain of its own) tested in order at `family_z(z, chains)` standard
    errors (`gap_bound`, the margin for the set's size); then, with `check` (the candidates and
    cloud-only on other clips), the proposal's chain up to it tested in order on those at `z`.
    Nothing shown within: the best quality among the chains' heads (then the cheaper), met False.
    z = 0: the plain rule (the mean gap >= -points, every candidate alone, no check)."""
    if not candidates:
        raise ValueError("no candidates to choose from")
    names = [n for n, _ in candidates]
    order = _chains(names, chains)
    scores = {n: score_clips(c) for n, c in candidates}

    def affordable(n: str) -> bool:
        return max_call_rate is None or scores[n].call_rate <= max_call_rate + 1e-12

    def cheapest_of(pool: Sequence[str]) -> str | None:
        pool = [n for n in names if n in set(pool) and affordable(n)]  # candidates' order: ties keep the earlier
        return min(pool, key=lambda n: key(scores[n])) if pool else None

    plain = z <= 0
    z_cal = 0.0 if plain else family_z(z, len(order))
    bounds = {n: gap_bound(c, reference, z_cal, unit) for n, c in candidates}
    if plain:
        accepted = [n for n in names if bounds[n].mean >= -points - 1e-9]
    else:
        accepted = [n for chain in order for n in _in_order(chain, bounds, points)]
    proposed = cheapest_of(accepted)
    chosen, on_check, confirmed = proposed, {}, []
    if check is not None and not plain:
        others, reference_check = check
        on_check = {n: gap_bound(c, reference_check, z, unit) for n, c in others}
        if proposed is not None:
            chain = next(c for c in order if proposed in c)
            confirmed = _in_order(chain[:chain.index(proposed) + 1], on_check, points)
            chosen = cheapest_of(confirmed)
    if chosen is not None:
        return Selection(chosen, True, proposed, z, z_cal, order, bounds, accepted, on_check, confirmed)
    heads = [c[0] for c in order]
    best = min((n for n in names if n in set(heads)), key=lambda n: (-scores[n].quality, key(scores[n])))
    return Selection(best, False, proposed, z, z_cal, order, bounds, accepted, on_check, confirmed)


def choose(candidates: Sequence[tuple[str, Sequence[ClipCost]]], reference: Sequence[ClipCost], points: float,
           z: float = 1.0, max_call_rate: float | None = None,
           key: Callable[[SettingScore], tuple] = cost_key, **rule: Any) -> tuple[str, SettingScore, bool]:
    """`select`'s choice as (name, its score on the calibration clips, shown within the budget);
    `rule`: select's `chains`, `check` and `unit`. `candidates`: (name, per-clip costs) pairs, each
    over the reference's clips."""
    picked = select(candidates, reference, points, z, max_call_rate=max_call_rate, key=key, **rule)
    return picked.name, score_clips(dict(candidates)[picked.name]), picked.met


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
