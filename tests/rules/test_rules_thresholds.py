"""Thresholds: one documented object, strict about what it accepts."""

from __future__ import annotations

from dataclasses import fields

import pytest

from kvdoctor.rules.thresholds import Thresholds


def test_defaults_follow_design():
    t = Thresholds()
    assert t.window_seconds == 60
    assert t.kv_ceiling_ratio == 0.90
    assert t.bandwidth_high_ratio == 0.80 and t.sm_high_ratio == 0.80
    assert t.itl_quantile == 0.95


def test_every_knob_is_documented():
    docs = Thresholds.describe()
    assert set(docs) == {f.name for f in fields(Thresholds)}
    assert all(len(text) > 20 for text in docs.values())


def test_booleans_are_not_numbers():
    with pytest.raises(ValueError, match="must be a number"):
        Thresholds(trend_ratio=True)
