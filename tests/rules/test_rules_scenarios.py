"""Agreement, Python half: diagnose() gives each scenario's expected verdict.

The promtool half (tests/rules/test_rules_promtool.py) feeds the same series, decoded from the
same expanding notation, to ``promtool test rules``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvdoctor.rules.diagnosis import VERDICTS, diagnose
from kvdoctor.rules.signals import GPU_DRAM_BANDWIDTH_UTILIZATION, SIGNALS
from tests.support.scenarios import SCENARIO_BY_NAME, SCENARIOS, decode_series, encode_series


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_python_verdict_matches_the_scenario(scenario):
    diagnosis = diagnose(scenario.window())
    assert diagnosis.verdict == scenario.expected, f"{scenario.why}\nheadline: {diagnosis.headline}"


def test_suite_covers_every_verdict_and_the_required_cases():
    assert len(SCENARIOS) >= 20
    assert {s.expected for s in SCENARIOS} == set(VERDICTS)
    names = set(SCENARIO_BY_NAME)
    for required in (
        "idle_stale_kv",
        "counter_reset_inside_window",
        "prefill_burst",
        "gpu_source_down",
        "thrashing_kv_oscillates_under_preemption",
        "high_hit_ratio_bandwidth_bound",
    ):
        assert required in names
    boundaries = [n for n in names if n.endswith("_just_under") or n.endswith("_just_over")]
    assert len(boundaries) >= 14


@pytest.mark.parametrize(
    "pair",
    [
        ("preemptions_just_under", "preemptions_just_over"),
        ("kv_transfer_just_under", "kv_transfer_just_over"),
        ("pcie_just_under", "pcie_just_over"),
        ("slow_tier_hits_just_under", "slow_tier_hits_just_over"),
        ("kv_ceiling_just_under", "kv_ceiling_just_over"),
        ("slo_just_under", "slo_just_over"),
        ("trend_just_under", "trend_just_over"),
        ("bandwidth_just_under", "bandwidth_just_over"),
        ("sm_just_under", "sm_just_over"),
        ("host_overhead_just_under", "host_overhead_just_over"),
        ("prefill_ratio_just_under_no_gpu", "prefill_ratio_just_over_no_gpu"),
    ],
)
def test_boundary_pairs_straddle_their_threshold(pair):
    under, over = (SCENARIO_BY_NAME[n] for n in pair)
    assert under.expected != over.expected


def test_missing_gpu_counters_still_give_a_verdict_with_a_missing_line():
    diagnosis = diagnose(SCENARIO_BY_NAME["gpu_source_down"].window())
    assert diagnosis.verdict == "memory_bandwidth_bound"
    assert GPU_DRAM_BANDWIDTH_UTILIZATION in diagnosis.missing
    assert "GPU counters missing" in diagnosis.headline
    with_gpu = diagnose(SCENARIO_BY_NAME["high_hit_ratio_bandwidth_bound"].window())
    assert diagnosis.confidence < with_gpu.confidence


def test_counter_reset_is_not_a_preemption_burst():
    scenario = SCENARIO_BY_NAME["counter_reset_inside_window"]
    window = scenario.window()
    preempt = next(v for (name, _), v in window.series.items() if name == "kvdoctor_preemptions_total")
    assert np.nanmax(preempt) - np.nanmin(preempt) >= 57  # a naive max-min would say 57 preemptions
    assert diagnose(window).features["preemptions_per_minute"] == 0


def test_idle_headline_mentions_stale_kv():
    diagnosis = diagnose(SCENARIO_BY_NAME["idle_stale_kv"].window())
    assert "left over" in diagnosis.headline and diagnosis.actions == []


@pytest.mark.parametrize(
    "values",
    [
        np.arange(10.0),
        np.array([1.0, 1, 1, 1, 2, 3, 4, np.nan, np.nan, 5]),
        np.cumsum(np.full(50, 0.1)),
        np.array([0.78, 0.99, 0.86, 0.97] * 5),
        np.array([3e11, 3.1e11, 0.0, 1e-05, 2e-05, 3e-05, 4e-05]),
        np.array([10.0, 8, 6, 4, 2]),
    ],
)
def test_expanding_notation_round_trips_exactly(values):
    text = encode_series(values)
    back = decode_series(text, len(values))
    assert np.array_equal(back, values, equal_nan=True)
    assert "e" not in text.replace("_", "")  # positional numbers only: promtool's lexer reads them plainly


def test_scenarios_use_only_canonical_signals():
    for scenario in SCENARIOS[:3]:
        for name, _ in scenario.series():
            base = name.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count")
            assert name in SIGNALS or base in SIGNALS, name


def test_scenario_windows_end_on_the_evaluation_instant():
    scenario = SCENARIO_BY_NAME["baseline"]
    window = scenario.window()
    assert window.end == scenario.eval_seconds
    assert len(window) == int(scenario.window_seconds / scenario.step) + 1
    assert not any(math.isnan(v) for v in window.timestamps)
