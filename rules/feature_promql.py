"""The features' PromQL twins: what each feature's recording rule computes, and the shared inputs.

``rules/features.py`` pairs each with its Python computation. A renderer takes a ``PromContext``
(the window as PromQL durations, the keys) and the thresholds; where several features read one raw
family, they ask the context for a shared input (``PromContext.input``), which ``rules/promql.py``
records once, before the features: the GPU ratios per pod and method, the prefix-hit counters.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from kvdoctor.signals.vocabulary import (
    GENERATION_SECONDS,
    GPU_DRAM_BANDWIDTH_UTILIZATION,
    GPU_SM_ACTIVE,
    INTER_TOKEN_LATENCY,
    METHOD_NVML_UTIL,
    PREFIX_CACHE_HITS,
    PREFIX_CACHE_HITS_BY_TIER,
)

from .thresholds import Thresholds
from .view import Part, Selector

# Labels that identify an engine / a pod's GPUs in PromQL aggregations and joins. ``instance`` is the
# scrape target's address: in Kubernetes one per pod (so it adds nothing to namespace/pod), and
# without Kubernetes labels (static configs, docker-compose, a VM) the only label that tells two
# exporters apart, so two engines serving the same model never merge into one verdict and one alert.
# An engine scraped by two jobs has one instance: it stays one engine.
IDENTITY_KEYS = ("namespace", "pod", "instance")
ENGINE_KEYS = (*IDENTITY_KEYS, "model_name", "engine")
GPU_KEYS = IDENTITY_KEYS

TIER_ALL = Selector(PREFIX_CACHE_HITS_BY_TIER)
TIER_SLOW = Selector(PREFIX_CACHE_HITS_BY_TIER, (("tier", "!=", "device"),))
TIER_DEVICE = Selector(PREFIX_CACHE_HITS_BY_TIER, (("tier", "=", "device"),))

Renderer = Callable[["PromContext", Thresholds], str]


def prom_number(value: float) -> str:
    """A float as PromQL reads it back exactly (repr), without a trailing ``.0``."""
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


@dataclass(frozen=True)
class PromContext:
    """What feature expressions need to render: the window as PromQL durations and the keys.

    ``inputs`` collects the shared inputs the features asked for while rendering (record name ->
    expression): a raw family several features read is read once, by its own recording rule
    (``input``), which ``rules/promql.py`` writes before the features.
    """

    window: str  # e.g. "60s"
    third: str  # window / 3
    recent: str = ""  # the state sub-window (Thresholds.state_window_seconds); "" means the window
    engine_keys: str = ", ".join(ENGINE_KEYS)
    gpu_keys: str = ", ".join(GPU_KEYS)
    inputs: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    def range_of(self, part: Part) -> str:
        """The duration a feature over ``part`` reads: its recording rule is named after it."""
        if part == "recent":
            return self.recent or self.window
        return self.third if part in ("early", "late") else self.window

    def record(self, feature: str, part: Part) -> str:
        """The recording rule of ``feature`` (over ``part``): ``kvdoctor:<feature>:<range>``."""
        return f"kvdoctor:{feature}:{self.range_of(part)}"

    def input(self, stem: str, rng: str, expr: str) -> str:
        """The shared input ``kvdoctor:<stem>:<rng>`` recording ``expr`` (which reads ``[rng]``)."""
        name = f"kvdoctor:{stem}:{rng}"
        if self.inputs.setdefault(name, expr) != expr:
            raise ValueError(f"two expressions for the input {name}")
        return name


def gpu_median_max_promql(sel: Selector, part: Part = "all") -> Renderer:
    return lambda c, t: (
        f"max by ({c.gpu_keys}) "
        f"(quantile_over_time({prom_number(t.gpu_quantile)}, "
        f"{sel.promql()}[{recent_range(c) if part == 'recent' else c.window}]))"
    )


# The GPU ratios several features read (the precise ones, and all methods for gpu_busy_ratio): each
# read once, its median per GPU reduced to the busiest GPU of each method (one input per signal).
_GPU_INPUTS = {GPU_DRAM_BANDWIDTH_UTILIZATION: "gpu_dram_bandwidth_by_method", GPU_SM_ACTIVE: "gpu_sm_active_by_method"}


def _gpu_input(c: PromContext, t: Thresholds, signal: str) -> str:
    rng = recent_range(c)
    expr = f"max by ({c.gpu_keys}, method) (quantile_over_time({prom_number(t.gpu_quantile)}, {signal}[{rng}]))"
    return c.input(_GPU_INPUTS[signal], rng, expr)


def gpu_precise_promql(signal: str) -> Renderer:
    """The busiest GPU's median of ``signal`` over the state sub-window, GPM or DCGM only."""
    return lambda c, t: f'max by ({c.gpu_keys}) ({_gpu_input(c, t, signal)}{{method!="{METHOD_NVML_UTIL}"}})'


def _hits_inputs(c: PromContext) -> tuple[str, str]:
    """The prefix-hit counters' increases over the state sub-window, each read once: by tier (per
    engine and tier) and the engine's own (per engine)."""
    k, rng = c.engine_keys, recent_range(c)
    by_tier = c.input(
        "prefix_cache_hits_by_tier_increase", rng, f"sum by ({k}, tier) (increase({PREFIX_CACHE_HITS_BY_TIER}[{rng}]))"
    )
    engine = c.input("prefix_cache_hits_increase", rng, f"sum by ({k}) (increase({PREFIX_CACHE_HITS}[{rng}]))")
    return by_tier, engine


def _tier_sum(c: PromContext, by_tier: str, sel: Selector) -> str:
    inner = ",".join(f'{label}{op}"{value}"' for label, op, value in sel.matchers)
    return f"sum by ({c.engine_keys}) ({by_tier}{{{inner}}})" if inner else f"sum by ({c.engine_keys}) ({by_tier})"


def _total_hits_promql(c: PromContext) -> str:
    """``total_hit_tokens`` in PromQL (each alternative only where the ones before it are absent),
    recorded once as a shared input: the slow-tier fraction reads it twice."""
    k = c.engine_keys
    by_tier, engine = _hits_inputs(c)
    tiers, device = _tier_sum(c, by_tier, TIER_ALL), _tier_sum(c, by_tier, TIER_DEVICE)
    expr = f"({tiers} and on({k}) {device}) or ({engine} + on({k}) {tiers}) or {tiers} or {engine}"
    return c.input("prefix_cache_hits_all_tiers_increase", recent_range(c), expr)


def slow_tier_fraction_promql(c: PromContext, t: Thresholds) -> str:
    """``_slow_tier_fraction``: 0 where hits are counted by tier but none off the GPU, or where the
    engine moves no KV between tiers; no sample where KV moves but hits are not counted by tier."""
    by_tier, _ = _hits_inputs(c)
    k = c.engine_keys
    total = _total_hits_promql(c)
    tiers, slow = _tier_sum(c, by_tier, TIER_ALL), _tier_sum(c, by_tier, TIER_SLOW)
    transfers = c.record("kv_to_gpu_bytes_per_second", "recent")
    # 0 wherever the hits are not unknown: unless KV moves in while no tier is counted
    zero = f"{total} * 0 unless on({k}) ({transfers} unless on({k}) {tiers})"
    return f"({slow} or on({k}) ({zero})) / on({k}) {total}"


def gpu_busy_promql(c: PromContext, t: Thresholds) -> str:
    names = "|".join(_gpu_input(c, t, signal) for signal in (GPU_DRAM_BANDWIDTH_UTILIZATION, GPU_SM_ACTIVE))
    return f'max by ({c.gpu_keys}) ({{__name__=~"{names}"}})'


def quantile_promql(q: Callable[[Thresholds], float], part: Part, histogram: str = INTER_TOKEN_LATENCY) -> Renderer:
    """A quantile of ``histogram`` over ``part``, straight from its buckets: the one rule reading them.

    The quantile is taken of each histogram as scraped, then the largest per engine: summing the
    buckets by engine first (``sum by (..., le)``) costs a grouping of every bucket series, about a
    third again at a thousand engines. An engine has one histogram, so both give the same number;
    one scraped twice (two jobs) gives it twice, and ``max`` keeps one series per engine."""

    def render(c: PromContext, t: Thresholds) -> str:
        if part == "early":
            raise ValueError("the first third is Python only (the trend note): no rule reads it")
        buckets = f"{histogram}_bucket[{c.range_of(part)}]"
        return f"max by ({c.engine_keys}) (histogram_quantile({prom_number(q(t))}, increase({buckets})))"

    return render


def mean_time_per_token_promql(c: PromContext, t: Thresholds) -> str:
    """Generation seconds over generation tokens, as rates (the same ratio as of the increases): the
    tokens' rate is the recorded ``generation_tokens_per_second``."""
    return (
        f"sum by ({c.engine_keys}) (rate({GENERATION_SECONDS}[{c.window}])) "
        f"/ on({c.engine_keys}) {c.record('generation_tokens_per_second', 'all')}"
    )


def recent_range(c: PromContext) -> str:
    """The state sub-window's duration (the window where it is not set)."""
    return c.recent or c.window
