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
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .actions import LedgerFacts
from .conditions import All, Any, Atom, Cmp, CmpFeatures, Condition, Named, Not, Param, Present, evaluate
from .features import FEATURES, GPU
from .knee import Knee
from .signals import PREFIX_CACHE_HITS
from .thresholds import Thresholds
from .tree import CONTEXT_FEATURES, SLO, SLOW_VERDICTS, Branch
from .units import RATIO, fmt_bytes, fmt_duration, fmt_ms, fmt_pct
from .view import WindowView

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
    "requests_running": "requests running",
    "requests_waiting": "requests waiting",
    "requests_swapped": "requests swapped out to host memory",
    "preemptions_per_minute": "preemptions per minute",
    "kv_usage": "KV cache usage",
    "kv_host_usage": "host KV cache usage",
    "kv_to_gpu_bytes_per_second": "KV moved into the GPU",
    "slow_tier_hit_fraction": "prefix hits served from a slower tier",
    "itl_p95_seconds": "per-token latency (ITL p95)",
    "itl_early_median_seconds": "per-token latency, first third of the window",
    "itl_late_median_seconds": "per-token latency, last third of the window",
    "time_per_token_mean_seconds": "mean time per output token",
    "ttft_p95_seconds": "time to first token (p95)",
    "pcie_receive_bytes_per_second": "PCIe receive bandwidth",
    "dram_bandwidth_ratio": "GPU DRAM bandwidth",
    "sm_active_ratio": "GPU SM activity",
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
    note: str = ""
    context: bool = False  # explains the verdict rather than deciding it

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


def evidence(branch: Branch, values: Mapping[str, float], params: Mapping[str, float]) -> list[Evidence]:
    """The comparisons on the path to ``branch`` (one row per quantity), then its context."""
    rows: dict[str, Evidence] = {}
    for atom in deciding_atoms(branch.condition, values, params):
        item = _atom_evidence(atom, values, params)
        if item.feature not in rows:
            rows[item.feature] = item
    for name in (*CONTEXT_FEATURES, *branch.context):
        if name not in rows:
            rows[name] = _context_evidence(name, values, params)
    return list(rows.values())


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
    )


def _context_evidence(feature: str, values: Mapping[str, float], params: Mapping[str, float]) -> Evidence:
    check = _CONTEXT_CHECKS.get(feature)
    if check is not None:
        op, param = check
        return _compared(feature, op, param, values, params, evaluate(Cmp(feature, op, param), values, params), True)
    f = FEATURES[feature]
    v = values.get(feature, math.nan)
    measured = not math.isnan(v)
    note = "context: " + f.note + ("" if measured else _missing_note(feature))
    return Evidence(f.signal, f.name, v if measured else None, None, "", None, measured, f.unit, note, True)


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
    )


# ------------------------------------------------------------------------------------ notes


def notes(v: Mapping[str, float], slo_seconds: float, t: Thresholds) -> list[str]:
    """What a fast engine's operator should still know: full pool, tier traffic, a busy bus, a
    preemption, a rising ITL, a slow first token with nothing waiting."""
    out: list[str] = []
    waiting = v.get("requests_waiting", math.nan)
    no_queue = "no queue" if waiting == 0 else ("queue not reported" if math.isnan(waiting) else "a short queue")
    if _ge(v, "kv_usage", t.kv_ceiling_ratio):
        out.append(f"KV pool {fmt_pct(v['kv_usage'])} full, {no_queue}: headroom is low")
    transfers = _transfer_text(v, t).lstrip("; ")
    if transfers:
        out.append(f"tier traffic ({transfers}) with decode on time: the transfer is hidden")
    out += _crossed(
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
    if _ge(v, "ttft_p95_seconds", t.ttft_slow_seconds):
        out.append(
            f"TTFT p{t.ttft_quantile * 100:g} {fmt_duration(v['ttft_p95_seconds'])} over "
            f"{fmt_duration(t.ttft_slow_seconds)} with nothing waiting: long prompts (prefill)"
        )
    return out


def _ge(v: Mapping[str, float], name: str, threshold: float) -> bool:
    value = v.get(name, math.nan)
    return not math.isnan(value) and value >= threshold


def _crossed(v: Mapping[str, float], *notes: tuple[str, float, Callable[[float], str], str]) -> list[str]:
    """The notes ``(feature, threshold, how its value is shown, text)`` whose feature is at or above
    its threshold: each text with the value shown in its ``{}``."""
    return [text.format(shown(v[name])) for name, threshold, shown, text in notes if _ge(v, name, threshold)]


# --------------------------------------------------------------------------------- headline


def latency_text(v: Mapping[str, float], slo_seconds: float, t: Thresholds) -> str:
    """The latency measure against the SLO: the ITL p95, else the mean time per token, else unknown."""
    p95, mean = v.get("itl_p95_seconds", math.nan), v.get("time_per_token_mean_seconds", math.nan)
    slo = fmt_ms(slo_seconds, trim=True)
    if not math.isnan(p95):
        return f"ITL p{t.itl_quantile * 100:g} {fmt_ms(p95, trim=True)} (SLO {slo})"
    if not math.isnan(mean) and math.isfinite(mean):
        return f"mean time per token {fmt_ms(mean, trim=True)} (SLO {slo}; a mean: no ITL histogram)"
    return "ITL unknown"


def _delay_text(v: Mapping[str, float], slo_seconds: float, t: Thresholds) -> str:
    """How the engine is slow: requests waiting, TTFT over its SLO, the latency over the SLO."""
    parts = []
    if _ge(v, "requests_waiting", t.queue_waiting_min):
        parts.append(f"{v['requests_waiting']:.0f} requests waiting")
    if _ge(v, "ttft_p95_seconds", t.ttft_slow_seconds):
        parts.append(f"TTFT p{t.ttft_quantile * 100:g} {fmt_duration(v['ttft_p95_seconds'])}")
    p95, mean = v.get("itl_p95_seconds", math.nan), v.get("time_per_token_mean_seconds", math.nan)
    if p95 >= slo_seconds or (math.isnan(p95) and mean >= slo_seconds):
        parts.append(latency_text(v, slo_seconds, t))
    return ", ".join(parts)


def headline(
    branch: Branch,
    v: Mapping[str, float],
    slo_seconds: float,
    t: Thresholds,
    knee: Knee,
    hit_ratio: float | None,
    facts: LedgerFacts,
    view: WindowView,
) -> str:
    """The verdict of ``branch`` in one line, with the numbers that show it."""
    span = f"{view.end - view.start:.0f} s" if len(view) else "the window"
    kv = v.get("kv_usage", math.nan)
    itl = latency_text(v, slo_seconds, t)
    slow = _delay_text(v, slo_seconds, t)
    bw, sm = v.get("dram_bandwidth_ratio", math.nan), v.get("sm_active_ratio", math.nan)
    knee_text = f"; {knee.note}" if knee.kind else ""
    gpu_missing = math.isnan(v.get("gpu_busy_ratio", math.nan))
    kv_text = f"KV usage {fmt_pct(kv)}" if not math.isnan(kv) else "KV usage not reported"
    b = branch.id
    if b == "idle":
        if all(math.isnan(v.get(n, math.nan)) for n in ("generation_tokens_per_second", "requests_running")):
            text = f"Idle as far as can be told: no token counter or running-requests gauge in the last {span}"
        else:
            text = f"Idle: no tokens generated and no request running or waiting in the last {span}"
        if not math.isnan(kv) and kv >= 0.05:
            text += f" (KV usage {fmt_pct(kv)} is left over from earlier traffic)"
    elif b == "healthy":
        p95, mean = v.get("itl_p95_seconds", math.nan), v.get("time_per_token_mean_seconds", math.nan)
        slo = fmt_ms(slo_seconds, trim=True)
        if not math.isnan(p95):
            text = f"Healthy: ITL p{t.itl_quantile * 100:g} {fmt_ms(p95, trim=True)} under the {slo} SLO"
        else:
            text = (
                f"Healthy: mean time per token {fmt_ms(mean, trim=True)} under the {slo} SLO (a mean: no ITL histogram)"
            )
        text += ", nothing waiting" if v.get("requests_waiting", math.nan) == 0 else ""
        if hit_ratio is not None and hit_ratio >= t.prefix_hit_ratio_high:
            text += f"; prefix cache hit ratio {fmt_pct(hit_ratio)} and fast"
    elif b == "unmeasured":
        unchecked = ["no ITL histogram or time-per-token counter"]
        if math.isnan(kv):
            unchecked.append("no KV usage signal")
        if math.isnan(v.get("requests_waiting", math.nan)):
            unchecked.append("no queue gauge")
        text = (
            "No sign of slowness, but speed is not measured: "
            + ", ".join(unchecked)
            + ": cannot tell whether decode is on time"
        )
    elif b in ("thrashing_preemptions", "thrashing_swapping", "thrashing_reload"):
        if b == "thrashing_preemptions":
            cause = f"{v['preemptions_per_minute']:.1f} preemptions/min"
            effect = "preempted requests recompute their whole prefix and queue again"
        elif b == "thrashing_swapping":
            host = v.get("kv_host_usage", math.nan)
            cause = f"{v['requests_swapped']:.0f} requests swapped out to host memory" + (
                f" (host KV pool {fmt_pct(host)})" if not math.isnan(host) else ""
            )
            effect = "swapped requests stall until their KV is swapped back"
        else:
            cause = "KV moved into a full pool" + _transfer_text(v, t)
            effect = "blocks are evicted and reloaded"
        text = f"KV cache thrashing: {cause} with {kv_text}, and {slow}: {effect}{knee_text}"
    elif b == "tier_miss":
        text = (
            "KV tier miss: prefix hits are served from a slow tier ("
            + _transfer_text(v, t).lstrip("; ")
            + (f"; GPU pool at {fmt_pct(kv)}" if not math.isnan(kv) else "")
            + f") and {slow}: the transfer is not hidden behind compute"
        )
    elif b == "capacity_pressure":
        text = f"KV capacity pressure: {kv_text} with {slow}, no preemption yet: admission is limited by the KV pool"
    elif b == "request_queueing":
        running = v.get("requests_running", math.nan)
        run_text = f" while {running:.0f} run" if not math.isnan(running) else ""
        room = f"the KV pool has room ({kv_text})" if not math.isnan(kv) else "KV usage is not reported"
        text = (
            f"Requests queue: {slow}{run_text} and {room}: the engine's sequence limit (vLLM --max-num-seqs, "
            "llama.cpp --parallel, SGLang --max-running-requests) or the load is the limit"
        )
    elif b == "bandwidth_high":
        text = (
            f"Decode is HBM-bandwidth bound: DRAM bandwidth {fmt_pct(bw)} busy"
            + (f", SM {fmt_pct(sm)}" if not math.isnan(sm) else "")
            + f"; {itl}"
            + _ledger_text(facts)
            + knee_text
        )
    elif b == "sm_high":
        text = (
            f"Decode is compute bound: SM {fmt_pct(sm)} active"
            + (f" vs DRAM bandwidth {fmt_pct(bw)}" if not math.isnan(bw) else "")
            + f"; {itl}"
        )
    elif b == "gpu_idle":
        text = (
            f"Decode is host-overhead bound: the GPU is mostly idle (busiest counter {fmt_pct(v['gpu_busy_ratio'])}) "
            f"with {itl}: the time goes to the scheduler, CPU or Python"
        )
    elif b == "prefill_heavy_no_gpu":
        ratio = v["prompt_tokens_per_second"] / v["generation_tokens_per_second"]
        text = (
            f"Decode is slow: {itl}, under prefill-heavy traffic ({ratio:.0f} prompt tokens per generated "
            "token): most likely compute bound"
        )
    else:  # decode_default
        if gpu_missing:
            text = f"Decode is slow: {itl}: most likely HBM-bandwidth bound" + knee_text
        else:
            busy = ", ".join(
                p
                for p in (
                    f"DRAM {fmt_pct(bw)}" if not math.isnan(bw) else "",
                    f"SM {fmt_pct(sm)}" if not math.isnan(sm) else "",
                )
                if p
            )
            gpu = (
                f"with the GPU moderately busy ({busy})"
                if busy
                else f"with only NVML duty cycles (busiest {fmt_pct(v['gpu_busy_ratio'])}), which cannot tell "
                "bandwidth from compute"
            )
            text = f"Decode is slow: {itl}, {gpu}: most likely HBM-bandwidth bound" + _ledger_text(facts) + knee_text
    if branch.verdict in SLOW_VERDICTS and hit_ratio is not None and hit_ratio >= t.prefix_hit_ratio_high:
        text = f"Cache hit but slow (prefix hit ratio {fmt_pct(hit_ratio)} does not help here). {text}"
    if branch.gpu_side and gpu_missing:
        text += f" [GPU counters missing: verdict from engine signals only; get them from {GPU_COUNTERS_HINT}]"
    return text


def _transfer_text(v: Mapping[str, float], t: Thresholds) -> str:
    """The transfer signals that crossed their thresholds."""
    parts = _crossed(
        v,
        ("kv_to_gpu_bytes_per_second", t.kv_to_gpu_bytes_per_second_min, fmt_bytes, "{}/s of KV into the GPU"),
        ("pcie_receive_bytes_per_second", t.pcie_receive_bytes_per_second_min, fmt_bytes, "PCIe receive {}/s"),
        ("slow_tier_hit_fraction", t.slow_tier_hit_fraction_min, fmt_pct, "{} of hit tokens from off-GPU tiers"),
    )
    return "".join("; " + p for p in parts)


def _ledger_text(facts: LedgerFacts) -> str:
    per_token = facts.kv_bytes()
    floor = facts.floor(per_token)
    if facts.model is None or per_token is None or floor is None or facts.live_tokens is None:
        return ""
    read = facts.model.weight_bytes + per_token * facts.live_tokens
    return f"; each step re-reads {fmt_bytes(read)} (floor {fmt_ms(floor, trim=True)})"
