"""Knee detection: latency rising with KV (bandwidth) vs jumping at a KV level (pool exhausted)."""

from __future__ import annotations

import numpy as np
import pytest

from kvdoctor.rules.knee import JUMP, RISES_WITH_KV, detect_knee

RNG = np.random.default_rng(3)


def noisy(y: np.ndarray, spread: float = 0.03) -> np.ndarray:
    return y * (1 + RNG.uniform(-spread, spread, len(y)))


def test_latency_that_jumps_at_a_kv_level():
    kv = np.linspace(0.5, 1.0, 80)
    itl = noisy(np.where(kv >= 0.92, 0.12, 0.03))
    knee = detect_knee(kv, itl)
    assert knee.kind == JUMP
    assert knee.kv_level == pytest.approx(0.92, abs=0.01)
    assert knee.ratio == pytest.approx(4, rel=0.1)
    assert "92%" in knee.note


def test_latency_that_rises_with_kv():
    kv = np.linspace(0.1, 0.9, 80)
    itl = noisy(0.03 * (1 + 1.5 * kv))
    knee = detect_knee(kv, itl)
    assert knee.kind == RISES_WITH_KV
    assert knee.ratio == pytest.approx((1 + 1.5 * 0.9) / (1 + 1.5 * 0.1), rel=0.1)


def test_a_preemption_stall_does_not_make_a_knee():
    kv = np.linspace(0.3, 0.6, 60)
    itl = noisy(np.full(60, 0.03))
    itl[20] = 20.0  # one stalled interval
    assert detect_knee(kv, itl).kind is None


def test_flat_kv_or_too_few_points_say_nothing():
    assert detect_knee(np.full(50, 0.5), noisy(np.full(50, 0.03))).kind is None
    knee = detect_knee(np.linspace(0, 1, 5), np.linspace(0.01, 0.1, 5))
    assert knee.kind is None and "need" in knee.note


def test_intervals_without_tokens_are_ignored():
    kv = np.linspace(0.5, 1.0, 80)
    itl = np.where(kv >= 0.9, 0.1, 0.02)
    weights = np.ones(80)
    itl[::2] = np.nan  # no tokens in these intervals: 0/0
    weights[::2] = 0
    assert detect_knee(kv, itl, weights).kind == JUMP
