"""A window prepared for the tree's features: selectors and the statistics computed on them.

``WindowView`` answers the questions features ask of a ``Window`` (rates, increases, quantiles
over time, histogram quantiles) with ``signals/stats.py``'s Prometheus arithmetic, over the whole
window or a part of it, and computes each answer once per batch of series rather than once per
selector (speed only: the results are, to the bit, those of each selector's series on their own).
"""

from __future__ import annotations

import math
import operator
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from kvdoctor.signals import stats
from kvdoctor.signals.window import Labels, Window

from .thresholds import Thresholds

Part = str  # "all", "early" / "late" (the window's first / last third), "recent" (its last recent_seconds)
Columns = slice | np.ndarray  # a part's columns: a slice, or a mask where they are not contiguous
RowFunction = Callable[[np.ndarray], np.ndarray]


def part_range(part: Part, start: float, end: float, recent_seconds: float) -> tuple[float, float]:
    """The (start, end) of ``part`` of the window ``start``..``end`` (``part`` not "all")."""
    third = (end - start) / 3.0
    if part == "early":
        return start, start + third
    if part == "recent":
        return max(start, end - recent_seconds), end
    return end - third, end


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


class WindowView:
    """A window prepared for feature evaluation: series grouped by name, the range and its parts.

    Statistics are computed per *batch* of names rather than per selector: the series of every
    name of a batch go through one ``stats.increase`` per range (counters) or one sort per range,
    shared by all quantiles (gauges). On a 60 s window numpy's per-call overhead, not the
    arithmetic, is the cost. Each selector gets exactly what the statistic gives on its own
    series (the statistics work row by row; where a path choice depends on all rows,
    ``_Increases`` keeps it per selector); a name in no batch is a batch of its own (``batches``
    None: every name). Arrays handed out are shared with the cache: read-only.
    """

    def __init__(
        self, window: Window, recent_seconds: float | None = None, batches: Sequence[Sequence[str]] | None = None
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
        for names in batches or ():
            present = tuple(n for n in dict.fromkeys(names) if n in by_name and n not in seen)
            if present:
                self._batch_names.append(present)
                seen.update(present)
        self._batches: dict[str, _Batch] | None = None  # by name, built on first use
        self._parts: dict[Part, tuple[Columns, np.ndarray, float, float]] = {}
        self._times: list[float] | None = None
        self._times_known = False
        self._increases: dict[tuple[str, Part, Selector | None], np.ndarray] = {}
        self._labels: dict[str, list[dict[str, str]]] = {}
        self._picks: dict[Selector, np.ndarray | None] = {}
        self._buckets: dict[str, _Buckets] = {}

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

    def _part(self, part: Part) -> tuple[Columns, np.ndarray, float, float]:
        """(the part's columns; timestamps; range start; range end)."""
        hit = self._parts.get(part)
        if hit is None:
            start, end = self.start, self.end
            ts = self.ts
            cols: Columns = slice(None)
            if part != "all" and len(ts):
                start, end = part_range(part, start, end, self.recent_seconds)
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
        if not self._times_known:
            times: list[float] = self.ts.tolist()
            ok = not any(map(math.isnan, times)) and all(a <= b for a, b in pairwise(times))
            self._times = times if ok else None
            self._times_known = True
        return self._times

    def _increase(self, name: str, part: Part, sel: Selector | None = None) -> np.ndarray:
        """``stats.increase`` of the series ``name`` (those of ``sel``) over ``part``."""
        if name not in self._by_name:
            return np.empty(0)
        batch = self._batch(name)
        pick = None if sel is None else self._pick(sel)
        cols, ts, start, end = self._part(part)
        if part == "all":  # one call for the batch
            increases = batch.increases.get(part)
            if increases is None:
                increases = batch.increases[part] = _Increases(ts, batch.matrix, start, end, batch.gaps())
            return increases.of(batch.offsets[name], pick)
        # A part: per selector, on the layout its rows have always had once their columns were
        # picked (column-major, as ``rows[:, mask]`` makes them): numpy adds up a row of that
        # layout in another order than a row of the batch, which can move the last bit.
        key = (name, part, None if pick is None else sel)
        hit = self._increases.get(key)
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
            self._increases[key] = hit
        return hit

    def _quantile(self, name: str, q: float, part: Part) -> np.ndarray:
        """``stats.quantile_over_time`` of every series ``name`` over ``part`` (one sort per batch)."""
        if name not in self._by_name:
            return np.empty(0)
        batch = self._batch(name)
        hit = batch.quantiles.get((part, q))
        if hit is None:
            srt, complete = batch.sorted(part, self._part(part)[0])
            hit = stats.quantile_of_complete(q, srt) if complete else stats.quantile_of_sorted(q, srt)
            batch.quantiles[(part, q)] = hit
        return hit[batch.offsets[name]]

    def _label_dicts(self, name: str) -> list[dict[str, str]]:
        hit = self._labels.get(name)
        if hit is None:
            hit = self._labels[name] = [dict(labels) for labels, _ in self._by_name.get(name, ())]
        return hit

    def _pick(self, sel: Selector) -> np.ndarray | None:
        """Positions of the selector's series among those of its name; None when all match."""
        if not sel.matchers:
            return None
        if sel not in self._picks:
            dicts = self._label_dicts(sel.name)
            idx = [i for i, labels in enumerate(dicts) if sel.matches(labels)]
            self._picks[sel] = None if len(idx) == len(dicts) else np.array(idx, dtype=np.intp)
        return self._picks[sel]

    # ------------------------------------------------------------------------- the API
    def has(self, name: str) -> bool:
        """True if any series ``name`` has a sample in the window."""
        if name not in self._by_name:
            return False
        return self._batch(name).has(name)

    def labels(self, name: str) -> list[dict[str, str]]:
        return list(self._label_dicts(name))

    def rows(
        self, sel: Selector, part: Part = "all"
    ) -> tuple[list[dict[str, str]], np.ndarray, np.ndarray, float, float]:
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

    def rowwise(self, fn: RowFunction, sel: Selector, part: Part = "all") -> np.ndarray:
        """``fn(self.rows(sel, part)[1])`` for a function ``fn`` of a (rows, n) array that works row
        by row: over the whole window computed once for the batch of the selector's name."""
        if part != "all" or sel.name not in self._by_name:
            return fn(self.rows(sel, part)[1])
        batch = self._batch(sel.name)
        hit = batch.rowwise.get((fn, part))
        if hit is None:
            hit = batch.rowwise[(fn, part)] = fn(batch.matrix)
        out = hit[batch.offsets[sel.name]]
        idx = self._pick(sel)
        return out if idx is None else out[idx]

    # aggregations mirroring the PromQL the compiler writes
    def sum_rate(self, sel: Selector, part: Part = "all") -> float:
        _, _, start, end = self._part(part)
        return nansum(self._increase(sel.name, part, sel) / (end - start))

    def sum_deriv(self, sel: Selector, part: Part = "all") -> float:
        """``sum(deriv(x[part]))`` over the selector's series: how fast a gauge grows, per second."""
        _, values, ts, _, _ = self.rows(sel, part)
        return nansum(stats.deriv(ts, values)) if len(values) else math.nan

    def sum_increase(self, sel: Selector, part: Part = "all") -> float:
        return nansum(self._increase(sel.name, part, sel))

    def quantiles(self, sel: Selector, q: float, part: Part = "all") -> np.ndarray:
        out = self._quantile(sel.name, q, part)
        idx = self._pick(sel)
        return out if idx is None else out[idx]

    def histogram_quantile(self, name: str, q: float, part: Part = "all") -> float:
        bucket = name + "_bucket"
        if bucket not in self._by_name:
            return math.nan
        prepared = self._buckets.get(bucket)
        if prepared is None:
            prepared = self._buckets[bucket] = _Buckets(
                [parse_le(labels.get("le")) for labels in self._label_dicts(bucket)]
            )
        return prepared.quantile(q, self._increase(bucket, part).tolist())


class _Batch:
    """The series of some names, rows of one array, and what was computed on them per part."""

    __slots__ = (
        "_gaps",
        "_gaps_known",
        "_present",
        "increases",
        "matrix",
        "offsets",
        "parts",
        "quantiles",
        "rowwise",
        "sorted_parts",
    )

    def __init__(self, matrix: np.ndarray, offsets: dict[str, slice]):
        self.matrix = matrix
        self.offsets = offsets
        self.parts: dict[Part, np.ndarray] = {}
        self.increases: dict[Part, _Increases] = {}
        self.quantiles: dict[tuple[Part, float], np.ndarray] = {}
        self.sorted_parts: dict[Part, tuple[np.ndarray, bool]] = {}
        self.rowwise: dict[tuple[RowFunction, Part], np.ndarray] = {}
        self._present: dict[str, bool] | None = None
        self._gaps: np.ndarray | None = None
        self._gaps_known = False

    def gaps(self) -> np.ndarray | None:
        """For each row, whether it lacks a sample somewhere; None when no row does."""
        if not self._gaps_known:
            missing = np.isnan(self.matrix)
            self._gaps = missing.any(axis=1) if missing.any() else None
            self._gaps_known = True
        return self._gaps

    @staticmethod
    def stack(
        batches: Sequence[tuple[str, ...]], by_name: Mapping[str, list[tuple[Labels, np.ndarray]]], n: int
    ) -> dict[str, _Batch]:
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

    def values(self, part: Part, cols: Columns) -> np.ndarray:
        if isinstance(cols, slice):
            return self.matrix[:, cols]  # a view
        hit = self.parts.get(part)
        if hit is None:
            hit = self.parts[part] = self.matrix[:, cols]
            hit.flags.writeable = False
        return hit

    def sorted(self, part: Part, cols: Columns) -> tuple[np.ndarray, bool]:
        """Each row sorted (NaN last), and whether no row has a gap."""
        hit = self.sorted_parts.get(part)
        if hit is None:
            srt = np.sort(self.values(part, cols), axis=1)
            complete = srt.shape[1] > 0 and (self.gaps() is None or not np.isnan(srt[:, -1]).any())
            hit = self.sorted_parts[part] = (srt, complete)
        return hit

    def has(self, name: str) -> bool:
        if self._present is None:
            rows: list[bool]
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
        self.general = np.empty(0)  # the general path's answer, where a row needs it
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
        self.order: Callable[[list[float]], tuple[float, ...]] | None = None  # None: already in order
        if not any(map(math.isnan, bounds)):
            order = sorted(range(len(bounds)), key=bounds.__getitem__)
            ordered = [bounds[i] for i in order]
            if ordered and ordered[-1] == math.inf and all(a < b for a, b in pairwise(ordered)):
                self.sorted_bounds = ordered
                if order != list(range(len(bounds))):  # (so at least two buckets)
                    self.order = operator.itemgetter(*order)

    def quantile(self, q: float, increases: list[float]) -> float:
        """``histogram_quantile`` of the buckets' ``increases`` (NaN: a bucket without one)."""
        if self.sorted_bounds is not None and not any(map(math.isnan, increases)):
            counts = increases if self.order is None else list(self.order(increases))
            return stats.sorted_bucket_quantile(q, self.sorted_bounds, counts)
        kept = [(b, c) for b, c in zip(self.bounds, increases, strict=False) if c == c and b == b]  # drop NaN
        if not kept:
            return math.nan
        return stats.bucket_quantile(q, [b for b, _ in kept], [c for _, c in kept])


def parse_le(text: str | None) -> float:
    """A bucket's ``le`` label as a number (NaN when there is none or it is not one)."""
    try:
        return float(text) if text is not None else math.nan
    except ValueError:
        return math.nan


# numpy's sum of one element adds it to the identity (0.0 + -0.0 is 0.0) in some versions only
_SUM_OF_ONE_ADDS_ZERO = math.copysign(1.0, float(np.array([-0.0]).sum())) > 0


def nansum(values: np.ndarray) -> float:
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


def nanmax(values: np.ndarray) -> float:
    """Prometheus ``max``: the largest of the samples there are, no sample if there are none."""
    if len(values):
        top = values.max()  # NaN if any is
        if not math.isnan(top):
            return float(top)
    present = values[~np.isnan(values)]
    return float(present.max()) if len(present) else math.nan
