"""The block-length rule for a link (decoding/block_length.py), against hand-computed values."""

from __future__ import annotations

import pytest

from specdec_cli.decoding.block_length import best_k, expected_tokens


def test_expected_tokens_by_hand():
    assert expected_tokens(3, 0.5) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tokens(4, 1.0) == 5.0
    assert expected_tokens(7, 0.0) == 1.0


def test_a_hand_computed_optimum():
    # a = 0.5, t_edge = 1, wait = 10: E(k) = 2 - 0.5^k, rate = E(k) / (k + 10):
    # k=1: 1.5/11 = 0.1364, k=2: 1.75/12 = 0.1458, k=3: 1.875/13 = 0.1442 -> 2.
    assert best_k(10.0, 1.0, 0.0, 0.5) == 2
    assert best_k(8.0, 1.0, 2.0, 0.5) == 2  # the cloud's forward is part of the wait


def test_one_token_blocks_below_the_critical_wait():
    # k=1 beats k=2 while wait <= t (1 + a - a^2) / a^2: at a = 0.5, t = 1 that is 5.
    assert best_k(4.9, 1.0, 0.0, 0.5) == 1
    assert best_k(5.1, 1.0, 0.0, 0.5) >= 2
    assert best_k(0.0, 1.0, 0.0, 0.9) == 1


def test_the_extremes_of_acceptance():
    # a = 0: one token per block whatever the wait; a = 1: rate (k+1)/(k t + D) grows with k iff D > t.
    assert best_k(100.0, 1.0, 0.0, 0.0) == 1
    assert best_k(2.0, 1.0, 0.0, 1.0, k_max=16) == 16
    assert best_k(0.5, 1.0, 0.0, 1.0) == 1


def test_k_grows_with_the_delay_but_only_logarithmically():
    ks = [best_k(d / 1000, 0.001, 0.0, 0.8, k_max=64) for d in (1, 10, 100, 1000)]
    assert ks == sorted(ks) and ks[0] < ks[-1]
    steps = [b - a for a, b in zip(ks, ks[1:], strict=False)]
    assert max(steps) <= 2 * min(steps) + 2  # about the same step per factor of 10: logarithmic
    assert ks[-1] < 10 * ks[1]  # a 100x longer wait: far from 100x longer blocks


def test_bad_inputs_are_refused():
    for args in [(-1.0, 0.001), (float("nan"), 0.001), (0.01, 0.0), (0.01, 0.001, 0.0, 1.5)]:
        with pytest.raises(ValueError):
            best_k(*args)
