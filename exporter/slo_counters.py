"""The SLO counters: observations over the exporter's latency SLOs, for the burn-rate alerts.

Each cycle, for every series of the engine's ITL histogram (and its TTFT histogram where a TTFT SLO
is set), the observations over the SLO are read from the cumulative buckets
(``signals.stats.observations_over``) and their growth since the last cycle is added to
``kvdoctor_tokens_over_itl_slo_total`` (``kvdoctor_requests_over_ttft_slo_total``). Divided by the
histogram's ``_count``, its increase over any window is the share over the SLO in that window: one
series per engine where the buckets are twenty or more, so the long burn-rate windows read two
counters instead of every bucket (rules/slo_alerts.py).

The counters start at 0 with the exporter and only ever grow: an SLO changed between two runs
cannot make the first cycle's count jump, and an engine that restarts (its histogram's count falls)
adds what it counted since.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.stats import observations_over
from kvdoctor.signals.window import Labels, SeriesKey


@dataclass(frozen=True)
class SloCount:
    """One counter: the histogram it reads and the SLO (seconds) it counts against."""

    counter: str
    histogram: str
    slo_seconds: float


def slo_counts(slo_seconds: float, ttft_slo_seconds: float | None) -> tuple[SloCount, ...]:
    """The counters an exporter with these SLOs publishes."""
    counts = [SloCount(S.TOKENS_OVER_ITL_SLO, S.INTER_TOKEN_LATENCY, slo_seconds)]
    if ttft_slo_seconds:
        counts.append(SloCount(S.REQUESTS_OVER_TTFT_SLO, S.TIME_TO_FIRST_TOKEN, ttft_slo_seconds))
    return tuple(counts)


def histograms_over(count: SloCount, samples: Mapping[SeriesKey, float]) -> dict[Labels, tuple[float, float]]:
    """For each series of ``count``'s histogram (its labels without ``le``): (observations over the
    SLO, observations), from the cumulative buckets in ``samples``. Stateless: the fleet rig and the
    tests compute the same figures from a scenario's buckets."""
    bucket = count.histogram + "_bucket"
    by_series: dict[Labels, tuple[list[float], list[float]]] = {}
    for (name, labels), value in samples.items():
        if name != bucket:
            continue
        le = next((v for k, v in labels if k == "le"), None)
        if le is None:
            continue
        try:
            bound = float(le)
        except ValueError:
            continue
        bounds, values = by_series.setdefault(tuple(kv for kv in labels if kv[0] != "le"), ([], []))
        bounds.append(bound)
        values.append(value)
    out = {}
    for labels, (bounds, values) in by_series.items():
        over = observations_over(count.slo_seconds, bounds, values)
        if over == over:  # NaN: no +Inf bucket, not a histogram to count
            out[labels] = (over, max(values))
    return out


class SloCounters:
    """The counters of one exporter, kept across cycles."""

    def __init__(self, counts: tuple[SloCount, ...]):
        self.counts = counts
        self._last: dict[SeriesKey, tuple[float, float]] = {}  # counter key -> (over, count) last cycle
        self._totals: dict[SeriesKey, float] = {}

    def samples(self, samples: Mapping[SeriesKey, float]) -> dict[SeriesKey, float]:
        """This cycle's counter values (every series the histograms have now)."""
        seen: dict[SeriesKey, tuple[float, float]] = {}
        for count in self.counts:
            for labels, figures in histograms_over(count, samples).items():
                seen[(count.counter, labels)] = figures
        for key, (over, total) in seen.items():
            last = self._last.get(key)
            if last is None:
                grew = 0.0  # counted from the first cycle on
            elif total < last[1]:
                grew = over  # the engine restarted: its histogram counts again from 0
            else:
                grew = max(0.0, over - last[0])  # never less: the interpolation's rounding is no restart
            self._totals[key] = self._totals.get(key, 0.0) + grew
        # A series gone from the histogram is forgotten; should it return, its counter starts again at 0.
        self._last = seen
        self._totals = {key: self._totals[key] for key in seen}
        return dict(self._totals)

    @property
    def series(self) -> int:
        """Series to keep room for: one per counter and engine label set seen last cycle (at least one each)."""
        return max(len(self.counts), len(self._last))
