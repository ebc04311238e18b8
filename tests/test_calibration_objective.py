"""Calibrate's rule for "within N points of cloud-only" (calibration_objective.select, issue 41 item
5): a lower confidence bound on the per-clip gap with a margin that grows as the set shrinks
(Agresti-Min's Wald+2), a correction for choosing the cheapest of many settings (fixed-sequence
testing along each chain, Bonferroni across chains), and a check of the proposal on other clips.
Every expected number below is worked by hand in the test's docstring, or taken from the published
formula or a normal table."""

from __future__ import annotations

import math

import pytest

from specdec_cli.calibration_objective import (
    ONE_ATTRIBUTE,
    ClipCost,
    call_rate_key,
    choose,
    clips_to_show,
    family_z,
    gap_bound,
    select,
)

A = 100.0 / 6  # one attribute of one clip, in points
RIGHT = 1.0
ONE_OFF = 5 / 6  # one of six attributes wrong


def _clips(qualities: list[float], calls: int) -> list[ClipCost]:
    """Clips of 10 tokens each with `calls` cloud calls: the call rate is calls / 10."""
    return [ClipCost(q, 10, calls, 1, 100 + calls) for q in qualities]


def _setting(n: int, losses: int, calls: int) -> list[ClipCost]:
    """n clips, one attribute lost on the first `losses` (cloud-only is right on every one)."""
    return _clips([ONE_OFF] * losses + [RIGHT] * (n - losses), calls)


def test_gap_bound_is_agresti_and_mins_wald_plus_2():
    """With 0/1 outcomes and unit 100 the bound is Agresti and Min's adjusted Wald interval for
    matched pairs (their published R code, diffpropci: diff = (c - b) / (n + 2), sd = sqrt((b + c +
    1) - (c - b)^2 / (n + 2)) / (n + 2)). 30 pairs, b = 5 where only cloud-only is right, c = 2
    where only the setting is: diff = -3/32, sd = sqrt(8 - 9/32)/32."""
    reference = _clips([1.0] * 5 + [0.0] * 2 + [1.0] * 10 + [0.0] * 13, 1)
    setting = _clips([0.0] * 5 + [1.0] * 2 + [1.0] * 10 + [0.0] * 13, 1)
    b = gap_bound(setting, reference, z=1.96, unit=100.0)
    assert b.n == 30 and b.mean == pytest.approx(-300 / 30)
    assert b.adjusted == pytest.approx(100 * -3 / 32)
    assert b.se == pytest.approx(100 * math.sqrt(8 - 9 / 32) / 32)
    assert b.lower == pytest.approx(b.adjusted - 1.96 * b.se)


def test_a_setting_that_matched_on_every_clip_still_keeps_a_margin():
    """The standard error no longer collapses to 0 on a lucky set (the plain sample error did): 24
    clips with no difference: the pseudo-clips give var = A^2 / 26, se = A / 26 = 0.641 points.
    One attribute lost on one of the 24: adjusted mean -A/26 = -0.641, var = 2 A^2 / 26 - (A/26)^2
    = 20.957, se = sqrt(20.957 / 26) = 0.898."""
    same = gap_bound(_setting(24, 0, 1), _setting(24, 0, 9), z=1.0)
    assert same.mean == 0.0 and same.se == pytest.approx(A / 26) == pytest.approx(0.641, abs=1e-3)
    assert same.lower == pytest.approx(-0.641, abs=1e-3)
    one = gap_bound(_setting(24, 1, 1), _setting(24, 0, 9), z=2.0)
    assert one.adjusted == pytest.approx(-0.641, abs=1e-3)
    assert one.se == pytest.approx(0.898, abs=1e-3)
    assert one.lower == pytest.approx(-0.641 - 2 * 0.898, abs=2e-3)


def test_the_margin_grows_as_the_set_shrinks():
    """The same setting, one attribute lost on one clip in twelve, on 48 and on 192 clips. 48:
    adjusted -4A/50 = -1.333, var = 5 A^2/50 - 1.333^2 = 26.0, se = 0.721. 192: adjusted -16A/194
    = -1.375, var = 17 A^2 / 194 - 1.375^2 = 22.45, se = 0.340: about half (1 / sqrt(4)). With no
    difference at all: A/50 = 0.333 against A/194 = 0.086."""
    small = gap_bound(_setting(48, 4, 1), _setting(48, 0, 9), z=1.0)
    large = gap_bound(_setting(192, 16, 1), _setting(192, 0, 9), z=1.0)
    assert small.se == pytest.approx(0.721, abs=1e-3) and large.se == pytest.approx(0.340, abs=1e-3)
    assert small.adjusted - small.lower > large.adjusted - large.lower
    clean48 = gap_bound(_setting(48, 0, 1), _setting(48, 0, 9), z=1.0)
    clean192 = gap_bound(_setting(192, 0, 1), _setting(192, 0, 9), z=1.0)
    assert clean48.se == pytest.approx(0.333, abs=1e-3) and clean192.se == pytest.approx(0.086, abs=1e-3)


def test_the_z_grows_with_the_chains_bonferroni():
    """Normal table: one test at 90 % (z 1.2816) split over 2 chains is 95 % each (z 1.6449); 95 %
    over 5 chains is 99 % each (2.3263). One chain: the margin itself."""
    assert family_z(1.0, 1) == 1.0
    assert family_z(1.2815516, 2) == pytest.approx(1.6449, abs=1e-4)
    assert family_z(1.6448536, 5) == pytest.approx(2.3263, abs=1e-4)
    assert family_z(1.0, 2) < family_z(1.0, 4) < family_z(1.0, 12)
    assert family_z(0.0, 12) == 0.0


def test_a_setting_within_only_by_noise_is_refused_and_one_truly_within_is_accepted():
    """48 clips; cloud-only right on all. One block length's thresholds, safest first: t0 verifies
    every block (matches cloud-only on every clip), t0.5 loses one attribute on 4 clips (mean -1.39:
    outside 1 point by any rule), t1 loses one on 1 clip (mean -0.35) and is the cheapest. t1 sends
    fewer blocks up than t0.5, so it is no better: it looks within only by the luck of these 48
    clips. The plain rule (z = 0) takes it. So did the sample-error rule (se 0.347, bound -0.69);
    now, with no order given (3 chains of one, z = 1.6175), its bound is -0.333 - 1.6175 x 0.469 =
    -1.09: refused, t0 (bound -0.54) chosen. With the order given, t0.5 stops the chain before t1.
    A chain where the middle threshold loses on one clip only (bound -0.80 at z = 1): t1 is truly
    within, and is chosen."""
    reference = _setting(48, 0, 9)
    t0, t05, t1 = _setting(48, 0, 5), _setting(48, 4, 3), _setting(48, 1, 1)
    candidates = [("t0", t0), ("t0.5", t05), ("t1", t1)]
    assert choose(candidates, reference, 1.0, z=0.0, key=call_rate_key)[::2] == ("t1", True)
    assert choose(candidates, reference, 1.0, key=call_rate_key)[::2] == ("t0", True)
    ordered = select(candidates, reference, 1.0, chains=[["t0", "t0.5", "t1"]], key=call_rate_key)
    assert (ordered.name, ordered.met, ordered.accepted, ordered.z) == ("t0", True, ["t0"], 1.0)
    assert ordered.calibration["t1"].lower == pytest.approx(-0.333 - 0.469, abs=2e-3)  # within alone
    truly = [("t0", t0), ("t0.5", _setting(48, 1, 3)), ("t1", t1)]
    picked = select(truly, reference, 1.0, chains=[["t0", "t0.5", "t1"]], key=call_rate_key)
    assert (picked.name, picked.met, picked.accepted) == ("t1", True, ["t0", "t0.5", "t1"])


def test_the_check_clips_confirm_the_proposal_or_step_back_along_its_chain():
    """Calibration: every threshold of the chain matches cloud-only on 48 clips: t1, the cheapest,
    is proposed. Check (48 other clips, z = 1): t0 holds, t0.5 loses one attribute on 4 clips
    (bound -1.33 - 0.72: out), so the chain stops there and t0 is chosen; t1 is never tested.
    With 6 check clips not even a perfect match is shown within 1 point (se = A/8 = 2.08): nothing
    confirmed, the best quality of the chain heads (t0), flagged. The plain rule ignores the check."""
    cal = [(n, _setting(48, 0, c)) for n, c in (("t0", 5), ("t0.5", 3), ("t1", 1))]
    chk = [("t0", _setting(48, 0, 5)), ("t0.5", _setting(48, 4, 3)), ("t1", _setting(48, 0, 1))]
    chain = [["t0", "t0.5", "t1"]]
    sel = select(cal, _setting(48, 0, 9), 1.0, chains=chain, check=(chk, _setting(48, 0, 9)), key=call_rate_key)
    assert (sel.proposed, sel.confirmed, sel.name, sel.met) == ("t1", ["t0"], "t0", True)
    assert sel.check["t0.5"].z == 1.0 and not sel.check["t0.5"].within(1.0)
    few = [(n, _setting(6, 0, c)) for n, c in (("t0", 5), ("t0.5", 3), ("t1", 1))]
    sel = select(cal, _setting(48, 0, 9), 1.0, chains=chain, check=(few, _setting(6, 0, 9)), key=call_rate_key)
    assert (sel.proposed, sel.confirmed, sel.name, sel.met) == ("t1", [], "t0", False)
    plain = select(cal, _setting(48, 0, 9), 1.0, z=0.0, chains=chain, check=(chk, _setting(48, 0, 9)),
                   key=call_rate_key)
    assert (plain.name, plain.met, plain.check) == ("t1", True, {})


def test_nothing_shown_within_falls_back_to_the_best_chain_head():
    """12 clips can show no setting within 1 point (se >= A/14 = 1.19): each chain's safest
    setting is a candidate for the fallback, the one with the best quality (then the cheaper)."""
    reference = _setting(12, 0, 9)
    cands = [("k4 t0", _setting(12, 0, 6)), ("k4 t1", _setting(12, 0, 2)),
             ("k6 t0", _setting(12, 0, 4)), ("k6 t1", _setting(12, 2, 1))]
    sel = select(cands, reference, 1.0, chains=[["k4 t0", "k4 t1"], ["k6 t0", "k6 t1"]], key=call_rate_key)
    assert (sel.name, sel.met, sel.accepted, sel.proposed) == ("k6 t0", False, [], None)


def test_clips_to_show_is_where_a_perfect_match_first_fits():
    """z A / (n + 2) <= points: 15 clips at z = 1 within 1 point (A/17 = 0.98), not 14 (A/16 = 1.04)."""
    assert clips_to_show(1.0, 1.0) == 15 and ONE_ATTRIBUTE == pytest.approx(A)
    for n, fits in ((14, False), (15, True)):
        assert gap_bound(_setting(n, 0, 1), _setting(n, 0, 9), z=1.0).within(1.0) is fits
    z4 = family_z(1.0, 4)  # 1.7546: 3 points need z4 A / (n + 2) <= 3, n >= 7.75
    assert clips_to_show(3.0, z4) == 8
    assert gap_bound(_setting(8, 0, 1), _setting(8, 0, 9), z=z4).within(3.0)
    assert not gap_bound(_setting(7, 0, 1), _setting(7, 0, 9), z=z4).within(3.0)


def test_chains_must_name_candidates_once():
    cands = [("a", _setting(4, 0, 1)), ("b", _setting(4, 0, 1))]
    for bad in ([["a", "a"]], [["a"], ["a", "b"]], [["c"]]):
        with pytest.raises(ValueError):
            select(cands, _setting(4, 0, 9), 1.0, chains=bad)


# -- labels that leave attributes out (issue 51, item 3) -------------------------------------------

FULL = {"gender": "女声", "rate": "语速较快", "pitch": "音调偏高", "volume": "音量适中", "pauses": "停顿较少",
        "emotion": "情绪激动"}


def _without(*attrs: str) -> dict[str, str]:
    return {a: v for a, v in FULL.items() if a not in attrs}


def test_weights_make_the_mean_clip_quality_the_mean_per_attribute_accuracy():
    """Three clips: A labels all six, B leaves volume out (ambiguous), C leaves gender, pitch and
    emotion out (no declared gender). Per attribute, clips labelled: gender 2 (A, B), rate 3, pitch
    2, volume 2 (A, C), pauses 3, emotion 2; m = 6 attributes. Weight n / (m n_a): 3/12 = 1/4 for
    the attributes on two clips, 3/18 = 1/6 for rate and pauses.
    Right: A all six; B gender wrong, the other four right; C rate wrong, volume and pauses right.
    Per attribute: gender 1/2, rate 2/3, pitch 2/2, volume 2/2, pauses 3/3, emotion 2/2; their
    mean (1/2 + 2/3 + 4) / 6 = 31/36. Clip qualities: A 4/4 + 2/6 = 4/3; B 1/6 + 1/4 + 1/6 + 1/4
    (rate, pitch, pauses, emotion) = 5/6; C 1/4 + 1/6 (volume, pauses) = 5/12. Mean (16 + 10 + 5)
    / 36 = 31/36."""
    from fractions import Fraction

    from specdec_cli.calibration_objective import attribute_weights, weighted_quality

    labels = [FULL, _without("volume"), _without("gender", "pitch", "emotion")]
    weights = attribute_weights(labels)
    quarter, sixth = Fraction(1, 4), Fraction(1, 6)
    assert weights[0] == {"gender": quarter, "rate": sixth, "pitch": quarter, "volume": quarter, "pauses": sixth,
                          "emotion": quarter}
    assert weights[1] == {"gender": quarter, "rate": sixth, "pitch": quarter, "pauses": sixth, "emotion": quarter}
    assert weights[2] == {"rate": sixth, "volume": quarter, "pauses": sixth}
    right = [dict.fromkeys(FULL, True),
             {"gender": False, "rate": True, "pitch": True, "volume": None, "pauses": True, "emotion": True},
             {"gender": None, "rate": False, "pitch": None, "volume": True, "pauses": True, "emotion": None}]
    qualities = [weighted_quality(c, w) for c, w in zip(right, weights, strict=True)]
    assert qualities == pytest.approx([4 / 3, 5 / 6, 5 / 12])
    assert sum(qualities) / 3 == pytest.approx(31 / 36)


def test_with_every_attribute_labelled_a_clip_is_the_share_it_got_right_exactly():
    """k of six right is k/6 as a float, as before partial labels (not a sum of rounded sixths:
    six times the float 1/6 is 0.9999999999999999)."""
    from specdec_cli.calibration_objective import attribute_weights, weighted_quality

    [weights] = attribute_weights([FULL])
    for k in range(7):
        correct = {a: i < k for i, a in enumerate(FULL)}
        assert weighted_quality(correct, weights) == k / 6


def test_the_unit_is_one_attribute_of_one_clip_as_the_labels_weigh_it():
    """All six on every clip: 100/6. No gender anywhere (three attributes labelled: rate, volume,
    pauses, on every clip): 100/3. Six attributes, each on 3 of 4 clips: the smallest weight
    4 / (6 x 3) = 2/9, 22.2 points."""
    from specdec_cli.calibration_objective import attribute_unit

    assert attribute_unit([FULL] * 5) == ONE_ATTRIBUTE
    assert attribute_unit([_without("gender", "pitch", "emotion")] * 4) == pytest.approx(100 / 3)
    # rate and volume on two clips of four, gender on all four: its weight 4 / (6 x 4) is the smallest
    partial = [FULL, _without("rate"), _without("volume"), _without("rate", "volume")]
    assert attribute_unit(partial) == ONE_ATTRIBUTE
    three_of_four = [_without("gender"), _without("rate"), _without("pitch", "volume"), _without("pauses", "emotion")]
    assert attribute_unit(three_of_four) == pytest.approx(100 * 4 / (6 * 3))
