"""The benchmarks' own arithmetic: the interval the fleet benchmark puts around its ratio to the floor
(bench/fleet_rig.py ``ratio_interval``), which says whether a ratio near the target is decided."""

from __future__ import annotations

import math
import random

import pytest

from bench.fleet_rig import ratio_interval


def test_the_interval_holds_the_ratio_of_medians_and_narrows_with_more_evaluations():
    rng = random.Random(1)
    short = [1.1 * rng.lognormvariate(0, 0.2) for _ in range(12)], [rng.lognormvariate(0, 0.2) for _ in range(12)]
    long = [1.1 * rng.lognormvariate(0, 0.2) for _ in range(120)], [rng.lognormvariate(0, 0.2) for _ in range(120)]
    low_short, high_short = ratio_interval(*short)
    low_long, high_long = ratio_interval(*long)
    assert low_long <= 1.1 <= high_long
    assert high_long - low_long < (high_short - low_short) / 2


def test_a_steady_ratio_has_no_spread_and_the_same_seed_gives_the_same_interval():
    assert ratio_interval([2.0] * 10, [1.0] * 8) == pytest.approx((2.0, 2.0))
    ours, floor = [1.0, 1.3, 0.9, 1.6, 1.1], [1.0, 1.2, 1.1, 0.8, 1.4]
    assert ratio_interval(ours, floor) == ratio_interval(ours, floor)
    low, high = ratio_interval(ours, floor)
    assert low < 1.0 < high


def test_no_evaluations_give_no_interval():
    assert all(math.isnan(v) for v in ratio_interval([], [1.0]))
    assert all(math.isnan(v) for v in ratio_interval([1.0], []))
