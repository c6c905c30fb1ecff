"""What each Live chart shows, as a small JSON form (``ChartData``), and how it is thinned. Pure.

``ChartData``::

    {"traces": [{"name": str, "kind": str, "group": str, "x": [...], "y": [...]}, ...],
     "extras": {...}}   # knee, decode-floor line, SLO: whatever is drawn but not appended to;
                        # "axes": each y axis' top, so dual axes share their ticks

``live_charts(frame, diagnosis)`` makes it from a ``LiveFrame``; ``figures.build(chart, data)``
turns it into a figure, ``extension(data, cap)`` into a ``dcc.Graph.extendData`` payload that
appends the same traces in the same order. ``signature(data)`` says what a figure is made of
(trace names and extras): when it changes the page rebuilds the figure instead of appending to it.
``axis_tops`` says how high each chart's y axes reach: a point above needs a rebuild, not an append.
``downsample`` and ``thin_scatter`` cut what a browser is sent to what it can show.

Every y axis of a live chart has ``TICKS`` intervals from zero to a round top (``nice_top``), so the
two axes of a dual-axis chart share their gridlines; tops have floors (``PCIE_AXIS_FLOOR``, ...) so
a few bytes of noise never fill a chart as a cliff would. The ITL charts carry the SLO the verdict
was made against (the diagnosis' context: the exporter's published SLO).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from tsdownsample import NaNMinMaxLTTBDownsampler

from kvdoctor.dashboard.derive import LiveFrame
from kvdoctor.rules.thresholds import Thresholds
from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.units import round_significant

KV_LATENCY = "kv_latency"
BANDWIDTH = "bandwidth"
TRANSFERS = "transfers"
ITL_KV = "itl_kv"
LIVE_CHARTS = (KV_LATENCY, BANDWIDTH, TRANSFERS, ITL_KV)

# Percent: where the tree calls decode bandwidth bound (its default threshold; a diagnosis made with
# another one carries it in its evidence, and the chart draws that: ``bandwidth_line``).
BANDWIDTH_BOUND_LINE = Thresholds().bandwidth_high_ratio * 100
KNEE_STEP = 0.02
TICKS = 5  # intervals on every y axis, so the two axes of a chart line up
# Axis floors: the least an axis shows, so noise stays near zero instead of filling the chart.
PCIE_AXIS_FLOOR = 1e9  # bytes/s: a small fraction of any PCIe link (Gen3 x16 moves ~16 GB/s)
PREEMPTION_AXIS_FLOOR = 1.0  # per second
LATENCY_AXIS_FLOOR_MS = 1.0
SLO_HEADROOM = 1.25  # the latency axis reaches at least this far above the SLO line
SCATTER_KINDS = frozenset({"itl_points"})

ChartData = dict[str, Any]


# --------------------------------------------------------------------------- compact JSON lists


def compact(values: Iterable[float] | np.ndarray, digits: int = 4) -> list:
    """Floats rounded to ``digits`` significant digits, ``None`` for NaN/inf (JSON null, a gap)."""
    a = np.asarray(values, dtype=float)
    out = np.full(a.shape, np.nan)
    finite = np.isfinite(a)
    x = a[finite]
    if x.size:
        nonzero = x != 0
        mag = np.zeros_like(x)
        mag[nonzero] = np.floor(np.log10(np.abs(x[nonzero])))
        shift = (digits - 1 - mag).astype(int)
        # Multiply or divide by an exact power of ten so the result prints short.
        up = np.power(10.0, np.clip(shift, 0, None))
        down = np.power(10.0, np.clip(-shift, 0, None))
        out[finite] = np.round(x * up / down) * down / up
    return [None if not f else v for f, v in zip(finite.tolist(), out.tolist(), strict=True)]


def epoch_ms(ts: np.ndarray) -> list[int]:
    return np.round(np.asarray(ts, dtype=float) * 1000.0).astype(np.int64).tolist()


# ------------------------------------------------------------------------------ frame -> charts


def _trace(name: str, kind: str, x: list, y, group: str = "", digits: int = 4) -> dict:
    return {"name": name, "kind": kind, "group": group, "x": x, "y": compact(y, digits)}


def knee_extras(diagnosis: Mapping | None) -> dict | None:
    """``{"kind", "kv_level"}`` from a diagnosis' knee, or None."""
    knee = (diagnosis or {}).get("knee")
    if not isinstance(knee, Mapping) or not knee.get("kind"):
        return None
    try:
        level = float(knee.get("kv_level"))
    except (TypeError, ValueError):
        return None
    if not math.isfinite(level):
        return None
    # Rounded to 2% of KV so a knee estimate that wobbles does not rebuild the charts each second.
    return {"kind": str(knee.get("kind") or ""), "kv_level": round(round(level / KNEE_STEP) * KNEE_STEP, 4)}


def bandwidth_line(diagnosis: Mapping | None) -> float:
    """The DRAM bandwidth (percent) at which the tree calls decode bandwidth bound: the threshold
    the diagnosis compared DRAM bandwidth with (its evidence, or its differential's), else the
    tree's default. The chart and the tree read one value."""
    entries = [diagnosis or {}, *((diagnosis or {}).get("differential") or [])]
    for entry in entries:
        for item in entry.get("evidence") or [] if isinstance(entry, Mapping) else []:
            threshold = item.get("threshold") if isinstance(item, Mapping) else None
            if (
                item.get("feature") == "dram_bandwidth_ratio"
                and isinstance(threshold, int | float)
                and 0 < threshold <= 1
            ):
                return float(threshold) * 100
    return BANDWIDTH_BOUND_LINE


def slo_ms(diagnosis: Mapping | None) -> float | None:
    """The ITL SLO (ms) the diagnosis was made against (its context: the exporter's published SLO)."""
    context = (diagnosis or {}).get("context")
    try:
        seconds = float(context.get("slo_seconds")) if isinstance(context, Mapping) else math.nan
    except (TypeError, ValueError):
        return None
    return round_significant(seconds * 1000.0) if math.isfinite(seconds) and seconds > 0 else None


def nice_top(peak: float, floor: float, intervals: int = TICKS) -> float:
    """The top of a y axis from zero: ``intervals`` steps of a round size (1, 2, 2.5 or 5 x 10^k),
    the smallest that reaches ``peak`` and ``floor``."""
    need = max(peak if math.isfinite(peak) else 0.0, floor, 1e-12)
    raw = need / intervals
    magnitude = 10.0 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1.0, 2.0, 2.5, 5.0, 10.0) if m * magnitude >= raw * (1 - 1e-9))
    return round_significant(step * intervals, 6)


def _peak(*arrays: np.ndarray) -> float:
    values = np.concatenate([np.asarray(a, dtype=float).ravel() for a in arrays]) if arrays else np.empty(0)
    values = values[np.isfinite(values)]
    return float(values.max()) if values.size else 0.0


def axis_tops(data_by_chart: Mapping[str, ChartData]) -> dict[str, dict[str, float]]:
    """Each chart's y-axis tops (``extras["axes"]``)."""
    return {chart: dict((data.get("extras") or {}).get("axes") or {}) for chart, data in data_by_chart.items()}


def exceeds(new: Mapping[str, Mapping[str, float]], drawn: Mapping[str, Mapping[str, float]] | None) -> bool:
    """Whether new points reach above an axis the browser has drawn (they would be cut off)."""
    return any(
        top > (drawn or {}).get(chart, {}).get(axis, math.inf)
        for chart, axes in new.items()
        for axis, top in axes.items()
    )


def floor_line(x: np.ndarray, floor_seconds: np.ndarray, x_max: float) -> dict | None:
    """The decode-floor line in ms over ``[0, x_max]`` fitted on (x, floor) pairs, or the points
    themselves when x has not moved enough to fit a slope; None without floor data."""
    ok = np.isfinite(x) & np.isfinite(floor_seconds)
    if not np.any(ok):
        return None
    xs, ys = x[ok], floor_seconds[ok] * 1000.0
    if np.ptp(xs) > 0.01 * max(x_max, 1e-12) and len(xs) >= 2:
        slope, intercept = np.polyfit(xs, ys, 1)
        ends = [intercept, intercept + slope * x_max]
        return {"x": [0.0, round_significant(x_max)], "y": [round_significant(v) for v in ends], "fit": True}
    median_x, median_y = float(np.median(xs)), float(np.median(ys))
    return {"x": [round_significant(median_x)], "y": [round_significant(median_y)], "fit": False}


def live_charts(
    frame: LiveFrame, diagnosis: Mapping | None = None, floor_frame: LiveFrame | None = None
) -> dict[str, ChartData]:
    """The four Live charts' data from a frame (all of a window, or only its new points).

    ``floor_frame`` is where the decode-floor line is fitted (the whole window); it defaults to
    ``frame``.
    """
    t = epoch_ms(frame.ts)
    knee = knee_extras(diagnosis)
    slo = slo_ms(diagnosis)
    latency_floor = max(LATENCY_AXIS_FLOOR_MS, (slo or 0.0) * SLO_HEADROOM)

    kv_latency = {
        "traces": [
            _trace("KV cache usage (%)", "kv", t, frame.kv_usage * 100.0),
            _trace("ITL p50 (ms)", "p50", t, frame.itl_p50 * 1000.0),
            _trace("ITL p95 (ms)", "p95", t, frame.itl_p95 * 1000.0),
        ],
        "extras": {
            "slo_ms": slo,
            "axes": {"y2": nice_top(_peak(frame.itl_p50, frame.itl_p95) * 1000.0, latency_floor)},
        },
    }

    bw_traces = []
    for g in frame.gpus:
        label = f"GPU {g.gpu}"
        if g.dram_method == S.METHOD_NVML_UTIL:
            bw_traces.append(
                _trace(f"{label} memory duty cycle (NVML, not bandwidth) (%)", "dram", t, g.dram * 100, g.gpu)
            )
        else:
            bw_traces.append(_trace(f"{label} DRAM bandwidth (%)", "dram", t, g.dram * 100, g.gpu))
        bw_traces.append(_trace(f"{label} SM activity (%)", "sm", t, g.sm * 100, g.gpu))
    bandwidth = {"traces": bw_traces, "extras": {"line": bandwidth_line(diagnosis)}}

    transfers = {
        "traces": [
            _trace("preemptions/s", "preemptions", t, frame.preemption_rate),
            _trace("KV to GPU (B/s)", "kv_to_gpu", t, frame.kv_to_gpu_rate),
            _trace("KV from GPU (B/s)", "kv_from_gpu", t, frame.kv_from_gpu_rate),
            _trace("PCIe receive (B/s)", "pcie_rx", t, frame.pcie_rx),
            _trace("PCIe transmit (B/s)", "pcie_tx", t, frame.pcie_tx),
        ],
        "extras": {
            "axes": {
                "y": nice_top(
                    _peak(frame.kv_to_gpu_rate, frame.kv_from_gpu_rate, frame.pcie_rx, frame.pcie_tx), PCIE_AXIS_FLOOR
                ),
                "y2": nice_top(_peak(frame.preemption_rate), PREEMPTION_AXIS_FLOOR),
            }
        },
    }

    by_tokens = math.isfinite(frame.kv_capacity_tokens)
    x = frame.resident_tokens if by_tokens else frame.kv_usage * 100.0
    ff = floor_frame or frame
    fx = ff.resident_tokens if by_tokens else ff.kv_usage * 100.0
    x_max = frame.kv_capacity_tokens if by_tokens else 100.0
    keep = np.isfinite(x) & np.isfinite(frame.itl_mean)
    floor = floor_line(fx, ff.decode_floor, x_max)
    knee_x = None
    if knee:
        knee_x = round_significant(knee["kv_level"] * (x_max if by_tokens else 100.0))
    itl_kv = {
        "traces": [
            {
                "name": "mean ITL (ms)",
                "kind": "itl_points",
                "group": "",
                "x": compact(x[keep], 5),
                "y": compact(frame.itl_mean[keep] * 1000.0),
            },
        ],
        "extras": {
            "x_unit": "tokens" if by_tokens else "percent",
            "x_max": round_significant(x_max, 6),
            "floor": floor,
            "knee": dict(knee, x=knee_x) if knee else None,
            "slo_ms": slo,
        },
    }
    return {KV_LATENCY: kv_latency, BANDWIDTH: bandwidth, TRANSFERS: transfers, ITL_KV: itl_kv}


def signature(data: ChartData) -> str:
    """What the figure is made of; a change means rebuild instead of append. The decode-floor
    line counts only by its presence: it is refitted on rebuilds, not on every update; the axes'
    tops are compared by ``exceeds`` (new points are often lower than the whole window's)."""
    extras = dict(data.get("extras") or {})
    extras.pop("axes", None)
    if "floor" in extras:
        extras["floor"] = bool(extras["floor"])
    return json.dumps([[t["name"] for t in data["traces"]], extras], sort_keys=True)


def signatures(data_by_chart: Mapping[str, ChartData]) -> dict[str, str]:
    """``signature`` of each chart."""
    return {chart: signature(data) for chart, data in data_by_chart.items()}


MIN_POINTS_PER_TRACE = 300
# A marker costs the browser far more than a line vertex (one SVG element each: ~0.2 ms in headless
# Chromium against ~0.002 ms a vertex, bench/bench_dashboard.py): scatters keep fewer points.
MAX_SCATTER_POINTS = 600
# Scatters are thinned to one point per cell of this grid (columns, rows) over the data's ranges:
# about 3 px a cell on a 550 x 240 px plot, so the markers (5 px) a cell drops lie under the one it
# keeps. Where that leaves more than the cap, the grid is halved each way until it does not.
SCATTER_GRID = (200, 100)


def thin_scatter(
    x: np.ndarray, y: np.ndarray, limit: int = MAX_SCATTER_POINTS, grid: tuple[int, int] = SCATTER_GRID
) -> np.ndarray:
    """Indices (in order) of the points of a scatter worth drawing: the newest point of each
    occupied grid cell, and always the extremes (lowest and highest x and y); at most ``limit``
    (``limit`` >= 5). Unlike an even sample this never drops an outlier: alone in its cell, it stays."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    idx = np.flatnonzero(np.isfinite(x) & np.isfinite(y))
    if len(idx) == 0:
        return idx
    xs, ys = x[idx], y[idx]
    extremes = idx[[np.argmin(xs), np.argmax(xs), np.argmin(ys), np.argmax(ys)]]

    def cells(values: np.ndarray, n: int) -> np.ndarray:
        lo, hi = min(0.0, float(values.min())), float(values.max())  # the axes start at zero
        span = hi - lo if hi > lo else 1.0
        return np.minimum(((values - lo) / span * n).astype(np.int64), n - 1)

    cols, rows = grid
    while True:
        cell = cells(xs, cols) * rows + cells(ys, rows)
        _, last = np.unique(cell[::-1], return_index=True)  # the newest point of each cell
        keep = np.union1d(idx[len(idx) - 1 - last], extremes)
        if len(keep) <= limit or cols * rows == 1:
            return keep
        cols, rows = max(1, cols // 2), max(1, rows // 2)


def downsample(data: ChartData, n_out: int, chart_budget: int | None = None) -> ChartData:
    """Each trace cut to at most ``n_out`` points with MinMaxLTTB (keeps the spikes and the gaps);
    with ``chart_budget``, the traces share that many points (at least MIN_POINTS_PER_TRACE each).
    Scatters are thinned to what can be seen (``thin_scatter``), at most MAX_SCATTER_POINTS."""
    if chart_budget and data["traces"]:
        n_out = min(n_out, max(MIN_POINTS_PER_TRACE, chart_budget // len(data["traces"])))
    traces = []
    for t in data["traces"]:
        xs, ys = t["x"], t["y"]
        if t["kind"] in SCATTER_KINDS:
            idx = thin_scatter(_floats(xs), _floats(ys), min(n_out, MAX_SCATTER_POINTS))
            traces.append(t if len(idx) == len(xs) else dict(t, x=[xs[i] for i in idx], y=[ys[i] for i in idx]))
            continue
        if len(xs) <= n_out:
            traces.append(t)
            continue
        x, y = _floats(xs), _floats(ys)
        if not np.all(np.diff(x) >= 0) or np.all(np.isnan(y)):  # not a time series, or nothing to keep
            idx = np.linspace(0, len(x) - 1, n_out).round().astype(int)
        else:
            idx = np.sort(NaNMinMaxLTTBDownsampler().downsample(x, y, n_out=n_out))
        traces.append(dict(t, x=[xs[i] for i in idx], y=[ys[i] for i in idx]))
    return {"traces": traces, "extras": data.get("extras")}


def _floats(values: list) -> np.ndarray:
    return np.asarray([np.nan if v is None else v for v in values], dtype=float)


def extension(data: ChartData, cap: int) -> tuple[dict, list[int], int] | None:
    """``dcc.Graph.extendData`` for appending ``data``'s points, keeping at most ``cap`` per trace."""
    traces = data["traces"]
    if not traces or not any(t["x"] for t in traces):
        return None
    if all(t["kind"] in SCATTER_KINDS for t in traces):
        cap = min(cap, MAX_SCATTER_POINTS)
    return (
        {"x": [t["x"] for t in traces], "y": [t["y"] for t in traces]},
        list(range(len(traces))),
        cap,
    )
