"""diagnose(): the contract other components rely on, evidence, actions with ledger effects, headlines."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from kvdoctor.ledger.model import COMMON_MODELS
from kvdoctor.rules.context import Context
from kvdoctor.rules.diagnosis import Diagnosis, diagnose
from kvdoctor.rules.thresholds import MIN_WINDOW_SAMPLES, Thresholds
from kvdoctor.rules.verdicts import VERDICTS
from kvdoctor.signals.vocabulary import GPU_DRAM_BANDWIDTH_UTILIZATION, GPU_SM_ACTIVE, INTER_TOKEN_LATENCY
from kvdoctor.signals.window import Snapshot, Window
from tests.support.scenarios import SCENARIO_BY_NAME

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32-cpu"


def window(name: str) -> Window:
    return SCENARIO_BY_NAME[name].window()


def test_verdicts_are_exactly_the_contract():
    contract = """idle healthy kv_thrashing kv_tier_miss kv_capacity_pressure request_queueing
                  memory_bandwidth_bound compute_bound host_overhead_bound unknown"""
    assert tuple(contract.split()) == VERDICTS


def test_context_defaults():
    ctx = Context()
    assert ctx.model is None and ctx.gpu_peak_bandwidth is None and ctx.kv_dtype is None
    assert ctx.slo_seconds is None and ctx.slo == 0.1  # None: the window's published SLO, else 100 ms


def test_to_json_is_plain_json_with_the_documented_fields():
    d = diagnose(window("gpu_source_down"))
    payload = json.loads(json.dumps(d.to_json(), allow_nan=False))
    assert {"verdict", "confidence", "headline", "evidence", "actions", "knee", "missing"} <= set(payload)
    assert 0 <= payload["confidence"] <= 1
    for item in payload["evidence"]:
        assert {"signal", "value", "threshold", "comparison", "measured", "note"} <= set(item)
    for action in payload["actions"]:
        assert {"title", "flag_vllm", "flag_sglang", "effect"} <= set(action)
    assert {"kind", "kv_level"} <= set(payload["knee"])


def test_evidence_names_what_was_not_measured():
    d = diagnose(window("gpu_source_down"))
    unmeasured = {e.feature for e in d.evidence if not e.measured}
    assert {"dram_bandwidth_ratio", "sm_active_ratio", "gpu_busy_ratio"} <= unmeasured
    assert {GPU_DRAM_BANDWIDTH_UTILIZATION, GPU_SM_ACTIVE} <= set(d.missing)
    measured = {e.feature: e for e in d.evidence if e.measured}
    p95 = measured["itl_p95_seconds"]
    assert p95.threshold == 0.1 and p95.comparison == ">=" and p95.holds is True
    hint = next(e for e in d.evidence if e.feature == "dram_bandwidth_ratio")
    assert "NVML" in hint.note and "dcgm-exporter" in hint.note  # says how to get the missing counter


def test_a_window_too_short_to_judge_is_unknown_never_healthy():
    d = diagnose(Window.empty())
    assert d.verdict == "unknown" and d.confidence < 0.1 and not d.actions and not d.differential
    assert INTER_TOKEN_LATENCY in d.missing
    assert "0 snapshots in the window" in d.headline
    full = window("bandwidth_just_over")  # a slow engine: one or two snapshots of it prove nothing
    for n in (1, 2):
        short = full.slice(full.timestamps[-n], full.end)
        d = diagnose(short)
        assert (d.verdict, d.samples) == ("unknown", n), d.headline
        assert f"{n} snapshot{'s' if n > 1 else ''} in the window" in d.headline
        assert f"at least {MIN_WINDOW_SAMPLES}" in d.headline
    last3 = full.slice(full.timestamps[-3], full.end)
    assert diagnose(last3).verdict != "unknown"


def test_slo_from_the_context():
    w = window("slo_just_under")  # ITL p95 ~95 ms
    assert diagnose(w).verdict == "healthy"
    assert diagnose(w, Context(slo_seconds=0.05)).verdict == "memory_bandwidth_bound"


def test_thresholds_are_honoured():
    w = window("kv_ceiling_just_over")  # KV 92% with a queue
    assert diagnose(w).verdict == "kv_capacity_pressure"
    # with a 95% ceiling the pool has room: the queue is the batch limit's
    assert diagnose(w, thresholds=Thresholds(kv_ceiling_ratio=0.95)).verdict == "request_queueing"


def test_cache_hit_but_slow_is_said_explicitly():
    d = diagnose(window("high_hit_ratio_bandwidth_bound"))
    assert d.headline.startswith("Cache hit but slow (prefix hit ratio 91%")
    assert "HBM-bandwidth bound" in d.headline
    tier = diagnose(window("tier_miss_cache_hit_but_slow"))
    assert tier.headline.startswith("Cache hit but slow") and "slow tier" in tier.headline


def test_fast_with_high_hit_ratio_is_simply_healthy():
    d = diagnose(window("healthy_high_hit_ratio"))
    assert d.verdict == "healthy"
    assert "Cache hit but slow" not in d.headline and "92%" in d.headline


def test_thrashing_reports_the_knee():
    d = diagnose(window("thrashing_kv_oscillates_under_preemption"))
    assert d.knee.kind == "jump"
    assert 0.85 <= d.knee.kv_level <= 0.96
    assert "jumps" in d.headline
    assert [a.id for a in d.actions[:2]] == ["route_away", "shed_load"]  # mitigate first
    gqa = next(a for a in d.actions if a.id == "gqa_model")  # model unknown: kept, premise stated, and last
    assert gqa.premise == "if the model has no GQA (as many KV heads as attention heads)"
    assert d.actions.index(gqa) > [a.id for a in d.actions].index("fp8_kv_cache")


def test_cpu_engine_knee_rises_with_kv_but_cannot_lift_a_blind_verdict():
    """The knee points at bandwidth, but without GPU counters compute and host overhead are not
    ruled out: the verdict stays at most 0.5 confident, capped by those competitors."""
    d = diagnose(window("cpu_engine_latency_rises_with_kv"))
    assert d.knee.kind == "rises_with_kv" and "rises" in d.headline
    assert d.confidence <= 0.5 and {"compute_bound", "host_overhead_bound"} <= set(d.unresolved)
    flat = diagnose(window("gpu_source_down"))
    assert d.confidence >= flat.confidence


def test_actions_carry_the_ledger_effect_when_the_model_is_known():
    ctx = Context(model=COMMON_MODELS["Llama-3.1-8B"])
    d = diagnose(window("high_hit_ratio_bandwidth_bound"), ctx)
    by_id = {a.id: a for a in d.actions}
    assert "gqa_model" not in by_id  # Llama 3.1 already uses GQA
    fp8 = by_id["fp8_kv_cache"]
    assert fp8.flag_vllm == "--kv-cache-dtype fp8" and fp8.flag_sglang == "--kv-cache-dtype fp8_e4m3"
    assert re.fullmatch(
        r"FP8 KV: 128 KiB -> 64 KiB per token; decode step floor (\d+\.\d) ms -> (\d+\.\d) ms; "
        r"the pool holds 400,000 -> 800,000 tokens",
        fp8.effect,
    )
    before, after = map(float, re.findall(r"(\d+\.\d) ms", fp8.effect))
    assert after < before
    assert "each step re-reads" in d.headline
    ledger = d.to_json()["ledger"]
    assert ledger["kv_bytes_per_token"] == 128 * 1024
    assert ledger["decode_step_floor_seconds"] * 1000 == pytest.approx(before, abs=0.05)
    assert ledger["itl_p95_over_floor"] > 1


def test_actions_come_cheapest_first_and_drop_what_cannot_help():
    mha = Context(model=COMMON_MODELS["Llama-2-7B"], kv_dtype="fp8")
    d = diagnose(window("preemptions_just_over"), mha)
    ids = [a.id for a in d.actions]
    assert "fp8_kv_cache" not in ids  # already FP8
    gqa = d.actions[ids.index("gqa_model")]
    assert gqa.premise is None and gqa.effect.startswith("GQA with 8 KV heads: 256 KiB -> 64 KiB per token")
    assert ids.index("cap_context") < ids.index("kv_offload_prefetch") < ids.index("gqa_model")


@pytest.mark.parametrize(
    "verdict_scenario, first_fix",
    [
        ("prefill_burst", "limit_prefill"),
        ("host_overhead_just_under", "cuda_graphs"),
        ("kv_transfer_just_over", "fp8_kv_cache"),
    ],
)
def test_each_slow_verdict_has_actions(verdict_scenario, first_fix):
    d = diagnose(window(verdict_scenario))
    assert d.actions[0].id == "route_away" and d.actions[0].group == "mitigate"
    assert next(a for a in d.actions if a.group == "fix").id == first_fix


def test_a_window_from_a_real_vllm_filling_its_kv_cache():
    """16 real scrapes of vLLM 0.32 (CPU) while 16 requests fill an 8 MiB KV cache: usage reaches
    97%, 13 requests wait, no preemption yet."""
    from kvdoctor.exporter import adapters
    from kvdoctor.signals import textparse

    adapter = adapters.ADAPTERS["vllm"]
    snapshots = []
    for i, path in enumerate(sorted((FIXTURES / "fill-sequence").glob("*.txt"))):
        raw = [(n, labels, v) for n, labels, v, _ in textparse.iter_samples(path.read_text(), adapter.wanted_names())]
        snapshots.append(Snapshot(float(i), adapter.normalise(raw)))
    d = diagnose(Window.from_snapshots(snapshots))
    assert d.verdict == "kv_capacity_pressure"
    assert GPU_DRAM_BANDWIDTH_UTILIZATION in d.missing  # a CPU build: no GPU counters


def test_stale_kv_after_traffic_stopped_is_idle():
    """The same engine after the burst: counters flat, KV usage still reported high."""
    snaps = [
        Snapshot(
            float(t),
            {
                ("kvdoctor_generation_tokens_total", (("engine", "vllm"),)): 5000.0,
                ("kvdoctor_kv_cache_usage_ratio", (("engine", "vllm"),)): 0.97,
            },
        )
        for t in range(60)
    ]
    d = diagnose(Window.from_snapshots(snaps))
    assert d.verdict == "idle" and "97%" in d.headline


def test_diagnosis_fields_are_consistent():
    d: Diagnosis = diagnose(window("baseline"))
    assert d.verdict in VERDICTS and not d.slow and d.actions == []
    assert d.window_seconds == 60 and d.samples == 61
    assert all(not (isinstance(v, float) and math.isinf(v)) for v in d.features.values())
    assert np.isfinite(d.confidence)


@pytest.mark.parametrize("seed", range(12))
def test_gappy_partial_windows_never_break_diagnose(seed):
    """Scrapes fail, series come and go: whatever is left still gives a verdict (and valid JSON)."""
    rng = np.random.default_rng(seed)
    names = sorted(SCENARIO_BY_NAME)
    base = window(names[seed % len(names)])
    series = {}
    for key, values in base.series.items():
        if rng.random() < 0.2:
            continue  # the series is gone
        values = values.copy()
        values[rng.random(len(values)) < rng.uniform(0, 0.6)] = np.nan
        series[key] = values
    keep = rng.integers(1, len(base) + 1)
    d = diagnose(Window(base.timestamps[-keep:], {k: v[-keep:] for k, v in series.items()}))
    assert d.verdict in VERDICTS
    json.dumps(d.to_json(), allow_nan=False)


def test_a_negative_peak_bandwidth_gauge_is_ignored_not_fatal():
    from kvdoctor.signals.vocabulary import GPU_DRAM_PEAK_BANDWIDTH

    healthy = window("high_hit_ratio_bandwidth_bound")
    broken = Window(
        healthy.timestamps,
        {
            key: (np.full_like(values, -1.0) if key[0] == GPU_DRAM_PEAK_BANDWIDTH else values)
            for key, values in healthy.series.items()
        },
    )
    assert any(key[0] == GPU_DRAM_PEAK_BANDWIDTH for key in broken.series)
    ctx = Context(model=COMMON_MODELS["Llama-3.1-8B"])
    d = diagnose(broken, ctx)  # was: ValueError("peak bandwidth must be positive")
    assert d.verdict == diagnose(healthy, ctx).verdict
    assert (
        d.to_json()["ledger"]["decode_step_floor_seconds"] is None
        or d.to_json()["ledger"]["decode_step_floor_seconds"] > 0
    )
