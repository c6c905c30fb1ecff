"""``--thresholds FILE``: a YAML mapping read into ``Thresholds``; every bad file is one clear line."""

from __future__ import annotations

import pytest

from kvdoctor.rules.thresholds import Thresholds
from kvdoctor.sources.thresholds_file import load_thresholds
from tests.support.errors import one_line_error


def test_yaml_overrides_only_what_it_names(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("kv_ceiling_ratio: 0.95\nwindow_seconds: 120\n")
    t = load_thresholds(path)
    assert t.kv_ceiling_ratio == 0.95 and t.window_seconds == 120
    assert t.bandwidth_high_ratio == Thresholds().bandwidth_high_ratio


def test_empty_yaml_gives_the_defaults(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("")
    assert load_thresholds(path) == Thresholds()


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
    assert message in one_line_error(ValueError, load_thresholds, path)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="cannot read thresholds file"):
        load_thresholds(tmp_path / "absent.yaml")
