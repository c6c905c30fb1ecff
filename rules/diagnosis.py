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

import numpy as np

from . import stats, tree
from .actions import Action, LedgerFacts, fmt_bytes, fmt_ms, plan_actions
from .knee import JUMP, RISES_WITH_KV, Knee, detect_knee
from .ledger import GpuSpec, ModelShape, lookup_gpu
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
from .thresholds import DEFAULT_THRESHOLDS, Thresholds
from .tree import Branch, Cmp, CmpFeatures, Present, Selector, WindowView
from .window import Window

VERDICTS = (
    "idle",
    "healthy",
    "kv_thrashing",
    "kv_tier_miss",
    "kv_capacity_pressure",
    "memory_bandwidth_bound",
    "compute_bound",
    "host_overhead_bound",
)
SLOW_VERDICTS = VERDICTS[2:]

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
    tree.COUNTER_SERIES + (PREFIX_CACHE_HITS, PREFIX_CACHE_QUERIES),
    tree.GAUGE_SERIES + (GPU_DRAM_PEAK_BANDWIDTH, KV_CACHE_CAPACITY, PREFIX_CACHE_HIT_RATIO),
    (INTER_TOKEN_LATENCY + "_sum", INTER_TOKEN_LATENCY + "_count"),  # the knee's
)
_NEAR_THRESHOLD = 0.05  # a deciding value within 5% of its threshold costs confidence
_FEW_SAMPLES = 10


@dataclass(frozen=True)
class Context:
    """What the window cannot say: the model's shape, the GPU's peak bandwidth, the latency SLO."""

    model: ModelShape | None = None
    gpu_peak_bandwidth: float | None = None  # bytes/s of one GPU; else from the window or the catalogue
    slo_seconds: float = 0.1  # ITL SLO compared with the ITL p95
    kv_dtype: str | None = None  # the engine's KV cache dtype (e.g. "fp8"); default: the model's dtype


@dataclass(frozen=True)
class Evidence:
    """One signal the verdict rests on: its windowed value and what it was compared with."""

    signal: str  # canonical signal name (kvdoctor_*)
    feature: str  # the tree's name for the windowed quantity
    value: float | None
    threshold: float | None
    comparison: str  # ">=", "<", ... or "" for context-only evidence
    holds: bool | None  # the comparison's outcome (None: not a comparison)
    measured: bool
    unit: str = ""
    note: str = ""

    def to_json(self) -> dict:
        return {
            "signal": self.signal,
            "feature": self.feature,
            "value": _json_number(self.value),
            "threshold": _json_number(self.threshold),
            "comparison": self.comparison,
            "holds": self.holds,
            "measured": self.measured,
            "unit": self.unit,
            "note": self.note,
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

    @property
    def slow(self) -> bool:
        return self.verdict in SLOW_VERDICTS

    def to_json(self) -> dict:
        return {
            "verdict": self.verdict,
            "confidence": round(self.confidence, 3),
            "headline": self.headline,
            "evidence": [e.to_json() for e in self.evidence],
            "actions": [a.to_json() for a in self.actions],
            "knee": self.knee.to_json(),
            "missing": list(self.missing),
            "branch": self.branch,
            "features": {k: _json_number(v) for k, v in self.features.items()},
            "window": {"seconds": self.window_seconds, "samples": self.samples},
            "ledger": {k: _json_number(v) for k, v in self.ledger.items()},
        }


def _json_number(v: float | None) -> float | None:
    if v is None or (isinstance(v, float) and (math.isnan(v) or math.isinf(v))):
        return None
    return float(v)


# -------------------------------------------------------------------------------- diagnose


def diagnose(window: Window, context: Context | None = None, thresholds: Thresholds | None = None) -> Diagnosis:
    """The verdict for ``window`` with its evidence, actions, knee and what was missing."""
    ctx = context or Context()
    t = thresholds or DEFAULT_THRESHOLDS
    view = WindowView(window, recent_seconds=t.state_window_seconds, batches=_BATCHES)
    values = tree.compute_features(view, t)
    params = tree.parameters(t, ctx.slo_seconds)
    branch = tree.choose_branch(values, params)
    index = tree.BRANCHES.index(branch)

    missing = _missing_signals(view)
    evidence = _evidence(values, params, index)
    knee = _knee(view, t) if branch.verdict != "idle" else Knee(note="idle")
    hit_ratio = _prefix_hit_ratio(view)
    facts = _ledger_facts(view, ctx)
    confidence = _confidence(branch, values, params, view, knee, missing)
    headline = _headline(branch, values, ctx, t, knee, hit_ratio, facts, view)
    if hit_ratio is not None:
        evidence.append(
            Evidence(
                PREFIX_CACHE_HITS,
                "prefix_hit_ratio",
                hit_ratio,
                t.prefix_hit_ratio_high,
                ">=",
                hit_ratio >= t.prefix_hit_ratio_high,
                True,
                "ratio",
                "prefix-cache hit ratio over the window (context: a hit says nothing about speed)",
            )
        )
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


_ATOMS = {branch.id: tuple(tree.atoms(branch.condition)) for branch in tree.BRANCHES}  # the tree is constant


def _evidence(values: dict, params: dict, index: int) -> list[Evidence]:
    """Every comparison the tree made on its way to branch ``index``, once each."""
    seen: set = set()
    listed: set[str] = set()
    out: list[Evidence] = []
    for branch in tree.BRANCHES[: index + 1]:
        for atom in _ATOMS[branch.id]:
            # a presence check adds nothing once its feature's value is on the list
            if atom in seen or (isinstance(atom, Present) and atom.feature in listed):
                continue
            seen.add(atom)
            evidence = _atom_evidence(atom, values, params)
            listed.add(evidence.feature)
            out.append(evidence)
    return out


def _atom_evidence(atom, values: dict, params: dict) -> Evidence:
    if isinstance(atom, Cmp):
        f = tree.FEATURES[atom.feature]
        v = values.get(atom.feature, math.nan)
        measured = not math.isnan(v)
        note = f.note + (f" (threshold: {atom.threshold.describe()})" if measured else "; not measured")
        return Evidence(
            f.signal,
            f.name,
            v if measured else None,
            atom.threshold.value(params),
            atom.op,
            tree.evaluate(atom, values, params) if measured else None,
            measured,
            f.unit,
            note,
        )
    if isinstance(atom, CmpFeatures):
        f = tree.FEATURES[atom.left]
        v = values.get(atom.left, math.nan)
        right = tree.right_side(atom, values, params)
        measured = not (math.isnan(v) or math.isnan(right))
        how = (
            atom.right
            + (f" x {atom.scale.describe()}" if atom.scale else "")
            + (f" + {atom.offset.describe()}" if atom.offset else "")
        )
        note = f"{f.note}, compared with {how}" + ("" if measured else "; not measured")
        return Evidence(
            f.signal,
            f.name,
            None if math.isnan(v) else v,
            None if math.isnan(right) else right,
            atom.op,
            tree.evaluate(atom, values, params) if measured else None,
            measured,
            f.unit,
            note,
        )
    if isinstance(atom, Present):
        f = tree.FEATURES[atom.feature]
        v = values.get(atom.feature, math.nan)
        measured = not math.isnan(v)
        return Evidence(
            f.signal,
            f.name,
            v if measured else None,
            None,
            "present",
            measured,
            measured,
            f.unit,
            f.note + ("" if measured else "; not measured"),
        )
    raise TypeError(atom)  # pragma: no cover


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


def _confidence(branch: Branch, values: dict, params: dict, view: WindowView, knee: Knee, missing: list[str]) -> float:
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
    for atom in _ATOMS[branch.id]:
        if isinstance(atom, Cmp):
            v = values.get(atom.feature, math.nan)
            thr = atom.threshold.value(params)
            if not math.isnan(v) and thr and abs(v - thr) / abs(thr) < _NEAR_THRESHOLD:
                c -= 0.1
                break
    if len(view) < _FEW_SAMPLES:
        c *= 0.6
    return float(min(0.99, max(0.05, c)))


def _fmt_pct(v: float) -> str:
    return f"{v:.0%}"


def _fmt_rate_bytes(v: float) -> str:
    return fmt_bytes(v) + "/s"


def _headline(
    branch: Branch,
    v: dict,
    ctx: Context,
    t: Thresholds,
    knee: Knee,
    hit_ratio: float | None,
    facts: LedgerFacts,
    view: WindowView,
) -> str:
    span = f"{view.end - view.start:.0f} s" if len(view) else "the window"
    kv = v.get("kv_usage", math.nan)
    p95 = v.get("itl_p95_seconds", math.nan)
    slo = fmt_ms(ctx.slo_seconds)
    early, late = v.get("itl_early_median_seconds", math.nan), v.get("itl_late_median_seconds", math.nan)
    if math.isnan(p95):
        itl = "ITL unknown"
    elif p95 >= ctx.slo_seconds or math.isnan(early) or math.isnan(late):
        itl = f"ITL p{t.itl_quantile * 100:g} {fmt_ms(p95)} (SLO {slo})"
    else:  # slow because it is rising
        itl = (
            f"ITL rising, median {fmt_ms(early)} -> {fmt_ms(late)} (p{t.itl_quantile * 100:g} {fmt_ms(p95)}, SLO {slo})"
        )
    bw, sm = v.get("dram_bandwidth_ratio", math.nan), v.get("sm_active_ratio", math.nan)
    knee_text = f"; {knee.note}" if knee.kind else ""
    gpu_missing = math.isnan(v.get("gpu_busy_ratio", math.nan))
    b = branch.id
    if b == "idle":
        text = f"Idle: no tokens generated in the last {span}"
        if not math.isnan(kv) and kv >= 0.05:
            text += f" (KV usage {_fmt_pct(kv)} is left over from earlier traffic)"
    elif b == "healthy":
        if math.isnan(p95):
            text = "Healthy as far as can be told: tokens flow, no KV capacity or placement problem; no ITL histogram"
        else:
            text = f"Healthy: ITL p{t.itl_quantile * 100:g} {fmt_ms(p95)} under the {slo} SLO, no KV capacity or placement problem"
        if hit_ratio is not None and hit_ratio >= t.prefix_hit_ratio_high:
            text += f"; prefix cache hit ratio {_fmt_pct(hit_ratio)} and fast"
    elif b == "thrashing_preemptions":
        text = (
            f"KV cache thrashing: {v['preemptions_per_minute']:.1f} preemptions/min"
            + (f" with KV usage at {_fmt_pct(kv)}" if not math.isnan(kv) else "")
            + ": preempted requests recompute their whole prefix and queue again"
            + knee_text
        )
    elif b == "thrashing_reload":
        text = (
            f"KV cache thrashing: KV is moved into a full pool (KV usage {_fmt_pct(kv)}"
            + _transfer_text(v, t)
            + "): blocks are evicted and reloaded"
            + knee_text
        )
    elif b == "tier_miss":
        text = (
            "KV tier miss: prefix hits are served from a slow tier ("
            + _transfer_text(v, t).lstrip("; ")
            + (f"; GPU pool at {_fmt_pct(kv)}" if not math.isnan(kv) else "")
            + "): the transfer is not hidden behind compute"
        )
    elif b == "capacity_pressure":
        text = (
            f"KV capacity pressure: KV usage {_fmt_pct(kv)} with {v['requests_waiting']:.0f} requests waiting, "
            "no preemption yet: admission is limited by the KV pool"
        )
    elif b == "bandwidth_high":
        text = (
            f"Decode is HBM-bandwidth bound: DRAM bandwidth {_fmt_pct(bw)} busy"
            + (f", SM {_fmt_pct(sm)}" if not math.isnan(sm) else "")
            + f"; {itl}"
            + _ledger_text(facts)
            + knee_text
        )
    elif b == "sm_high":
        text = (
            f"Decode is compute bound: SM {_fmt_pct(sm)} active"
            + (f" vs DRAM bandwidth {_fmt_pct(bw)}" if not math.isnan(bw) else "")
            + f"; {itl}"
        )
    elif b == "gpu_idle":
        text = (
            f"Decode is host-overhead bound: the GPU is mostly idle (busiest counter {_fmt_pct(v['gpu_busy_ratio'])}) "
            f"with {itl}: the time goes to the scheduler, CPU or Python"
        )
    elif b == "prefill_heavy_no_gpu":
        ratio = v["prompt_tokens_per_second"] / v["generation_tokens_per_second"]
        text = (
            f"Decode is slow: {itl}, under prefill-heavy traffic ({ratio:.0f} prompt tokens per generated "
            "token): most likely compute bound; no GPU counters to confirm"
        )
    else:  # decode_default
        if gpu_missing:
            text = f"Decode is slow: {itl}; no GPU counters: most likely HBM-bandwidth bound" + knee_text
        else:
            parts = [
                f"DRAM {_fmt_pct(bw)}" if not math.isnan(bw) else "",
                f"SM {_fmt_pct(sm)}" if not math.isnan(sm) else "",
            ]
            busy = ", ".join(p for p in parts if p)
            if busy:
                gpu = f"with the GPU moderately busy ({busy})"
            else:
                gpu = (
                    f"with only NVML duty cycles (busiest {_fmt_pct(v['gpu_busy_ratio'])}), which cannot tell "
                    "bandwidth from compute"
                )
            text = f"Decode is slow: {itl}, {gpu}: most likely HBM-bandwidth bound" + _ledger_text(facts) + knee_text
    if branch.verdict in SLOW_VERDICTS and hit_ratio is not None and hit_ratio >= t.prefix_hit_ratio_high:
        text = f"Cache hit but slow (prefix hit ratio {_fmt_pct(hit_ratio)} does not help here). {text}"
    if branch.step == 4 and gpu_missing:
        text += " [GPU counters missing: verdict from engine signals only]"
    return text


def _transfer_text(v: dict, t: Thresholds) -> str:
    """The transfer signals that crossed their thresholds."""
    parts = []
    if v.get("kv_to_gpu_bytes_per_second", math.nan) >= t.kv_to_gpu_bytes_per_second_min:
        parts.append(f"{_fmt_rate_bytes(v['kv_to_gpu_bytes_per_second'])} of KV into the GPU")
    if v.get("pcie_receive_bytes_per_second", math.nan) >= t.pcie_receive_bytes_per_second_min:
        parts.append(f"PCIe receive {_fmt_rate_bytes(v['pcie_receive_bytes_per_second'])}")
    if v.get("slow_tier_hit_fraction", math.nan) >= t.slow_tier_hit_fraction_min:
        parts.append(f"{_fmt_pct(v['slow_tier_hit_fraction'])} of hit tokens from off-GPU tiers")
    return "".join("; " + p for p in parts)


def _ledger_numbers(facts: LedgerFacts, values: dict) -> dict[str, float | None]:
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


def _ledger_text(facts: LedgerFacts) -> str:
    per_token = facts.kv_bytes()
    floor = facts.floor(per_token)
    if facts.model is None or per_token is None or floor is None or facts.live_tokens is None:
        return ""
    read = facts.model.weight_bytes + per_token * facts.live_tokens
    return f"; each step re-reads {fmt_bytes(read)} (floor {fmt_ms(floor)})"
