"""A verdict in words: the evidence list and the headline the on-call engineer reads.

``evidence`` lists every comparison the tree made on its way to the chosen branch, with the value
and the threshold; ``headline`` says in one line what is happening, with the numbers that show it
("Decode is HBM-bandwidth bound: DRAM bandwidth 91% busy, SM 40%; ITL p95 118 ms (SLO 100 ms)").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from .actions import LedgerFacts
from .conditions import Atom, Cmp, CmpFeatures, Present, evaluate, right_side
from .features import FEATURES
from .knee import Knee
from .signals import PREFIX_CACHE_HITS
from .thresholds import Thresholds
from .tree import BRANCH_ATOMS, BRANCHES, SLOW_VERDICTS, Branch
from .units import RATIO, fmt_bytes, fmt_ms, fmt_pct
from .view import WindowView


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

    def to_json(self) -> dict[str, str | float | bool | None]:
        return {
            "signal": self.signal,
            "feature": self.feature,
            "value": json_number(self.value),
            "threshold": json_number(self.threshold),
            "comparison": self.comparison,
            "holds": self.holds,
            "measured": self.measured,
            "unit": self.unit,
            "note": self.note,
        }


def json_number(v: float | None) -> float | None:
    """A number for JSON: None for a missing, NaN or infinite one."""
    if v is None or (isinstance(v, float) and (math.isnan(v) or math.isinf(v))):
        return None
    return float(v)


# --------------------------------------------------------------------------------- evidence


def evidence(values: Mapping[str, float], params: Mapping[str, float], index: int) -> list[Evidence]:
    """Every comparison the tree made on its way to branch ``index``, once each."""
    seen: set[Atom] = set()
    listed: set[str] = set()
    out: list[Evidence] = []
    for branch in BRANCHES[: index + 1]:
        for atom in BRANCH_ATOMS[branch.id]:
            # a presence check adds nothing once its feature's value is on the list
            if atom in seen or (isinstance(atom, Present) and atom.feature in listed):
                continue
            seen.add(atom)
            item = _atom_evidence(atom, values, params)
            listed.add(item.feature)
            out.append(item)
    return out


def _atom_evidence(atom: Atom, values: Mapping[str, float], params: Mapping[str, float]) -> Evidence:
    if isinstance(atom, Cmp):
        f = FEATURES[atom.feature]
        v = values.get(atom.feature, math.nan)
        measured = not math.isnan(v)
        note = f.note + (f" (threshold: {atom.threshold.describe()})" if measured else "; not measured")
        return Evidence(
            f.signal,
            f.name,
            v if measured else None,
            atom.threshold.value(params),
            atom.op,
            evaluate(atom, values, params) if measured else None,
            measured,
            f.unit,
            note,
        )
    if isinstance(atom, CmpFeatures):
        f = FEATURES[atom.left]
        v = values.get(atom.left, math.nan)
        right = right_side(atom, values, params)
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
            evaluate(atom, values, params) if measured else None,
            measured,
            f.unit,
            note,
        )
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
        f.note + ("" if measured else "; not measured"),
    )


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
        "prefix-cache hit ratio over the window (context: a hit says nothing about speed)",
    )


# --------------------------------------------------------------------------------- headline


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
    p95 = v.get("itl_p95_seconds", math.nan)
    slo = fmt_ms(slo_seconds, trim=True)
    quantile = f"p{t.itl_quantile * 100:g}"
    early, late = v.get("itl_early_median_seconds", math.nan), v.get("itl_late_median_seconds", math.nan)
    if math.isnan(p95):
        itl = "ITL unknown"
    elif p95 >= slo_seconds or math.isnan(early) or math.isnan(late):
        itl = f"ITL {quantile} {fmt_ms(p95, trim=True)} (SLO {slo})"
    else:  # slow because it is rising
        itl = (
            f"ITL rising, median {fmt_ms(early, trim=True)} -> {fmt_ms(late, trim=True)} "
            f"({quantile} {fmt_ms(p95, trim=True)}, SLO {slo})"
        )
    bw, sm = v.get("dram_bandwidth_ratio", math.nan), v.get("sm_active_ratio", math.nan)
    knee_text = f"; {knee.note}" if knee.kind else ""
    gpu_missing = math.isnan(v.get("gpu_busy_ratio", math.nan))
    b = branch.id
    if b == "idle":
        text = f"Idle: no tokens generated in the last {span}"
        if not math.isnan(kv) and kv >= 0.05:
            text += f" (KV usage {fmt_pct(kv)} is left over from earlier traffic)"
    elif b == "healthy":
        if math.isnan(p95):
            text = "Healthy as far as can be told: tokens flow, no KV capacity or placement problem; no ITL histogram"
        else:
            text = (
                f"Healthy: ITL {quantile} {fmt_ms(p95, trim=True)} under the {slo} SLO, "
                "no KV capacity or placement problem"
            )
        if hit_ratio is not None and hit_ratio >= t.prefix_hit_ratio_high:
            text += f"; prefix cache hit ratio {fmt_pct(hit_ratio)} and fast"
    elif b == "thrashing_preemptions":
        text = (
            f"KV cache thrashing: {v['preemptions_per_minute']:.1f} preemptions/min"
            + (f" with KV usage at {fmt_pct(kv)}" if not math.isnan(kv) else "")
            + ": preempted requests recompute their whole prefix and queue again"
            + knee_text
        )
    elif b == "thrashing_reload":
        text = (
            f"KV cache thrashing: KV is moved into a full pool (KV usage {fmt_pct(kv)}"
            + _transfer_text(v, t)
            + "): blocks are evicted and reloaded"
            + knee_text
        )
    elif b == "tier_miss":
        text = (
            "KV tier miss: prefix hits are served from a slow tier ("
            + _transfer_text(v, t).lstrip("; ")
            + (f"; GPU pool at {fmt_pct(kv)}" if not math.isnan(kv) else "")
            + "): the transfer is not hidden behind compute"
        )
    elif b == "capacity_pressure":
        text = (
            f"KV capacity pressure: KV usage {fmt_pct(kv)} with {v['requests_waiting']:.0f} requests waiting, "
            "no preemption yet: admission is limited by the KV pool"
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
            "token): most likely compute bound; no GPU counters to confirm"
        )
    else:  # decode_default
        if gpu_missing:
            text = f"Decode is slow: {itl}; no GPU counters: most likely HBM-bandwidth bound" + knee_text
        else:
            parts = [
                f"DRAM {fmt_pct(bw)}" if not math.isnan(bw) else "",
                f"SM {fmt_pct(sm)}" if not math.isnan(sm) else "",
            ]
            busy = ", ".join(p for p in parts if p)
            if busy:
                gpu = f"with the GPU moderately busy ({busy})"
            else:
                gpu = (
                    f"with only NVML duty cycles (busiest {fmt_pct(v['gpu_busy_ratio'])}), which cannot tell "
                    "bandwidth from compute"
                )
            text = f"Decode is slow: {itl}, {gpu}: most likely HBM-bandwidth bound" + _ledger_text(facts) + knee_text
    if branch.verdict in SLOW_VERDICTS and hit_ratio is not None and hit_ratio >= t.prefix_hit_ratio_high:
        text = f"Cache hit but slow (prefix hit ratio {fmt_pct(hit_ratio)} does not help here). {text}"
    if branch.step == 4 and gpu_missing:
        text += " [GPU counters missing: verdict from engine signals only]"
    return text


def _transfer_text(v: Mapping[str, float], t: Thresholds) -> str:
    """The transfer signals that crossed their thresholds."""
    parts: list[str] = []
    if v.get("kv_to_gpu_bytes_per_second", math.nan) >= t.kv_to_gpu_bytes_per_second_min:
        parts.append(f"{fmt_bytes(v['kv_to_gpu_bytes_per_second'])}/s of KV into the GPU")
    if v.get("pcie_receive_bytes_per_second", math.nan) >= t.pcie_receive_bytes_per_second_min:
        parts.append(f"PCIe receive {fmt_bytes(v['pcie_receive_bytes_per_second'])}/s")
    if v.get("slow_tier_hit_fraction", math.nan) >= t.slow_tier_hit_fraction_min:
        parts.append(f"{fmt_pct(v['slow_tier_hit_fraction'])} of hit tokens from off-GPU tiers")
    return "".join("; " + p for p in parts)


def _ledger_text(facts: LedgerFacts) -> str:
    per_token = facts.kv_bytes()
    floor = facts.floor(per_token)
    if facts.model is None or per_token is None or floor is None or facts.live_tokens is None:
        return ""
    read = facts.model.weight_bytes + per_token * facts.live_tokens
    return f"; each step re-reads {fmt_bytes(read)} (floor {fmt_ms(floor, trim=True)})"
