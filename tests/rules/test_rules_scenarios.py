"""Agreement, Python half: diagnose() gives each scenario's expected verdict.

The promtool half (tests/rules/test_rules_promtool.py) feeds the same series, decoded from the
same expanding notation, to ``promtool test rules``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvdoctor.rules.confidence import itl_quantile_bound
from kvdoctor.rules.context import Context
from kvdoctor.rules.diagnosis import diagnose
from kvdoctor.rules.thresholds import Thresholds
from kvdoctor.rules.tree import parameters
from kvdoctor.rules.verdicts import VERDICTS
from kvdoctor.rules.verdicts import verdict as catalogue_entry
from kvdoctor.signals.vocabulary import GPU_DRAM_BANDWIDTH_UTILIZATION, SIGNALS
from tests.support.scenarios import (
    CHANGE_LAG,
    SCENARIO_BY_NAME,
    SCENARIOS,
    SPARSE_THRASH_LAG,
    Gpu,
    Latency,
    Linear,
    Scenario,
    SpikeAtEnd,
    decode_series,
    encode_series,
)

# Issue 24's "Why", one named scenario per case (tests/support/scenarios.py says why each).
ISSUE_24_CASES = (
    "bandwidth_bound_queue_forming",  # 1. the queue pre-empted the cause
    "bandwidth_bound_24_waiting",
    "compute_bound_growing_queue",
    "host_overhead_ten_waiting",
    "harmless_queue_one_waiting",  # 2. a harmless queue called slow
    "queue_growing_decode_on_time",  # the queue is the verdict only when decode is on time
    "ttft_over_threshold_decode_on_time",
    "tier_miss_then_host_overhead",  # 3. the verdict lagged the incident
    "thrashing_stops_bandwidth_remains",
    "capacity_pressure_then_tier_miss",
    "thrashing_stops_pool_stays_full",
    "window_one_snapshot",  # 4. a window too short to judge said healthy
    "window_two_snapshots",
)
CHANGES_OF_CAUSE = (
    "tier_miss_then_host_overhead",
    "thrashing_stops_bandwidth_remains",
    "capacity_pressure_then_tier_miss",
)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_python_verdict_matches_the_scenario(scenario):
    diagnosis = diagnose(scenario.window())
    assert diagnosis.verdict == scenario.expected, f"{scenario.why}\nheadline: {diagnosis.headline}"


def test_suite_covers_every_verdict_and_the_required_cases():
    assert len(SCENARIOS) >= 20
    assert {s.expected for s in SCENARIOS} == set(VERDICTS)  # unknown too: a window under 3 snapshots
    names = set(SCENARIO_BY_NAME)
    for required in (
        "idle_stale_kv",
        "counter_reset_inside_window",
        "prefill_burst",
        "gpu_source_down",
        "thrashing_kv_oscillates_under_preemption",
        "high_hit_ratio_bandwidth_bound",
        # issue #14's "Why": one SLO, fast engines are not slow, actions that fit, engine versions
        "published_slo_15ms",
        "pcie_tier_traffic_fast_decode",
        "full_pool_empty_queue",
        "busy_bus_fast_decode",
        "capacity_pressure_400_waiting",
        "compute_bound_with_prefix_hits",
        "vllm_v0_swapping",
        "lmcache_hits_count_with_the_engines_own",
        # issue #15's queue and long-request cases
        "llamacpp_slots_full_queue",
        "vllm_max_num_seqs_queue",
        "long_request_is_not_idle",
        # issue #24's "Why": the cause before its queue, a harmless queue, a change of cause, a short window
        *ISSUE_24_CASES,
    ):
        assert required in names
    boundaries = [n for n in names if n.endswith("_just_under") or n.endswith("_just_over")]
    assert len(boundaries) >= 14
    assert sum(s.timeless for s in SCENARIOS) >= 30  # run at 15 s, 30 s and 1 m scrape intervals too


@pytest.mark.parametrize(
    "pair",
    [
        ("preemptions_just_under", "preemptions_just_over"),
        ("kv_transfer_just_under", "kv_transfer_just_over"),
        ("pcie_just_under", "pcie_just_over"),
        ("slow_tier_hits_just_under", "slow_tier_hits_just_over"),
        ("kv_ceiling_just_under", "kv_ceiling_just_over"),
        ("slo_just_under", "slo_just_over"),
        ("published_slo_default_would_pass", "published_slo_15ms"),
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


# ------------------------------------------------------------------ what on-call reads (issue #14, #15)


def test_a_fast_engine_with_tier_traffic_is_healthy_with_a_note():
    d = diagnose(SCENARIO_BY_NAME["pcie_tier_traffic_fast_decode"].window())
    assert d.verdict == "healthy" and d.features["itl_p95_seconds"] < 0.05
    assert any(n.startswith("tier traffic (PCIe receive 12.0 GB/s") for n in d.notes), d.notes
    assert "Note: tier traffic" in d.headline


def test_a_full_pool_without_a_queue_is_healthy_and_says_headroom_is_low():
    d = diagnose(SCENARIO_BY_NAME["full_pool_empty_queue"].window())
    assert d.verdict == "healthy"
    assert "KV pool 97% full, no queue: headroom is low" in d.notes


def test_the_published_slo_decides_unless_one_is_given():
    scenario = SCENARIO_BY_NAME["published_slo_15ms"]
    d = diagnose(scenario.window())
    assert d.verdict == "memory_bandwidth_bound" and d.context.slo == 0.015
    assert d.context.slo_source == "published by the exporter" and "(SLO 15 ms)" in d.headline
    given = diagnose(scenario.window(), Context(slo_seconds=0.1))
    assert given.verdict == "healthy" and given.context.slo_source == "given"


def test_the_llamacpp_queue_says_what_it_could_not_check():
    d = diagnose(SCENARIO_BY_NAME["llamacpp_slots_full_queue"].window())
    assert d.verdict == "request_queueing"
    assert "12 requests waiting while 4 run" in d.headline and "KV usage is not reported" in d.headline
    assert "llama.cpp --parallel" in d.headline
    ids = [a.id for a in d.actions]
    assert ids[:3] == ["route_away", "shed_load", "raise_sequence_limit"]
    raise_limit = d.actions[2]
    assert raise_limit.premise == "if the KV cache has room (its usage is not reported)"
    assert raise_limit.flag_llamacpp.startswith("--parallel")


@pytest.mark.parametrize("growing", [False, True], ids=["steady", "growing"])
def test_the_llamacpp_queue_is_as_sure_as_what_it_could_not_check_allows(growing):
    """No ITL histogram, no TTFT, no KV usage: a mean time per token 60x under the SLO rules out
    slow decode (its ITL p95 can be at most 20x the mean), so the confidence is capped only below
    what the missing signals leave open -- a full KV pool, said in the headline -- not at 0.15."""
    scenario = SCENARIO_BY_NAME["llamacpp_slots_full_queue"]
    d = diagnose(scenario.but(waiting=Linear(2, 0.5) if growing else scenario.waiting).window())
    assert d.verdict == "request_queueing" and (d.features["queue_growth_per_minute"] > 10) is growing
    assert itl_quantile_bound(d.features, parameters(Thresholds(), d.context.slo)) < d.context.slo
    assert 0.5 <= d.confidence < catalogue_entry("request_queueing").base_confidence
    assert "kv_capacity_pressure" in d.unresolved
    assert not {"memory_bandwidth_bound", "compute_bound", "host_overhead_bound"} & set(d.unresolved)
    assert "a full pool would make this KV capacity pressure" in d.headline


def test_a_mean_time_per_token_near_the_slo_leaves_slow_decode_open():
    """The same queue with a mean of half the SLO: a p95 over the SLO is possible, so slow decode
    stays unresolved and the confidence low."""
    scenario = SCENARIO_BY_NAME["llamacpp_slots_full_queue"]
    d = diagnose(scenario.but(latency=Latency(base=0.05, mix=((1.0, 1.0),))).window(), Context(slo_seconds=0.1))
    assert d.verdict == "request_queueing"
    assert {"memory_bandwidth_bound", "compute_bound"} <= set(d.unresolved)
    assert d.confidence <= 0.25


def test_the_vllm_queue_on_max_num_seqs_says_how_much_room_the_pool_has():
    d = diagnose(SCENARIO_BY_NAME["vllm_max_num_seqs_queue"].window())
    assert d.verdict == "request_queueing" and "KV usage 40%" in d.headline
    ttft = next(e for e in d.evidence if e.feature == "ttft_p95_seconds")
    assert ttft.measured and ttft.value > 0.9  # the queue's cost, as evidence
    raise_limit = next(a for a in d.actions if a.id == "raise_sequence_limit")
    assert raise_limit.effect == (
        "KV usage 40% with 32 running: room for about 40 more sequences of this length before the 90% ceiling"
    )


def test_a_request_longer_than_the_window_is_not_idle():
    scenario = SCENARIO_BY_NAME["long_request_is_not_idle"]
    window = scenario.window()
    d = diagnose(window)
    assert d.features["generation_tokens_per_second"] == 0  # counted only when the request ends
    assert d.verdict == "healthy" and d.branch == "unmeasured"
    assert d.headline.startswith("No sign of slowness, but speed is not measured: no ITL histogram")
    assert "no KV usage signal" in d.headline and d.confidence <= 0.3


def test_no_latency_and_no_kv_never_claims_healthy_speed():
    d = diagnose(SCENARIO_BY_NAME["long_request_is_not_idle"].window())
    assert "Healthy" not in d.headline and "fast" not in d.headline


def test_a_mean_time_per_token_is_labelled_and_less_sure_than_a_p95():
    mean = diagnose(SCENARIO_BY_NAME["llamacpp_mean_time_per_token_fast"].window())
    assert mean.verdict == "healthy" and "mean time per token 1.6 ms" in mean.headline
    assert "a mean: no ITL histogram" in mean.headline
    p95 = diagnose(SCENARIO_BY_NAME["baseline"].window())
    assert mean.confidence < p95.confidence
    slow = diagnose(SCENARIO_BY_NAME["llamacpp_mean_time_per_token_slow"].window())
    assert slow.verdict == "memory_bandwidth_bound" and "mean time per token 150 ms" in slow.headline


def test_vllm_v0_swapping_is_thrashing_with_the_swap_as_evidence():
    d = diagnose(SCENARIO_BY_NAME["vllm_v0_swapping"].window())
    assert d.verdict == "kv_thrashing" and d.branch == "thrashing_swapping"
    rows = {e.feature: e for e in d.evidence}
    assert rows["requests_swapped"].value == 3 and rows["requests_swapped"].holds
    assert rows["kv_host_usage"].value == 0.4 and rows["kv_host_usage"].measured
    assert "3 requests swapped out to host memory (host KV pool 40%)" in d.headline


def test_gpu_side_verdicts_without_gpu_counters_are_at_most_half_sure_and_say_how_to_get_them():
    for name in ("gpu_source_down", "prefill_ratio_just_over_no_gpu", "cpu_engine_latency_rises_with_kv"):
        d = diagnose(SCENARIO_BY_NAME[name].window())
        assert d.confidence <= 0.5, name
        assert "NVML" in d.headline and "dcgm-exporter" in d.headline, name


# ------------------------------------------------------------------ issue #24: the cause first, the queue beside it


def _contributing(d) -> dict[str, dict]:
    return {entry["verdict"]: entry for entry in d.to_json()["differential"]}


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s.contributing], ids=lambda s: s.name)
def test_the_queue_behind_a_slow_decode_is_listed_as_its_consequence(scenario):
    d = diagnose(scenario.window())
    assert d.verdict == scenario.expected, d.headline
    listed = _contributing(d)
    assert set(scenario.contributing) <= set(listed), f"{scenario.why}\ndifferential: {list(listed)}"
    for entry in listed.values():
        assert set(entry) >= {"verdict", "confidence", "consequence", "summary", "evidence"}
        assert 0 <= entry["confidence"] <= 1 and entry["summary"] and isinstance(entry["evidence"], list)
    queue = listed["request_queueing"]
    assert queue["consequence"] is True  # the queue is what the slow decode produces, not a cause beside it
    assert scenario.expected not in listed  # the verdict is not its own contributing cause
    assert len(d.differential) == len(listed)


def test_every_slow_cause_with_requests_waiting_declares_its_queue():
    """A scenario whose decode is over the SLO while requests wait (or TTFT is slow) and whose verdict is a
    cause must declare the queue it produces, so the differential is checked wherever it applies."""
    missing = []
    for scenario in SCENARIOS:
        if scenario.expected in ("idle", "healthy", "unknown", "request_queueing"):
            continue
        f = diagnose(scenario.window()).features
        itl = f["itl_p95_seconds"] if not math.isnan(f["itl_p95_seconds"]) else f["time_per_token_mean_seconds"]
        slow = itl >= 0.1 if scenario.published_slo is None else itl >= scenario.published_slo
        delayed = f["requests_waiting"] >= 1 or f["ttft_p95_seconds"] >= 2.0
        if slow and delayed and "request_queueing" not in scenario.contributing:
            missing.append(scenario.name)
    assert not missing, f"slow causes with a queue behind them that do not declare it: {missing}"


def test_a_queue_that_neither_delays_nor_grows_is_not_slowness():
    d = diagnose(SCENARIO_BY_NAME["harmless_queue_one_waiting"].window())
    assert d.features["requests_waiting"] == 1
    assert d.features["itl_p95_seconds"] == pytest.approx(0.030)
    assert d.features["ttft_p95_seconds"] == pytest.approx(0.35)
    assert d.verdict == "healthy" and not d.slow, d.headline


def _with_lag(scenario: Scenario, lag: float) -> Scenario:
    """The change of cause ``lag`` seconds before the evaluation instant instead of ``CHANGE_LAG``."""

    def moved(value):
        return SpikeAtEnd(value.base, value.peak, lag, lag + 1) if isinstance(value, SpikeAtEnd) else value

    changes = {f: moved(getattr(scenario, f)) for f in ("kv_usage", "waiting", "kv_to_gpu_bytes_per_second")}
    changes["preemptions_per_minute"] = moved(scenario.preemptions_per_minute)
    gpus = tuple(Gpu(moved(g.dram), moved(g.sm), moved(g.pcie_rx), g.method, g.model) for g in scenario.gpus)
    return scenario.but(gpus=gpus, **changes)


@pytest.mark.parametrize("name", CHANGES_OF_CAUSE)
def test_the_new_cause_wins_within_one_state_window_and_a_scrape_and_keeps_winning(name):
    """Issue 24: with the engine slow throughout, the cause changes; from one state window plus a
    scrape after the change (16 s at 1 s) until the old cause has left the whole window, the verdict
    is the new cause, never the old one or a hybrid of the two."""
    scenario = SCENARIO_BY_NAME[name]
    assert CHANGE_LAG == 16.0
    got = {lag: diagnose(_with_lag(scenario, lag).window()).verdict for lag in range(16, 62, 3)}
    assert set(got.values()) == {scenario.expected}, got


def test_a_thrash_that_stopped_beside_a_full_pool_yields_to_capacity_pressure_a_third_later():
    """Beside a full pool the tree keeps preemptions over the window's last third (so a sparse thrash
    does not flicker, below); from a third and a scrape after they stopped (21 s at 1 s, under issue
    24's 25 s) until they leave the window, the verdict is capacity pressure, never the old thrash."""
    scenario = SCENARIO_BY_NAME["thrashing_stops_pool_stays_full"]
    assert SPARSE_THRASH_LAG == 21.0
    assert diagnose(_with_lag(scenario, 5).window()).verdict == "kv_thrashing"  # a preemption 5 s ago is now
    got = {lag: diagnose(_with_lag(scenario, lag).window()).verdict for lag in range(21, 62, 2)}
    assert set(got.values()) == {"kv_capacity_pressure"}, got
    d = diagnose(scenario.window())
    assert d.features["preemptions_per_minute"] == d.features["preemptions_per_minute_late"] == 0
    assert "kv_thrashing" not in {c.verdict for c in d.differential}, d.differential


@pytest.mark.parametrize("phase", range(0, 20, 3))
def test_a_thrash_sparser_than_the_state_window_reads_thrashing_in_its_gaps(phase):
    """3 preemptions a minute (one per 20 s: the 15 s state window sees none at some instants) beside
    a full pool with requests waiting: thrashing at every phase, never capacity pressure."""
    base = SCENARIO_BY_NAME["preemptions_just_over"]
    scenario = base.but(preemptions_per_minute=3.0, duration=base.length + phase)
    d = diagnose(scenario.window())
    assert d.verdict == "kv_thrashing", (phase, d.features["preemptions_per_minute"], d.headline)


def test_a_transfer_that_stopped_is_not_quoted_as_current():
    d = diagnose(SCENARIO_BY_NAME["tier_miss_then_host_overhead"].window())
    assert d.verdict == "host_overhead_bound", d.headline
    assert d.features["kv_to_gpu_bytes_per_second"] < 1e9  # the counter has been flat for 16 s
    assert d.features["pcie_receive_bytes_per_second"] < 1e9
    assert "into the GPU" not in d.headline and "GB/s" not in d.headline
    for row in d.evidence:
        if row.feature in ("kv_to_gpu_bytes_per_second", "pcie_receive_bytes_per_second") and row.value is not None:
            assert row.value < 1e9, row


def test_preemptions_that_stopped_do_not_keep_the_thrashing_verdict():
    d = diagnose(SCENARIO_BY_NAME["thrashing_stops_bandwidth_remains"].window())
    assert d.verdict == "memory_bandwidth_bound", d.headline
    assert d.features["preemptions_per_minute"] == 0 and "preemption" not in d.headline


def test_a_tier_miss_after_capacity_pressure_quotes_the_pool_as_it_is_now():
    d = diagnose(SCENARIO_BY_NAME["capacity_pressure_then_tier_miss"].window())
    assert d.verdict == "kv_tier_miss" and d.branch == "tier_miss", d.headline
    assert d.features["kv_usage"] == pytest.approx(0.7)
    assert d.features["kv_to_gpu_bytes_per_second"] == pytest.approx(6e9, rel=0.05)  # the rate now, not averaged
    assert "97%" not in d.headline
    rows = {e.feature: e for e in d.evidence}
    assert rows["kv_usage"].value == pytest.approx(0.7)


@pytest.mark.parametrize("samples", [1, 2, 3])
def test_a_window_needs_three_samples_to_be_judged(samples):
    """Fewer than ``MIN_WINDOW_SAMPLES`` samples: verdict ``unknown`` with a one-line reason, never
    ``healthy``; from three on, the slow engine is diagnosed."""
    from kvdoctor.rules.thresholds import MIN_WINDOW_SAMPLES

    assert MIN_WINDOW_SAMPLES == 3
    window = SCENARIO_BY_NAME["window_two_snapshots"].but(duration=float(samples - 1)).window()
    assert len(window) == samples
    d = diagnose(window)
    if samples < MIN_WINDOW_SAMPLES:
        assert d.verdict == "unknown" and not d.slow, d.headline
        assert d.headline and "\n" not in d.headline and "1 snapshots" not in d.headline
    else:
        assert d.verdict == "memory_bandwidth_bound", d.headline
