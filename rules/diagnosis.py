"""``diagnose(window)``: why is decode slow? The decision tree of ``rules/tree.py`` on a window.

The window holds canonical ``kvdoctor_*`` series for one engine and its GPUs (or none: a CPU
engine). Every number is windowed and robust -- rates from counter increases (resets handled),
quantiles over the window, histogram quantiles from bucket increases -- so vLLM's KV usage
oscillating under preemption, counter history from before the window and counter resets do not
fool it. The same tree compiles to the alert rules (``rules/promql.py``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import features, render, stats, tree
from .actions import Action, LedgerFacts, plan_actions
from .conditions import Cmp
from .knee import JUMP, RISES_WITH_KV, Knee, detect_knee
from .ledger import GpuSpec, lookup_gpu
from .model import ModelShape
from .render import Evidence, json_number
from .signals import (
    GPU_DRAM_BANDWIDTH_UTILIZATION,
    GPU_DRAM_PEAK_BANDWIDTH,
    GPU_SM_ACTIVE,
    INTER_TOKEN_LATENCY,
    KV_CACHE_CAPACITY,
    KV_CACHE_USAGE,
    PREFIX_CACHE_HIT_RATIO,
    PREFIX_CACHE_HITS,
    PREFIX_CACHE_QUERIES,
    SIGNALS,
)
from .thresholds import DEFAULT_SLO_SECONDS, DEFAULT_THRESHOLDS, Thresholds
from .tree import SLOW_VERDICTS as SLOW_VERDICTS
from .tree import VERDICTS as VERDICTS
from .tree import Branch
from .view import Selector, WindowView
from .window import Window

# How sure each branch is when it fires cleanly (before the adjustments in _confidence).
_BASE_CONFIDENCE = {
    "idle": 0.95,
    "thrashing_preemptions": 0.9,
    "thrashing_reload": 0.75,
    "tier_miss": 0.75,
    "capacity_pressure": 0.8,
    "healthy": 0.85,
    "bandwidth_high": 0.85,
    "sm_high": 0.8,
    "gpu_idle": 0.7,
    "prefill_heavy_no_gpu": 0.45,
    "decode_default": 0.55,
}
# The WindowView's batches: the tree's, plus the series read here beyond its features.
_BATCHES = (
    (*features.COUNTER_SERIES, PREFIX_CACHE_HITS, PREFIX_CACHE_QUERIES),
    (*features.GAUGE_SERIES, GPU_DRAM_PEAK_BANDWIDTH, KV_CACHE_CAPACITY, PREFIX_CACHE_HIT_RATIO),
    (INTER_TOKEN_LATENCY + "_sum", INTER_TOKEN_LATENCY + "_count"),  # the knee's
)
_NEAR_THRESHOLD = 0.05  # a deciding value within 5% of its threshold costs confidence
_FEW_SAMPLES = 10


@dataclass(frozen=True)
class Context:
    """What the window cannot say: the model's shape, the GPU's peak bandwidth, the latency SLO."""

    model: ModelShape | None = None
    gpu_peak_bandwidth: float | None = None  # bytes/s of one GPU; else from the window or the catalogue
    slo_seconds: float = DEFAULT_SLO_SECONDS  # ITL SLO compared with the ITL p95
    kv_dtype: str | None = None  # the engine's KV cache dtype (e.g. "fp8"); default: the model's dtype


@dataclass(frozen=True)
class Diagnosis:
    verdict: str
    confidence: float
    headline: str
    evidence: list[Evidence]
    actions: list[Action]
    knee: Knee
    missing: list[str]
    branch: str = ""
    features: dict[str, float] = field(default_factory=dict)
    window_seconds: float = 0.0
    samples: int = 0
    ledger: dict[str, float | None] = field(default_factory=dict)  # the roofline numbers, when computable

    @property
    def slow(self) -> bool:
        return self.verdict in SLOW_VERDICTS

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "confidence": round(self.confidence, 3),
            "headline": self.headline,
            "evidence": [e.to_json() for e in self.evidence],
            "actions": [a.to_json() for a in self.actions],
            "knee": self.knee.to_json(),
            "missing": list(self.missing),
            "branch": self.branch,
            "features": {k: json_number(v) for k, v in self.features.items()},
            "window": {"seconds": self.window_seconds, "samples": self.samples},
            "ledger": {k: json_number(v) for k, v in self.ledger.items()},
        }


# -------------------------------------------------------------------------------- diagnose


def diagnose(window: Window, context: Context | None = None, thresholds: Thresholds | None = None) -> Diagnosis:
    """The verdict for ``window`` with its evidence, actions, knee and what was missing."""
    ctx = context or Context()
    t = thresholds or DEFAULT_THRESHOLDS
    view = WindowView(window, recent_seconds=t.state_window_seconds, batches=_BATCHES)
    values = features.compute_features(view, t)
    params = tree.parameters(t, ctx.slo_seconds)
    branch = tree.choose_branch(values, params)
    index = tree.BRANCHES.index(branch)

    missing = _missing_signals(view)
    evidence = render.evidence(values, params, index)
    knee = _knee(view, t) if branch.verdict != "idle" else Knee(note="idle")
    hit_ratio = _prefix_hit_ratio(view)
    facts = _ledger_facts(view, ctx)
    confidence = _confidence(branch, values, params, view, knee, missing)
    headline = render.headline(branch, values, ctx.slo_seconds, t, knee, hit_ratio, facts, view)
    if hit_ratio is not None:
        evidence.append(render.hit_ratio_evidence(hit_ratio, t))
    return Diagnosis(
        verdict=branch.verdict,
        confidence=confidence,
        headline=headline,
        evidence=evidence,
        actions=plan_actions(branch.verdict, facts),
        knee=knee,
        missing=missing,
        branch=branch.id,
        features=values,
        window_seconds=float(window.end - window.start) if len(window) else 0.0,
        samples=len(window),
        ledger=_ledger_numbers(facts, values),
    )


_TREE_SIGNAL_SERIES = tuple(
    (name, SIGNALS[name].series_names) for name in tree.TREE_SIGNALS.engine + tree.TREE_SIGNALS.gpu
)


def _missing_signals(view: WindowView) -> list[str]:
    """Tree signals with no sample in the window."""
    return [name for name, series in _TREE_SIGNAL_SERIES if not any(map(view.has, series))]


# ----------------------------------------------------------------------------- knee, ledger


def _knee(view: WindowView, t: Thresholds) -> Knee:
    """Knee detection on per-interval (KV usage, ITL) pairs; ITL per interval = delta sum / delta count."""
    sums, counts = Selector(INTER_TOKEN_LATENCY + "_sum"), Selector(INTER_TOKEN_LATENCY + "_count")
    kv = view.rows(Selector(KV_CACHE_USAGE))[1]
    if not len(view.labels(sums.name)) or not len(view.labels(counts.name)) or not len(kv) or kv.shape[1] < 2:
        return Knee(note="needs the ITL histogram and KV usage")
    d_sum = view.rowwise(stats.counter_deltas, sums).sum(axis=0)
    d_count = view.rowwise(stats.counter_deltas, counts).sum(axis=0)
    kv_filled = stats.forward_fill(kv)
    with np.errstate(invalid="ignore", divide="ignore"):
        kv_level = np.nanmax(kv_filled, axis=0) if kv_filled.shape[0] > 1 else kv_filled[0]
        kv_interval = kv_level[1:]  # the usage at the end of each interval
        itl = d_sum / d_count
    return detect_knee(kv_interval, itl, d_count, t)


def _prefix_hit_ratio(view: WindowView) -> float | None:
    hits = view.sum_increase(Selector(PREFIX_CACHE_HITS))
    queries = view.sum_increase(Selector(PREFIX_CACHE_QUERIES))
    if not math.isnan(hits) and not math.isnan(queries) and queries > 0:
        return hits / queries
    ratio = view.quantiles(Selector(PREFIX_CACHE_HIT_RATIO), 0.5)
    ratio = ratio[~np.isnan(ratio)]
    return float(ratio.mean()) if len(ratio) else None


_lookup_gpu = functools.lru_cache(maxsize=64)(lookup_gpu)  # the same few device names every cycle


def _gpu_spec(view: WindowView) -> GpuSpec | None:
    for labels in view.labels(GPU_DRAM_BANDWIDTH_UTILIZATION) + view.labels(GPU_SM_ACTIVE):
        if labels.get("model"):
            spec = _lookup_gpu(labels["model"])
            if spec:
                return spec
    return None


def _gpu_count(view: WindowView) -> int:
    ids = {
        (lb.get("gpu"), lb.get("uuid"))
        for name in (GPU_DRAM_BANDWIDTH_UTILIZATION, GPU_SM_ACTIVE)
        for lb in view.labels(name)
    }
    return max(1, len(ids))


def _ledger_facts(view: WindowView, ctx: Context) -> LedgerFacts:
    spec = _gpu_spec(view)
    peak = ctx.gpu_peak_bandwidth
    if not peak:
        measured = _present(view.quantiles(Selector(GPU_DRAM_PEAK_BANDWIDTH), 0.5))
        measured = measured[measured > 0]  # a zero or negative peak is a broken gauge, not a fact
        peak = float(measured.max()) if len(measured) else (spec.peak_bandwidth if spec else None)
    capacity = _present(view.quantiles(Selector(KV_CACHE_CAPACITY), 0.5))
    usage = _present(view.quantiles(Selector(KV_CACHE_USAGE), 0.5))
    cap = float(capacity.sum()) if len(capacity) else None
    live = float(usage.sum()) / len(usage) * cap if cap is not None and len(usage) else None  # usage.mean()
    return LedgerFacts(
        model=ctx.model,
        kv_dtype=ctx.kv_dtype,
        peak_bandwidth=peak,
        gpus=_gpu_count(view),
        live_tokens=live,
        capacity_tokens=cap,
        pcie_bandwidth=spec.pcie_bandwidth if spec else None,
    )


def _present(values: np.ndarray) -> np.ndarray:
    """The values that are not NaN, in order (``values`` itself when none is)."""
    if len(values) == 1:
        return values if values[0] == values[0] else values[:0]
    missing = np.isnan(values)
    return values[~missing] if missing.any() else values


# ------------------------------------------------------------------------ confidence, words


def _confidence(
    branch: Branch,
    values: dict[str, float],
    params: dict[str, float],
    view: WindowView,
    knee: Knee,
    missing: list[str],
) -> float:
    c = _BASE_CONFIDENCE[branch.id]
    gpu_missing = math.isnan(values.get("gpu_busy_ratio", math.nan))
    if branch.id == "decode_default":
        c = 0.55 if not gpu_missing else 0.4
        if knee.kind == RISES_WITH_KV:
            c += 0.15  # ITL rising with resident KV points at bandwidth
    if (
        branch.id == "gpu_idle"
        and math.isnan(values.get("dram_bandwidth_ratio", math.nan))
        and math.isnan(values.get("sm_active_ratio", math.nan))
    ):
        c -= 0.1  # only NVML duty cycles
    if branch.id == "thrashing_preemptions" and knee.kind == JUMP:
        c += 0.05
    if branch.id == "healthy" and INTER_TOKEN_LATENCY in missing:
        c = 0.5  # tokens flow, but no latency to judge by
    if branch.id == "idle" and math.isnan(values.get("generation_tokens_per_second", math.nan)):
        c = 0.6  # judged without a token counter
    # a deciding comparison close to its threshold
    for atom in tree.BRANCH_ATOMS[branch.id]:
        if isinstance(atom, Cmp):
            v = values.get(atom.feature, math.nan)
            thr = atom.threshold.value(params)
            if not math.isnan(v) and thr and abs(v - thr) / abs(thr) < _NEAR_THRESHOLD:
                c -= 0.1
                break
    if len(view) < _FEW_SAMPLES:
        c *= 0.6
    return float(min(0.99, max(0.05, c)))


def _ledger_numbers(facts: LedgerFacts, values: dict[str, float]) -> dict[str, float | None]:
    """Measured ITL against the physical floor (DESIGN.md: "measured 11.8 ms vs a floor of 9.4 ms")."""
    per_token = facts.kv_bytes()
    floor = facts.floor(per_token)
    p95 = values.get("itl_p95_seconds", math.nan)
    return {
        "kv_bytes_per_token": per_token,
        "live_kv_tokens": facts.live_tokens,
        "peak_bandwidth_bytes_per_second": facts.peak_bandwidth,
        "gpus": float(facts.gpus),
        "decode_step_floor_seconds": floor,
        "itl_p95_over_floor": (p95 / floor) if floor and not math.isnan(p95) else None,
    }
