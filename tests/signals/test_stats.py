"""Windowed statistics: Prometheus' rate/increase, quantile_over_time and histogram_quantile."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvdoctor.signals import stats

NAN = math.nan


def ts(n: int, step: float = 1.0) -> np.ndarray:
    return np.arange(n) * step


class TestIncrease:
    def test_steady_counter_over_an_aligned_range_is_its_delta(self):
        values = np.array([100.0, 110, 120, 130, 140])
        assert stats.increase(ts(5), values, 0, 4)[0] == 40
        assert stats.rate(ts(5), values, 0, 4)[0] == 10

    def test_counter_history_before_the_window_does_not_count(self):
        values = np.full(61, 57.0)  # 57 preemptions long ago, none now
        assert stats.increase(ts(61), values, 0, 60)[0] == 0

    def test_reset_counts_the_value_after_the_restart(self):
        # 50 -> 60, restart, 0 -> 5: the increase is 10 + 5, never negative
        values = np.array([50.0, 55, 60, 0, 5])
        assert stats.increase(ts(5), values, 0, 4)[0] == 15

    def test_reset_is_not_mistaken_for_a_burst(self):
        values = np.array([1000.0, 1000, 1000, 0, 0, 0])
        assert stats.increase(ts(6), values, 0, 5)[0] == 0

    def test_gaps_are_bridged_between_present_samples(self):
        values = np.array([10.0, NAN, NAN, 40, 50])
        assert stats.increase(ts(5), values, 0, 4)[0] == 40

    def test_reset_across_a_gap(self):
        values = np.array([10.0, 20, NAN, 3, 4])
        assert stats.increase(ts(5), values, 0, 4)[0] == pytest.approx(10 + 4)

    def test_fewer_than_two_samples_is_no_result(self):
        assert math.isnan(stats.increase(ts(3), np.array([NAN, 5.0, NAN]), 0, 2)[0])

    def test_extrapolates_to_the_range_like_prometheus(self):
        # Samples at 10..50 s (spacing 10 s) in a [0, 80] range: the start is within 1.1 x the
        # spacing, so Prometheus extends to it (+10 s); the end is 30 s away, so only half a
        # spacing (+5 s): 40 s sampled -> 55 s.
        t = np.array([10.0, 20, 30, 40, 50])
        values = np.array([100.0, 110, 120, 130, 140])
        assert stats.increase(t, values, 0, 80)[0] == pytest.approx(40 * 55 / 40)
        assert stats.rate(t, values, 0, 80)[0] == pytest.approx(40 * 55 / 40 / 80)

    def test_extrapolation_stops_at_the_counter_zero_point(self):
        # A counter that started at 0 shortly before the first sample cannot have been negative.
        t = np.array([5.0, 6, 7])
        values = np.array([1.0, 2, 3])
        # sampled 2 s, increase 2; zero point 1 s before the first sample (< 5 s to the start)
        assert stats.increase(t, values, 4.5, 7)[0] == pytest.approx(2 * (2 + 0.5) / 2)

    def test_rows_are_independent(self):
        values = np.array([[0.0, 1, 2], [5, 5, 5], [NAN, NAN, 1]])
        out = stats.increase(ts(3), values, 0, 2)
        assert out[0] == 2 and out[1] == 0 and math.isnan(out[2])


class TestQuantileOverTime:
    def test_median_of_odd_and_even_counts(self):
        assert stats.quantile_over_time(0.5, np.array([3.0, 1, 2]))[0] == 2
        assert stats.quantile_over_time(0.5, np.array([4.0, 1, 2, 3]))[0] == 2.5

    def test_ignores_absent_samples(self):
        assert stats.quantile_over_time(0.9, np.array([NAN, 1.0, NAN, 2.0]))[0] == pytest.approx(1.9)

    def test_high_quantile_sees_the_ceiling_through_oscillation(self):
        # vLLM under preemption: usage oscillates, the pool is still exhausted
        kv = np.tile([0.78, 0.99, 0.84, 0.97], 15)
        assert stats.quantile_over_time(0.9, kv)[0] >= 0.97
        assert np.mean(kv) < 0.9

    def test_empty_row_is_no_result(self):
        assert math.isnan(stats.quantile_over_time(0.5, np.array([[NAN, NAN]]))[0])

    def test_out_of_range_quantiles_follow_prometheus(self):
        assert stats.quantile_over_time(-1, np.array([1.0]))[0] == -math.inf
        assert stats.quantile_over_time(2, np.array([1.0]))[0] == math.inf


class TestHistogramQuantile:
    bounds = np.array([0.025, 0.05, 0.1, math.inf])

    def test_interpolates_inside_the_bucket(self):
        # 100 observations: 50 <= 25 ms, 90 <= 50 ms, 100 <= 100 ms
        counts = np.array([50.0, 90, 100, 100])
        assert stats.histogram_quantile(0.5, self.bounds, counts) == pytest.approx(0.025)
        assert stats.histogram_quantile(0.95, self.bounds, counts) == pytest.approx(0.05 + 0.05 * 0.5)

    def test_lowest_bucket_starts_at_zero(self):
        assert stats.histogram_quantile(0.5, self.bounds, np.array([100.0, 100, 100, 100])) == pytest.approx(0.0125)

    def test_highest_bucket_returns_the_last_finite_bound(self):
        counts = np.array([0.0, 0, 0, 10])
        assert stats.histogram_quantile(0.5, self.bounds, counts) == 0.1

    def test_no_observations_or_no_inf_bucket_is_nan(self):
        assert math.isnan(stats.histogram_quantile(0.5, self.bounds, np.zeros(4)))
        assert math.isnan(stats.histogram_quantile(0.5, self.bounds[:3], np.array([1.0, 2, 3])))

    def test_non_monotonic_counts_are_fixed_up(self):
        counts = np.array([50.0, 40, 100, 100])  # a scrape artefact
        assert stats.histogram_quantile(0.5, self.bounds, counts) == pytest.approx(0.025)

    def test_same_bound_from_several_series_is_summed(self):
        bounds = np.array([0.05, 0.05, math.inf, math.inf])
        counts = np.array([30.0, 30, 50, 50])
        assert stats.histogram_quantile(0.5, bounds, counts) == pytest.approx(0.05 * 50 / 60)


def test_counter_deltas_handle_resets_and_gaps():
    d = stats.counter_deltas(np.array([[10.0, 12, NAN, 15, 2, 4]]))
    assert d.tolist() == [[2, 0, 3, 2, 2]]


def test_forward_fill_keeps_leading_gaps():
    out = stats.forward_fill(np.array([[NAN, 1.0, NAN, 3]]))
    assert math.isnan(out[0, 0]) and out[0, 1:].tolist() == [1, 1, 3]


def test_theil_sen_ignores_a_stall():
    x = np.arange(60.0)
    y = 0.02 + 0.001 * x
    y[30] = 40.0  # one preemption stall
    assert stats.theil_sen_slope(x, y) == pytest.approx(0.001)
    assert math.isnan(stats.theil_sen_slope(np.array([1.0]), np.array([1.0])))


@pytest.mark.parametrize(
    "values, expected",
    [
        ([1, 2, 3], [1, 2, 3]),
        ([5, 7, 2, 4], [5, 7, 9, 11]),  # reset to 2: 7 was lost, so add it
        ([5, 7, 2, 1, 3], [5, 7, 9, 10, 12]),  # two resets
        ([np.nan, 3, np.nan, 5], [np.nan, 3, np.nan, 5]),  # gaps stay gaps
    ],
)
def test_corrected_counter_undoes_resets(values, expected):
    np.testing.assert_allclose(stats.corrected_counter(np.array(values, float)), expected, equal_nan=True)


def test_windowed_increase_counts_across_a_reset_and_spans_the_window():
    ts = np.arange(6, dtype=float)
    values = np.array([0, 10, 20, 5, 15, 25], float)  # reset between t=2 and t=3: +5 counts
    inc, span = stats.windowed_increase(ts, values, window=2.0)
    np.testing.assert_allclose(inc, [np.nan, 10, 20, 15, 15, 20], equal_nan=True)
    np.testing.assert_allclose(span, [np.nan, 1, 2, 2, 2, 2], equal_nan=True)
    np.testing.assert_allclose(stats.counter_rate(ts, values, 2.0)[2:], [10, 7.5, 7.5, 10])


@pytest.mark.parametrize("values", [[5, 7, 2, 4], [0, 10, 20, 5, 15, 25], [3, 3, 0, 0, 9, 1]])
def test_counter_deltas_and_the_corrected_counter_count_a_reset_alike(values):
    v = np.array(values, float)
    np.testing.assert_allclose(stats.counter_deltas(v)[0], np.diff(stats.corrected_counter(v)))
