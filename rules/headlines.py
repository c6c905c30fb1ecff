"""Each verdict's headline: one line that says what is happening, with the numbers that show it.

One builder per verdict (the catalogue, ``rules/verdicts.py``, names it), each taking the branch
that fired and the ``HeadlineFacts`` of the window. A headline never claims what no signal
measured. ``rules/render.py`` adds what every slow headline shares (the prefix-cache hit that does
not help, missing GPU counters, the queue a slow decode builds).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kvdoctor.signals.units import fmt_bytes, fmt_ms, fmt_pct, fmt_seconds, plural

from .action_checks import LedgerFacts
from .knee import Knee
from .thresholds import Thresholds


@dataclass(frozen=True)
class HeadlineFacts:
    """What a headline may quote: the features, the SLO, the thresholds, the knee, the ledger."""

    values: Mapping[str, float]
    slo_seconds: float
    thresholds: Thresholds
    knee: Knee
    facts: LedgerFacts
    span_seconds: float | None  # the window's length; None for an empty window
    reason: str = ""  # why no verdict could be made (unknown)

    def get(self, name: str) -> float:
        return self.values.get(name, math.nan)

    @property
    def span(self) -> str:
        return f"{self.span_seconds:.0f} s" if self.span_seconds is not None else "the window"

    @property
    def kv_text(self) -> str:
        kv = self.get("kv_usage")
        return f"KV usage {fmt_pct(kv)}" if not math.isnan(kv) else "KV usage not reported"

    @property
    def knee_text(self) -> str:
        return f"; {self.knee.note}" if self.knee.kind else ""

    @property
    def gpu_missing(self) -> bool:
        return math.isnan(self.get("gpu_busy_ratio"))


def at_least(values: Mapping[str, float], name: str, threshold: float) -> bool:
    value = values.get(name, math.nan)
    return not math.isnan(value) and value >= threshold


def crossed(values: Mapping[str, float], *notes: tuple[str, float, Callable[[float], str], str]) -> list[str]:
    """The notes ``(feature, threshold, how its value is shown, text)`` whose feature is at or above
    its threshold: each text with the value shown in its ``{}``."""
    return [
        text.format(shown(values[name])) for name, threshold, shown, text in notes if at_least(values, name, threshold)
    ]


def latency_text(v: Mapping[str, float], slo_seconds: float, t: Thresholds) -> str:
    """The latency measure against the SLO: the ITL p95, else the mean time per token, else unknown."""
    p95, mean = v.get("itl_p95_seconds", math.nan), v.get("time_per_token_mean_seconds", math.nan)
    slo = fmt_ms(slo_seconds, trim=True)
    if not math.isnan(p95):
        return f"ITL p{t.itl_quantile * 100:g} {fmt_ms(p95, trim=True)} (SLO {slo})"
    if not math.isnan(mean) and math.isfinite(mean):
        return f"mean time per token {fmt_ms(mean, trim=True)} (SLO {slo}; a mean: no ITL histogram)"
    return "ITL unknown"


def transfer_text(v: Mapping[str, float], t: Thresholds) -> str:
    """The transfer signals that crossed their thresholds, each after "; "."""
    parts = crossed(
        v,
        ("kv_to_gpu_bytes_per_second", t.kv_to_gpu_bytes_per_second_min, fmt_bytes, "{}/s of KV into the GPU"),
        ("pcie_receive_bytes_per_second", t.pcie_receive_bytes_per_second_min, fmt_bytes, "PCIe receive {}/s"),
        ("slow_tier_hit_fraction", t.slow_tier_hit_fraction_min, fmt_pct, "{} of hit tokens from off-GPU tiers"),
    )
    return "".join("; " + p for p in parts)


def delay_text(f: HeadlineFacts) -> str:
    """How the engine is slow: requests waiting, TTFT over its threshold, the latency over the SLO."""
    v, t = f.values, f.thresholds
    parts = []
    if at_least(v, "requests_waiting", t.queue_waiting_min):
        parts.append(f"{plural(round(v['requests_waiting']), 'request')} waiting")
    if at_least(v, "ttft_p95_seconds", t.ttft_slow_seconds):
        parts.append(f"TTFT p{t.ttft_quantile * 100:g} {fmt_seconds(v['ttft_p95_seconds'])}")
    p95, mean = f.get("itl_p95_seconds"), f.get("time_per_token_mean_seconds")
    if p95 >= f.slo_seconds or (math.isnan(p95) and mean >= f.slo_seconds):
        parts.append(latency_text(v, f.slo_seconds, t))
    return ", ".join(parts) or "requests delayed"


def ledger_text(facts: LedgerFacts) -> str:
    per_token = facts.kv_bytes()
    floor = facts.floor(per_token)
    if facts.model is None or per_token is None or floor is None or facts.live_tokens is None:
        return ""
    read = facts.model.weight_bytes + per_token * facts.live_tokens
    return f"; each step re-reads {fmt_bytes(read)} (floor {fmt_ms(floor, trim=True)})"


# ------------------------------------------------------------------------ one per verdict


def idle(branch: str, f: HeadlineFacts) -> str:
    kv = f.get("kv_usage")
    if all(math.isnan(f.get(n)) for n in ("generation_tokens_per_second", "requests_running")):
        text = f"Idle as far as can be told: no token counter or running-requests gauge in the last {f.span}"
    else:
        text = f"Idle: no tokens generated and no request running or waiting in the last {f.span}"
    if not math.isnan(kv) and kv >= 0.05:
        text += f" (KV usage {fmt_pct(kv)} is left over from earlier traffic)"
    return text


def unknown(branch: str, f: HeadlineFacts) -> str:
    return f"Not enough data to judge: {f.reason}" if f.reason else "Not enough data to judge"


def healthy(branch: str, f: HeadlineFacts) -> str:
    t, kv = f.thresholds, f.get("kv_usage")
    if branch == "unmeasured":
        unchecked = ["no ITL histogram or time-per-token counter"]
        if math.isnan(kv):
            unchecked.append("no KV usage signal")
        if math.isnan(f.get("requests_waiting")):
            unchecked.append("no queue gauge")
        return (
            "No sign of slowness, but speed is not measured: "
            + ", ".join(unchecked)
            + ": cannot tell whether decode is on time"
        )
    p95, mean = f.get("itl_p95_seconds"), f.get("time_per_token_mean_seconds")
    slo = fmt_ms(f.slo_seconds, trim=True)
    if not math.isnan(p95):
        text = f"Healthy: ITL p{t.itl_quantile * 100:g} {fmt_ms(p95, trim=True)} under the {slo} SLO"
    else:
        text = f"Healthy: mean time per token {fmt_ms(mean, trim=True)} under the {slo} SLO (a mean: no ITL histogram)"
    return text + (", nothing waiting" if f.get("requests_waiting") == 0 else "")


def kv_thrashing(branch: str, f: HeadlineFacts) -> str:
    v, t = f.values, f.thresholds
    if branch == "thrashing_swapping":
        host = f.get("kv_host_usage")
        cause = f"{v['requests_swapped']:.0f} requests swapped out to host memory" + (
            f" (host KV pool {fmt_pct(host)})" if not math.isnan(host) else ""
        )
        effect = "swapped requests stall until their KV is swapped back"
    elif branch == "thrashing_reload":
        cause = "KV moved into a full pool" + transfer_text(v, t)
        effect = "blocks are evicted and reloaded"
    else:
        cause = f"{v['preemptions_per_minute']:.1f} preemptions/min"
        effect = "preempted requests recompute their whole prefix and queue again"
    return f"KV cache thrashing: {cause} with {f.kv_text}, and {delay_text(f)}: {effect}{f.knee_text}"


def kv_tier_miss(branch: str, f: HeadlineFacts) -> str:
    kv = f.get("kv_usage")
    return (
        "KV tier miss: prefix hits are served from a slow tier ("
        + transfer_text(f.values, f.thresholds).lstrip("; ")
        + (f"; GPU pool at {fmt_pct(kv)}" if not math.isnan(kv) else "")
        + f") and {delay_text(f)}: the transfer is not hidden behind compute"
    )


def kv_capacity_pressure(branch: str, f: HeadlineFacts) -> str:
    return (
        f"KV capacity pressure: {f.kv_text} with {delay_text(f)}, no preemption yet: "
        "admission is limited by the KV pool"
    )


def request_queueing(branch: str, f: HeadlineFacts) -> str:
    running = f.get("requests_running")
    run_text = f" while {running:.0f} run" if not math.isnan(running) else ""
    room = (
        f"the KV pool has room ({f.kv_text})"
        if not math.isnan(f.get("kv_usage"))
        else "KV usage is not reported (a full pool would make this KV capacity pressure)"
    )
    return (
        f"Requests queue while decode is on time: {delay_text(f)}{run_text} and {room}: the engine's sequence limit "
        "(vLLM --max-num-seqs, llama.cpp --parallel, SGLang --max-running-requests) or the load is the limit"
    )


def _busy_text(f: HeadlineFacts) -> str:
    bw, sm = f.get("dram_bandwidth_ratio"), f.get("sm_active_ratio")
    return ", ".join(
        p
        for p in (
            f"DRAM {fmt_pct(bw)}" if not math.isnan(bw) else "",
            f"SM {fmt_pct(sm)}" if not math.isnan(sm) else "",
        )
        if p
    )


def memory_bandwidth_bound(branch: str, f: HeadlineFacts) -> str:
    itl = latency_text(f.values, f.slo_seconds, f.thresholds)
    bw, sm = f.get("dram_bandwidth_ratio"), f.get("sm_active_ratio")
    if branch == "bandwidth_high":
        return (
            f"Decode is HBM-bandwidth bound: DRAM bandwidth {fmt_pct(bw)} busy"
            + (f", SM {fmt_pct(sm)}" if not math.isnan(sm) else "")
            + f"; {itl}"
            + ledger_text(f.facts)
            + f.knee_text
        )
    if f.gpu_missing:
        return f"Decode is slow: {itl}: most likely HBM-bandwidth bound" + f.knee_text
    busy = _busy_text(f)
    gpu = (
        f"with the GPU moderately busy ({busy})"
        if busy
        else f"with only NVML duty cycles (busiest {fmt_pct(f.get('gpu_busy_ratio'))}), which cannot tell "
        "bandwidth from compute"
    )
    return f"Decode is slow: {itl}, {gpu}: most likely HBM-bandwidth bound" + ledger_text(f.facts) + f.knee_text


def compute_bound(branch: str, f: HeadlineFacts) -> str:
    itl = latency_text(f.values, f.slo_seconds, f.thresholds)
    if branch == "prefill_heavy_no_gpu":
        ratio = f.get("prompt_tokens_per_second") / f.get("generation_tokens_per_second")
        return (
            f"Decode is slow: {itl}, under prefill-heavy traffic ({ratio:.0f} prompt tokens per generated "
            "token): most likely compute bound"
        )
    bw, sm = f.get("dram_bandwidth_ratio"), f.get("sm_active_ratio")
    return (
        f"Decode is compute bound: SM {fmt_pct(sm)} active"
        + (f" vs DRAM bandwidth {fmt_pct(bw)}" if not math.isnan(bw) else "")
        + f"; {itl}"
    )


def host_overhead_bound(branch: str, f: HeadlineFacts) -> str:
    itl = latency_text(f.values, f.slo_seconds, f.thresholds)
    return (
        f"Decode is host-overhead bound: the GPU is mostly idle (busiest counter {fmt_pct(f.get('gpu_busy_ratio'))}) "
        f"with {itl}: the time goes to the scheduler, CPU or Python"
    )
