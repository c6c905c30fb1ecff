"""Knee detection on the window's (KV usage, inter-token latency) pairs.

Two shapes tell two stories:

- ``rises_with_kv``: latency climbs steadily with resident KV -- every decode step re-reads the
  whole KV of the batch, so the step time grows with it (HBM bandwidth);
- ``jump``: latency is flat, then jumps once KV usage passes a level -- the pool ran out and the
  engine started preempting (recomputing) or paging KV from a slower tier.

Both are fitted on log(ITL) (a preemption stall is a multiplicative outlier, not an additive one):
a straight line against KV usage, and the best two-level step. A step that explains the data much
better than the line, with a large enough ratio between its levels, is a jump at the step's KV
level; otherwise a line with a large enough rise over the KV range is ``rises_with_kv``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvdoctor.signals.units import fmt_pct

from .thresholds import Thresholds

RISES_WITH_KV = "rises_with_kv"
JUMP = "jump"

# The step must cut the residual error of the straight line at least this much to win.
_STEP_BEATS_LINE = 0.6
# Candidate split points are taken between distinct KV levels, keeping this share on each side.
_MIN_SIDE_SHARE = 0.1


@dataclass(frozen=True)
class Knee:
    """``kind``: "rises_with_kv", "jump" or None (no knee or not enough data); ``kv_level``: the
    KV usage (0..1) where latency jumps, or where the rise starts."""

    kind: str | None = None
    kv_level: float | None = None
    ratio: float | None = None  # ITL above / below the jump, or at the top / bottom of the KV range
    points: int = 0
    note: str = ""

    def to_json(self) -> dict[str, str | float | int | None]:
        return {
            "kind": self.kind,
            "kv_level": None if self.kv_level is None else round(float(self.kv_level), 4),
            "ratio": None if self.ratio is None else round(float(self.ratio), 4),
            "points": self.points,
            "note": self.note,
        }


def detect_knee(
    kv_usage: np.ndarray,
    itl_seconds: np.ndarray,
    weights: np.ndarray | None = None,
    thresholds: Thresholds | None = None,
) -> Knee:
    """Classify the (KV usage, ITL) cloud. ``weights`` (e.g. tokens per interval) weight the fit;
    pairs with a NaN or a non-positive ITL or weight are dropped."""
    t = thresholds or Thresholds()
    x = np.asarray(kv_usage, dtype=float)
    y = np.asarray(itl_seconds, dtype=float)
    w = np.ones_like(x) if weights is None else np.asarray(weights, dtype=float)
    with np.errstate(invalid="ignore"):
        # a NaN compares false, so ``> 0`` also drops pairs with a NaN ITL or weight
        keep = ~np.isnan(x) & (y > 0) & (w > 0)
    if not keep.all():
        x, y, w = x[keep], y[keep], w[keep]
    y = np.log(y)
    n = len(x)
    if n < t.knee_min_points:
        return Knee(points=n, note=f"{n} intervals with tokens; need {int(t.knee_min_points)}")
    span = float(x.max() - x.min())
    if span < t.knee_min_kv_span:
        return Knee(points=n, note=f"KV usage moved only {fmt_pct(span, 1)} in the window")

    order = np.argsort(x, kind="stable")
    x, y, w = x[order], y[order], w[order]
    wsum = w.sum()
    wy = w * y
    mean_y = wy.sum() / wsum
    dy = y - mean_y
    sst = (w * dy**2).sum()
    if sst <= 1e-12:
        return Knee(points=n, note="latency does not vary with KV usage")

    # Straight line (weighted least squares).
    mean_x = (w * x).sum() / wsum
    dx = x - mean_x
    sxx = (w * dx**2).sum()
    slope = (w * dx * dy).sum() / sxx
    sse_line = (w * (dy - slope * dx) ** 2).sum()

    # Best two-level step: cumulative sums give every split's error at once.
    cw = w.cumsum()
    cy = wy.cumsum()
    cyy = (wy * y).cumsum()
    # a split after index i (left = 0..i); only between distinct KV values, enough weight each side
    distinct = x[1:] > x[:-1]
    share = cw[:-1] / wsum
    valid = distinct & (share >= _MIN_SIDE_SHARE) & (share <= 1 - _MIN_SIDE_SHARE)
    best_step = None
    if valid.any():
        lw, ly, lyy = cw[:-1], cy[:-1], cyy[:-1]
        rw, ry, ryy = wsum - lw, cy[-1] - ly, cyy[-1] - lyy
        sse = (lyy - ly**2 / lw) + (ryy - ry**2 / rw)
        sse = np.where(valid, sse, np.inf)
        k = int(sse.argmin())
        left_mean, right_mean = ly[k] / lw[k], ry[k] / rw[k]
        best_step = (float(sse[k]), float((x[k] + x[k + 1]) / 2), math.exp(right_mean - left_mean))

    if best_step is not None:
        sse_step, level, ratio = best_step
        if sse_step <= _STEP_BEATS_LINE * sse_line and ratio >= t.knee_jump_ratio:
            return Knee(JUMP, level, ratio, n, f"ITL jumps x{ratio:.1f} once KV usage passes ~{fmt_pct(level)}")

    rise = math.exp(slope * span)
    r2 = 1.0 - sse_line / sst
    if rise >= t.knee_rise_ratio and r2 >= 0.3:
        note = f"ITL rises x{rise:.2f} as KV usage goes {fmt_pct(x[0])} -> {fmt_pct(x[-1])}"
        return Knee(RISES_WITH_KV, float(x[0]), rise, n, note)
    return Knee(points=n, note="no knee: latency does not follow KV usage")
