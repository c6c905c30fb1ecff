"""``kvdoctor stress``, the pure half: the concurrency schedule, and what a run means.

The KV-cache pressure test (the troubleshooting guide's): a fixed long prompt and a fixed generation
length, concurrency stepped up 1, 2, 4, ... until the KV cache saturates (usage at the ceiling or
the engine preempting) or a limit, while the exporter's signals are recorded. Two shapes tell two
stories, as in ``kvdoctor.rules.knee``:

- latency rising in step with KV usage: every decode step re-reads the KV of the whole batch
  (memory-bandwidth bound; on a CPU engine, the same memory-traffic effect, smaller);
- latency flat, then a jump once KV usage passes a level: the pool ran out and the engine
  started preempting (recomputing) or paging KV from a slower tier.

An engine that publishes no KV usage (llama.cpp without /slots, TGI) cannot saturate it: there the
run stops on the queue instead, the first step whose requests wait (median waiting at the tree's
``queue_waiting_min``) or whose time to first token (median) is over its SLO, and says so.

Everything here is pure (no I/O, no clock): ``load`` measures, ``timeline`` puts what it recorded
on one time grid, this module says what it means, ``report`` draws, ``kvdoctor.commands.stress``
drives. Per-token latency is the engine's own (the exporter's ITL histogram) when recorded, else
measured at the client (the time between streamed tokens), binned on the exporter's clock next to
its KV usage, preemption and queue samples; the knee is fitted on the (KV usage, mean per-token
latency) pairs of the bins, weighted by the tokens in each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvdoctor.rules.knee import JUMP, RISES_WITH_KV, Knee, detect_knee
from kvdoctor.rules.thresholds import Thresholds
from kvdoctor.signals.vocabulary import GPU_DRAM_BANDWIDTH_UTILIZATION, METHOD_NVML_UTIL
from kvdoctor.signals.window import Window

# The records and the binning live in ``timeline``; they are part of this module's interface too.
from kvdoctor.stress.timeline import (
    Bins,
    EngineLatency,
    RequestRecord,
    StepRecord,
    client_gaps,
    kv_signals,
    token_arrivals,
)

__all__ = [
    "DEFAULT_KV_SATURATION",
    "DEFAULT_TTFT_SLO_SECONDS",
    "QUEUE",
    "TTFT",
    "Saturation",
    "StepSummary",
    "StressSettings",
    "Verdict",
    "dram_bandwidth_peak",
    "find_saturation",
    "queue_reached",
    "step_schedule",
    "stress_verdict",
    "summarise_steps",
    "summary_json",
]

DEFAULT_KV_SATURATION = 0.95
DEFAULT_TTFT_SLO_SECONDS = Thresholds().ttft_slow_seconds
QUEUE = "queue"  # Saturation.reason: requests waited (no KV signal)
TTFT = "ttft"  # Saturation.reason: the time to first token went over its SLO (no KV signal)
BANDWIDTH = "bandwidth_bound"
PREEMPTION_ONSET = "preemption_onset"
NO_KNEE = "no_knee"
UNKNOWN = "unknown"


# The step plan's defaults: StressSettings' and `kvdoctor stress`'s flags'.
DEFAULTS = {
    "prompt_tokens": 1000,
    "max_tokens": 500,
    "start_concurrency": 1,
    "max_concurrency": 256,
    "step_seconds": 30.0,
}


@dataclass(frozen=True)
class StressSettings:
    """What one stress run was asked to do."""

    endpoint: str
    model: str | None = None
    prompt_tokens: int = DEFAULTS["prompt_tokens"]
    max_tokens: int = DEFAULTS["max_tokens"]
    start_concurrency: int = DEFAULTS["start_concurrency"]
    max_concurrency: int = DEFAULTS["max_concurrency"]
    step_seconds: float = DEFAULTS["step_seconds"]
    kv_saturation: float = DEFAULT_KV_SATURATION
    exporter: str | None = None
    share_prefix: bool = False  # requests share the fixed text as a prefix (the tag goes last)
    ttft_slo_seconds: float = DEFAULT_TTFT_SLO_SECONDS  # without a KV signal: TTFT over this stops the run

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
        if not (self.ttft_slo_seconds > 0 and math.isfinite(self.ttft_slo_seconds)):
            raise ValueError(f"--ttft-slo-ms must be a positive number, got {self.ttft_slo_seconds * 1000:g}")


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
    engine_tokens_per_second: float | None  # the engine's own generated-token counter (None: not recorded)
    engine_mean_per_token_ms: float | None  # generation seconds / tokens, engines that count both (llama.cpp)
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
    arrivals = token_arrivals(requests)
    counters = kv_signals(window) if window is not None and len(window) >= 2 else {}
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
        streamed = int(((arrivals > s.started) & (arrivals <= stop)).sum())
        ttfts = [r.ttft for r in mine if r.ttft is not None]
        in_bins = bins.step == s.index
        kv = bins.kv_usage[in_bins]
        kv = kv[~np.isnan(kv)]
        pre = bins.preemptions[in_bins]
        waiting = bins.waiting[in_bins]
        waiting = waiting[~np.isnan(waiting)]
        engine_tokens, engine_seconds = (_counted(counters.get(k), s.started, stop) for k in _GENERATION)
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
                engine_tokens_per_second=None if engine_tokens is None else engine_tokens / seconds,
                engine_mean_per_token_ms=(
                    _ms(engine_seconds / engine_tokens) if engine_seconds is not None and engine_tokens else None
                ),
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


_GENERATION = ("generation_tokens", "generation_seconds")


def _counted(series: tuple[np.ndarray, np.ndarray] | None, start: float, stop: float) -> float | None:
    """The increase of a counter over the intervals ending in (start, stop]; None if not recorded."""
    if series is None:
        return None
    ends, deltas = series
    return float(deltas[(ends > start) & (ends <= stop)].sum())


@dataclass(frozen=True)
class Saturation:
    """When the run saturated: the first bin at the KV ceiling or with a preemption; without any
    KV signal, the first step whose requests queued or waited too long for their first token."""

    reached: bool
    reason: str = ""  # "kv_ceiling" | "preemptions" | "queue" | "ttft" | ""
    at: float | None = None  # Unix seconds (the bin's start)
    step: int | None = None
    concurrency: int | None = None
    kv_usage: float | None = None  # the highest KV usage seen up to that moment
    waiting: float | None = None  # queue and ttft: the step's median requests waiting
    ttft_p50_ms: float | None = None  # queue and ttft: the step's median time to first token

    def to_json(self) -> dict:
        return {k: _num(v) for k, v in self.__dict__.items()}


def queue_reached(
    waiting: np.ndarray, ttft_p50: float | None, ttft_slo: float, thresholds: Thresholds | None = None
) -> str | None:
    """Why a step counts as saturated where no KV usage is known: ``QUEUE`` when its requests
    wait (median of ``waiting`` at the tree's ``queue_waiting_min``), ``TTFT`` when the median
    time to first token (seconds) is over ``ttft_slo``; None when neither."""
    t = thresholds or Thresholds()
    present = waiting[~np.isnan(waiting)]
    if len(present) and float(np.median(present)) >= t.queue_waiting_min:
        return QUEUE
    if ttft_p50 is not None and ttft_p50 > ttft_slo:
        return TTFT
    return None


def find_saturation(
    bins: Bins,
    steps: list[StepRecord],
    kv_ceiling: float = DEFAULT_KV_SATURATION,
    summaries: list[StepSummary] | None = None,
    ttft_slo: float = DEFAULT_TTFT_SLO_SECONDS,
) -> Saturation:
    """The first saturation of the run (see ``Saturation``); ``summaries`` give the steps' TTFT
    for the queue test, which applies only where no KV usage was recorded."""
    if np.isnan(bins.kv_usage).all() and not (bins.preemptions > 0).any():
        return _queue_saturation(bins, steps, summaries or [], ttft_slo)
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


def _queue_saturation(bins: Bins, steps: list[StepRecord], summaries: list[StepSummary], slo: float) -> Saturation:
    ttft = {s.index: s.ttft_p50_ms for s in summaries}
    for s in steps:
        in_step = bins.step == s.index
        ttft_ms = ttft.get(s.index)
        reason = queue_reached(bins.waiting[in_step], None if ttft_ms is None else ttft_ms / 1000.0, slo)
        if reason is None:
            continue
        waiting = bins.waiting[in_step]
        waiting = waiting[~np.isnan(waiting)]
        first = np.flatnonzero(in_step)
        at = float(bins.edges[first[0]]) if len(first) else s.started
        median = float(np.median(waiting)) if len(waiting) else None
        return Saturation(True, reason, at, s.index, s.concurrency, None, median, ttft_ms)
    return Saturation(False)


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


def dram_bandwidth_peak(window: Window | None) -> float | None:
    """The highest DRAM bandwidth utilisation a GPU counter recorded over the run (GPM or DCGM, not
    NVML's duty cycle); None where no GPU counter was recorded (a CPU-only run, no NVML or DCGM)."""
    if window is None or not len(window):
        return None
    peaks = [
        float(np.nanmax(values))
        for labels, values in window.select(GPU_DRAM_BANDWIDTH_UTILIZATION).items()
        if dict(labels).get("method") != METHOD_NVML_UTIL and np.isfinite(values).any()
    ]
    return max(peaks) if peaks else None


def stress_verdict(
    bins: Bins, saturation: Saturation, thresholds: Thresholds | None = None, dram_peak: float | None = None
) -> Verdict:
    """The pattern of (KV usage, mean per-token latency) over the run, in words: the knee, and how
    far the GPU counters (``dram_peak``, from ``dram_bandwidth_peak``) let it name the cause."""
    t = thresholds or Thresholds()
    has_kv = not np.isnan(bins.kv_usage).all()
    total_pre = float(np.nansum(bins.preemptions)) if not np.isnan(bins.preemptions).all() else None
    pre_text = f"; the engine preempted {total_pre:.0f} time{'s' if total_pre != 1 else ''}" if total_pre else ""
    if not has_kv:
        knee = Knee(note="no KV usage recorded")
        headline = "KV usage unknown (the engine publishes none here): latency is reported against concurrency only"
        if saturation.reached and saturation.reason in (QUEUE, TTFT):
            why = (
                f"a median {saturation.waiting:.0f} request{'s' if saturation.waiting != 1 else ''} waiting"
                if saturation.reason == QUEUE and saturation.waiting is not None
                else f"time to first token {saturation.ttft_p50_ms or 0:.0f} ms over its SLO"
            )
            headline = (
                f"KV usage unknown (the engine publishes none here): stopped on the queue at concurrency "
                f"×{saturation.concurrency} ({why}); latency is reported against concurrency only"
            )
        return Verdict(UNKNOWN, headline, knee)
    knee = detect_knee(bins.kv_usage, bins.itl_mean, bins.tokens, t)
    knee_time = None
    if knee.kv_level is not None:
        with np.errstate(invalid="ignore"):
            reached = np.flatnonzero(bins.kv_usage >= knee.kv_level)
        knee_time = float(bins.centres[reached[0]]) if len(reached) else None
    if knee.kind == JUMP:
        cause = (
            "the preemption-onset pattern, the KV pool ran out"
            if total_pre
            else "the paging-onset pattern, KV no longer fits where it is read fastest"
        )
        headline = (
            f"Per-token latency jumps x{knee.ratio:.1f} once KV usage passes ~{knee.kv_level:.0%}: {cause}{pre_text}"
        )
        return Verdict(PREEMPTION_ONSET, headline, knee, knee_time)
    if knee.kind == RISES_WITH_KV:
        with np.errstate(invalid="ignore"):
            paired = bins.kv_usage[~np.isnan(bins.kv_usage) & ~np.isnan(bins.itl_mean) & (bins.tokens > 0)]
        kv = paired if len(paired) else bins.kv_usage[~np.isnan(bins.kv_usage)]
        rise = (
            f"Per-token latency rises in step with KV usage (x{knee.ratio:.2f} as it goes "
            f"{kv.min():.0%} -> {kv.max():.0%}"
        )
        if dram_peak is None:
            headline = (
                f"{rise}): the memory-bandwidth-bound pattern, but no GPU counter was recorded (a CPU-only run, or "
                f"no NVML or DCGM), so the cause cannot be attributed to HBM bandwidth{pre_text}"
            )
        else:
            headline = (
                f"{rise}; GPU DRAM bandwidth up to {dram_peak:.0%} of peak): the memory-bandwidth-bound pattern, "
                f"every token re-reads the batch's KV{pre_text}"
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
