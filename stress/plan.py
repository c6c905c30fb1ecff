"""``kvdoctor stress``, the pure half: the concurrency schedule, what a run recorded, and what it means.

The KV-cache pressure test (the troubleshooting guide's): a fixed long prompt and a fixed generation
length, concurrency stepped up 1, 2, 4, ... until the KV cache saturates (usage at the ceiling or
the engine preempting) or a limit, while the exporter's signals are recorded. Two shapes tell two
stories, as in ``kvdoctor.rules.knee``:

- latency rising in step with KV usage: every decode step re-reads the KV of the whole batch
  (memory-bandwidth bound; on a CPU engine, the same memory-traffic effect, smaller);
- latency flat, then a jump once KV usage passes a level: the pool ran out and the engine
  started preempting (recomputing) or paging KV from a slower tier.

Everything here is pure (no I/O, no clock): ``stress_load`` measures, ``stress_report`` draws,
``kvdoctor.commands.stress`` drives. Per-token latency is measured at the client (the time between
streamed tokens, what a user sees), and binned on the exporter's clock next to its KV usage,
preemption and queue samples; the knee is fitted on the (KV usage, mean per-token latency) pairs
of the bins, weighted by the tokens in each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from kvdoctor.rules import stats
from kvdoctor.rules.knee import JUMP, RISES_WITH_KV, Knee, detect_knee
from kvdoctor.rules.signals import INTER_TOKEN_LATENCY, KV_CACHE_USAGE, PREEMPTIONS, REQUESTS_RUNNING, REQUESTS_WAITING
from kvdoctor.rules.thresholds import Thresholds
from kvdoctor.rules.window import Window

__all__ = [
    "DEFAULT_KV_SATURATION",
    "Bins",
    "EngineLatency",
    "RequestRecord",
    "Saturation",
    "StepRecord",
    "StepSummary",
    "StressSettings",
    "Verdict",
    "bin_run",
    "find_saturation",
    "kv_signals",
    "step_schedule",
    "stress_verdict",
    "summarise_steps",
    "summary_json",
]

DEFAULT_KV_SATURATION = 0.95
BANDWIDTH = "bandwidth_bound"
PREEMPTION_ONSET = "preemption_onset"
NO_KNEE = "no_knee"
UNKNOWN = "unknown"


@dataclass(frozen=True)
class StressSettings:
    """What one stress run was asked to do."""

    endpoint: str
    model: str | None = None
    prompt_tokens: int = 1000
    max_tokens: int = 500
    start_concurrency: int = 1
    max_concurrency: int = 256
    step_seconds: float = 30.0
    kv_saturation: float = DEFAULT_KV_SATURATION
    exporter: str | None = None

    def validate(self) -> None:
        """ValueError with one line naming the flag, for anything a run cannot use."""
        if self.prompt_tokens < 1:
            raise ValueError(f"--prompt-tokens must be at least 1, got {self.prompt_tokens}")
        if self.max_tokens < 2:
            raise ValueError(
                f"--max-tokens must be at least 2 (per-token latency needs two tokens), got {self.max_tokens}"
            )
        if self.start_concurrency < 1:
            raise ValueError(f"--start-concurrency must be at least 1, got {self.start_concurrency}")
        if self.max_concurrency < self.start_concurrency:
            raise ValueError(
                f"--max-concurrency ({self.max_concurrency}) is below --start-concurrency ({self.start_concurrency})"
            )
        if not (self.step_seconds > 0 and math.isfinite(self.step_seconds)):
            raise ValueError(f"--step-seconds must be a positive number, got {self.step_seconds:g}")
        if not 0 < self.kv_saturation <= 1:
            raise ValueError(f"--kv-saturation must be in (0, 1], got {self.kv_saturation:g}")


def step_schedule(start: int, maximum: int) -> list[int]:
    """Concurrency levels: ``start`` doubled until ``maximum``, which is always the last level.

    >>> step_schedule(1, 16)
    [1, 2, 4, 8, 16]
    >>> step_schedule(1, 24)
    [1, 2, 4, 8, 16, 24]
    >>> step_schedule(3, 3)
    [3]
    """
    if start < 1 or maximum < start:
        raise ValueError(f"need 1 <= start ({start}) <= maximum ({maximum})")
    levels = []
    level = start
    while level < maximum:
        levels.append(level)
        level *= 2
    levels.append(maximum)
    return levels


# ------------------------------------------------------------------------------ what was recorded


@dataclass
class RequestRecord:
    """One request of the load: when it started, when each streamed chunk arrived (Unix seconds)."""

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
        """(arrival time, seconds since the previous token) of every token after the first."""
        t = np.asarray(self.token_times, dtype=float)
        if len(t) < 2:
            return np.empty(0), np.empty(0)
        return t[1:], np.diff(t)


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
    KV usage (highest series), preemptions in each interval (counter deltas summed, resets handled),
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
    pre = rows(PREEMPTIONS)
    if pre is not None and len(ts) >= 2:
        deltas = stats.counter_deltas(pre).sum(axis=0)
        out["preemptions"] = (ts[1:], deltas)
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


def client_gaps(requests: list[RequestRecord]) -> tuple[np.ndarray, np.ndarray]:
    """(arrival time, gap) of every streamed token after each request's first, all requests."""
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
    n = max(1, int(math.ceil((end - start) / bin_seconds - 1e-9)))
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
                for b, v in zip(idx, values):
                    if b >= 0 and not math.isnan(v):
                        target[b] = v if math.isnan(target[b]) else max(target[b], v)
        kv[:] = _forward_fill_short(kv, 2)
        if "preemptions" in sig:
            ts, values = sig["preemptions"]
            preemptions[:] = 0.0
            idx = _bin_index(edges, ts)
            for b, v in zip(idx, values):
                if b >= 0:
                    preemptions[b] += v

    step = np.full(n, -1)
    centres = (edges[:-1] + edges[1:]) / 2
    for s in steps:
        stop = s.ended if s.ended is not None else end
        step[(centres >= s.started) & (centres < stop)] = s.index
    return Bins(edges, kv, itl_p50, itl_p95, itl_mean, tokens, preemptions, waiting, step, source)


# ------------------------------------------------------------------------------- what it means


@dataclass(frozen=True)
class StepSummary:
    index: int
    concurrency: int
    seconds: float
    requests_started: int
    requests_completed: int
    requests_failed: int
    tokens: int  # streamed tokens received during the step
    tokens_per_second: float
    itl_p50_ms: float | None
    itl_p95_ms: float | None
    ttft_p50_ms: float | None
    kv_usage_max: float | None
    kv_usage_median: float | None
    preemptions: float | None
    waiting_max: float | None

    def to_json(self) -> dict:
        return {k: _num(v) for k, v in self.__dict__.items()}


def _num(v):
    if isinstance(v, (float, np.floating)):
        return None if not math.isfinite(float(v)) else round(float(v), 6)
    if isinstance(v, np.integer):
        return int(v)
    return v


def _ms(v: float) -> float | None:
    return None if v is None or math.isnan(v) else float(v) * 1000.0


def summarise_steps(
    requests: list[RequestRecord], steps: list[StepRecord], bins: Bins, window: Window | None = None
) -> list[StepSummary]:
    """One line per concurrency step: the load and what the client saw (tokens/s, TTFT), the per-token
    latency (the engine's histogram when ``window`` has it, else the client's), the exporter's KV,
    preemptions and queue."""
    engine = EngineLatency.from_window(window)
    times, gaps = client_gaps(requests)
    out = []
    for s in steps:
        stop = s.ended if s.ended is not None else float(bins.edges[-1])
        seconds = max(stop - s.started, 1e-9)
        mine = [r for r in requests if r.step == s.index]
        in_step = (times > s.started) & (times <= stop)
        if engine is not None:
            p50, p95, _, _ = engine.over((engine.ends > s.started) & (engine.ends <= stop))
        else:
            g = gaps[in_step]
            p50, p95 = np.quantile(g, [0.5, 0.95]) if len(g) else (math.nan, math.nan)
        streamed = int(in_step.sum()) + sum(
            1 for r in requests if r.token_times and s.started < r.token_times[0] <= stop
        )
        ttfts = [r.ttft for r in mine if r.ttft is not None]
        in_bins = bins.step == s.index
        kv = bins.kv_usage[in_bins]
        kv = kv[~np.isnan(kv)]
        pre = bins.preemptions[in_bins]
        waiting = bins.waiting[in_bins]
        waiting = waiting[~np.isnan(waiting)]
        out.append(
            StepSummary(
                index=s.index,
                concurrency=s.concurrency,
                seconds=seconds,
                requests_started=len(mine),
                requests_completed=sum(1 for r in mine if r.status == "ok"),
                requests_failed=sum(1 for r in mine if r.status == "failed"),
                tokens=streamed,
                tokens_per_second=streamed / seconds,
                itl_p50_ms=_ms(p50),
                itl_p95_ms=_ms(p95),
                ttft_p50_ms=_ms(float(np.median(ttfts))) if ttfts else None,
                kv_usage_max=float(kv.max()) if len(kv) else None,
                kv_usage_median=float(np.median(kv)) if len(kv) else None,
                preemptions=None if not len(pre) or np.isnan(pre).all() else float(np.nansum(pre)),
                waiting_max=float(waiting.max()) if len(waiting) else None,
            )
        )
    return out


@dataclass(frozen=True)
class Saturation:
    """When the KV cache saturated: the first bin at the ceiling or with a preemption."""

    reached: bool
    reason: str = ""  # "kv_ceiling" | "preemptions" | ""
    at: float | None = None  # Unix seconds (the bin's start)
    step: int | None = None
    concurrency: int | None = None
    kv_usage: float | None = None  # the highest KV usage seen up to that moment

    def to_json(self) -> dict:
        return {k: _num(v) for k, v in self.__dict__.items()}


def find_saturation(bins: Bins, steps: list[StepRecord], kv_ceiling: float = DEFAULT_KV_SATURATION) -> Saturation:
    with np.errstate(invalid="ignore"):
        at_ceiling = bins.kv_usage >= kv_ceiling
        preempted = bins.preemptions > 0
    hit = np.flatnonzero(at_ceiling | preempted)
    if not len(hit):
        return Saturation(False)
    b = int(hit[0])
    reason = "preemptions" if preempted[b] else "kv_ceiling"
    step = int(bins.step[b]) if bins.step[b] >= 0 else None
    concurrency = next((s.concurrency for s in steps if s.index == step), None)
    # the fullest the pool got up to then (a preemption frees blocks: the bin itself may read low)
    seen = bins.kv_usage[: b + 1]
    seen = seen[~np.isnan(seen)]
    kv = float(seen.max()) if len(seen) else None
    return Saturation(True, reason, float(bins.edges[b]), step, concurrency, kv)


@dataclass(frozen=True)
class Verdict:
    """The pattern of the run: ``pattern`` is bandwidth_bound, preemption_onset, no_knee or unknown."""

    pattern: str
    headline: str
    knee: Knee
    knee_time: float | None = None  # when KV usage first reached the knee's level

    def to_json(self) -> dict:
        return {
            "pattern": self.pattern,
            "headline": self.headline,
            "knee": self.knee.to_json(),
            "knee_time": _num(self.knee_time),
        }


def stress_verdict(bins: Bins, saturation: Saturation, thresholds: Thresholds | None = None) -> Verdict:
    """The knee of (KV usage, mean per-token latency) over the run, in words."""
    t = thresholds or Thresholds()
    has_kv = not np.isnan(bins.kv_usage).all()
    total_pre = float(np.nansum(bins.preemptions)) if not np.isnan(bins.preemptions).all() else None
    pre_text = f"; the engine preempted {total_pre:.0f} time{'s' if total_pre != 1 else ''}" if total_pre else ""
    if not has_kv:
        knee = Knee(note="no KV usage recorded")
        return Verdict(
            UNKNOWN, "KV usage unknown (no exporter signals): latency is reported against concurrency only", knee
        )
    knee = detect_knee(bins.kv_usage, bins.itl_mean, bins.tokens, t)
    knee_time = None
    if knee.kv_level is not None:
        with np.errstate(invalid="ignore"):
            reached = np.flatnonzero(bins.kv_usage >= knee.kv_level)
        knee_time = float(bins.centres[reached[0]]) if len(reached) else None
    if knee.kind == JUMP:
        cause = (
            "preemption onset: the KV pool ran out"
            if total_pre
            else "paging onset: KV no longer fits where it is read fastest"
        )
        headline = (
            f"Per-token latency jumps x{knee.ratio:.1f} once KV usage passes ~{knee.kv_level:.0%}: {cause}{pre_text}"
        )
        return Verdict(PREEMPTION_ONSET, headline, knee, knee_time)
    if knee.kind == RISES_WITH_KV:
        with np.errstate(invalid="ignore"):
            paired = bins.kv_usage[~np.isnan(bins.kv_usage) & ~np.isnan(bins.itl_mean) & (bins.tokens > 0)]
        kv = paired if len(paired) else bins.kv_usage[~np.isnan(bins.kv_usage)]
        headline = (
            f"Per-token latency rises in step with KV usage (x{knee.ratio:.2f} as it goes "
            f"{kv.min():.0%} -> {kv.max():.0%}): decode is memory-bandwidth bound, every token "
            f"re-reads the batch's KV{pre_text}"
        )
        return Verdict(BANDWIDTH, headline, knee, knee_time)
    reach = (
        f"; KV saturated at concurrency {saturation.concurrency}"
        if saturation.reached and saturation.concurrency
        else "; KV did not saturate"
    )
    why = knee.note.removeprefix("no knee: ")
    return Verdict(NO_KNEE, f"No knee: {why}{reach}{pre_text}", knee, knee_time)


def summary_json(
    settings: StressSettings,
    info: dict,
    steps: list[StepSummary],
    saturation: Saturation,
    verdict: Verdict,
    started: float,
    ended: float,
    extra: dict | None = None,
) -> dict:
    """summary.json: what was asked, what the endpoint was, each step, saturation and the verdict."""
    return {
        "kind": "kvdoctor-stress",
        "version": 1,
        "settings": {k: _num(v) for k, v in settings.__dict__.items()},
        "endpoint": info,
        "started": started,
        "ended": ended,
        "seconds": round(ended - started, 3),
        "steps": [s.to_json() for s in steps],
        "saturation": saturation.to_json(),
        "verdict": verdict.to_json(),
        **(extra or {}),
    }
