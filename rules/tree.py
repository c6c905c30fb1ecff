"""The decision tree, written once as data: features, small predicates, and branches in order.

Evaluated twice from this one definition:

- in Python (``rules/diagnosis.py``): each ``Feature`` computes its windowed value from a
  ``Window`` with ``rules/stats.py`` (Prometheus arithmetic), then the branches are tried in order;
- as PromQL (``rules/promql.py``): each ``Feature`` becomes a recording rule over the canonical
  signals, and each verdict an alert whose expression is its branch's condition *and not* the
  conditions of every branch before it -- so exactly one verdict alert fires for a scenario.

Semantics shared by both halves: a feature with no data is *missing*; a comparison on a missing
feature is false (PromQL drops the sample); ``Not`` is evaluated for engines that are active.

Features are scoped to the engine (aggregated ``by (namespace, pod, model_name, engine)``, summing
data-parallel ranks) or to the pod's GPUs (``by (namespace, pod)``, the busiest GPU); GPU
conditions join the engine through ``pod``. A ``Window`` holds one engine and its GPUs, so the
Python half aggregates over everything in it.

The tree (DESIGN.md "The decision tree"), first match wins:

 1. idle                    no tokens generated in the window
 2. kv_thrashing            preemptions, or KV moved into a GPU pool that sits at the ceiling
 3. kv_tier_miss            significant KV moved into the GPU (transfers, PCIe, hits off-GPU)
 4. kv_capacity_pressure    KV pool at the ceiling and requests waiting, no preemption yet
 5. healthy                 ITL p95 under the SLO and not rising
 6. memory_bandwidth_bound  DRAM bandwidth high, SM not clearly above it
 7. compute_bound           SM activity high (bandwidth not high, or clearly below SM)
 8. host_overhead_bound     the GPU mostly idle (both bandwidth and SM low) while decode is slow
 9. compute_bound           no GPU counters, prefill-heavy traffic
10. memory_bandwidth_bound  otherwise (the decode prior; lower confidence)
"""

from __future__ import annotations

import math
import operator
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Union

import numpy as np

from . import stats
from .signals import (
    GENERATION_TOKENS,
    GPU_DRAM_BANDWIDTH_UTILIZATION,
    GPU_PCIE_RX,
    GPU_SM_ACTIVE,
    INTER_TOKEN_LATENCY,
    KV_CACHE_USAGE,
    KV_TRANSFER_BYTES,
    PREEMPTIONS,
    PREFIX_CACHE_HITS_BY_TIER,
    PROMPT_TOKENS,
    REQUESTS_RUNNING,
    REQUESTS_WAITING,
    SIGNALS,
    Kind,
)
from .thresholds import Thresholds
from .window import Labels, Window

ENGINE = "engine"
GPU = "gpu"

# Labels that identify an engine / a pod's GPUs in PromQL aggregations and joins.
ENGINE_KEYS = ("namespace", "pod", "model_name", "engine")
GPU_KEYS = ("namespace", "pod")

# Non-precise GPU counters: NVML's utilisation rates are duty cycles, not bandwidth or SM activity.
DUTY_CYCLE_METHOD = "nvml_util"


# ----------------------------------------------------------------------------------- selectors


@dataclass(frozen=True)
class Selector:
    """A canonical series name plus label matchers (``=`` or ``!=``), used by both halves."""

    name: str
    matchers: tuple[tuple[str, str, str], ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        for label, op, value in self.matchers:
            have = labels.get(label, "")
            if (op == "=" and have != value) or (op == "!=" and have == value):
                return False
        return True

    def promql(self, suffix: str = "") -> str:
        inner = ",".join(f'{label}{op}"{value}"' for label, op, value in self.matchers)
        return f"{self.name}{suffix}{{{inner}}}" if inner else f"{self.name}{suffix}"


# ------------------------------------------------------------------------- the Python half


class WindowView:
    """A window prepared for feature evaluation: series grouped by name, the range and its parts.

    Statistics are computed per *batch* of names rather than per selector: the series of every
    name read as a counter (``COUNTER_SERIES``) go through one ``stats.increase`` per range, those
    of every gauge (``GAUGE_SERIES``) through one sort per range, shared by all quantiles. On a
    60 s window numpy's per-call overhead, not the arithmetic, is the cost. Each selector gets
    exactly what the statistic gives on its own series (the statistics work row by row; where a
    path choice depends on all rows, ``_Increases`` keeps it per selector); a name in no batch is
    a batch of its own. Arrays handed out are shared with the cache: read-only.
    """

    def __init__(
        self, window: Window, recent_seconds: float | None = None, batches: tuple[tuple[str, ...], ...] | None = None
    ):
        self.window = window
        # the sub-window (the last ``recent_seconds``) over which state features are read
        self.recent_seconds = float(Thresholds().state_window_seconds if recent_seconds is None else recent_seconds)
        self.ts = window.timestamps
        self.start = window.start
        self.end = window.end
        by_name: dict[str, list[tuple[Labels, np.ndarray]]] = {}
        for (name, labels), values in window.series.items():
            entry = by_name.get(name)
            if entry is None:
                by_name[name] = [(labels, values)]
            else:
                entry.append((labels, values))
        self._by_name = by_name
        # each batch: the names (present in the window) whose series are stacked together
        self._batch_names: list[tuple[str, ...]] = []
        seen: set[str] = set()
        for names in BATCHES if batches is None else batches:
            present = tuple(n for n in dict.fromkeys(names) if n in by_name and n not in seen)
            if present:
                self._batch_names.append(present)
                seen.update(present)
        self._batches: dict[str, _Batch] | None = None  # by name, built on first use
        self._parts: dict[str, tuple[slice | np.ndarray, np.ndarray, float, float]] = {}
        self._cache: dict = {}

    def __len__(self) -> int:
        return len(self.ts)

    # ------------------------------------------------------------------ batches and ranges
    def _batch(self, name: str) -> _Batch:
        batches = self._batches
        if batches is None:
            batches = self._batches = _Batch.stack(self._batch_names, self._by_name, len(self.ts))
        batch = batches.get(name)
        if batch is None:  # a name in no batch
            batch = batches[name] = _Batch.stack([(name,)], self._by_name, len(self.ts))[name]
        return batch

    def _part(self, part: str) -> tuple[slice | np.ndarray, np.ndarray, float, float]:
        """(the part's columns: a slice, or a mask where they are not contiguous; timestamps; range
        start; range end)."""
        hit = self._parts.get(part)
        if hit is None:
            start, end = self.start, self.end
            ts = self.ts
            cols: slice | np.ndarray = slice(None)
            if part != "all" and len(ts):
                third = (end - start) / 3.0
                if part == "early":
                    end = start + third
                elif part == "recent":
                    start = max(start, end - self.recent_seconds)
                else:
                    start = end - third
                times = self._sorted_times()
                if times is not None and start == start and end == end:
                    # the samples with start <= ts <= end, found by bisection
                    first = bisect_left(times, start)
                    cols = slice(first, max(first, bisect_right(times, end)))
                else:
                    cols = (ts >= start) & (ts <= end)
                ts = ts[cols]
            hit = self._parts[part] = (cols, ts, start, end)
        return hit

    def _sorted_times(self) -> list[float] | None:
        """The timestamps as floats when they are sorted and not NaN (as windows always are)."""
        hit = self._cache.get("times", False)
        if hit is False:
            times = self.ts.tolist()
            ok = not any(map(math.isnan, times)) and all(a <= b for a, b in zip(times, times[1:]))
            hit = self._cache["times"] = times if ok else None
        return hit

    def _increase(self, name: str, part: str, sel: Selector | None = None) -> np.ndarray:
        """``stats.increase`` of the series ``name`` (those of ``sel``) over ``part``."""
        if name not in self._by_name:
            return np.empty(0)
        batch = self._batch(name)
        pick = None if sel is None else self._pick(sel)
        cols, ts, start, end = self._part(part)
        if part == "all":  # one call for the batch
            hit = batch.results.get(("increase", part))
            if hit is None:
                hit = batch.results[("increase", part)] = _Increases(ts, batch.matrix, start, end, batch.gaps())
            return hit.of(batch.offsets[name], pick)
        # A part: per selector, on the layout its rows have always had once their columns were
        # picked (column-major, as ``rows[:, mask]`` makes them): numpy adds up a row of that
        # layout in another order than a row of the batch, which can move the last bit.
        key = ("increase", name, part, None if pick is None else sel)
        hit = self._cache.get(key)
        if hit is None:
            rows = batch.matrix[batch.offsets[name]]
            if pick is not None:
                rows = rows[pick]
            if len(self.ts):
                rows = np.asfortranarray(rows[:, cols]) if isinstance(cols, slice) else rows[:, cols]
            if batch.gaps() is None and rows.shape[0] and rows.shape[1] >= 2:
                hit = stats.increase_complete(ts, rows, start, end)  # the path stats.increase takes
            else:
                hit = stats.increase(ts, rows, start, end)
            self._cache[key] = hit
        return hit

    def _quantile(self, name: str, q: float, part: str) -> np.ndarray:
        """``stats.quantile_over_time`` of every series ``name`` over ``part`` (one sort per batch)."""
        if name not in self._by_name:
            return np.empty(0)
        batch = self._batch(name)
        hit = batch.results.get(("quantile", part, q))
        if hit is None:
            srt, complete = batch.sorted(part, self._part(part)[0])
            hit = stats.quantile_of_complete(q, srt) if complete else stats.quantile_of_sorted(q, srt)
            batch.results[("quantile", part, q)] = hit
        return hit[batch.offsets[name]]

    def _label_dicts(self, name: str) -> list[dict]:
        key = ("labels", name)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = [dict(labels) for labels, _ in self._by_name.get(name, ())]
        return hit

    def _pick(self, sel: Selector) -> np.ndarray | None:
        """Positions of the selector's series among those of its name; None when all match."""
        if not sel.matchers:
            return None
        key = ("pick", sel)
        if key not in self._cache:
            dicts = self._label_dicts(sel.name)
            idx = [i for i, labels in enumerate(dicts) if sel.matches(labels)]
            self._cache[key] = None if len(idx) == len(dicts) else np.array(idx, dtype=np.intp)
        return self._cache[key]

    # ------------------------------------------------------------------------- the API
    def has(self, name: str) -> bool:
        """True if any series ``name`` has a sample in the window."""
        if name not in self._by_name:
            return False
        return self._batch(name).has(name)

    def labels(self, name: str) -> list[dict]:
        return list(self._label_dicts(name))

    def rows(self, sel: Selector, part: str = "all") -> tuple[list[dict], np.ndarray, np.ndarray, float, float]:
        """(labels, values (rows, n), timestamps, range start, range end) for a selector; ``part``
        is "all", "early"/"late" for the first/last third of the window, or "recent" for its last
        ``recent_seconds`` (the whole window when that is longer)."""
        cols, ts, start, end = self._part(part)
        if sel.name not in self._by_name:
            return [], np.empty((0, len(ts))), ts, start, end
        batch = self._batch(sel.name)
        arr = batch.matrix[batch.offsets[sel.name]]
        labels = self._label_dicts(sel.name)
        idx = self._pick(sel)
        if idx is not None:
            arr = arr[idx]
            labels = [labels[i] for i in idx]
        if part != "all" and len(self.ts):  # column-major, like ``arr[:, mask]`` (see _increase)
            arr = np.asfortranarray(arr[:, cols]) if isinstance(cols, slice) else arr[:, cols]
        return list(labels), arr, ts, start, end

    def rowwise(self, fn: Callable[[np.ndarray], np.ndarray], sel: Selector, part: str = "all") -> np.ndarray:
        """``fn(self.rows(sel, part)[1])`` for a function ``fn`` of a (rows, n) array that works row
        by row: over the whole window computed once for the batch of the selector's name."""
        if part != "all" or sel.name not in self._by_name:
            return fn(self.rows(sel, part)[1])
        batch = self._batch(sel.name)
        hit = batch.results.get((fn, part))
        if hit is None:
            hit = batch.results[(fn, part)] = fn(batch.matrix)
        out = hit[batch.offsets[sel.name]]
        idx = self._pick(sel)
        return out if idx is None else out[idx]

    # aggregations mirroring the PromQL the compiler writes
    def sum_rate(self, sel: Selector) -> float:
        _, _, start, end = self._part("all")
        return _nansum(self._increase(sel.name, "all", sel) / (end - start))

    def sum_increase(self, sel: Selector, part: str = "all") -> float:
        return _nansum(self._increase(sel.name, part, sel))

    def quantiles(self, sel: Selector, q: float, part: str = "all") -> np.ndarray:
        out = self._quantile(sel.name, q, part)
        idx = self._pick(sel)
        return out if idx is None else out[idx]

    def histogram_quantile(self, name: str, q: float, part: str = "all") -> float:
        bucket = name + "_bucket"
        if bucket not in self._by_name:
            return math.nan
        key = ("buckets", bucket)
        prepared = self._cache.get(key)
        if prepared is None:
            prepared = self._cache[key] = _Buckets([_le(labels.get("le")) for labels in self._label_dicts(bucket)])
        return prepared.quantile(q, self._increase(bucket, part).tolist())


class _Batch:
    """The series of some names, rows of one array, and what was computed on them per part."""

    __slots__ = ("_gaps", "_present", "matrix", "offsets", "parts", "results")

    def __init__(self, matrix: np.ndarray, offsets: dict[str, slice]):
        self.matrix = matrix
        self.offsets = offsets
        self.parts: dict[str, np.ndarray] = {}
        self.results: dict = {}
        self._present: dict[str, bool] | None = None
        self._gaps: np.ndarray | bool | None = False  # not computed yet

    def gaps(self) -> np.ndarray | None:
        """For each row, whether it lacks a sample somewhere; None when no row does."""
        if self._gaps is False:
            missing = np.isnan(self.matrix)
            self._gaps = missing.any(axis=1) if missing.any() else None
        return self._gaps

    @staticmethod
    def stack(batches: list[tuple[str, ...]], by_name: Mapping[str, list], n: int) -> dict[str, _Batch]:
        """Every batch's series in one array (one copy for all), each batch a band of its rows."""
        arrays = [values for names in batches for name in names for _, values in by_name[name]]
        matrix = np.array(arrays, dtype=float) if arrays else np.empty((0, n))
        matrix.flags.writeable = False
        out: dict[str, _Batch] = {}
        row = 0
        for names in batches:
            first = row
            offsets: dict[str, slice] = {}
            for name in names:
                count = len(by_name[name])
                offsets[name] = slice(row - first, row - first + count)
                row += count
            batch = _Batch(matrix[first:row], offsets)
            for name in names:
                out[name] = batch
        return out

    def values(self, part: str, cols: slice | np.ndarray) -> np.ndarray:
        if isinstance(cols, slice):
            return self.matrix[:, cols]  # a view
        hit = self.parts.get(part)
        if hit is None:
            hit = self.parts[part] = self.matrix[:, cols]
            hit.flags.writeable = False
        return hit

    def sorted(self, part: str, cols: slice | np.ndarray) -> tuple[np.ndarray, bool]:
        """Each row sorted (NaN last), and whether no row has a gap."""
        hit = self.results.get(("sorted", part))
        if hit is None:
            srt = np.sort(self.values(part, cols), axis=1)
            complete = srt.shape[1] > 0 and (self.gaps() is None or not np.isnan(srt[:, -1]).any())
            hit = self.results[("sorted", part)] = (srt, complete)
        return hit

    def has(self, name: str) -> bool:
        if self._present is None:
            if self.gaps() is None:  # every row has every sample (if there are samples)
                rows = [self.matrix.shape[1] > 0] * len(self.matrix)
            else:
                rows = (~np.isnan(self.matrix).all(axis=1)).tolist()
            self._present = {n: any(rows[sl]) for n, sl in self.offsets.items()}
        return self._present[name]


class _Increases:
    """``stats.increase`` of a batch's rows, handed out per selector exactly as if computed on the
    selector's series alone: ``stats.increase`` takes its faster path for series without gaps
    (``increase_complete``, row by row), its general path when any of them has one."""

    __slots__ = ("complete", "gappy", "general")

    def __init__(self, ts: np.ndarray, values: np.ndarray, start: float, end: float, gappy: np.ndarray | None):
        rows, n = values.shape
        self.gappy = gappy
        self.general: np.ndarray | None = None
        if n < 2 or rows == 0:
            self.complete = np.full(rows, np.nan)
            self.gappy = None
            return
        if gappy is not None:
            self.general = stats.increase(ts, values, start, end)
            if gappy.all():
                self.complete = self.general  # no row for the faster path
                return
        self.complete = stats.increase_complete(ts, values, start, end)

    def of(self, rows: slice, pick: np.ndarray | None) -> np.ndarray:
        out = self.complete[rows] if pick is None else self.complete[rows][pick]
        if self.gappy is not None:
            gappy = self.gappy[rows] if pick is None else self.gappy[rows][pick]
            if gappy.any():
                out = self.general[rows] if pick is None else self.general[rows][pick]
        return out


class _Buckets:
    """A histogram's bucket bounds, put in order once for every ``histogram_quantile`` on them."""

    __slots__ = ("bounds", "order", "sorted_bounds")

    def __init__(self, bounds: list[float]):
        self.bounds = bounds
        self.sorted_bounds: list[float] | None = None  # set when the bounds need no more preparing
        self.order: Callable[[list], tuple] | None = None  # None: already in order
        if not any(map(math.isnan, bounds)):
            order = sorted(range(len(bounds)), key=bounds.__getitem__)
            ordered = [bounds[i] for i in order]
            if ordered and ordered[-1] == math.inf and all(a < b for a, b in zip(ordered, ordered[1:])):
                self.sorted_bounds = ordered
                if order != list(range(len(bounds))):  # (so at least two buckets)
                    self.order = operator.itemgetter(*order)

    def quantile(self, q: float, increases: list[float]) -> float:
        """``histogram_quantile`` of the buckets' ``increases`` (NaN: a bucket without one)."""
        if self.sorted_bounds is not None and not any(map(math.isnan, increases)):
            counts = increases if self.order is None else list(self.order(increases))
            return stats.sorted_bucket_quantile(q, self.sorted_bounds, counts)
        kept = [(b, c) for b, c in zip(self.bounds, increases) if c == c and b == b]  # drop NaN
        if not kept:
            return math.nan
        return stats.bucket_quantile(q, [b for b, _ in kept], [c for _, c in kept])


def _le(text: str | None) -> float:
    try:
        return float(text) if text is not None else math.nan
    except ValueError:
        return math.nan


# numpy's sum of one element adds it to the identity (0.0 + -0.0 is 0.0) in some versions only
_SUM_OF_ONE_ADDS_ZERO = math.copysign(1.0, float(np.array([-0.0]).sum())) > 0


def _nansum(values: np.ndarray) -> float:
    """Prometheus ``sum``: the sum of the samples there are, no sample if there are none."""
    if len(values) == 1:  # one engine: numpy's answer without its overhead
        v = float(values[0])
        return 0.0 + v if _SUM_OF_ONE_ADDS_ZERO else v
    if len(values):
        total = values.sum()
        if not math.isnan(total):  # no NaN among them: the sum of the present samples is this one
            return float(total)
    present = values[~np.isnan(values)]
    return float(present.sum()) if len(present) else math.nan


def _nanmax(values: np.ndarray) -> float:
    if len(values):
        top = values.max()  # NaN if any is
        if not math.isnan(top):
            return float(top)
    present = values[~np.isnan(values)]
    return float(present.max()) if len(present) else math.nan


# ---------------------------------------------------------------------------- features


def prom_number(value: float) -> str:
    """A float as PromQL reads it back exactly (repr), without a trailing ``.0``."""
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


@dataclass(frozen=True)
class PromContext:
    """What feature expressions need to render: the window as PromQL durations and the keys."""

    window: str  # e.g. "60s"
    third: str  # window / 3
    two_thirds: str  # 2 x window / 3, the offset of the first third
    recent: str = ""  # the state sub-window (Thresholds.state_window_seconds); "" means the window
    engine_keys: str = ", ".join(ENGINE_KEYS)
    gpu_keys: str = ", ".join(GPU_KEYS)


@dataclass(frozen=True)
class Feature:
    """One windowed quantity the tree compares: its Python computation and its PromQL twin."""

    name: str  # also the recording rule's middle part: kvdoctor:<name>:<window>
    scope: str  # ENGINE or GPU
    unit: str  # for evidence: "ratio", "seconds", "bytes/s", "tokens/s", "per minute", "requests"
    signals: tuple[str, ...]  # canonical signals read
    note: str  # what the number is, for evidence
    python: Callable[[WindowView, Thresholds], float]
    promql: Callable[[PromContext, Thresholds], str]

    @property
    def signal(self) -> str:
        return self.signals[0]


def _recent(c: PromContext) -> str:
    return c.recent or c.window


def _gpu_median_max(sel: Selector, part: str = "all") -> Callable[[WindowView, Thresholds], float]:
    return lambda v, t: _nanmax(v.quantiles(sel, t.gpu_quantile, part))


def _gpu_median_max_promql(sel: Selector, part: str = "all") -> Callable[[PromContext, Thresholds], str]:
    return lambda c, t: (
        f"max by ({c.gpu_keys}) "
        f"(quantile_over_time({prom_number(t.gpu_quantile)}, "
        f"{sel.promql()}[{_recent(c) if part == 'recent' else c.window}]))"
    )


_PRECISE = (("method", "!=", DUTY_CYCLE_METHOD),)
_TO_GPU = Selector(KV_TRANSFER_BYTES, (("direction", "=", "to_gpu"),))
_DRAM_PRECISE = Selector(GPU_DRAM_BANDWIDTH_UTILIZATION, _PRECISE)
_SM_PRECISE = Selector(GPU_SM_ACTIVE, _PRECISE)
_TIER_ALL = Selector(PREFIX_CACHE_HITS_BY_TIER)
_TIER_SLOW = Selector(PREFIX_CACHE_HITS_BY_TIER, (("tier", "!=", "device"),))


def _slow_tier_fraction(v: WindowView, t: Thresholds) -> float:
    total = v.sum_increase(_TIER_ALL)
    if math.isnan(total):
        return math.nan
    slow = v.sum_increase(_TIER_SLOW)
    slow = 0.0 if math.isnan(slow) else slow
    with np.errstate(invalid="ignore", divide="ignore"):
        return float(np.float64(slow) / np.float64(total))


def _gpu_busy(v: WindowView, t: Thresholds) -> float:
    values = np.concatenate(
        [
            v.quantiles(Selector(GPU_DRAM_BANDWIDTH_UTILIZATION), t.gpu_quantile, "recent"),
            v.quantiles(Selector(GPU_SM_ACTIVE), t.gpu_quantile, "recent"),
        ]
    )
    return _nanmax(values)


def _gpu_busy_promql(c: PromContext, t: Thresholds) -> str:
    parts = [
        f'label_replace(quantile_over_time({prom_number(t.gpu_quantile)}, {name}[{_recent(c)}]), "gpu_signal", "{tag}", "", "")'
        for name, tag in ((GPU_DRAM_BANDWIDTH_UTILIZATION, "dram"), (GPU_SM_ACTIVE, "sm"))
    ]
    return f"max by ({c.gpu_keys}) ({parts[0]} or {parts[1]})"


def _itl_quantile(q: Callable[[Thresholds], float], part: str):
    return lambda v, t: v.histogram_quantile(INTER_TOKEN_LATENCY, q(t), part)


def _itl_quantile_promql(q: Callable[[Thresholds], float], part: str):
    def render(c: PromContext, t: Thresholds) -> str:
        rng = {
            "all": f"[{c.window}]",
            "recent": f"[{_recent(c)}]",
            "late": f"[{c.third}]",
            "early": f"[{c.third}] offset {c.two_thirds}",
        }[part]
        return (
            f"histogram_quantile({prom_number(q(t))}, sum by ({c.engine_keys}, le) "
            f"(increase({INTER_TOKEN_LATENCY}_bucket{rng})))"
        )

    return render


FEATURES: dict[str, Feature] = {
    f.name: f
    for f in (
        Feature(
            "generation_tokens_per_second",
            ENGINE,
            "tokens/s",
            (GENERATION_TOKENS,),
            "output tokens per second over the window (counter resets handled)",
            lambda v, t: v.sum_rate(Selector(GENERATION_TOKENS)),
            lambda c, t: f"sum by ({c.engine_keys}) (rate({GENERATION_TOKENS}[{c.window}]))",
        ),
        Feature(
            "prompt_tokens_per_second",
            ENGINE,
            "tokens/s",
            (PROMPT_TOKENS,),
            "prompt tokens per second over the window",
            lambda v, t: v.sum_rate(Selector(PROMPT_TOKENS)),
            lambda c, t: f"sum by ({c.engine_keys}) (rate({PROMPT_TOKENS}[{c.window}]))",
        ),
        Feature(
            "requests_running",
            ENGINE,
            "requests",
            (REQUESTS_RUNNING,),
            "median requests running over the state sub-window (the window's last state_window_seconds)",
            lambda v, t: _nansum(v.quantiles(Selector(REQUESTS_RUNNING), 0.5, "recent")),
            lambda c, t: f"sum by ({c.engine_keys}) (quantile_over_time(0.5, {REQUESTS_RUNNING}[{_recent(c)}]))",
        ),
        Feature(
            "requests_waiting",
            ENGINE,
            "requests",
            (REQUESTS_WAITING,),
            "median requests waiting over the state sub-window (the window's last state_window_seconds)",
            lambda v, t: _nansum(v.quantiles(Selector(REQUESTS_WAITING), 0.5, "recent")),
            lambda c, t: f"sum by ({c.engine_keys}) (quantile_over_time(0.5, {REQUESTS_WAITING}[{_recent(c)}]))",
        ),
        Feature(
            "preemptions_per_minute",
            ENGINE,
            "per minute",
            (PREEMPTIONS,),
            "preemptions per minute over the window (counter history and resets handled)",
            lambda v, t: v.sum_rate(Selector(PREEMPTIONS)) * 60,
            lambda c, t: f"sum by ({c.engine_keys}) (rate({PREEMPTIONS}[{c.window}])) * 60",
        ),
        Feature(
            "kv_usage",
            ENGINE,
            "ratio",
            (KV_CACHE_USAGE,),
            "KV-cache usage, a high quantile over the state sub-window (robust to the oscillation under preemption)",
            lambda v, t: _nanmax(v.quantiles(Selector(KV_CACHE_USAGE), t.kv_usage_quantile, "recent")),
            lambda c, t: (
                f"max by ({c.engine_keys}) "
                f"(quantile_over_time({prom_number(t.kv_usage_quantile)}, {KV_CACHE_USAGE}[{_recent(c)}]))"
            ),
        ),
        Feature(
            "kv_to_gpu_bytes_per_second",
            ENGINE,
            "bytes/s",
            (KV_TRANSFER_BYTES,),
            "KV bytes per second moved into the GPU from another tier",
            lambda v, t: v.sum_rate(_TO_GPU),
            lambda c, t: f"sum by ({c.engine_keys}) (rate({_TO_GPU.promql()}[{c.window}]))",
        ),
        Feature(
            "slow_tier_hit_fraction",
            ENGINE,
            "ratio",
            (PREFIX_CACHE_HITS_BY_TIER,),
            "share of prefix-cache hit tokens served from a tier other than the GPU",
            _slow_tier_fraction,
            lambda c, t: (
                f"(sum by ({c.engine_keys}) (increase({_TIER_SLOW.promql()}[{c.window}])) "
                f"or on({c.engine_keys}) sum by ({c.engine_keys}) (increase({_TIER_ALL.promql()}[{c.window}])) * 0) "
                f"/ on({c.engine_keys}) sum by ({c.engine_keys}) (increase({_TIER_ALL.promql()}[{c.window}]))"
            ),
        ),
        Feature(
            "itl_p95_seconds",
            ENGINE,
            "seconds",
            (INTER_TOKEN_LATENCY,),
            "inter-token latency quantile from the histogram's bucket increases over the state sub-window",
            _itl_quantile(lambda t: t.itl_quantile, "recent"),
            _itl_quantile_promql(lambda t: t.itl_quantile, "recent"),
        ),
        Feature(
            "itl_early_median_seconds",
            ENGINE,
            "seconds",
            (INTER_TOKEN_LATENCY,),
            "median inter-token latency in the window's first third",
            _itl_quantile(lambda t: 0.5, "early"),
            _itl_quantile_promql(lambda t: 0.5, "early"),
        ),
        Feature(
            "itl_late_median_seconds",
            ENGINE,
            "seconds",
            (INTER_TOKEN_LATENCY,),
            "median inter-token latency in the window's last third",
            _itl_quantile(lambda t: 0.5, "late"),
            _itl_quantile_promql(lambda t: 0.5, "late"),
        ),
        Feature(
            "pcie_receive_bytes_per_second",
            GPU,
            "bytes/s",
            (GPU_PCIE_RX,),
            "PCIe receive bandwidth, median over the window, busiest GPU",
            _gpu_median_max(Selector(GPU_PCIE_RX)),
            _gpu_median_max_promql(Selector(GPU_PCIE_RX)),
        ),
        Feature(
            "dram_bandwidth_ratio",
            GPU,
            "ratio",
            (GPU_DRAM_BANDWIDTH_UTILIZATION,),
            "DRAM bandwidth utilisation (GPM or DCGM; not NVML's duty cycle), median over the state sub-window, busiest GPU",
            _gpu_median_max(_DRAM_PRECISE, "recent"),
            _gpu_median_max_promql(_DRAM_PRECISE, "recent"),
        ),
        Feature(
            "sm_active_ratio",
            GPU,
            "ratio",
            (GPU_SM_ACTIVE,),
            "SM activity (GPM or DCGM; not NVML's duty cycle), median over the state sub-window, busiest GPU",
            _gpu_median_max(_SM_PRECISE, "recent"),
            _gpu_median_max_promql(_SM_PRECISE, "recent"),
        ),
        Feature(
            "gpu_busy_ratio",
            GPU,
            "ratio",
            (GPU_DRAM_BANDWIDTH_UTILIZATION, GPU_SM_ACTIVE),
            "the larger of DRAM bandwidth and SM activity (any method, duty cycles included), median over the state sub-window, busiest GPU",
            _gpu_busy,
            _gpu_busy_promql,
        ),
    )
}


def _series_read(kinds: tuple[Kind, ...]) -> tuple[str, ...]:
    """The series names the features read from signals of ``kinds`` (a histogram: its buckets)."""
    names = (
        s + "_bucket" if SIGNALS[s].kind is Kind.HISTOGRAM else s
        for f in FEATURES.values()
        for s in f.signals
        if SIGNALS[s].kind in kinds
    )
    return tuple(dict.fromkeys(names))


# The WindowView's batches (speed only: a name left out is computed on its own).
COUNTER_SERIES: tuple[str, ...] = _series_read((Kind.COUNTER, Kind.HISTOGRAM))
GAUGE_SERIES: tuple[str, ...] = _series_read((Kind.GAUGE,))
BATCHES: tuple[tuple[str, ...], ...] = (COUNTER_SERIES, GAUGE_SERIES)


# --------------------------------------------------------------------------- predicates


@dataclass(frozen=True)
class Param:
    """A threshold: ``Thresholds.<name>`` (or ``slo_seconds``), optionally times another one."""

    name: str
    times: str | None = None

    def value(self, params: Mapping[str, float]) -> float:
        v = float(params[self.name])
        return v * float(params[self.times]) if self.times else v

    def describe(self) -> str:
        return f"{self.name} x {self.times}" if self.times else self.name


@dataclass(frozen=True)
class Cmp:
    """``feature <op> threshold``."""

    feature: str
    op: str
    threshold: Param


@dataclass(frozen=True)
class CmpFeatures:
    """``left <op> right x scale + offset``: two features of one scope compared."""

    left: str
    op: str
    right: str
    scale: Param | None = None
    offset: Param | None = None


@dataclass(frozen=True)
class Present:
    """The feature has a value in the window."""

    feature: str


@dataclass(frozen=True)
class All:
    terms: tuple = ()


@dataclass(frozen=True)
class Any:
    terms: tuple = ()


@dataclass(frozen=True)
class Not:
    term: object


@dataclass(frozen=True)
class Named:
    """A sub-condition with a name: the PromQL half records it (``kvdoctor:<name>:<window>``) and
    refers to it by that name, which keeps the alert expressions readable."""

    name: str
    condition: object


Condition = Union[Cmp, CmpFeatures, Present, All, Any, Not, Named]
Atom = Union[Cmp, CmpFeatures, Present]

OPS: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}


def right_side(c: CmpFeatures, values: Mapping[str, float], params: Mapping[str, float]) -> float:
    v = values.get(c.right, math.nan)
    if c.scale is not None:
        v = v * c.scale.value(params)
    if c.offset is not None:
        v = v + c.offset.value(params)
    return v


def evaluate(cond: Condition, values: Mapping[str, float], params: Mapping[str, float]) -> bool:
    """The condition on computed feature values; missing (NaN) features make comparisons false."""
    if isinstance(cond, Cmp):
        v = values.get(cond.feature, math.nan)
        return not math.isnan(v) and OPS[cond.op](v, cond.threshold.value(params))
    if isinstance(cond, CmpFeatures):
        left = values.get(cond.left, math.nan)
        right = right_side(cond, values, params)
        return not (math.isnan(left) or math.isnan(right)) and OPS[cond.op](left, right)
    if isinstance(cond, Present):
        return not math.isnan(values.get(cond.feature, math.nan))
    if isinstance(cond, All):
        return all(evaluate(t, values, params) for t in cond.terms)
    if isinstance(cond, Any):
        return any(evaluate(t, values, params) for t in cond.terms)
    if isinstance(cond, Not):
        return not evaluate(cond.term, values, params)
    if isinstance(cond, Named):
        return evaluate(cond.condition, values, params)
    raise TypeError(f"not a condition: {cond!r}")


def atoms(cond: Condition) -> Iterator[Atom]:
    """The comparisons a condition reads, in order."""
    if isinstance(cond, (Cmp, CmpFeatures, Present)):
        yield cond
    elif isinstance(cond, (All, Any)):
        for term in cond.terms:
            yield from atoms(term)
    elif isinstance(cond, Not):
        yield from atoms(cond.term)
    elif isinstance(cond, Named):
        yield from atoms(cond.condition)


def features_of(cond: Condition) -> list[str]:
    out: list[str] = []
    for a in atoms(cond):
        for name in (a.left, a.right) if isinstance(a, CmpFeatures) else (a.feature,):
            if name not in out:
                out.append(name)
    return out


# ------------------------------------------------------------------------------ the tree

ACTIVE = Named(
    "engine_active",
    Any(
        (
            Cmp("generation_tokens_per_second", ">", Param("idle_tokens_per_second")),
            # an engine without a token counter: requests in the batch are the next best sign of work
            All((Cmp("requests_running", ">", Param("zero")), Not(Present("generation_tokens_per_second")))),
        )
    ),
)
AT_CEILING = Cmp("kv_usage", ">=", Param("kv_ceiling_ratio"))
TRANSFERS_SIGNIFICANT = Named(
    "kv_transfers_significant",
    Any(
        (
            Cmp("kv_to_gpu_bytes_per_second", ">=", Param("kv_to_gpu_bytes_per_second_min")),
            Cmp("pcie_receive_bytes_per_second", ">=", Param("pcie_receive_bytes_per_second_min")),
            Cmp("slow_tier_hit_fraction", ">=", Param("slow_tier_hit_fraction_min")),
        )
    ),
)
QUEUE_BACKED_UP = Cmp("requests_waiting", ">=", Param("queue_waiting_min"))
SLOW = Named(
    "itl_slow",
    Any(
        (
            Cmp("itl_p95_seconds", ">=", Param("slo_seconds")),
            All(
                (
                    CmpFeatures(
                        "itl_late_median_seconds", ">=", "itl_early_median_seconds", scale=Param("trend_ratio")
                    ),
                    Cmp("itl_late_median_seconds", ">=", Param("trend_min_slo_fraction", "slo_seconds")),
                )
            ),
        )
    ),
)
PRECISE_GPU = Named("gpu_counters_precise", Any((Present("dram_bandwidth_ratio"), Present("sm_active_ratio"))))
BANDWIDTH_HIGH = Named(
    "gpu_bandwidth_high",
    All(
        (
            Cmp("dram_bandwidth_ratio", ">=", Param("bandwidth_high_ratio")),
            Not(CmpFeatures("sm_active_ratio", ">=", "dram_bandwidth_ratio", offset=Param("clearly_above_margin"))),
        )
    ),
)
# Recorded by the PromQL half, in this order (later ones may use the earlier ones).
NAMED_CONDITIONS: tuple[Named, ...] = (ACTIVE, TRANSFERS_SIGNIFICANT, SLOW, PRECISE_GPU, BANDWIDTH_HIGH)


@dataclass(frozen=True)
class Branch:
    """One leaf of the tree: the verdict when ``condition`` holds and no earlier branch did."""

    id: str
    verdict: str
    step: int  # DESIGN.md's step: 1 idle, 2 capacity/placement, 3 healthy, 4 bottleneck
    condition: Condition
    summary: str  # the branch in words, for evidence and docs


TRUE = All(())

BRANCHES: tuple[Branch, ...] = (
    Branch("idle", "idle", 1, Not(ACTIVE), "no tokens generated in the window"),
    Branch(
        "thrashing_preemptions",
        "kv_thrashing",
        2,
        Cmp("preemptions_per_minute", ">=", Param("preemptions_per_minute")),
        "the engine is preempting requests: the KV pool ran out",
    ),
    Branch(
        "thrashing_reload",
        "kv_thrashing",
        2,
        All((TRANSFERS_SIGNIFICANT, AT_CEILING)),
        "KV moves into a GPU pool that sits at the ceiling",
    ),
    Branch(
        "tier_miss",
        "kv_tier_miss",
        2,
        TRANSFERS_SIGNIFICANT,
        "prefix hits are served from a slower tier while the GPU pool has room",
    ),
    Branch(
        "capacity_pressure",
        "kv_capacity_pressure",
        2,
        All((AT_CEILING, QUEUE_BACKED_UP)),
        "the KV pool is full and requests wait, no preemption yet",
    ),
    Branch("healthy", "healthy", 3, Not(SLOW), "ITL p95 under the SLO and not rising"),
    Branch(
        "bandwidth_high",
        "memory_bandwidth_bound",
        4,
        BANDWIDTH_HIGH,
        "DRAM bandwidth is high and SM activity is not clearly above it",
    ),
    Branch(
        "sm_high",
        "compute_bound",
        4,
        Cmp("sm_active_ratio", ">=", Param("sm_high_ratio")),
        "SM activity is high and DRAM bandwidth is not",
    ),
    Branch(
        "gpu_idle",
        "host_overhead_bound",
        4,
        Cmp("gpu_busy_ratio", "<", Param("host_overhead_gpu_max")),
        "the GPU is mostly idle while decode is slow: the time goes to the host",
    ),
    Branch(
        "prefill_heavy_no_gpu",
        "compute_bound",
        4,
        All(
            (
                Not(PRECISE_GPU),
                CmpFeatures(
                    "prompt_tokens_per_second", ">=", "generation_tokens_per_second", scale=Param("prefill_heavy_ratio")
                ),
            )
        ),
        "no GPU counters; prefill-heavy traffic",
    ),
    Branch(
        "decode_default",
        "memory_bandwidth_bound",
        4,
        TRUE,
        "slow decode without a clearer cause: most likely bandwidth (decode re-reads weights and KV every token)",
    ),
)

BRANCH_BY_ID = {b.id: b for b in BRANCHES}


def parameters(thresholds: Thresholds, slo_seconds: float) -> dict[str, float]:
    """What ``Param`` names resolve to: every threshold, the SLO, and zero."""
    return {**thresholds.as_dict(), "slo_seconds": float(slo_seconds), "zero": 0.0}


def compute_features(view: WindowView, thresholds: Thresholds) -> dict[str, float]:
    """Every feature's value on the window (NaN where missing)."""
    out: dict[str, float] = {}
    with np.errstate(invalid="ignore", divide="ignore"):
        for name, feature in FEATURES.items():
            value = feature.python(view, thresholds)
            out[name] = math.nan if value is None else float(value)
    return out


def choose_branch(values: Mapping[str, float], params: Mapping[str, float]) -> Branch:
    """The first branch whose condition holds (the last one always does)."""
    for branch in BRANCHES:
        if evaluate(branch.condition, values, params):
            return branch
    raise AssertionError("the tree's last branch must always hold")  # pragma: no cover


def precedence_condition(index: int) -> Condition:
    """Branch ``index``'s own condition and-not every earlier branch's: what its alert encodes."""
    terms: list = [BRANCHES[index].condition]
    for earlier in BRANCHES[:index]:
        c = earlier.condition
        terms.append(c.term if isinstance(c, Not) else Not(c))
    return All(tuple(terms))


@dataclass(frozen=True)
class TreeSignals:
    """Signals grouped by what is missing when they are absent (for ``Diagnosis.missing``)."""

    gpu: tuple[str, ...] = (GPU_DRAM_BANDWIDTH_UTILIZATION, GPU_SM_ACTIVE, GPU_PCIE_RX)
    engine: tuple[str, ...] = field(
        default=(
            GENERATION_TOKENS,
            PROMPT_TOKENS,
            REQUESTS_RUNNING,
            REQUESTS_WAITING,
            PREEMPTIONS,
            KV_CACHE_USAGE,
            KV_TRANSFER_BYTES,
            PREFIX_CACHE_HITS_BY_TIER,
            INTER_TOKEN_LATENCY,
        )
    )


TREE_SIGNALS = TreeSignals()
