"""Rates, latency quantiles, targets and fleet ranking from windows (no Dash, no I/O)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvdoctor.dashboard import derive
from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.stats import histogram_quantile_rows
from kvdoctor.signals.window import Window, labels_of
from tests.support.synthetic import ENGINE, SCENARIOS, SyntheticEngine

INF = math.inf


def test_histogram_quantile_interpolates_like_promql():
    bounds = np.array([0.1, 0.2, 0.4, INF])
    # 10 in <=0.1, 30 in (0.1,0.2], 40 in (0.2,0.4], 20 above 0.4
    counts = np.array([[10, 40, 80, 100]], float)
    # p50: rank 50 falls in (0.2, 0.4]: 0.2 + 0.2 * (50-40)/40
    assert histogram_quantile_rows(0.5, bounds, counts)[0] == pytest.approx(0.25)
    # p05: rank 5 in the first bucket: 0 + 0.1 * 5/10
    assert histogram_quantile_rows(0.05, bounds, counts)[0] == pytest.approx(0.05)
    # p95: in the +Inf bucket -> the highest finite bound
    assert histogram_quantile_rows(0.95, bounds, counts)[0] == pytest.approx(0.4)


def test_histogram_quantile_is_nan_without_observations_or_without_inf_bucket():
    bounds = np.array([0.1, INF])
    assert np.isnan(histogram_quantile_rows(0.5, bounds, np.array([[0.0, 0.0]]))[0])
    assert np.isnan(histogram_quantile_rows(0.5, np.array([0.1, 0.2]), np.array([[1.0, 2.0]]))[0])


def _histogram_window(bucket_counters: dict[str, list[float]], ts=None) -> Window:
    n = len(next(iter(bucket_counters.values())))
    ts = np.arange(n, dtype=float) if ts is None else ts
    series = {
        (S.INTER_TOKEN_LATENCY + "_bucket", labels_of(ENGINE, le=le)): np.array(v, float)
        for le, v in bucket_counters.items()
    }
    return Window(ts, series)


def test_latency_quantile_from_bucket_increases_survives_a_counter_reset():
    # Each second: 6 observations <= 0.05, 4 in (0.05, 0.1]. The engine restarts at t=3.
    le_005 = [0, 6, 12, 6, 12, 18]
    le_01 = [0, 10, 20, 10, 20, 30]
    window = _histogram_window({"0.05": le_005, "0.1": le_01, "+Inf": le_01})
    bounds, counts = derive.bucket_increases(window, S.INTER_TOKEN_LATENCY, rate_window=2.0)
    np.testing.assert_allclose(counts[2:], [[12, 20, 20]] * 4)
    p50 = histogram_quantile_rows(0.5, bounds, counts)
    # rank 10 of 20 in (0, 0.05] holding 12: 0.05 * 10/12
    np.testing.assert_allclose(p50[2:], 0.05 * 10 / 12)


def test_live_frame_of_a_synthetic_engine():
    engine = SyntheticEngine(SCENARIOS["thrashing"], t0=1000.0, gpus=8)
    window = engine.window(1000.0, 1300.0)
    frame = derive.live_frame(window, {}, rate_window=10.0)
    assert len(frame) == 301
    assert len(frame.gpus) == 8 and [g.gpu for g in frame.gpus][:3] == ["0", "1", "2"]
    # Counters sampled each second: the rates are the simulated ones.
    np.testing.assert_allclose(frame.preemption_rate[20:], 0.8, rtol=1e-9)
    np.testing.assert_allclose(frame.kv_to_gpu_rate[20:], 2e9, rtol=1e-9)
    np.testing.assert_allclose(frame.pcie_rx[20:], 8 * (2e9 / 8 + 1e8))
    # The mean from _sum/_count is the simulated mean ITL; p50 of a log-normal is close to it.
    kv = np.clip(SCENARIOS["thrashing"].kv(window.timestamps - 1000.0), 0, 1)
    expected_mean = SCENARIOS["thrashing"].itl(kv)
    # Windowed over 10 s, so compare with the mean of the simulated ITL over the same window.
    assert np.nanmean(frame.itl_mean[20:]) == pytest.approx(np.mean(expected_mean[20:]), rel=0.02)
    assert np.all(frame.itl_p95[20:] >= frame.itl_p50[20:])
    assert frame.kv_capacity_tokens == 100_000
    np.testing.assert_allclose(frame.resident_tokens, kv * 100_000)
    assert np.all(np.isfinite(frame.decode_floor))


def test_live_frame_filters_by_target():
    window = SyntheticEngine(SCENARIOS["healthy"], t0=0.0, gpus=4).window(0.0, 60.0)
    frame = derive.live_frame(window, derive.parse_target("gpu=2"), 10.0)
    assert [g.gpu for g in frame.gpus] == ["2"]
    assert np.all(np.isfinite(frame.kv_usage))  # engine charts keep their engine
    np.testing.assert_allclose(frame.pcie_tx, 5e7)  # one GPU's PCIe, not four
    frame = derive.live_frame(window, derive.parse_target("engine=sglang"), 10.0)
    assert np.all(np.isnan(frame.kv_usage)) and len(frame.gpus) == 4


def test_parse_target_keeps_only_known_labels():
    assert derive.parse_target("engine=vllm&dp_rank=0&__name__=x&le=1") == {"engine": "vllm", "dp_rank": "0"}
    assert derive.parse_target("") == {}
    assert derive.parse_target(derive.format_target({"pod": "a b&c", "gpu": "3"})) == {"pod": "a b&c", "gpu": "3"}


def test_target_options_list_engines_and_gpus():
    window = SyntheticEngine(SCENARIOS["healthy"], t0=0.0, gpus=3).window(0.0, 5.0)
    options = derive.target_options(window.series.keys())
    assert [o.value for o in options] == ["", "gpu=0", "gpu=1", "gpu=2"]  # one engine: no engine entry
    two_engines = [*window.series.keys(), (S.KV_CACHE_USAGE, labels_of(engine="vllm", model_name="tiny", dp_rank="1"))]
    values = [o.value for o in derive.target_options(two_engines)]
    assert "engine=vllm&model_name=tiny" in values and "engine=vllm&model_name=tiny&dp_rank=1" in values


def test_slice_frame_keeps_identity_and_cuts_arrays():
    window = SyntheticEngine(SCENARIOS["healthy"], t0=0.0, gpus=2).window(0.0, 20.0)
    frame = derive.live_frame(window)
    part = derive.slice_frame(frame, frame.ts > 15.0)
    assert list(part.ts) == [16.0, 17.0, 18.0, 19.0, 20.0]
    assert len(part.gpus[1].dram) == 5 and part.kv_capacity_tokens == frame.kv_capacity_tokens


def test_source_health_from_window_and_status():
    ts = np.arange(3, dtype=float)
    window = Window(
        ts,
        {
            (S.SOURCE_UP, labels_of(source="engine")): np.array([1, 1, 0], float),
            (S.SOURCE_UP, labels_of(source="nvml")): np.array([0, 1, 1], float),
        },
    )
    health = derive.source_health(
        window,
        {
            "sources": {
                "engine": {"up": False, "last_error": "connection refused"},
                "dcgm": {"up": False, "last_error": "HTTP 500"},
            }
        },
    )
    assert [(h.name, h.up, h.error) for h in health] == [
        ("dcgm", False, "HTTP 500"),
        ("engine", False, "connection refused"),
        ("nvml", True, ""),
    ]


def test_every_rules_verdict_has_a_severity():
    from kvdoctor.rules.verdicts import VERDICTS

    ranked = sorted(VERDICTS, key=derive.severity, reverse=True)
    assert (
        ranked[0] == "kv_thrashing"
        and ranked[-1] == "idle"
        and len(set(map(derive.severity, VERDICTS))) == len(VERDICTS)
    )
