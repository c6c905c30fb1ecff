"""A verdict in words: the evidence, the headline and the notes the on-call engineer reads.

``evidence`` lists the comparisons on the path to the chosen branch (one row per quantity, each
with its threshold as configured) and then the state that explains it (KV usage, requests
waiting, preemptions, the ITL p95 against the SLO, and the branch's own context), each marked
measured or missing. ``headline`` says in one line what is happening with the numbers that show
it, and never claims what no signal measured. ``notes`` are what a fast engine's operator should
still know ("KV pool 97% full, no queue: headroom is low").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from kvdoctor.signals.units import (
    BYTES_PER_SECOND,
    PER_MINUTE,
    RATIO,
    REQUESTS,
    SECONDS,
    TOKENS_PER_SECOND,
    fmt_bytes,
    fmt_ms,
    fmt_pct,
    fmt_seconds,
    plural,
)
from kvdoctor.signals.vocabulary import PREFIX_CACHE_HITS

from .conditions import All, Any, Atom, Cmp, CmpFeatures, Condition, Named, Not, Param, Present, evaluate
from .features import FEATURES, GPU
from .headlines import HeadlineFacts, at_least, crossed, transfer_text
from .thresholds import Thresholds
from .tree import CONTEXT_FEATURES, DECODE_STEP, SLO, Branch
from .verdicts import SLOW_VERDICTS
from .verdicts import verdict as catalogue_entry

GPU_COUNTERS_HINT = "NVML (GPM, Hopper or newer) or dcgm-exporter (--dcgm-url)"

# The comparison a context row shows, where the quantity has a natural one.
_CONTEXT_CHECKS: dict[str, tuple[str, Param]] = {
    "itl_p95_seconds": (">=", SLO),
    "time_per_token_mean_seconds": (">=", SLO),
    "kv_usage": (">=", Param("kv_ceiling_ratio")),
    "requests_waiting": (">=", Param("queue_waiting_min")),
    "preemptions_per_minute": (">=", Param("preemptions_per_minute")),
    "requests_swapped": (">=", Param("requests_swapped_min")),
    "ttft_p95_seconds": (">=", Param("ttft_slow_seconds")),
    "dram_bandwidth_ratio": (">=", Param("bandwidth_high_ratio")),
    "sm_active_ratio": (">=", Param("sm_high_ratio")),
    "gpu_busy_ratio": ("<", Param("host_overhead_gpu_max")),
}


# Each windowed quantity in words, for people (the dashboard's evidence rows, --json's "label"); the
# feature's own name stays the key, shown beside it (the dashboard's tooltip).
FEATURE_LABELS: dict[str, str] = {
    "generation_tokens_per_second": "output tokens per second",
    "prompt_tokens_per_second": "prompt tokens per second",
    "requests_running": "requests running (median)",
    "requests_waiting": "requests waiting (median)",
    "queue_growth_per_minute": "queue growth",
    "requests_swapped": "requests swapped out to host memory",
    "preemptions_per_minute": "preemptions",
    "preemptions_per_minute_late": "preemptions",
    "kv_usage": "KV cache usage",
    "kv_usage_floor": "KV cache usage, its lowest",
    "kv_host_usage": "host KV cache usage",
    "kv_to_gpu_bytes_per_second": "KV moved into the GPU",
    "slow_tier_hit_fraction": "prefix hits served from a slower tier",
    "itl_p95_seconds": "ITL p95",
    "itl_early_median_seconds": "per-token latency, first third of the window",
    "itl_late_median_seconds": "per-token latency, last third of the window",
    "time_per_token_mean_seconds": "mean time per output token",
    "ttft_p95_seconds": "TTFT p95",
    "pcie_receive_bytes_per_second": "PCIe receive bandwidth",
    "dram_bandwidth_ratio": "GPU DRAM bandwidth (busiest GPU, median)",
    "sm_active_ratio": "GPU SM activity (busiest GPU, median)",
    "gpu_busy_ratio": "GPU busy (DRAM or SM, the larger)",
    "prefix_hit_ratio": "prefix-cache hit ratio",
}


def feature_label(name: str) -> str:
    """``name`` (a feature, or two compared: ``a / b``, ``a - b``) in words; the name if unknown."""
    for sep, word in ((" / ", " / "), (" - ", " minus ")):
        if sep in name:
            left, right = name.split(sep, 1)
            return f"{feature_label(left)}{word}{feature_label(right)}"
    return FEATURE_LABELS.get(name, name)


@dataclass(frozen=True)
class Evidence:
    """One quantity the verdict rests on: its windowed value and what it was compared with."""

    signal: str  # canonical signal name (kvdoctor_*)
    feature: str  # the tree's name for the windowed quantity
    value: float | None
    threshold: float | None  # as configured (a knob, or the SLO)
    comparison: str  # ">=", "<", ... "present", or "" for a value shown as it is
    holds: bool | None  # the comparison's outcome (None: not measured, or not a comparison)
    measured: bool
    unit: str = ""
    note: str = ""  # how the number is computed (--json only; people read ``text``)
    context: bool = False  # explains the verdict rather than deciding it
    text: str = ""  # the row in on-call words: "ITL p95 over the last 15 s: 45.9 ms (SLO 15 ms)"

    @property
    def label(self) -> str:
        """The quantity in words (``feature`` is its name)."""
        return feature_label(self.feature)

    def to_json(self) -> dict[str, str | float | bool | None]:
        return {
            "signal": self.signal,
            "feature": self.feature,
            "label": self.label,
            "value": json_number(self.value),
            "threshold": json_number(self.threshold),
            "comparison": self.comparison,
            "holds": self.holds,
            "measured": self.measured,
            "unit": self.unit,
            "note": self.note,
            "context": self.context,
            "text": self.text,
        }


def json_number(v: float | None) -> float | None:
    """A number for JSON: None for a missing, NaN or infinite one."""
    if v is None or (isinstance(v, float) and (math.isnan(v) or math.isinf(v))):
        return None
    return float(v)


# --------------------------------------------------------------------------------- evidence


def deciding_atoms(cond: Condition, values: Mapping[str, float], params: Mapping[str, float]) -> list[Atom]:
    """The comparisons that decided ``cond``: every term of an ``All``, the terms of an ``Any``
    that hold (all of them when none does), everything under a ``Not``."""
    if isinstance(cond, (Cmp, CmpFeatures, Present)):
        return [cond]
    if isinstance(cond, Named):
        return deciding_atoms(cond.condition, values, params)
    if isinstance(cond, Not):
        return deciding_atoms(cond.term, values, params)
    if isinstance(cond, All):
        return [a for t in cond.terms for a in deciding_atoms(t, values, params)]
    if isinstance(cond, Any):
        held = [t for t in cond.terms if evaluate(t, values, params)]
        return [a for t in held or cond.terms for a in deciding_atoms(t, values, params)]
    raise TypeError(f"not a condition: {cond!r}")


# Quantities only some engine generations have (vLLM V0's swap space and host pool): where the
# engine does not report them, their rows are left out rather than shown as "not measured".
GENERATION_SPECIFIC = frozenset({"requests_swapped", "kv_host_usage"})


def evidence(branch: Branch, values: Mapping[str, float], params: Mapping[str, float]) -> list[Evidence]:
    """The comparisons on the path to ``branch`` (one row per quantity), then its context."""
    rows: dict[str, Evidence] = {}
    for atom in deciding_atoms(branch.condition, values, params):
        item = _atom_evidence(atom, values, params)
        if item.feature not in rows:
            rows[item.feature] = item
    for name in (*CONTEXT_FEATURES, *branch.context):
        if name not in rows and not (name in GENERATION_SPECIFIC and math.isnan(values.get(name, math.nan))):
            rows[name] = context_row(name, values, params)
    return list(rows.values())


# Each quantity in one unit on every surface (ITL in ms, TTFT in s, ratios in %).
_SHOWN_IN_SECONDS = frozenset({"ttft_p95_seconds"})


def shown(feature: str, value: float) -> str:
    """``value`` of ``feature`` as people read it, in the one unit that quantity always has."""
    unit = FEATURES[feature.split(" ")[0]].unit if feature.split(" ")[0] in FEATURES else ""
    if " / " in feature:
        return f"{value:.2f}x"
    if unit == SECONDS:
        return fmt_seconds(value) if feature in _SHOWN_IN_SECONDS else fmt_ms(value, trim=True)
    if unit == RATIO:
        return fmt_pct(value, 1 if 0 < abs(value) < 0.01 else 0)
    if unit == BYTES_PER_SECOND:
        return fmt_bytes(value) + "/s"
    if unit == PER_MINUTE:
        return f"{value:.1f}/min"
    if unit == TOKENS_PER_SECOND:
        return f"{value:,.1f} tokens/s"
    if unit == REQUESTS:
        return f"{value:.0f}"
    return f"{value:.4g}"


_OPS = {">=": "≥", "<": "<", ">": ">", "<=": "≤"}


def words(
    feature: str, value: float, threshold: float | None, op: str, param: Param | None, params: Mapping[str, float]
) -> str:
    """One evidence row in on-call words: what, over what span, the value, and what it is compared with."""
    base = feature.split(" ")[0]
    f = FEATURES.get(base)
    label = feature_label(feature)
    span = ""
    if f is not None and " " not in feature:
        seconds = params.get("state_window_seconds" if f.part == "recent" else "window_seconds")
        span = f" over the last {seconds:g} s" if seconds else ""
    if math.isnan(value):
        how = f": needs {GPU_COUNTERS_HINT}" if f is not None and f.scope == GPU else ""
        return f"{label}: not measured{how}"
    text = f"{label}{span}: {shown(feature, value)}"
    if threshold is not None and op in _OPS:
        against = shown(feature, threshold) if " / " not in feature else f"{threshold:g}x"
        if " - " in feature:
            against = shown(base, threshold)
        name = "SLO" if param is not None and "slo_seconds" in (param.name, param.times) else f"threshold {_OPS[op]}"
        text += f" ({name} {against})"
    return text


def _missing_note(feature: str) -> str:
    how = f": needs {GPU_COUNTERS_HINT}" if FEATURES[feature].scope == GPU else ""
    return f"; not measured{how}"


def _atom_evidence(atom: Atom, values: Mapping[str, float], params: Mapping[str, float]) -> Evidence:
    if isinstance(atom, Cmp):
        return _compared(atom.feature, atom.op, atom.threshold, values, params, evaluate(atom, values, params))
    if isinstance(atom, CmpFeatures):
        return _features_compared(atom, values, params)
    f = FEATURES[atom.feature]  # Present
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
        f.note + ("" if measured else _missing_note(f.name)),
        text=words(f.name, v, None, "", None, params),
    )


def _compared(
    feature: str,
    op: str,
    threshold: Param,
    values: Mapping[str, float],
    params: Mapping[str, float],
    holds: bool,
    context: bool = False,
) -> Evidence:
    f = FEATURES[feature]
    v = values.get(feature, math.nan)
    measured = not math.isnan(v)
    note = f.note + (f" (threshold: {threshold.describe()})" if measured else _missing_note(feature))
    return Evidence(
        f.signal,
        f.name,
        v if measured else None,
        threshold.value(params),
        op,
        holds if measured else None,
        measured,
        f.unit,
        ("context: " if context else "") + note,
        context,
        words(feature, v, threshold.value(params), op, threshold, params),
    )


def _features_compared(atom: CmpFeatures, values: Mapping[str, float], params: Mapping[str, float]) -> Evidence:
    """``left op right x scale`` shown as ``left / right op scale``, ``left op right + offset`` as
    ``left - right op offset``: the threshold as configured, a value a measurement can reach."""
    f = FEATURES[atom.left]
    left, right = values.get(atom.left, math.nan), values.get(atom.right, math.nan)
    if atom.scale is not None:
        name, value, param, unit = f"{atom.left} / {atom.right}", left / right if right else math.nan, atom.scale, ""
    else:
        param = atom.offset or Param("zero")
        name, value, unit = f"{atom.left} - {atom.right}", left - right, f.unit
    measured = not math.isnan(value)
    note = f"{f.note}, compared with {atom.right} (threshold: {param.describe()})" + (
        "" if measured else _missing_note(atom.left)
    )
    return Evidence(
        f.signal,
        name,
        value if measured else None,
        param.value(params),
        atom.op,
        evaluate(atom, values, params) if measured else None,
        measured,
        unit,
        note,
        text=words(name, value, param.value(params), atom.op, param, params),
    )


def context_row(feature: str, values: Mapping[str, float], params: Mapping[str, float]) -> Evidence:
    """A quantity that explains the verdict (compared with its natural threshold, where it has one)."""
    check = _CONTEXT_CHECKS.get(feature)
    if check is not None:
        op, param = check
        return _compared(feature, op, param, values, params, evaluate(Cmp(feature, op, param), values, params), True)
    f = FEATURES[feature]
    v = values.get(feature, math.nan)
    measured = not math.isnan(v)
    note = "context: " + f.note + ("" if measured else _missing_note(feature))
    text = words(feature, v, None, "", None, params)
    return Evidence(f.signal, f.name, v if measured else None, None, "", None, measured, f.unit, note, True, text)


def hit_ratio_evidence(hit_ratio: float, t: Thresholds) -> Evidence:
    """The prefix-cache hit ratio, listed as context: a hit says nothing about speed."""
    return Evidence(
        PREFIX_CACHE_HITS,
        "prefix_hit_ratio",
        hit_ratio,
        t.prefix_hit_ratio_high,
        ">=",
        hit_ratio >= t.prefix_hit_ratio_high,
        True,
        RATIO,
        "context: prefix-cache hit tokens (every tier) per prompt token over the window; a hit says nothing "
        "about speed",
        True,
        f"prefix-cache hit ratio over the last {t.window_seconds:g} s: {fmt_pct(hit_ratio)} "
        "(a hit says where the KV came from, not how fast it is read)",
    )


# ------------------------------------------------------------------------------------ notes


def notes(v: Mapping[str, float], slo_seconds: float, t: Thresholds) -> list[str]:
    """What a fast engine's operator should still know: full pool, tier traffic, a busy bus, a
    preemption, a rising ITL, a slow first token with nothing waiting."""
    out: list[str] = []
    waiting = v.get("requests_waiting", math.nan)
    no_queue = "no queue" if waiting == 0 else ("queue not reported" if math.isnan(waiting) else "a short queue")
    if at_least(v, "requests_waiting", t.queue_waiting_min):
        out.append(
            f"{plural(round(v['requests_waiting']), 'request')} waiting, but the queue neither grows nor delays the "
            "first token: "
            "not slowness"
        )
    if at_least(v, "kv_usage", t.kv_ceiling_ratio):
        out.append(f"KV pool {fmt_pct(v['kv_usage'])} full, {no_queue}: headroom is low")
    transfers = transfer_text(v, t).lstrip("; ")
    if transfers:
        out.append(f"tier traffic ({transfers}) with decode on time: the transfer is hidden")
    out += crossed(
        v,
        (
            "dram_bandwidth_ratio",
            t.bandwidth_high_ratio,
            fmt_pct,
            "DRAM bandwidth {} busy with decode on time: little headroom",
        ),
        (
            "preemptions_per_minute",
            t.preemptions_per_minute,
            "{:.1f}".format,
            "{} preemptions/min: the KV pool ran out briefly",
        ),
        ("requests_swapped", t.requests_swapped_min, "{:.0f}".format, "{} requests swapped out to host memory"),
    )
    early, late = v.get("itl_early_median_seconds", math.nan), v.get("itl_late_median_seconds", math.nan)
    if late >= early * t.trend_ratio and late >= t.trend_min_slo_fraction * slo_seconds:
        out.append(
            f"ITL rising, median {fmt_ms(early, trim=True)} -> {fmt_ms(late, trim=True)}, "
            f"still under the {fmt_ms(slo_seconds, trim=True)} SLO"
        )
    if at_least(v, "ttft_p95_seconds", t.ttft_slow_seconds):
        out.append(
            f"TTFT p{t.ttft_quantile * 100:g} {fmt_seconds(v['ttft_p95_seconds'])} over "
            f"{fmt_seconds(t.ttft_slow_seconds)} with nothing waiting: long prompts (prefill)"
        )
    return out


# --------------------------------------------------------------------------------- headline


def headline(branch: Branch, facts: HeadlineFacts, hit_ratio: float | None) -> str:
    """The verdict of ``branch`` in one line (its catalogue builder), with what every slow headline
    shares: the queue a slow decode builds, a prefix-cache hit that does not help, missing GPU counters."""
    v, t = facts.values, facts.thresholds
    text = catalogue_entry(branch.verdict).headline(branch.id, facts)
    if branch.step == DECODE_STEP and at_least(v, "requests_waiting", t.queue_waiting_min):
        text += f"; {plural(round(v['requests_waiting']), 'request')} waiting: a consequence of slow decode"
    if branch.verdict == "healthy" and hit_ratio is not None and hit_ratio >= t.prefix_hit_ratio_high:
        text += f"; prefix cache hit ratio {fmt_pct(hit_ratio)} and fast"
    if branch.verdict in SLOW_VERDICTS and hit_ratio is not None and hit_ratio >= t.prefix_hit_ratio_high:
        text = f"Cache hit but slow (prefix hit ratio {fmt_pct(hit_ratio)} does not help here). {text}"
    if branch.gpu_side and facts.gpu_missing:
        text += f" [GPU counters missing: verdict from engine signals only; get them from {GPU_COUNTERS_HINT}]"
    return text
