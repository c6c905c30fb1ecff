"""The SLO counters the exporter keeps from the engine's histograms (exporter/slo_counters.py): they
start at 0 with the exporter, grow by the observations over the SLO, read the bucket holding the SLO
as histogram_quantile interpolates, survive an engine restart, and never jump on rounding."""

from __future__ import annotations

import pytest

from kvdoctor.exporter.slo_counters import SloCounters, slo_counts
from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.stats import bucket_quantile, observations_over
from kvdoctor.signals.window import labels_of

ENGINE = {"engine": "vllm", "model_name": "m", "pod": "p"}
BOUNDS = ("0.01", "0.05", "0.1", "0.5", "+Inf")
KEY = (S.TOKENS_OVER_ITL_SLO, labels_of(ENGINE))


def _page(cumulative: tuple[float, ...]) -> dict:
    name = S.INTER_TOKEN_LATENCY + "_bucket"
    return {(name, labels_of(ENGINE, le=le)): float(c) for le, c in zip(BOUNDS, cumulative, strict=True)}


def test_counts_from_zero_then_the_observations_over_the_slo():
    counters = SloCounters(slo_counts(0.05, None))
    assert counters.samples(_page((10, 20, 30, 40, 50))) == {KEY: 0.0}
    # 10 more observations, all in the 0.1-0.5 s bucket: all over a 50 ms SLO
    assert counters.samples(_page((10, 20, 30, 50, 60))) == {KEY: 10.0}
    # 10 more in the 0.01-0.05 s bucket: none over it
    assert counters.samples(_page((10, 30, 40, 60, 70))) == {KEY: 10.0}


def test_the_bucket_holding_the_slo_counts_in_proportion():
    """A 75 ms SLO sits half-way through the 0.05-0.1 s bucket: half its observations are over it,
    as histogram_quantile interpolates (the p-quantile is over the SLO exactly where more than 1 - p
    of the observations are)."""
    counters = SloCounters(slo_counts(0.075, None))
    counters.samples(_page((0, 0, 0, 0, 0)))
    assert counters.samples(_page((0, 0, 10, 10, 10))) == {KEY: pytest.approx(5.0)}
    bounds, counts = [0.01, 0.05, 0.1, 0.5, float("inf")], [0, 0, 10, 10, 10]
    assert observations_over(0.075, bounds, counts) == pytest.approx(5.0)
    assert bucket_quantile(0.49, bounds, counts) < 0.075 < bucket_quantile(0.51, bounds, counts)


def test_an_engine_restart_adds_what_it_counted_since():
    counters = SloCounters(slo_counts(0.05, None))
    counters.samples(_page((0, 0, 0, 100, 100)))
    assert counters.samples(_page((0, 0, 0, 150, 150))) == {KEY: 50.0}
    assert counters.samples(_page((0, 0, 0, 7, 7))) == {KEY: 57.0}  # restarted: 7 since


def test_rounding_in_an_unchanged_histogram_is_no_restart():
    """Re-reading the same buckets can interpolate a hair lower; that must add nothing, not the whole
    count over the SLO (which read on the rule engine as a burst of slow tokens)."""
    counters = SloCounters(slo_counts(0.07, None))
    counters.samples(_page((1e9, 2e9, 3e9, 4e9, 5e9)))
    before = counters.samples(_page((1e9, 2e9, 3e9, 4e9 + 1, 5e9 + 1)))
    for _ in range(5):
        assert counters.samples(_page((1e9, 2e9, 3e9, 4e9 + 1, 5e9 + 1))) == before


def test_a_ttft_counter_only_with_a_ttft_slo():
    assert [c.counter for c in slo_counts(0.1, None)] == [S.TOKENS_OVER_ITL_SLO]
    assert [c.counter for c in slo_counts(0.1, 2.0)] == [S.TOKENS_OVER_ITL_SLO, S.REQUESTS_OVER_TTFT_SLO]
