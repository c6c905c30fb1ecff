"""``diagnose(window)``: why is decode slow? The decision tree of ``rules/tree.py`` on a window.

The window holds canonical ``kvdoctor_*`` series for one engine and its GPUs (or none: a CPU
engine). Every number is windowed and robust -- rates from counter increases (resets handled),
quantiles over the window, histogram quantiles from bucket increases -- so vLLM's KV usage
oscillating under preemption, counter history from before the window and counter resets do not
fool it. The same tree compiles to the alert rules (``rules/promql.py``).

The context (SLO, model, GPU) is what the caller gives, else what the window's exporter published
(``rules/context.py``), else the defaults: a window read from the exporter, from Prometheus or from
a trace is diagnosed against the SLO the exporter itself used.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvdoctor.ledger.gpus import GpuSpec, lookup_gpu
from kvdoctor.signals import stats
from kvdoctor.signals.units import plural
from kvdoctor.signals.vocabulary import (
    CONTEXT_INFO,
    GPU_DRAM_BANDWIDTH_UTILIZATION,
    GPU_DRAM_PEAK_BANDWIDTH,
    GPU_SM_ACTIVE,
    INTER_TOKEN_LATENCY,
    ITL_SLO,
    KV_CACHE_CAPACITY,
    KV_CACHE_USAGE,
    KV_TRANSFER_BYTES,
    PREFIX_CACHE_HIT_RATIO,
    PREFIX_CACHE_HITS_BY_TIER,
    PREFIX_CACHE_QUERIES,
    PROMPT_TOKENS,
    SIGNALS,
)
from kvdoctor.signals.window import Window

from . import features, render, tree
from .action_checks import LedgerFacts
from .actions import Action, plan_actions
from .conditions import evaluate
from .confidence import confidence as assess_confidence
from .confidence import dynamic_base
from .context import Context, context_to_json, published_context, resolve
from .headlines import HeadlineFacts
from .knee import Knee, detect_knee
from .render import Evidence, json_number
from .thresholds import DEFAULT_THRESHOLDS, MIN_WINDOW_SAMPLES, Thresholds
from .verdicts import SLOW_VERDICTS, UNKNOWN
from .verdicts import rank as verdict_rank
from .verdicts import verdict as catalogue_entry
from .view import Selector, WindowView

__all__ = ["Contributor", "Diagnosis", "diagnose"]

# The WindowView's batches: the tree's, plus the series read here beyond its features.
_BATCHES = (
    (*features.COUNTER_SERIES, PREFIX_CACHE_QUERIES, PROMPT_TOKENS),
    (*features.GAUGE_SERIES, GPU_DRAM_PEAK_BANDWIDTH, KV_CACHE_CAPACITY, PREFIX_CACHE_HIT_RATIO, ITL_SLO, CONTEXT_INFO),
    (INTER_TOKEN_LATENCY + "_sum", INTER_TOKEN_LATENCY + "_count"),  # the knee's
)
_FEW_SAMPLES = 10
QUEUEING = "request_queueing"


@dataclass(frozen=True)
class Contributor:
    """A cause present beside the verdict (the differential): its own branch held, or it is the queue
    a slow decode builds (``consequence``)."""

    verdict: str
    confidence: float
    summary: str
    evidence: list[Evidence]
    consequence: bool = False
    branch: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "confidence": round(self.confidence, 3),
            "consequence": self.consequence,
            "summary": self.summary,
            "branch": self.branch,
            "evidence": [e.to_json() for e in self.evidence],
        }


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
    notes: list[str] = field(default_factory=list)  # what a fast engine's operator should still know
    unresolved: list[str] = field(default_factory=list)  # verdicts missing signals could not rule out
    context: Context = field(default_factory=Context)
    differential: list[Contributor] = field(default_factory=list)  # other causes present, ranked

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
            "notes": list(self.notes),
            "knee": self.knee.to_json(),
            "missing": list(self.missing),
            "unresolved": list(self.unresolved),
            "branch": self.branch,
            "features": {k: json_number(v) for k, v in self.features.items()},
            "window": {"seconds": self.window_seconds, "samples": self.samples},
            "ledger": {k: json_number(v) for k, v in self.ledger.items()},
            "context": context_to_json(self.context),
            "differential": [c.to_json() for c in self.differential],
        }


# -------------------------------------------------------------------------------- diagnose


def diagnose(window: Window, context: Context | None = None, thresholds: Thresholds | None = None) -> Diagnosis:
    """The verdict for ``window`` with its evidence, actions, knee, differential and what was missing;
    ``unknown`` for a window of fewer than ``MIN_WINDOW_SAMPLES`` snapshots."""
    t = thresholds or DEFAULT_THRESHOLDS
    view = WindowView(window, recent_seconds=t.state_window_seconds, batches=_BATCHES)
    ctx = resolve(context, _published(view))
    if len(view) < MIN_WINDOW_SAMPLES:
        return _unknown(window, view, ctx, t)
    slo = ctx.slo
    values = features.compute_features(view, t)
    params = tree.parameters(t, slo)
    branch = tree.choose_branch(values, params)

    missing = _missing_signals(view)
    knee = _knee(view, t) if branch.verdict != "idle" else Knee(note="idle")
    hit_ratio = _prefix_hit_ratio(view)
    facts = _ledger_facts(view, ctx, values, t)
    confidence, unresolved = assess_confidence(values, params, knee.kind, len(view) < _FEW_SAMPLES)
    evidence = render.evidence(branch, values, params)
    if hit_ratio is not None:
        evidence.append(render.hit_ratio_evidence(hit_ratio, t))
    notes = render.notes(values, slo, t) if branch.verdict == "healthy" else []  # a slow verdict says it all
    span = float(view.end - view.start) if len(view) else None
    headline = render.headline(branch, HeadlineFacts(values, slo, t, knee, facts, span), hit_ratio)
    if notes:
        headline += ". Note: " + "; ".join(notes)
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
        notes=notes,
        unresolved=unresolved,
        context=ctx,
        differential=differential(branch, values, params, confidence, knee.kind),
    )


def differential(
    chosen: tree.Branch,
    values: dict[str, float],
    params: dict[str, float],
    confidence: float,
    knee_kind: str | None = None,
) -> list[Contributor]:
    """Every other cause whose own condition holds on ``values`` (fallbacks excepted), each as sure as
    its branch would be but never surer than the verdict, then the queue a slow decode builds; worst
    first within equal confidence."""
    out: dict[str, Contributor] = {}
    if chosen.verdict not in SLOW_VERDICTS:
        return []
    for branch in tree.DIFFERENTIAL_BRANCHES:
        if branch.verdict in (chosen.verdict, *out):
            continue
        if evaluate(branch.condition, values, params):
            sure = min(dynamic_base(branch, values, knee_kind), confidence)
            rows = [e for e in render.evidence(branch, values, params) if not e.context]
            out[branch.verdict] = Contributor(branch.verdict, sure, branch.summary, rows, branch=branch.id)
    ranked = sorted(out.values(), key=lambda c: (-c.confidence, verdict_rank(c.verdict)))
    if chosen.verdict != QUEUEING and evaluate(tree.QUEUE_CONSEQUENCE, values, params):
        waiting = values["requests_waiting"]
        ranked.append(
            Contributor(
                QUEUEING,
                confidence,
                f"{plural(waiting, 'request')} waiting: a consequence of the slowness, not its cause",
                [
                    render.context_row("requests_waiting", values, params),
                    render.context_row("ttft_p95_seconds", values, params),
                ],
                consequence=True,
                branch="queue_consequence",
            )
        )
    return ranked


def _unknown(window: Window, view: WindowView, ctx: Context, t: Thresholds) -> Diagnosis:
    """The answer for a window too short to judge: says how short, claims nothing."""
    got = plural(len(view), "snapshot")
    reason = f"{got} in the window; the tree needs at least {MIN_WINDOW_SAMPLES} (a rate needs two in its range)"
    span = float(view.end - view.start) if len(view) else None
    facts = HeadlineFacts({}, ctx.slo, t, Knee(note="too few samples"), LedgerFacts(), span, reason)
    return Diagnosis(
        verdict=UNKNOWN,
        confidence=0.0,
        headline=catalogue_entry(UNKNOWN).headline(UNKNOWN, facts),
        evidence=[],
        actions=[],
        knee=Knee(note="too few samples"),
        missing=_missing_signals(view),
        branch=UNKNOWN,
        window_seconds=float(window.end - window.start) if len(window) else 0.0,
        samples=len(window),
        context=ctx,
    )


_TREE_SIGNAL_SERIES = tuple(
    (name, SIGNALS[name].series_names) for name in tree.TREE_SIGNALS.engine + tree.TREE_SIGNALS.gpu
)


def _missing_signals(view: WindowView) -> list[str]:
    """Tree signals with no sample in the window."""
    return [name for name, series in _TREE_SIGNAL_SERIES if not any(map(view.has, series))]


def _published(view: WindowView) -> Context:
    """The context the window's exporter published (its newest info labels and SLO sample)."""
    labels, info, _, _, _ = view.rows(Selector(CONTEXT_INFO))
    newest = [int(np.flatnonzero(~np.isnan(row))[-1]) if (~np.isnan(row)).any() else -1 for row in info]
    ordered = [labels[i] for i in sorted(range(len(labels)), key=newest.__getitem__) if newest[i] >= 0]
    slo_rows = view.rows(Selector(ITL_SLO))[1]
    slo_values = stats.forward_fill(slo_rows).max(axis=0).tolist() if slo_rows.shape[0] else []
    return published_context(ordered, slo_values)


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
    """Hit tokens (every tier, counted once) per prompt token looked up (else per prompt token
    received: prompt tokens include the cached ones), capped at 1; else the engine's ratio gauge."""
    hits = features.total_hit_tokens(view)
    queries = view.sum_increase(Selector(PREFIX_CACHE_QUERIES))
    if math.isnan(queries):
        queries = view.sum_increase(Selector(PROMPT_TOKENS))
    if not math.isnan(hits) and not math.isnan(queries) and queries > 0:
        return min(1.0, hits / queries)
    ratio = view.quantiles(Selector(PREFIX_CACHE_HIT_RATIO), 0.5)
    ratio = ratio[~np.isnan(ratio)]
    return float(ratio.mean()) if len(ratio) else None


_lookup_gpu = functools.lru_cache(maxsize=64)(lookup_gpu)  # the same few device names every cycle


def _gpu_spec(view: WindowView, ctx: Context) -> GpuSpec | None:
    names = [ctx.gpu_model] if ctx.gpu_model else []
    names += [lb.get("model", "") for lb in view.labels(GPU_DRAM_BANDWIDTH_UTILIZATION) + view.labels(GPU_SM_ACTIVE)]
    for name in names:
        spec = _lookup_gpu(name) if name else None
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


def _known(value: float) -> float | None:
    return None if math.isnan(value) else value


def _ledger_facts(view: WindowView, ctx: Context, values: dict[str, float], t: Thresholds) -> LedgerFacts:
    spec = _gpu_spec(view, ctx)
    peak = ctx.gpu_peak_bandwidth
    if not peak:
        measured = _present(view.quantiles(Selector(GPU_DRAM_PEAK_BANDWIDTH), 0.5))
        measured = measured[measured > 0]  # a zero or negative peak is a broken gauge, not a fact
        peak = float(measured.max()) if len(measured) else (spec.peak_bandwidth if spec else None)
    capacity = _present(view.quantiles(Selector(KV_CACHE_CAPACITY), 0.5))
    usage = _present(view.quantiles(Selector(KV_CACHE_USAGE), 0.5))
    cap = float(capacity.sum()) if len(capacity) else None
    live = float(usage.sum()) / len(usage) * cap if cap is not None and len(usage) else None  # usage.mean()
    hits = features.total_hit_tokens(view)
    ratio = view.quantiles(Selector(PREFIX_CACHE_HIT_RATIO), 0.5)
    if not math.isnan(hits):
        prefix_hits: bool | None = hits > 0
    elif len(ratio) and not np.isnan(ratio).all():
        prefix_hits = bool(np.nanmax(ratio) > 0)
    else:
        prefix_hits = None
    tiered = view.has(KV_TRANSFER_BYTES) or any(
        lb.get("tier", "device") != "device" for lb in view.labels(PREFIX_CACHE_HITS_BY_TIER)
    )
    return LedgerFacts(
        model=ctx.model,
        kv_dtype=ctx.kv_dtype,
        peak_bandwidth=peak,
        gpus=_gpu_count(view),
        live_tokens=live,
        capacity_tokens=cap,
        pcie_bandwidth=spec.pcie_bandwidth if spec else None,
        prefix_hits=prefix_hits,
        kv_tier=True if tiered else None,
        kv_usage=_known(values.get("kv_usage", math.nan)),
        kv_ceiling=t.kv_ceiling_ratio,
        requests_running=_known(values.get("requests_running", math.nan)),
    )


def _present(values: np.ndarray) -> np.ndarray:
    """The values that are not NaN, in order (``values`` itself when none is)."""
    if len(values) == 1:
        return values if values[0] == values[0] else values[:0]
    missing = np.isnan(values)
    return values[~missing] if missing.any() else values


def _ledger_numbers(facts: LedgerFacts, values: dict[str, float]) -> dict[str, float | None]:
    """Measured ITL against the physical floor ("measured 11.8 ms vs a floor of 9.4 ms")."""
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
