"""The features: each windowed quantity the tree compares, computed in Python and written in PromQL.

A ``Feature`` computes its value from a ``WindowView`` with ``rules/stats.py`` (Prometheus
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

from .signals import (
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
from .thresholds import Thresholds
from .units import BYTES_PER_SECOND, PER_MINUTE, RATIO, REQUESTS, SECONDS, TOKENS_PER_SECOND
from .view import Part, Selector, WindowView, nanmax, nansum

ENGINE = "engine"
GPU = "gpu"

# Labels that identify an engine / a pod's GPUs in PromQL aggregations and joins.
ENGINE_KEYS = ("namespace", "pod", "model_name", "engine")
GPU_KEYS = ("namespace", "pod")

PythonFeature = Callable[[WindowView, Thresholds], float]


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

    def range_of(self, part: Part) -> str:
        """The duration a feature over ``part`` reads: its recording rule is named after it."""
        if part == "recent":
            return self.recent or self.window
        return self.third if part in ("early", "late") else self.window


@dataclass(frozen=True)
class Feature:
    """One windowed quantity the tree compares: its Python computation and its PromQL twin."""

    name: str  # also the recording rule's middle part: kvdoctor:<name>:<range it reads>
    scope: str  # ENGINE or GPU
    unit: str  # for evidence: one of rules/units.py's feature units (RATIO, SECONDS, ...)
    signals: tuple[str, ...]  # canonical signals read
    note: str  # what the number is, for evidence
    python: PythonFeature
    promql: Callable[[PromContext, Thresholds], str]
    part: Part = "all"  # the part of the window it reads (names its recording rule)

    @property
    def signal(self) -> str:
        return self.signals[0]


def _recent(c: PromContext) -> str:
    return c.recent or c.window


def _gpu_median_max(sel: Selector, part: Part = "all") -> PythonFeature:
    return lambda v, t: nanmax(v.quantiles(sel, t.gpu_quantile, part))


def _gpu_median_max_promql(sel: Selector, part: Part = "all") -> Callable[[PromContext, Thresholds], str]:
    return lambda c, t: (
        f"max by ({c.gpu_keys}) "
        f"(quantile_over_time({prom_number(t.gpu_quantile)}, "
        f"{sel.promql()}[{_recent(c) if part == 'recent' else c.window}]))"
    )


_PRECISE = (("method", "!=", METHOD_NVML_UTIL),)  # not duty cycles
_TO_GPU = Selector(KV_TRANSFER_BYTES, (("direction", "=", "to_gpu"),))
_DRAM_PRECISE = Selector(GPU_DRAM_BANDWIDTH_UTILIZATION, _PRECISE)
_SM_PRECISE = Selector(GPU_SM_ACTIVE, _PRECISE)
_TIER_ALL = Selector(PREFIX_CACHE_HITS_BY_TIER)
_TIER_SLOW = Selector(PREFIX_CACHE_HITS_BY_TIER, (("tier", "!=", "device"),))
_TIER_DEVICE = Selector(PREFIX_CACHE_HITS_BY_TIER, (("tier", "=", "device"),))


def total_hit_tokens(v: WindowView) -> float:
    """Prefix-cache hit tokens over the window, every tier counted once: the by-tier counters where
    they include the GPU's own tier (they then add up to every hit), else the engine's hit counter
    (its GPU cache) plus the tiers' (LMCache, KVBM); whichever exists alone; NaN if neither."""
    by_tier = v.sum_increase(_TIER_ALL)
    engine = v.sum_increase(Selector(PREFIX_CACHE_HITS))
    if not math.isnan(by_tier):
        if not math.isnan(v.sum_increase(_TIER_DEVICE)) or math.isnan(engine):
            return by_tier
        return engine + by_tier
    return engine


def _total_hits_promql(c: PromContext) -> str:
    """``total_hit_tokens`` in PromQL (each alternative only where the ones before it are absent)."""
    k = c.engine_keys

    def inc(sel: Selector) -> str:
        return f"sum by ({k}) (increase({sel.promql()}[{c.window}]))"

    tiers, device, engine = inc(_TIER_ALL), inc(_TIER_DEVICE), inc(Selector(PREFIX_CACHE_HITS))
    return f"(({tiers} and on({k}) {device}) or ({engine} + on({k}) {tiers}) or {tiers} or {engine})"


def _slow_tier_fraction(v: WindowView, t: Thresholds) -> float:
    total = total_hit_tokens(v)
    if math.isnan(total):
        return math.nan
    slow = v.sum_increase(_TIER_SLOW)
    slow = 0.0 if math.isnan(slow) else slow
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


def _gpu_busy_promql(c: PromContext, t: Thresholds) -> str:
    parts = [
        f"label_replace(quantile_over_time({prom_number(t.gpu_quantile)}, {name}[{_recent(c)}]), "
        f'"gpu_signal", "{tag}", "", "")'
        for name, tag in ((GPU_DRAM_BANDWIDTH_UTILIZATION, "dram"), (GPU_SM_ACTIVE, "sm"))
    ]
    return f"max by ({c.gpu_keys}) ({parts[0]} or {parts[1]})"


def _quantile(q: Callable[[Thresholds], float], part: Part, histogram: str = INTER_TOKEN_LATENCY) -> PythonFeature:
    return lambda v, t: v.histogram_quantile(histogram, q(t), part)


def _quantile_promql(
    q: Callable[[Thresholds], float], part: Part, histogram: str = INTER_TOKEN_LATENCY
) -> Callable[[PromContext, Thresholds], str]:
    def render(c: PromContext, t: Thresholds) -> str:
        rng = {
            "all": f"[{c.window}]",
            "recent": f"[{_recent(c)}]",
            "late": f"[{c.third}]",
            "early": f"[{c.third}] offset {c.two_thirds}",
        }[part]
        return (
            f"histogram_quantile({prom_number(q(t))}, sum by ({c.engine_keys}, le) (increase({histogram}_bucket{rng})))"
        )

    return render


def _ratio_of_increases_promql(numerator: str, denominator: str) -> Callable[[PromContext, Thresholds], str]:
    return lambda c, t: (
        f"sum by ({c.engine_keys}) (increase({numerator}[{c.window}])) "
        f"/ on({c.engine_keys}) sum by ({c.engine_keys}) (increase({denominator}[{c.window}]))"
    )


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
            lambda v, t: v.sum_rate(Selector(GENERATION_TOKENS)),
            lambda c, t: f"sum by ({c.engine_keys}) (rate({GENERATION_TOKENS}[{c.window}]))",
        ),
        Feature(
            "prompt_tokens_per_second",
            ENGINE,
            TOKENS_PER_SECOND,
            (PROMPT_TOKENS,),
            "prompt tokens per second over the window",
            lambda v, t: v.sum_rate(Selector(PROMPT_TOKENS)),
            lambda c, t: f"sum by ({c.engine_keys}) (rate({PROMPT_TOKENS}[{c.window}]))",
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
            "preemptions (or retractions) per minute over the window (counter history and resets handled)",
            lambda v, t: v.sum_rate(Selector(PREEMPTIONS)) * 60,
            lambda c, t: f"sum by ({c.engine_keys}) (rate({PREEMPTIONS}[{c.window}])) * 60",
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
            "KV bytes per second moved into the GPU from another tier",
            lambda v, t: v.sum_rate(_TO_GPU),
            lambda c, t: f"sum by ({c.engine_keys}) (rate({_TO_GPU.promql()}[{c.window}]))",
        ),
        Feature(
            "slow_tier_hit_fraction",
            ENGINE,
            RATIO,
            (PREFIX_CACHE_HITS_BY_TIER, PREFIX_CACHE_HITS),
            "share of prefix-cache hit tokens (every tier counted once) served from a tier other than the GPU",
            _slow_tier_fraction,
            lambda c, t: (
                f"(sum by ({c.engine_keys}) (increase({_TIER_SLOW.promql()}[{c.window}])) "
                f"or on({c.engine_keys}) {_total_hits_promql(c)} * 0) "
                f"/ on({c.engine_keys}) {_total_hits_promql(c)}"
            ),
        ),
        Feature(
            "itl_p95_seconds",
            ENGINE,
            SECONDS,
            (INTER_TOKEN_LATENCY,),
            f"inter-token latency quantile (itl_quantile) from the histogram's bucket increases {_STATE}",
            _quantile(lambda t: t.itl_quantile, "recent"),
            _quantile_promql(lambda t: t.itl_quantile, "recent"),
            part="recent",
        ),
        Feature(
            "itl_early_median_seconds",
            ENGINE,
            SECONDS,
            (INTER_TOKEN_LATENCY,),
            "median inter-token latency in the window's first third",
            _quantile(lambda t: 0.5, "early"),
            _quantile_promql(lambda t: 0.5, "early"),
            part="early",
        ),
        Feature(
            "itl_late_median_seconds",
            ENGINE,
            SECONDS,
            (INTER_TOKEN_LATENCY,),
            "median inter-token latency in the window's last third",
            _quantile(lambda t: 0.5, "late"),
            _quantile_promql(lambda t: 0.5, "late"),
            part="late",
        ),
        Feature(
            "time_per_token_mean_seconds",
            ENGINE,
            SECONDS,
            (GENERATION_SECONDS, GENERATION_TOKENS),
            "MEAN time per output token over the window (generation seconds / tokens of the requests "
            "that ended): the latency measure of engines without an ITL histogram",
            _mean_time_per_token,
            _ratio_of_increases_promql(GENERATION_SECONDS, GENERATION_TOKENS),
        ),
        Feature(
            "ttft_p95_seconds",
            ENGINE,
            SECONDS,
            (TIME_TO_FIRST_TOKEN,),
            "time-to-first-token quantile (ttft_quantile) from the histogram's bucket increases over the window",
            _quantile(lambda t: t.ttft_quantile, "all", TIME_TO_FIRST_TOKEN),
            _quantile_promql(lambda t: t.ttft_quantile, "all", TIME_TO_FIRST_TOKEN),
        ),
        Feature(
            "pcie_receive_bytes_per_second",
            GPU,
            BYTES_PER_SECOND,
            (GPU_PCIE_RX,),
            "PCIe receive bandwidth, median over the window, busiest GPU",
            _gpu_median_max(Selector(GPU_PCIE_RX)),
            _gpu_median_max_promql(Selector(GPU_PCIE_RX)),
        ),
        Feature(
            "dram_bandwidth_ratio",
            GPU,
            RATIO,
            (GPU_DRAM_BANDWIDTH_UTILIZATION,),
            f"DRAM bandwidth utilisation (GPM or DCGM; not NVML's duty cycle), median {_STATE}, busiest GPU",
            _gpu_median_max(_DRAM_PRECISE, "recent"),
            _gpu_median_max_promql(_DRAM_PRECISE, "recent"),
            part="recent",
        ),
        Feature(
            "sm_active_ratio",
            GPU,
            RATIO,
            (GPU_SM_ACTIVE,),
            f"SM activity (GPM or DCGM; not NVML's duty cycle), median {_STATE}, busiest GPU",
            _gpu_median_max(_SM_PRECISE, "recent"),
            _gpu_median_max_promql(_SM_PRECISE, "recent"),
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
            _gpu_busy_promql,
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
