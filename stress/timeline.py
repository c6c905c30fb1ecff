"""``kvdoctor stress``: what a run recorded, and the run on one time grid.

The load generator (``load``) fills ``RequestRecord``s and ``StepRecord``s; the exporter's signals
arrive as a ``Window``. ``bin_run`` puts both on one grid (the exporter's collection intervals when
it recorded the run): KV usage, preemptions and the queue next to the per-token latency of each
interval. Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from kvdoctor.signals import stats
from kvdoctor.signals.vocabulary import (
    GENERATION_SECONDS,
    GENERATION_TOKENS,
    INTER_TOKEN_LATENCY,
    KV_CACHE_USAGE,
    PREEMPTIONS,
    REQUESTS_RUNNING,
    REQUESTS_WAITING,
)
from kvdoctor.signals.window import Window

# Tokens that reach the client less than this apart came in one read: the client was busy (a
# loaded machine, many streams in one event loop) and read what had piled up. Real gaps between
# two tokens of one request are longer (a decode step: ~0.5 ms for a tiny model on a CPU, 5-100 ms
# on real ones).
BURST_SECONDS = 0.00025


@dataclass
class RequestRecord:
    """One request of the load: when it started, when each streamed token arrived (Unix seconds)."""

    step: int  # index into the schedule of the step that started it
    started: float
    token_times: list[float] = field(default_factory=list)
    ended: float | None = None
    status: str = "running"  # running | ok | failed | cancelled
    error: str = ""
    completion_tokens: int | None = None  # from the usage the server reported, when it did

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.started if self.token_times else None

    def gaps(self) -> tuple[np.ndarray, np.ndarray]:
        """(arrival time, per-token latency) of the tokens after the first read.

        Tokens read together (a burst: less than ``BURST_SECONDS`` apart) share the time since the
        previous burst evenly, each placed at its share of it: a client that read 20 tokens at once
        after 26 ms saw 1.3 ms a token, not 26 ms once and nothing 19 times. The tokens that came
        with the first one have no time of their own (they waited behind the first token) and are
        left out; the first token's own latency is the time to first token."""
        t = np.asarray(self.token_times, dtype=float)
        if len(t) < 2:
            return np.empty(0), np.empty(0)
        starts = np.flatnonzero(np.diff(t) >= BURST_SECONDS) + 1  # the first token of each later burst
        if not len(starts):
            return np.empty(0), np.empty(0)
        ends = np.append(starts[1:], len(t)) - 1  # the last token of each of those bursts
        before = t[starts - 1]  # when the previous burst ended
        sizes = ends - starts + 1
        gap = np.repeat((t[ends] - before) / sizes, sizes)
        rank = np.arange(len(t) - starts[0]) - np.repeat(starts - starts[0], sizes) + 1
        return np.repeat(before, sizes) + gap * rank, gap


@dataclass
class StepRecord:
    index: int
    concurrency: int
    started: float
    ended: float | None = None


@dataclass(frozen=True)
class Bins:
    """The run on a common time grid (edges[i] .. edges[i+1]); NaN where nothing was measured."""

    edges: np.ndarray  # (n+1,) Unix seconds
    kv_usage: np.ndarray  # highest KV usage (0..1) sampled in the bin, any engine series
    itl_p50: np.ndarray  # per-token latency quantiles of the tokens that arrived in the bin (s)
    itl_p95: np.ndarray
    itl_mean: np.ndarray
    tokens: np.ndarray  # token gaps counted in the bin (the knee's weights)
    preemptions: np.ndarray  # preemptions the engine counted in the bin
    waiting: np.ndarray  # highest requests-waiting sample in the bin
    step: np.ndarray  # index of the step the bin belongs to (-1 outside every step)
    latency_source: str = "engine"  # "engine": the exporter's ITL histogram; "client": streamed-token gaps

    @property
    def centres(self) -> np.ndarray:
        return (self.edges[:-1] + self.edges[1:]) / 2

    def __len__(self) -> int:
        return len(self.edges) - 1


def kv_signals(window: Window) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The exporter signals the stress test reads, as (timestamps, per-snapshot value) each:
    KV usage (highest series); preemptions, generated tokens and generation seconds in each
    interval (counter deltas summed, resets handled; the end of each interval as its time);
    requests waiting and running (summed over series)."""
    ts = window.timestamps
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def rows(name: str) -> np.ndarray | None:
        found = list(window.select(name).values())
        return np.vstack(found) if found else None

    kv = rows(KV_CACHE_USAGE)
    if kv is not None:
        present = ~np.isnan(kv).all(axis=0)
        highest = np.full(len(ts), np.nan)
        highest[present] = np.nanmax(kv[:, present], axis=0)
        out["kv_usage"] = (ts, highest)
    for key, name in (
        ("preemptions", PREEMPTIONS),
        ("generation_tokens", GENERATION_TOKENS),
        ("generation_seconds", GENERATION_SECONDS),
    ):
        counter = rows(name)
        if counter is not None and len(ts) >= 2:
            out[key] = (ts[1:], stats.counter_deltas(counter).sum(axis=0))
    for key, name in (("waiting", REQUESTS_WAITING), ("running", REQUESTS_RUNNING)):
        values = rows(name)
        if values is not None:
            present = ~np.isnan(values).all(axis=0)
            summed = np.where(present, np.nansum(values, axis=0), np.nan)
            out[key] = (ts, summed)
    return out


def _bin_index(edges: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Bin of each time (-1 outside the grid); a time on an inner edge belongs to the earlier bin."""
    idx = np.searchsorted(edges, t, side="left") - 1
    idx[(t == edges[0])] = 0
    idx[(idx < 0) | (idx >= len(edges) - 1)] = -1
    return idx


class EngineLatency:
    """The engine's own per-token latency histogram (the exporter's ITL series), as per-interval
    bucket increases: quantiles and means over any set of intervals, counter resets handled."""

    def __init__(self, ends: np.ndarray, bounds: np.ndarray, buckets: np.ndarray, sums: np.ndarray, counts: np.ndarray):
        self.ends = ends  # (m,) end time of each interval between two snapshots
        self.bounds = bounds  # (k,) the ``le`` bounds, ascending, +Inf last
        self.buckets = buckets  # (k, m) increases of each cumulative bucket
        self.sums = sums  # (m,)
        self.counts = counts  # (m,)

    @classmethod
    def from_window(cls, window: Window | None) -> EngineLatency | None:
        if window is None or len(window) < 2:
            return None
        by_le: dict[float, list[np.ndarray]] = {}
        for labels, values in window.select(INTER_TOKEN_LATENCY + "_bucket").items():
            try:
                by_le.setdefault(float(dict(labels).get("le", "nan")), []).append(values)
            except ValueError:
                continue
        by_le.pop(math.nan, None)
        sums = list(window.select(INTER_TOKEN_LATENCY + "_sum").values())
        counts = list(window.select(INTER_TOKEN_LATENCY + "_count").values())
        if not by_le or not math.isinf(max(by_le)) or not sums or not counts:
            return None
        bounds = np.array(sorted(by_le))
        buckets = np.vstack([stats.counter_deltas(np.vstack(by_le[le])).sum(axis=0) for le in bounds])
        return cls(
            window.timestamps[1:],
            bounds,
            buckets,
            stats.counter_deltas(np.vstack(sums)).sum(axis=0),
            stats.counter_deltas(np.vstack(counts)).sum(axis=0),
        )

    def over(self, mask: np.ndarray) -> tuple[float, float, float, float]:
        """(p50, p95, mean, tokens) over the intervals selected by ``mask``; NaN without tokens."""
        tokens = float(self.counts[mask].sum())
        if tokens <= 0:
            return math.nan, math.nan, math.nan, 0.0
        increases = self.buckets[:, mask].sum(axis=1)
        p50 = stats.histogram_quantile(0.5, self.bounds, increases)
        p95 = stats.histogram_quantile(0.95, self.bounds, increases)
        return p50, p95, float(self.sums[mask].sum()) / tokens, tokens


def token_arrivals(requests: list[RequestRecord]) -> np.ndarray:
    """When every streamed token of every request arrived."""
    if not requests:
        return np.empty(0)
    return np.concatenate([np.asarray(r.token_times, dtype=float) for r in requests])


def client_gaps(requests: list[RequestRecord]) -> tuple[np.ndarray, np.ndarray]:
    """(arrival time, per-token latency) of the streamed tokens after each request's first read
    (``RequestRecord.gaps``), all requests."""
    arrivals = [r.gaps() for r in requests]
    if not arrivals:
        return np.empty(0), np.empty(0)
    return np.concatenate([a for a, _ in arrivals]), np.concatenate([g for _, g in arrivals])


def _forward_fill_short(values: np.ndarray, limit: int) -> np.ndarray:
    """NaN runs of at most ``limit`` after a value take that value (a bin the exporter's cycle missed)."""
    out = values.copy()
    last, run = math.nan, 0
    for i, v in enumerate(out):
        if math.isnan(v):
            run += 1
            if not math.isnan(last) and run <= limit:
                out[i] = last
        else:
            last, run = v, 0
    return out


def _grid(window: Window | None, start: float, end: float, bin_seconds: float) -> np.ndarray:
    """Bin edges: the exporter's own snapshots when it recorded the run (each bin one collection
    interval, its KV sample at the end: the pairs ``rules.knee`` fits), else a fixed grid."""
    if window is not None and len(window) >= 2:
        ts = window.timestamps
        first = int(np.searchsorted(ts, start, side="right"))  # the first snapshot after the start
        last = int(np.searchsorted(ts, end, side="right")) - 1  # the last snapshot before the load stopped
        first, last = max(first, 1), min(last, len(ts) - 1)
        if last > first:
            return ts[first - 1 : last + 1].astype(float)
    n = max(1, math.ceil((end - start) / bin_seconds - 1e-9))
    return start + bin_seconds * np.arange(n + 1)


def bin_run(
    requests: list[RequestRecord],
    steps: list[StepRecord],
    window: Window | None,
    start: float,
    end: float,
    bin_seconds: float = 1.0,
) -> Bins:
    """The run on one grid (the exporter's collection intervals when it recorded the run): its KV
    usage, preemptions and queue, and the per-token latency -- the engine's own (the exporter's ITL
    histogram) when recorded, else the gaps between streamed tokens at the client (which carry the
    client's own scheduling noise too)."""
    if not (bin_seconds > 0) or not end > start:
        raise ValueError("need bin_seconds > 0 and end > start")
    edges = _grid(window, start, end, bin_seconds)
    n = len(edges) - 1
    nan = lambda: np.full(n, np.nan)  # noqa: E731
    itl_p50, itl_p95, itl_mean, kv, waiting = nan(), nan(), nan(), nan(), nan()
    tokens = np.zeros(n)
    preemptions = nan()

    engine = EngineLatency.from_window(window)
    if engine is not None:
        source = "engine"
        idx = _bin_index(edges, engine.ends)
        for b in range(n):
            itl_p50[b], itl_p95[b], itl_mean[b], tokens[b] = engine.over(idx == b)
    else:
        source = "client"
        times, gaps = client_gaps(requests)
        if len(times):
            idx = _bin_index(edges, times)
            for b in range(n):
                g = gaps[idx == b]
                if len(g):
                    tokens[b] = len(g)
                    itl_p50[b], itl_p95[b] = np.quantile(g, [0.5, 0.95])
                    itl_mean[b] = g.mean()

    if window is not None and len(window):
        sig = kv_signals(window)
        for key, target in (("kv_usage", kv), ("waiting", waiting)):
            if key in sig:
                ts, values = sig[key]
                idx = _bin_index(edges, ts)
                for b, v in zip(idx, values, strict=True):
                    if b >= 0 and not math.isnan(v):
                        target[b] = v if math.isnan(target[b]) else max(target[b], v)
        kv[:] = _forward_fill_short(kv, 2)
        if "preemptions" in sig:
            ts, values = sig["preemptions"]
            preemptions[:] = 0.0
            idx = _bin_index(edges, ts)
            for b, v in zip(idx, values, strict=True):
                if b >= 0:
                    preemptions[b] += v

    step = np.full(n, -1)
    centres = (edges[:-1] + edges[1:]) / 2
    for s in steps:
        stop = s.ended if s.ended is not None else end
        step[(centres >= s.started) & (centres < stop)] = s.index
    return Bins(edges, kv, itl_p50, itl_p95, itl_mean, tokens, preemptions, waiting, step, source)
