"""The fast paths give, to the bit, what the general paths give.

``diagnose`` runs every second on the exporter, so its statistics take shortcuts: a
``WindowView`` computes each statistic once for a batch of series instead of once per selector,
rows without gaps skip the gap handling, histogram quantiles run in plain Python floats. Each
shortcut is checked here against the general path on windows with gaps, counter resets (several,
non-integral), missing and all-NaN series, shuffled series, duplicate buckets and unsorted
timestamps. Equality is exact (same bits), not approximate.
"""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest

from kvdoctor.rules import diagnosis, features
from kvdoctor.rules.action_checks import LedgerFacts
from kvdoctor.rules.context import Context
from kvdoctor.rules.features import FEATURES
from kvdoctor.rules.knee import detect_knee
from kvdoctor.rules.thresholds import Thresholds
from kvdoctor.rules.view import Selector, WindowView, _Buckets, nanmax, nansum, parse_le, part_range
from kvdoctor.signals import stats
from kvdoctor.signals.vocabulary import GPU_DRAM_PEAK_BANDWIDTH, INTER_TOKEN_LATENCY, KV_CACHE_CAPACITY, KV_CACHE_USAGE
from kvdoctor.signals.window import Window
from tests.support.scenarios import SCENARIOS

NAN = math.nan


def bits(value) -> tuple:
    """Exact identity of floats (and of arrays of them): -0.0 differs from 0.0, NaN equals NaN."""
    values = np.atleast_1d(np.asarray(value, dtype=float)).ravel()
    return tuple(struct.pack("<d", v) if not math.isnan(v) else b"nan" for v in values.tolist())


# ------------------------------------------------------------------ the reference view


class ReferenceView:
    """The straightforward evaluation: each selector's series stacked on their own and each
    statistic called on them (what ``WindowView`` did before it batched)."""

    def __init__(self, window: Window, recent_seconds: float):
        self.window = window
        self.recent_seconds = float(recent_seconds)
        self.ts = window.timestamps
        self.start = window.start
        self.end = window.end
        self._by_name: dict[str, list[tuple[dict, np.ndarray]]] = {}
        for (name, labels), values in window.series.items():
            self._by_name.setdefault(name, []).append((dict(labels), values))

    def __len__(self) -> int:
        return len(self.ts)

    def has(self, name: str) -> bool:
        return any(not np.isnan(v).all() for _, v in self._by_name.get(name, ()))

    def labels(self, name: str) -> list[dict]:
        return [labels for labels, _ in self._by_name.get(name, ())]

    def rows(self, sel: Selector, part: str = "all"):
        start, end = self.start, self.end
        ts = self.ts
        mask = None
        if part != "all" and len(ts):
            start, end = part_range(part, start, end, self.recent_seconds)
            mask = (ts >= start) & (ts <= end)
            ts = ts[mask]
        found = [(labels, values) for labels, values in self._by_name.get(sel.name, ()) if sel.matches(labels)]
        if found:
            arr = np.vstack([values for _, values in found])
            if mask is not None:
                arr = arr[:, mask]
        else:
            arr = np.empty((0, len(ts)))
        return [labels for labels, _ in found], arr, ts, start, end

    def rowwise(self, fn, sel: Selector, part: str = "all"):
        return fn(self.rows(sel, part)[1])

    def sum_rate(self, sel: Selector, part: str = "all") -> float:
        _, arr, ts, start, end = self.rows(sel, part)
        return reference_nansum(stats.rate(ts, arr, start, end))

    def sum_deriv(self, sel: Selector, part: str = "all") -> float:
        _, arr, ts, _, _ = self.rows(sel, part)
        return reference_nansum(stats.deriv(ts, arr)) if len(arr) else math.nan

    def sum_increase(self, sel: Selector, part: str = "all") -> float:
        _, arr, ts, start, end = self.rows(sel, part)
        return reference_nansum(stats.increase(ts, arr, start, end))

    def quantiles(self, sel: Selector, q: float, part: str = "all") -> np.ndarray:
        return stats.quantile_over_time(q, self.rows(sel, part)[1])

    def histogram_quantile(self, name: str, q: float, part: str = "all") -> float:
        labels, arr, ts, start, end = self.rows(Selector(name + "_bucket"), part)
        if not labels:
            return math.nan
        inc = stats.increase(ts, arr, start, end)
        bounds = np.array([parse_le(lb.get("le")) for lb in labels])
        keep = ~np.isnan(inc) & ~np.isnan(bounds)
        if not keep.any():
            return math.nan
        return stats.histogram_quantile(q, bounds[keep], inc[keep])


def reference_nansum(values: np.ndarray) -> float:
    present = values[~np.isnan(values)]
    return float(present.sum()) if len(present) else math.nan


def reference_nanmax(values: np.ndarray) -> float:
    present = values[~np.isnan(values)]
    return float(present.max()) if len(present) else math.nan


# -------------------------------------------------------------------------- windows


def resets(values: np.ndarray, rng: np.random.Generator, count: int) -> np.ndarray:
    """``count`` counter restarts to a non-integral value (their corrections do not add exactly)."""
    out = values.copy()
    for at in rng.integers(1, len(out), size=count):
        out[at:] = out[at:] - out[at] + rng.uniform(0, 3) * 1.37
    return out


def perturbed(window: Window, rng: np.random.Generator) -> Window:
    n = len(window)
    series = {}
    for key, values in window.series.items():
        v = values.copy()
        r = rng.random()
        if r < 0.08:
            continue  # the series is gone
        if n and r < 0.25:
            v[rng.random(n) < rng.uniform(0.05, 0.5)] = NAN
        elif n and r < 0.32:
            v[: rng.integers(0, n)] = NAN  # appeared late
        elif n and r < 0.39:
            v[rng.integers(0, n) :] = NAN  # vanished
        elif n > 3 and r < 0.6:
            v = resets(v, rng, int(rng.integers(1, 6)))
            if rng.random() < 0.3:
                v[rng.integers(0, n)] = NAN
        elif r < 0.63:
            v[:] = NAN
        series[key] = v
    keys = list(series)
    if rng.random() < 0.3:  # another series order: buckets no longer sorted by bound
        keys = [keys[i] for i in rng.permutation(len(keys))]
    return Window(window.timestamps.copy(), {k: series[k] for k in keys})


def unsorted(window: Window, rng: np.random.Generator) -> Window:
    """The same samples with the columns in another order (parts are then not contiguous)."""
    order = rng.permutation(len(window))
    return Window(window.timestamps[order], {k: v[order] for k, v in window.series.items()})


def windows() -> list[tuple[str, Window]]:
    rng = np.random.default_rng(20240611)
    out = []
    for i, scenario in enumerate(SCENARIOS):
        w = scenario.window()
        out.append((scenario.name, w))
        for j in range(1 + i % 2):
            out.append((f"{scenario.name}/perturbed{j}", perturbed(w, rng)))
        if i % 6 == 0:
            out.append((f"{scenario.name}/unsorted", unsorted(perturbed(w, rng), rng)))
            for keep in (k for k in (1, 2, 3) if k <= len(w.timestamps)):  # a scenario may be shorter
                out.append((f"{scenario.name}/last{keep}", w.slice(float(w.timestamps[-keep]), w.end)))
    out.append(("empty", Window.empty()))
    return out


ITL_BOUNDS = ("0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1.0", "2.5", "+Inf")


def multi_reset_window(gap: bool = True, restarts: int = 4) -> Window:
    """ITL buckets with several non-integral resets each. With a ``gap`` in one of them, the
    complete ones get other bits from ``stats.increase``'s general path than from its
    complete-rows path, so the batched view must keep to the path each selector's own rows would
    take; with many ``restarts``, the window's thirds hold several each, and numpy sums a row
    of the column-major array ``rows[:, mask]`` gives in another order than a row of the batch."""
    rng = np.random.default_rng(3)
    n = 61
    ts = np.arange(n, dtype=float) + 1_700_000_000.0
    engine = (("engine", "vllm"), ("model_name", "m"), ("pod", "p"))
    series = {}
    for i, le in enumerate(ITL_BOUNDS):
        values = resets(np.cumsum(rng.uniform(0, 100 * (i + 1), n)), rng, restarts)
        if gap and i == 7:
            values[20] = NAN
        series[(INTER_TOKEN_LATENCY + "_bucket", tuple(sorted((*engine, ("le", le)))))] = values
    series[(KV_CACHE_USAGE, engine)] = rng.uniform(0.2, 0.9, n)
    return Window(ts, series)


WINDOWS = [
    *windows(),
    ("multi_reset", multi_reset_window()),
    ("many_resets", multi_reset_window(gap=False, restarts=15)),
]
# for the slower, exhaustive comparison: a fifth of them, and every short or special one
SOME_WINDOWS = [
    (name, w)
    for i, (name, w) in enumerate(WINDOWS)
    if i % 5 == 0 or len(w) <= 3 or name in ("empty", "multi_reset", "many_resets")
]
THRESHOLDS = (Thresholds(), Thresholds(state_window_seconds=7.0, kv_usage_quantile=0.75, itl_quantile=0.5))


# ---------------------------------------------------------------------------- tests


@pytest.mark.parametrize("name, window", WINDOWS, ids=[name for name, _ in WINDOWS])
def test_batched_features_are_the_per_selector_ones(name, window):
    for t in THRESHOLDS:
        expected = features.compute_features(ReferenceView(window, t.state_window_seconds), t)
        for batches in (None, diagnosis._BATCHES):
            got = features.compute_features(WindowView(window, t.state_window_seconds, batches=batches), t)
            assert list(got) == list(expected)
            for feature in FEATURES:
                assert bits(got[feature]) == bits(expected[feature]), (feature, got[feature], expected[feature])


@pytest.mark.parametrize("name, window", SOME_WINDOWS, ids=[name for name, _ in SOME_WINDOWS])
def test_the_view_hands_out_what_the_reference_does(name, window):
    t = THRESHOLDS[1]
    view = WindowView(window, t.state_window_seconds, batches=diagnosis._BATCHES)
    ref = ReferenceView(window, t.state_window_seconds)
    names = {n for n, _ in window.series} | {"not_a_series"}
    for series_name in sorted(names):
        assert view.has(series_name) == ref.has(series_name)
        assert view.labels(series_name) == ref.labels(series_name)
        for part in ("all", "recent", "early", "late"):
            sel = Selector(series_name)
            got, want = view.rows(sel, part), ref.rows(sel, part)
            assert got[0] == want[0] and bits(got[2]) == bits(want[2]) and bits(got[3:]) == bits(want[3:])
            assert got[1].shape == want[1].shape and bits(got[1]) == bits(want[1])
            deltas = stats.counter_deltas
            assert bits(view.rowwise(deltas, sel, part)) == bits(ref.rowwise(deltas, sel, part))
            assert bits(view.sum_increase(sel, part)) == bits(ref.sum_increase(sel, part))
            assert bits(view.quantiles(sel, 0.9, part)) == bits(ref.quantiles(sel, 0.9, part))
    # what diagnose reads besides the features
    assert diagnosis._missing_signals(view) == diagnosis._missing_signals(ref)
    assert repr(diagnosis._knee(view, t)) == repr(diagnosis._knee(ref, t))
    assert repr(diagnosis._prefix_hit_ratio(view)) == repr(diagnosis._prefix_hit_ratio(ref))
    context = Context()
    values = features.compute_features(view, t)
    got = diagnosis._ledger_facts(view, context, values, t)
    want = reference_ledger_facts(ref, context)
    for field in ("peak_bandwidth", "gpus", "live_tokens", "capacity_tokens", "pcie_bandwidth"):
        assert repr(getattr(got, field)) == repr(getattr(want, field)), field


def reference_ledger_facts(view, ctx):
    """``_ledger_facts`` with plain NaN filtering and ``mean``."""
    spec = diagnosis._gpu_spec(view, ctx)
    peak = ctx.gpu_peak_bandwidth
    if not peak:
        measured = view.quantiles(Selector(GPU_DRAM_PEAK_BANDWIDTH), 0.5)
        measured = measured[~np.isnan(measured)]
        measured = measured[measured > 0]  # a broken gauge is no fact
        peak = float(measured.max()) if len(measured) else (spec.peak_bandwidth if spec else None)
    capacity = view.quantiles(Selector(KV_CACHE_CAPACITY), 0.5)
    capacity = capacity[~np.isnan(capacity)]
    usage = view.quantiles(Selector(KV_CACHE_USAGE), 0.5)
    usage = usage[~np.isnan(usage)]
    cap = float(capacity.sum()) if len(capacity) else None
    live = float(usage.mean()) * cap if cap is not None and len(usage) else None
    return LedgerFacts(
        model=ctx.model,
        kv_dtype=ctx.kv_dtype,
        peak_bandwidth=peak,
        gpus=diagnosis._gpu_count(view),
        live_tokens=live,
        capacity_tokens=cap,
        pcie_bandwidth=spec.pcie_bandwidth if spec else None,
    )


def test_the_reset_windows_tell_the_paths_apart():
    """Guards the guard: on these windows the shortcuts the view must not take would give other
    bits, so its agreement with the reference above is not an accident."""
    buckets = Selector(INTER_TOKEN_LATENCY + "_bucket")
    ref = ReferenceView(multi_reset_window(), 20.0)
    _, arr, ts, start, end = ref.rows(buckets)
    complete = ~np.isnan(arr).any(axis=1)
    general = stats.increase(ts, arr, start, end)[complete]
    faster = stats.increase(ts, arr[complete], start, end)
    assert bits(general) != bits(faster)
    assert np.allclose(general, faster, rtol=1e-12)
    ref = ReferenceView(multi_reset_window(gap=False, restarts=15), 20.0)
    _, arr, ts, start, end = ref.rows(buckets, "early")  # column-major
    assert bits(stats.increase(ts, arr, start, end)) != bits(stats.increase(ts, np.ascontiguousarray(arr), start, end))


def counters(rng: np.random.Generator, rows: int, n: int, integral: bool) -> np.ndarray:
    """Counters with up to three restarts; ``integral``: whole values, so every sum is exact."""
    v = np.cumsum(rng.uniform(0, 50, size=(rows, n)), axis=1)
    for r in range(rows):
        for at in rng.integers(1, max(n, 2), size=int(rng.integers(0, 4))):
            v[r, at:] -= v[r, at] - rng.uniform(0, 5)
    return np.floor(v) if integral else v


@pytest.mark.parametrize("seed", range(25))
def test_increase_without_gaps_matches_the_general_path(seed):
    """Rows without gaps (integral counters, so the reset corrections add exactly) through
    ``increase_complete`` and through the general path (forced by a row with a gap)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 70))
    v = counters(rng, int(rng.integers(1, 6)), n, integral=True)
    if rng.random() < 0.5:
        v[int(rng.integers(0, len(v)))] += 1e6  # a counter with history: no clamping to zero
    ts = np.cumsum(rng.uniform(0.5, 15, n))
    gappy = v[:1].copy()
    gappy[0, int(rng.integers(0, n))] = NAN
    for start, end in (
        (ts[0], ts[-1]),
        (ts[0] - rng.uniform(0, 30), ts[-1] + rng.uniform(0, 30)),
        (ts[0] - 0.01, ts[-1]),
    ):
        for is_rate in (False, True):
            faster = stats.increase(ts, v, start, end, is_rate)
            general = stats.increase(ts, np.vstack([v, gappy]), start, end, is_rate)[:-1]
            assert bits(faster) == bits(general)
            assert bits(faster) == bits(stats.increase_complete(ts, v, start, end, is_rate))
            for r in range(len(v)):  # row by row
                assert bits(stats.increase_complete(ts, v[r : r + 1], start, end, is_rate)) == bits(faster[r])


@pytest.mark.parametrize("seed", range(20))
def test_quantiles_without_gaps_match_the_general_path(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 70))
    v = rng.normal(size=(int(rng.integers(1, 6)), n)).round(int(rng.integers(0, 4)))
    gappy = np.full((1, n), NAN)
    srt = np.sort(v, axis=1)
    for q in (0.0, 0.1, 0.5, 0.9, 0.95, 1.0, float(rng.random()), -1.0, 2.0):
        expected = stats.quantile_of_sorted(q, np.sort(np.vstack([v, gappy]), axis=1))[:-1]
        assert bits(stats.quantile_of_complete(q, srt)) == bits(expected)
        assert bits(stats.quantile_over_time(q, v)) == bits(expected)


@pytest.mark.parametrize("seed", range(20))
def test_deltas_and_fill_without_gaps_match_the_general_path(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    v = counters(rng, int(rng.integers(1, 5)), n, integral=bool(seed % 2))
    if seed % 3 == 0 and n > 1:
        v[0, int(rng.integers(0, n))] = math.inf
    gappy = np.full((1, n), NAN)
    assert bits(stats.forward_fill(v)) == bits(stats.forward_fill(np.vstack([v, gappy]))[:-1])
    assert bits(stats.counter_deltas(v)) == bits(stats.counter_deltas(np.vstack([v, gappy]))[:-1])
    # the nan_to_num the faster path skips when every delta is finite
    filled = stats.forward_fill(np.vstack([v, gappy]))
    if n >= 2:
        d = np.diff(filled, axis=1)
        with np.errstate(invalid="ignore"):
            d = np.where(d < 0, filled[:, 1:], d)
        assert bits(stats.counter_deltas(np.vstack([v, gappy]))) == bits(np.nan_to_num(d, nan=0.0))


def random_histogram(rng: np.random.Generator) -> tuple[list[float], list[float]]:
    pool = [0.0, -1.0, 0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0]
    bounds = [float(b) for b in rng.choice(pool, size=int(rng.integers(0, 9)), replace=bool(rng.random() < 0.3))]
    if rng.random() < 0.85:
        bounds.append(math.inf)
    if rng.random() < 0.1:
        bounds.append(-math.inf)
    if rng.random() < 0.1 and bounds:
        bounds[int(rng.integers(0, len(bounds)))] = NAN
    bounds = [bounds[i] for i in rng.permutation(len(bounds))] if rng.random() < 0.4 else sorted(bounds)
    counts = np.cumsum(rng.integers(0, 40, len(bounds)) * rng.choice([1.0, 0.37])).tolist()
    if rng.random() < 0.2:
        counts = [counts[i] for i in rng.permutation(len(counts))]  # not monotone
    if rng.random() < 0.2 and counts:
        counts[int(rng.integers(0, len(counts)))] = NAN
    if rng.random() < 0.1:
        counts = [0.0 for _ in counts]
    if rng.random() < 0.05:
        counts = [-c for c in counts]
    return bounds, counts


@pytest.mark.parametrize("seed", range(100))
def test_bucket_quantile_is_histogram_quantile(seed):
    rng = np.random.default_rng(seed)
    bounds, counts = random_histogram(rng)
    if not bounds:
        return
    for q in (0.0, 0.5, 0.95, 1.0, -0.5, 1.5, float(rng.random())):
        with np.errstate(invalid="ignore"):  # -Inf bounds make NaNs on the way
            expected = stats.histogram_quantile(q, np.array(bounds), np.array(counts))
        assert bits(stats.bucket_quantile(q, bounds, counts)) == bits(expected), (q, bounds, counts)
        # the view's buckets (order worked out once), which drop a bucket without a bound or count
        keep = [b == b and c == c for b, c in zip(bounds, counts, strict=False)]
        if any(keep):
            with np.errstate(invalid="ignore"):
                expected = stats.histogram_quantile(q, np.array(bounds)[keep], np.array(counts)[keep])
            assert bits(_Buckets(bounds).quantile(q, counts)) == bits(expected), (q, bounds, counts)


@pytest.mark.parametrize(
    "values",
    [
        [],
        [NAN],
        [-0.0],
        [0.0],
        [2.5],
        [math.inf],
        [-math.inf],
        [NAN, NAN],
        [1.0, NAN, 3.0],
        [-0.0, -0.0],
        [0.1, 0.2, 0.3],
        [math.inf, -math.inf],
        [1e308, 1e308],
        list(np.linspace(0.1, 3.3, 17)),
        [NAN] * 9,
    ],
)
def test_sum_and_max_shortcuts(values):
    arr = np.array(values, dtype=float)
    with np.errstate(invalid="ignore", over="ignore"):
        assert bits(nansum(arr)) == bits(reference_nansum(arr))
        assert bits(nanmax(arr)) == bits(reference_nanmax(arr))
    present = diagnosis._present(arr)
    assert len(present) == np.count_nonzero(~np.isnan(arr))
    assert bits(present) == bits(arr[~np.isnan(arr)]) or len(present) == 0


@pytest.mark.parametrize("seed", range(20))
def test_knee_without_dropped_pairs_matches_the_filtering_path(seed):
    """Pairs with a NaN or a non-positive ITL or weight are dropped; data without them takes the
    path that skips the filtering, and must land where the filtering path does."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 80))
    kv = rng.uniform(0.2, 1.0, n)
    itl = 0.03 * (1 + kv * rng.uniform(0, 3)) * np.exp(rng.normal(0, 0.2, n))
    if seed % 2:
        itl = np.where(kv > 0.7, itl * 3, itl)
    weights = rng.integers(1, 900, n).astype(float)
    bad = rng.random(n) < 0.3
    t = Thresholds()
    dirty = detect_knee(np.where(bad, NAN, kv), itl, weights, t)
    clean = detect_knee(kv[~bad], itl[~bad], weights[~bad], t)
    assert repr(dirty) == repr(clean)
