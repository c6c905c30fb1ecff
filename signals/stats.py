"""Windowed statistics over columnar series, computed the way Prometheus computes them.

The decision tree runs twice, in Python and as PromQL alert rules, and both must reach the same
verdict on the same samples. So the functions here follow Prometheus 2.x's own arithmetic
(promql/functions.go, promql/quantile.go), vectorised over rows with numpy:

- ``increase`` / ``rate``: counter resets handled (a drop means the counter restarted from 0),
  extrapolation to the range boundaries exactly as ``extrapolatedRate``;
- ``quantile_over_time``: the same interpolation as ``quantile()``;
- ``histogram_quantile``: ``bucketQuantile`` on the buckets' increases.

Input layout: ``ts`` is a (n,) array of Unix seconds, ``values`` a (rows, n) array with NaN where a
series had no sample (NaN never stands for a real value here). Results are NaN where Prometheus
would return no sample.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from itertools import accumulate

import numpy as np

__all__ = [
    "bucket_quantile",
    "corrected_counter",
    "counter_deltas",
    "counter_rate",
    "deriv",
    "forward_fill",
    "histogram_quantile",
    "increase",
    "increase_complete",
    "observations_over",
    "quantile_of_complete",
    "quantile_of_sorted",
    "quantile_over_time",
    "rate",
    "sorted_bucket_quantile",
    "theil_sen_slope",
    "windowed_increase",
]


def _rows(values: np.ndarray) -> np.ndarray:
    v = np.asarray(values, dtype=float)
    return v[np.newaxis, :] if v.ndim == 1 else v


def forward_fill(values: np.ndarray) -> np.ndarray:
    """Each NaN replaced by the last value before it in its row (leading NaNs stay NaN)."""
    v = _rows(values)
    if v.size == 0:
        return v.copy()
    present = ~np.isnan(v)
    if present.all():  # nothing to fill
        return v.copy()
    idx = np.where(present, np.arange(v.shape[1])[np.newaxis, :], 0)
    np.maximum.accumulate(idx, axis=1, out=idx)
    out = np.take_along_axis(v, idx, axis=1)
    # positions before a row's first sample picked column 0, which may itself be NaN or a later value
    seen = np.maximum.accumulate(present, axis=1)
    out[~seen] = np.nan
    return out


def increase(
    ts: np.ndarray, values: np.ndarray, range_start: float, range_end: float, is_rate: bool = False
) -> np.ndarray:
    """Prometheus ``increase(x[range])`` (or ``rate`` with ``is_rate``) per row over the samples given.

    ``range_start``/``range_end`` are the selector's boundaries (for ``x[60s]`` at time t: t-60, t);
    the samples passed should be those inside it. Rows with fewer than two samples give NaN.

    Without a gap anywhere, ``increase_complete`` computes it. Its counter-reset correction sums
    the same terms one column shorter, which can move the last bit for a row with three or more
    non-integral resets -- so a row's result depends on whether another row has a gap.
    """
    v = _rows(values)
    ts = np.asarray(ts, dtype=float)
    rows, n = v.shape
    if n < 2 or rows == 0:
        return np.full(rows, np.nan)
    present = ~np.isnan(v)
    if present.all():  # the common case: every series sampled every cycle
        return increase_complete(ts, v, range_start, range_end, is_rate)
    out = np.full(rows, np.nan)
    count = present.sum(axis=1)
    ok = count >= 2
    if not ok.any():
        return out
    cols = np.arange(n)
    first_i = np.where(present, cols, n).min(axis=1)
    last_i = np.where(present, cols, -1).max(axis=1)
    safe_first = np.minimum(first_i, n - 1)
    safe_last = np.maximum(last_i, 0)
    first_v = v[np.arange(rows), safe_first]
    last_v = v[np.arange(rows), safe_last]
    # Counter resets between consecutive *present* samples: a drop adds the value before it.
    filled = forward_fill(v)
    prev = np.empty_like(filled)
    prev[:, 0] = np.nan
    prev[:, 1:] = filled[:, :-1]
    with np.errstate(invalid="ignore"):
        drops = present & ~np.isnan(prev) & (v < prev)
    correction = np.where(drops, prev, 0.0).sum(axis=1)
    result = last_v - first_v + correction

    first_t = ts[safe_first]
    last_t = ts[safe_last]
    duration_to_start = first_t - range_start
    duration_to_end = range_end - last_t
    sampled = last_t - first_t
    with np.errstate(invalid="ignore", divide="ignore"):
        average = sampled / (count - 1)
        # Counters cannot go below zero: do not extrapolate past the counter's zero point.
        to_zero = sampled * (first_v / result)
        clamp = (result > 0) & (first_v >= 0) & (to_zero < duration_to_start)
        duration_to_start = np.where(clamp, to_zero, duration_to_start)
        threshold = average * 1.1
        interval = sampled.copy()
        interval += np.where(duration_to_start < threshold, duration_to_start, average / 2)
        interval += np.where(duration_to_end < threshold, duration_to_end, average / 2)
        result = result * (interval / sampled)
        if is_rate:
            result = result / (range_end - range_start)
    ok &= sampled > 0
    out[ok] = result[ok]
    return out


def increase_complete(
    ts: np.ndarray, v: np.ndarray, range_start: float, range_end: float, is_rate: bool = False
) -> np.ndarray:
    """``increase`` for rows (rows, n >= 2) without gaps: every row shares its first and last
    timestamps, so the extrapolation's durations are scalars. Row by row: a row's result depends
    on that row alone (a row with gaps gets a meaningless value and leaves the others alone)."""
    rows, n = v.shape
    first_t, last_t = float(ts[0]), float(ts[-1])
    sampled = last_t - first_t
    if not sampled > 0:
        return np.full(rows, np.nan)
    first_v = v[:, 0]
    prev = v[:, :-1]
    correction = np.where(v[:, 1:] < prev, prev, 0.0).sum(axis=1)
    result: np.ndarray = v[:, -1] - first_v + correction
    duration_to_start = first_t - range_start
    duration_to_end = range_end - last_t
    average = sampled / (n - 1)
    threshold = average * 1.1
    half = average / 2
    end_part = duration_to_end if duration_to_end < threshold else half
    # Counters cannot go below zero: do not extrapolate past the counter's zero point. (The zero
    # point is never after the first sample, so only a range starting before it can clamp.)
    clamp = None
    if duration_to_start > 0:
        with np.errstate(invalid="ignore", divide="ignore"):
            to_zero = sampled * (first_v / result)
            clamp = (result > 0) & (first_v >= 0) & (to_zero < duration_to_start)
    interval: np.ndarray | float  # per row where the zero point clamps, else one for every row
    if clamp is not None and clamp.any():
        start_part = np.where(clamp, to_zero, duration_to_start)
        interval = sampled + np.where(start_part < threshold, start_part, half)
        interval += end_part
        result = result * (interval / sampled)
    else:  # the same interval for every row
        interval = sampled + (duration_to_start if duration_to_start < threshold else half)
        interval += end_part
        result = result * (interval / sampled)
    if is_rate:
        with np.errstate(invalid="ignore", divide="ignore"):
            result = result / (range_end - range_start)
    return result


def rate(ts: np.ndarray, values: np.ndarray, range_start: float, range_end: float) -> np.ndarray:
    """Prometheus ``rate(x[range])`` per row: ``increase`` divided by the range in seconds."""
    return increase(ts, values, range_start, range_end, is_rate=True)


def deriv(ts: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Prometheus ``deriv(x[range])`` per row: the slope (per second) of the least-squares line
    through the row's samples; NaN for a row with fewer than two."""
    v = _rows(values)
    out = np.full(v.shape[0], np.nan)
    t = np.asarray(ts, dtype=float)
    for i, row in enumerate(v):
        present = ~np.isnan(row)
        if present.sum() < 2:
            continue
        x = t[present] - t[present][0]  # Prometheus regresses on times relative to one sample too
        y = row[present]
        dx = x - x.mean()
        denominator = float(np.dot(dx, dx))
        if denominator > 0:
            out[i] = float(np.dot(dx, y - y.mean())) / denominator
    return out


def quantile_over_time(q: float, values: np.ndarray) -> np.ndarray:
    """Prometheus ``quantile_over_time(q, x[range])`` per row (NaN for a row without samples)."""
    return quantile_of_sorted(q, np.sort(_rows(values), axis=1))


def _outside(q: float, rows: int) -> np.ndarray | None:
    """The answer when it does not depend on the samples: no rows, or ``q`` outside [0, 1]."""
    if rows == 0:
        return np.empty(0)
    if q < 0:
        return np.full(rows, -math.inf)
    if q > 1:
        return np.full(rows, math.inf)
    return None


def quantile_of_sorted(q: float, srt: np.ndarray) -> np.ndarray:
    """``quantile_over_time`` on rows already sorted (``np.sort(values, axis=1)``: NaN last), so
    that several quantiles can share one sort."""
    rows, n = srt.shape
    fixed = _outside(q, rows)
    if fixed is not None:
        return fixed
    count = (~np.isnan(srt)).sum(axis=1)
    out = np.full(rows, np.nan)
    ok = count > 0
    if not ok.any() or n == 0:
        return out
    if ok.all() and (count == n).all():
        return quantile_of_complete(q, srt)
    rank = q * (count - 1.0)
    lower = np.maximum(0.0, np.floor(rank))
    upper = np.minimum(count - 1.0, lower + 1.0)
    weight = rank - np.floor(rank)
    lo_i = np.clip(lower, 0, n - 1).astype(int)[:, np.newaxis]
    hi_i = np.clip(upper, 0, n - 1).astype(int)[:, np.newaxis]
    lo_v = np.take_along_axis(srt, lo_i, axis=1)[:, 0]
    hi_v = np.take_along_axis(srt, hi_i, axis=1)[:, 0]
    res = lo_v * (1 - weight) + hi_v * weight
    out[ok] = res[ok]
    return out


def quantile_of_complete(q: float, srt: np.ndarray) -> np.ndarray:
    """``quantile_of_sorted`` for sorted rows without gaps (at least one column): the same
    positions and weight in every row, so the interpolation's scalars are computed once."""
    rows, n = srt.shape
    fixed = _outside(q, rows)
    if fixed is not None:
        return fixed
    rank = q * (n - 1.0)
    floor = math.floor(rank)
    lower = max(0.0, floor)
    upper = min(n - 1.0, lower + 1.0)
    weight = rank - floor
    out: np.ndarray = srt[:, int(lower)] * (1 - weight) + srt[:, int(upper)] * weight
    return out


def histogram_quantile_rows(q: float, bounds: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """PromQL ``histogram_quantile`` for every row of cumulative bucket ``counts`` (n, B), ``bounds``
    sorted and ending in +Inf: one call for a whole time series of histograms (the dashboard's)."""
    n = counts.shape[0]
    out = np.full(n, np.nan)
    if counts.shape[1] < 2 or not np.isinf(bounds[-1]):
        return out  # PromQL needs at least one finite bucket and the +Inf bucket
    rows = ~np.any(np.isnan(counts), axis=1)
    c = np.maximum.accumulate(np.where(np.isnan(counts), 0.0, counts), axis=1)  # enforce monotone
    total = c[:, -1]
    rows &= total > 0
    if not np.any(rows):
        return out
    rank = q * total
    idx = np.argmax(c >= rank[:, None], axis=1)
    upper = bounds[idx]
    finite_top = bounds[-2]
    lower = np.where(idx > 0, bounds[np.maximum(idx - 1, 0)], 0.0)
    below = np.where(idx > 0, c[np.arange(n), np.maximum(idx - 1, 0)], 0.0)
    in_bucket = c[np.arange(n), idx] - below
    with np.errstate(invalid="ignore", divide="ignore"):
        value = lower + (upper - lower) * np.where(in_bucket > 0, (rank - below) / in_bucket, 1.0)
    value = np.where(np.isinf(upper), finite_top, value)
    value = np.where((idx == 0) & (bounds[0] <= 0), bounds[0], value)
    out[rows] = value[rows]
    return out


def histogram_quantile(q: float, upper_bounds: np.ndarray, counts: np.ndarray) -> float:
    """Prometheus ``histogram_quantile`` on one histogram: cumulative ``counts`` per ``le`` bound
    (typically each bucket's increase over the window). NaN without a +Inf bucket or observations."""
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    ub = np.asarray(upper_bounds, dtype=float)
    c = np.asarray(counts, dtype=float)
    keep = ~np.isnan(c)
    ub, c = ub[keep], c[keep]
    if len(ub) == 0:
        return math.nan
    order = np.argsort(ub, kind="stable")
    ub, c = ub[order], c[order]
    if not math.isinf(ub[-1]) or ub[-1] < 0:
        return math.nan
    # coalesce buckets with the same bound (several series of one histogram)
    uniq, inverse = np.unique(ub, return_inverse=True)
    if len(uniq) != len(ub):
        c = np.bincount(inverse, weights=c)
        ub = uniq
    c = np.maximum.accumulate(c)  # ensureMonotonic
    if len(ub) < 2:
        return math.nan
    observations = c[-1]
    if observations == 0:
        return math.nan
    return float(histogram_quantile_rows(q, ub, c[np.newaxis, :])[0])


def bucket_quantile(q: float, upper_bounds: list[float], counts: list[float]) -> float:
    """``histogram_quantile`` in plain Python floats, for the few buckets of one histogram where
    numpy's per-call overhead would dominate. Same arithmetic step by step, so the same result to
    the bit (tests/rules/test_rules_fast_paths.py holds the two together)."""
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    pairs = [(b, c) for b, c in zip(upper_bounds, counts, strict=False) if c == c]  # drop absent buckets
    if not pairs:
        return math.nan
    if any(b != b for b, _ in pairs):
        return math.nan  # numpy sorts a NaN bound last, where +Inf must be
    pairs.sort(key=lambda p: p[0])  # stable, like argsort(kind="stable")
    if not math.isinf(pairs[-1][0]) or pairs[-1][0] < 0:
        return math.nan
    bounds = [b for b, _ in pairs]
    cum = [c for _, c in pairs]
    if any(bounds[i] == bounds[i - 1] for i in range(1, len(bounds))):
        # coalesce equal bounds (several series of one histogram), summing like np.bincount
        bounds, cum = [], []
        for b, c in pairs:
            if bounds and bounds[-1] == b:
                cum[-1] += c
            else:
                bounds.append(b)
                cum.append(0.0 + c)
    return sorted_bucket_quantile(q, bounds, cum)


def sorted_bucket_quantile(q: float, bounds: list[float], counts: list[float]) -> float:
    """``bucket_quantile`` once its buckets are prepared: ``bounds`` strictly increasing and ending
    in +Inf, ``counts`` without NaN."""
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    if len(bounds) < 2:
        return math.nan
    cum = list(accumulate(counts, max))  # ensureMonotonic (max keeps the running value on ties)
    total = cum[-1]
    if not total > 0:
        return math.nan
    rank = q * total
    idx = bisect_left(cum, rank)  # the first bucket reaching the rank (argmax's 0 if none does)
    if idx == len(cum):
        idx = 0
    upper = bounds[idx]
    if idx == 0 and bounds[0] <= 0:
        return float(bounds[0])
    if math.isinf(upper):
        return float(bounds[-2])
    lower = bounds[idx - 1] if idx > 0 else 0.0
    below = cum[idx - 1] if idx > 0 else 0.0
    in_bucket = cum[idx] - below
    return float(lower + (upper - lower) * ((rank - below) / in_bucket if in_bucket > 0 else 1.0))


def corrected_counter(values: np.ndarray) -> np.ndarray:
    """One counter with resets undone (each drop adds the value before it, as ``increase`` and
    ``counter_deltas`` count a reset), NaN where absent."""
    out = np.full(len(values), np.nan)
    valid = ~np.isnan(values)
    v = values[valid]
    if len(v) == 0:
        return out
    resets = v[1:] < v[:-1]
    correction = np.concatenate(([0.0], np.cumsum(np.where(resets, v[:-1], 0.0))))
    out[valid] = v + correction
    return out


def windowed_increase(ts: np.ndarray, values: np.ndarray, window: float) -> tuple[np.ndarray, np.ndarray]:
    """(increase, span) of one counter: for each point, the counter's increase since the oldest sample at most
    ``window`` seconds older, and that span in seconds. NaN where the point is absent or there is
    no earlier sample in the window. Counter resets are handled."""
    inc = np.full(len(ts), np.nan)
    span = np.full(len(ts), np.nan)
    corrected = corrected_counter(np.asarray(values, dtype=float))
    valid = np.flatnonzero(~np.isnan(corrected))
    if len(valid) < 2:
        return inc, span
    vt, vc = ts[valid], corrected[valid]
    first = np.searchsorted(vt, vt - window - 1e-9, side="left")
    d_t = vt - vt[first]
    d_v = vc - vc[first]
    has_span = d_t > 0
    inc[valid[has_span]] = d_v[has_span]
    span[valid[has_span]] = d_t[has_span]
    return inc, span


def counter_rate(ts: np.ndarray, values: np.ndarray, window: float) -> np.ndarray:
    """One counter's per-second rate over the trailing window at each point (NaN where undefined;
    no extrapolation: what a chart of the last samples shows, not PromQL's ``rate``)."""
    inc, span = windowed_increase(ts, values, window)
    with np.errstate(invalid="ignore", divide="ignore"):
        out: np.ndarray = inc / span
    return out


def counter_deltas(values: np.ndarray) -> np.ndarray:
    """Per-interval increments of counters (rows), counter resets handled: a drop counts the new
    value (the counter restarted from zero). Absent samples are bridged; shape (rows, n-1)."""
    v = forward_fill(values)
    if v.shape[1] < 2:
        return np.zeros((v.shape[0], 0))
    d = np.diff(v, axis=1)
    with np.errstate(invalid="ignore"):
        d = np.where(d < 0, v[:, 1:], d)
    if np.isfinite(d).all():  # what nan_to_num would return, without its overhead
        return d
    return np.nan_to_num(d, nan=0.0)


def theil_sen_slope(x: np.ndarray, y: np.ndarray, max_points: int = 200) -> float:
    """Median of pairwise slopes (robust to outliers such as a preemption stall); NaN if undefined.
    Long inputs are thinned evenly to ``max_points`` to bound the O(n^2) pairs."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    keep = ~(np.isnan(x) | np.isnan(y))
    x, y = x[keep], y[keep]
    if len(x) > max_points:
        idx = np.linspace(0, len(x) - 1, max_points).astype(int)
        x, y = x[idx], y[idx]
    if len(x) < 2:
        return math.nan
    i, j = np.triu_indices(len(x), k=1)
    dx = x[j] - x[i]
    valid = dx != 0
    if not valid.any():
        return math.nan
    return float(np.median((y[j] - y[i])[valid] / dx[valid]))


def observations_over(threshold: float, upper_bounds: list[float], counts: list[float]) -> float:
    """How many observations of one histogram (cumulative ``counts`` per ``le`` bound, +Inf among
    them) were over ``threshold``, reading the bucket that holds it as ``histogram_quantile``
    interpolates: linearly, from 0 for the first bucket. So the share over the threshold is over a
    fraction f exactly where the histogram's (1 - f) quantile is over it: the SLO burn rates count
    with this what the quantile compared. A threshold at or past the highest finite bound counts
    nothing (the quantile never exceeds that bound). NaN without a +Inf bucket.

    With the buckets and the threshold fixed, the result is a counter: every term grows with the
    buckets (``exporter/slo_counters.py`` publishes it)."""
    pairs = sorted((b, c) for b, c in zip(upper_bounds, counts, strict=True) if c == c and b == b)
    if not pairs or not math.isinf(pairs[-1][0]):
        return math.nan
    cum = list(accumulate((c for _, c in pairs), max))
    total = cum[-1]
    lower_bound, lower_count = 0.0, 0.0
    for (bound, _), count in zip(pairs, cum, strict=True):
        if math.isinf(bound):
            return 0.0  # the threshold is past every finite bound
        if bound >= threshold:
            if bound <= lower_bound:  # a first bucket at or below 0: nothing to interpolate
                return total - count
            share = (threshold - lower_bound) / (bound - lower_bound)
            return total - (lower_count + (count - lower_count) * max(0.0, share))
        lower_bound, lower_count = bound, count
    return 0.0
