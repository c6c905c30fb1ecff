"""The features: each windowed quantity the tree compares, computed in Python and written in PromQL.

A ``Feature`` computes its value from a ``WindowView`` with ``signals/stats.py`` (Prometheus
arithmetic) and renders its twin PromQL recording rule over the canonical signals, so the Python
evaluator and the alert rules read the same numbers. A feature with no data is NaN (missing).

Features are scoped to the engine (aggregated ``by (namespace, pod, model_name, engine)``, summing
data-parallel ranks) or to the pod's GPUs (``by (namespace, pod)``, the busiest GPU); GPU
conditions join the engine through ``pod``. A ``Window`` holds one engine and its GPUs, so the
Python half aggregates over everything in it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kvdoctor.signals.units import BYTES_PER_SECOND, PER_MINUTE, RATIO, REQUESTS, SECONDS, TOKENS_PER_SECOND
from kvdoctor.signals.vocabulary import (
    GENERATION_SECONDS,
    GENERATION_TOKENS,
    GPU_DRAM_BANDWIDTH_UTILIZATION,
    GPU_PCIE_RX,
    GPU_SM_ACTIVE,
    INTER_TOKEN_LATENCY,
    KV_CACHE_HOST_USAGE,
    KV_CACHE_USAGE,
    KV_TRANSFER_BYTES,
    METHOD_NVML_UTIL,
    PREEMPTIONS,
    PREFIX_CACHE_HITS,
    PREFIX_CACHE_HITS_BY_TIER,
    PROMPT_TOKENS,
    REQUESTS_RUNNING,
    REQUESTS_SWAPPED,
    REQUESTS_WAITING,
    SIGNALS,
    TIME_TO_FIRST_TOKEN,
    Kind,
)

from .feature_promql import TIER_ALL as _TIER_ALL
from .feature_promql import TIER_DEVICE as _TIER_DEVICE
from .feature_promql import TIER_SLOW as _TIER_SLOW
from .feature_promql import (
    PromContext,
    gpu_busy_promql,
    gpu_median_max_promql,
    gpu_precise_promql,
    mean_time_per_token_promql,
    prom_number,
    quantile_promql,
    slow_tier_fraction_promql,
)
from .feature_promql import recent_range as _recent
from .thresholds import Thresholds
from .view import Part, Selector, WindowView, nanmax, nansum

ENGINE = "engine"
GPU = "gpu"

PythonFeature = Callable[[WindowView, Thresholds], float]


@dataclass(frozen=True)
class Feature:
    """One windowed quantity the tree compares: its Python computation and its PromQL twin."""

    name: str  # also the recording rule's middle part: kvdoctor:<name>:<range it reads>
    scope: str  # ENGINE or GPU
    unit: str  # for evidence: one of signals/units.py's feature units (RATIO, SECONDS, ...)
    signals: tuple[str, ...]  # canonical signals read
    note: str  # what the number is, for evidence
    python: PythonFeature
    # its recording rule's expression; None: Python only (a note's input that no condition of the
    # tree and no reader of the records needs, so the rule file does not pay for it)
    promql: Callable[[PromContext, Thresholds], str] | None
    part: Part = "all"  # the part of the window it reads (names its recording rule)

    @property
    def recorded(self) -> bool:
        return self.promql is not None

    @property
    def signal(self) -> str:
        return self.signals[0]


def _gpu_median_max(sel: Selector, part: Part = "all") -> PythonFeature:
    return lambda v, t: nanmax(v.quantiles(sel, t.gpu_quantile, part))


_PRECISE = (("method", "!=", METHOD_NVML_UTIL),)  # not duty cycles
_TO_GPU = Selector(KV_TRANSFER_BYTES, (("direction", "=", "to_gpu"),))
_DRAM_PRECISE = Selector(GPU_DRAM_BANDWIDTH_UTILIZATION, _PRECISE)
_SM_PRECISE = Selector(GPU_SM_ACTIVE, _PRECISE)


def total_hit_tokens(v: WindowView, part: Part = "all") -> float:
    """Prefix-cache hit tokens over the window, every tier counted once: the by-tier counters where
    they include the GPU's own tier (they then add up to every hit), else the engine's hit counter
    (its GPU cache) plus the tiers' (LMCache, KVBM); whichever exists alone; NaN if neither."""
    by_tier = v.sum_increase(_TIER_ALL, part)
    engine = v.sum_increase(Selector(PREFIX_CACHE_HITS), part)
    if not math.isnan(by_tier):
        if not math.isnan(v.sum_increase(_TIER_DEVICE, part)) or math.isnan(engine):
            return by_tier
        return engine + by_tier
    return engine


def _slow_tier_fraction(v: WindowView, t: Thresholds) -> float:
    """Hits from off-GPU tiers per hit: 0 where the engine has hits by tier but none off the GPU, or no
    tier at all; unknown where KV moves between tiers but the hits are not counted by tier."""
    total = total_hit_tokens(v, "recent")
    if math.isnan(total):
        return math.nan
    slow = v.sum_increase(_TIER_SLOW, "recent")
    if math.isnan(slow):
        tiered = not math.isnan(v.sum_increase(_TIER_ALL, "recent"))
        if not tiered and not math.isnan(v.sum_rate(_TO_GPU, "recent")):
            return math.nan
        slow = 0.0
    with np.errstate(invalid="ignore", divide="ignore"):
        return float(np.float64(slow) / np.float64(total))


def _mean_time_per_token(v: WindowView, t: Thresholds) -> float:
    seconds = v.sum_increase(Selector(GENERATION_SECONDS))
    tokens = v.sum_increase(Selector(GENERATION_TOKENS))
    if math.isnan(seconds) or math.isnan(tokens):
        return math.nan
    with np.errstate(invalid="ignore", divide="ignore"):
        return float(np.float64(seconds) / np.float64(tokens))


def _gpu_busy(v: WindowView, t: Thresholds) -> float:
    values = np.concatenate(
        [
            v.quantiles(Selector(GPU_DRAM_BANDWIDTH_UTILIZATION), t.gpu_quantile, "recent"),
            v.quantiles(Selector(GPU_SM_ACTIVE), t.gpu_quantile, "recent"),
        ]
    )
    return nanmax(values)


def _quantile(q: Callable[[Thresholds], float], part: Part, histogram: str = INTER_TOKEN_LATENCY) -> PythonFeature:
    return lambda v, t: v.histogram_quantile(histogram, q(t), part)


def _engine_median(signal: str) -> tuple[PythonFeature, Callable[[PromContext, Thresholds], str]]:
    """The median of ``signal`` over the state sub-window, summed over the engine's ranks."""
    return (
        lambda v, t: nansum(v.quantiles(Selector(signal), 0.5, "recent")),
        lambda c, t: f"sum by ({c.engine_keys}) (quantile_over_time(0.5, {signal}[{_recent(c)}]))",
    )


def _engine_high(signal: str) -> tuple[PythonFeature, Callable[[PromContext, Thresholds], str]]:
    """A high quantile (``kv_usage_quantile``) of a usage ratio over the state sub-window, fullest rank."""
    return (
        lambda v, t: nanmax(v.quantiles(Selector(signal), t.kv_usage_quantile, "recent")),
        lambda c, t: (
            f"max by ({c.engine_keys}) (quantile_over_time({prom_number(t.kv_usage_quantile)}, {signal}[{_recent(c)}]))"
        ),
    )


def _engine_rate(
    sel: Selector, scale: int = 1, part: Part = "all"
) -> tuple[PythonFeature, Callable[[PromContext, Thresholds], str]]:
    """The per-second rate of counter ``sel`` over ``part`` of the window (times ``scale``), summed
    over the engine's ranks."""
    times = f" * {scale}" if scale != 1 else ""
    return (
        lambda v, t: v.sum_rate(sel, part) * scale,
        lambda c, t: f"sum by ({c.engine_keys}) (rate({sel.promql()}[{c.range_of(part)}])){times}",
    )


def _engine_growth(sel: Selector) -> tuple[PythonFeature, Callable[[PromContext, Thresholds], str]]:
    """How fast gauge ``sel`` grows over the state sub-window, per minute, summed over the engine's ranks."""
    return (
        lambda v, t: v.sum_deriv(sel, "recent") * 60,
        lambda c, t: f"sum by ({c.engine_keys}) (deriv({sel.promql()}[{_recent(c)}])) * 60",
    )


def _itl_median_of_third(part: Part, which: str) -> Feature:
    """``itl_<part>_median_seconds``: the median inter-token latency in the window's ``which`` third.
    Python only: the trend note on a healthy verdict reads it, no condition of the tree, so no rule
    records it (two more passes over every ITL bucket series, each costing what reading them does)."""
    return Feature(
        f"itl_{part}_median_seconds",
        ENGINE,
        SECONDS,
        (INTER_TOKEN_LATENCY,),
        f"median inter-token latency in the window's {which} third",
        _quantile(lambda t: 0.5, part),
        None,
        part=part,
    )


_STATE = "over the state sub-window (the window's last state_window_seconds)"

FEATURES: dict[str, Feature] = {
    f.name: f
    for f in (
        Feature(
            "generation_tokens_per_second",
            ENGINE,
            TOKENS_PER_SECOND,
            (GENERATION_TOKENS,),
            "output tokens per second over the window (counter resets handled)",
            *_engine_rate(Selector(GENERATION_TOKENS)),
        ),
        Feature(
            "prompt_tokens_per_second",
            ENGINE,
            TOKENS_PER_SECOND,
            (PROMPT_TOKENS,),
            "prompt tokens per second over the window",
            *_engine_rate(Selector(PROMPT_TOKENS)),
        ),
        Feature(
            "requests_running",
            ENGINE,
            REQUESTS,
            (REQUESTS_RUNNING,),
            f"median requests running {_STATE}",
            *_engine_median(REQUESTS_RUNNING),
            part="recent",
        ),
        Feature(
            "requests_waiting",
            ENGINE,
            REQUESTS,
            (REQUESTS_WAITING,),
            f"median requests waiting {_STATE}",
            *_engine_median(REQUESTS_WAITING),
            part="recent",
        ),
        Feature(
            "queue_growth_per_minute",
            ENGINE,
            PER_MINUTE,
            (REQUESTS_WAITING,),
            f"growth of the queue (requests waiting), per minute, the slope of a least-squares line {_STATE}",
            *_engine_growth(Selector(REQUESTS_WAITING)),
            part="recent",
        ),
        Feature(
            "requests_swapped",
            ENGINE,
            REQUESTS,
            (REQUESTS_SWAPPED,),
            f"median requests swapped out to host memory {_STATE} (vLLM V0)",
            *_engine_median(REQUESTS_SWAPPED),
            part="recent",
        ),
        Feature(
            "preemptions_per_minute",
            ENGINE,
            PER_MINUTE,
            (PREEMPTIONS,),
            f"preemptions (or retractions) per minute {_STATE} (counter history and resets handled)",
            *_engine_rate(Selector(PREEMPTIONS), 60, "recent"),
            part="recent",
        ),
        Feature(
            "preemptions_per_minute_late",
            ENGINE,
            PER_MINUTE,
            (PREEMPTIONS,),
            "preemptions (or retractions) per minute over the window's last third: a thrash too sparse for the "
            "state sub-window to see every time, while the pool stays full (the last third, not the whole "
            "window, so a thrash that stopped is forgotten a third of a window later)",
            *_engine_rate(Selector(PREEMPTIONS), 60, "late"),
            part="late",
        ),
        Feature(
            "kv_usage",
            ENGINE,
            RATIO,
            (KV_CACHE_USAGE,),
            f"KV-cache usage, a high quantile {_STATE} (robust to the oscillation under preemption)",
            *_engine_high(KV_CACHE_USAGE),
            part="recent",
        ),
        Feature(
            "kv_usage_floor",
            ENGINE,
            RATIO,
            (KV_CACHE_USAGE,),
            f"KV-cache usage, its lowest {_STATE}, fullest rank (a pool full throughout, not only at its peaks)",
            lambda v, t: nanmax(v.quantiles(Selector(KV_CACHE_USAGE), 0.0, "recent")),
            lambda c, t: f"max by ({c.engine_keys}) (min_over_time({KV_CACHE_USAGE}[{_recent(c)}]))",
            part="recent",
        ),
        Feature(
            "kv_host_usage",
            ENGINE,
            RATIO,
            (KV_CACHE_HOST_USAGE,),
            f"host (CPU) KV-cache pool usage, a high quantile {_STATE}",
            *_engine_high(KV_CACHE_HOST_USAGE),
            part="recent",
        ),
        Feature(
            "kv_to_gpu_bytes_per_second",
            ENGINE,
            BYTES_PER_SECOND,
            (KV_TRANSFER_BYTES,),
            f"KV bytes per second moved into the GPU from another tier {_STATE}",
            *_engine_rate(_TO_GPU, 1, "recent"),
            part="recent",
        ),
        Feature(
            "slow_tier_hit_fraction",
            ENGINE,
            RATIO,
            (PREFIX_CACHE_HITS_BY_TIER, PREFIX_CACHE_HITS),
            "share of prefix-cache hit tokens (every tier counted once) served from a tier other than the GPU "
            + _STATE,
            _slow_tier_fraction,
            slow_tier_fraction_promql,
            part="recent",
        ),
        Feature(
            "itl_p95_seconds",
            ENGINE,
            SECONDS,
            (INTER_TOKEN_LATENCY,),
            f"inter-token latency quantile (itl_quantile) from the histogram's bucket increases {_STATE}",
            _quantile(lambda t: t.itl_quantile, "recent"),
            quantile_promql(lambda t: t.itl_quantile, "recent"),
            part="recent",
        ),
        _itl_median_of_third("early", "first"),
        _itl_median_of_third("late", "last"),
        Feature(
            "time_per_token_mean_seconds",
            ENGINE,
            SECONDS,
            (GENERATION_SECONDS, GENERATION_TOKENS),
            "MEAN time per output token over the window (generation seconds / tokens of the requests "
            "that ended): the latency measure of engines without an ITL histogram",
            _mean_time_per_token,
            mean_time_per_token_promql,
        ),
        Feature(
            "ttft_p95_seconds",
            ENGINE,
            SECONDS,
            (TIME_TO_FIRST_TOKEN,),
            f"time-to-first-token quantile (ttft_quantile) from the histogram's bucket increases {_STATE}",
            _quantile(lambda t: t.ttft_quantile, "recent", TIME_TO_FIRST_TOKEN),
            quantile_promql(lambda t: t.ttft_quantile, "recent", TIME_TO_FIRST_TOKEN),
            part="recent",
        ),
        Feature(
            "pcie_receive_bytes_per_second",
            GPU,
            BYTES_PER_SECOND,
            (GPU_PCIE_RX,),
            f"PCIe receive bandwidth, median {_STATE}, busiest GPU",
            _gpu_median_max(Selector(GPU_PCIE_RX), "recent"),
            gpu_median_max_promql(Selector(GPU_PCIE_RX), "recent"),
            part="recent",
        ),
        Feature(
            "dram_bandwidth_ratio",
            GPU,
            RATIO,
            (GPU_DRAM_BANDWIDTH_UTILIZATION,),
            f"DRAM bandwidth utilisation (GPM or DCGM; not NVML's duty cycle), median {_STATE}, busiest GPU",
            _gpu_median_max(_DRAM_PRECISE, "recent"),
            gpu_precise_promql(GPU_DRAM_BANDWIDTH_UTILIZATION),
            part="recent",
        ),
        Feature(
            "sm_active_ratio",
            GPU,
            RATIO,
            (GPU_SM_ACTIVE,),
            f"SM activity (GPM or DCGM; not NVML's duty cycle), median {_STATE}, busiest GPU",
            _gpu_median_max(_SM_PRECISE, "recent"),
            gpu_precise_promql(GPU_SM_ACTIVE),
            part="recent",
        ),
        Feature(
            "gpu_busy_ratio",
            GPU,
            RATIO,
            (GPU_DRAM_BANDWIDTH_UTILIZATION, GPU_SM_ACTIVE),
            f"the larger of DRAM bandwidth and SM activity (any method, duty cycles included), median {_STATE}, "
            "busiest GPU",
            _gpu_busy,
            gpu_busy_promql,
            part="recent",
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


# What the features read, by how a WindowView batches it (speed only: see rules/view.py).
COUNTER_SERIES: tuple[str, ...] = _series_read((Kind.COUNTER, Kind.HISTOGRAM))
GAUGE_SERIES: tuple[str, ...] = _series_read((Kind.GAUGE,))


def compute_features(view: WindowView, thresholds: Thresholds) -> dict[str, float]:
    """Every feature's value on the window (NaN where missing)."""
    out: dict[str, float] = {}
    with np.errstate(invalid="ignore", divide="ignore"):
        for name, feature in FEATURES.items():
            out[name] = float(feature.python(view, thresholds))
    return out
