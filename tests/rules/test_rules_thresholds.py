"""Thresholds: one documented object, overridable from YAML, strict about what it accepts."""

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


def test_yaml_overrides_only_what_it_names(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("kv_ceiling_ratio: 0.95\nwindow_seconds: 120\n")
    t = Thresholds.from_yaml(path)
    assert t.kv_ceiling_ratio == 0.95 and t.window_seconds == 120
    assert t.bandwidth_high_ratio == Thresholds().bandwidth_high_ratio


def test_empty_yaml_gives_the_defaults(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("")
    assert Thresholds.from_yaml(path) == Thresholds()


@pytest.mark.parametrize(
    "text, message",
    [
        ("kv_ceilling_ratio: 0.9\n", "unknown threshold(s) kv_ceilling_ratio"),
        ("kv_ceiling_ratio: 1.5\n", "kv_ceiling_ratio must be > 0 and <= 1"),
        ("kv_ceiling_ratio: high\n", "kv_ceiling_ratio must be a number"),
        ("preemptions_per_minute: 0\n", "preemptions_per_minute must be > 0"),
        ("- 1\n- 2\n", "expected a mapping"),
        ("a: [\n", "is not valid YAML"),
    ],
)
def test_bad_files_are_rejected_with_one_clear_line(tmp_path, text, message):
    path = tmp_path / "t.yaml"
    path.write_text(text)
    with pytest.raises(ValueError) as err:
        Thresholds.from_yaml(path)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="cannot read thresholds file"):
        Thresholds.from_yaml(tmp_path / "absent.yaml")


def test_booleans_are_not_numbers():
    with pytest.raises(ValueError, match="must be a number"):
        Thresholds(trend_ratio=True)
