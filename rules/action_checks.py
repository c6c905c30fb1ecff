"""Each action checked against the facts: ``CHECKS[action_id](facts)`` says whether to keep it, the
premise it rests on where the facts do not say (``"if the model has no GQA ..."``), and, with the
model's shape, the ledger's predicted effect ("FP8 KV: 128 KiB -> 64 KiB per token; decode step
floor 21.4 -> 15.2 ms")."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from kvdoctor.ledger.arithmetic import (
    DEFAULT_HOST_BANDWIDTH,
    PCIE4_X16,
    decode_step_floor,
    host_transfer_seconds,
    kv_bytes_per_token,
    weight_bytes_per_step,
)
from kvdoctor.ledger.model import ModelShape, dtype_bytes
from kvdoctor.signals.units import GB, fmt_bytes, fmt_ms, fmt_pct

GQA_KV_HEADS = 8
PREFIX_TOKENS_EXAMPLE = 1000


@dataclass(frozen=True)
class LedgerFacts:
    """What the actions are checked against, gathered from the context and the window (None: unknown)."""

    model: ModelShape | None = None
    kv_dtype: str | None = None  # the engine's KV cache dtype; defaults to the model's dtype
    peak_bandwidth: float | None = None  # bytes/s of one GPU
    gpus: int = 1  # GPUs sharing the model (tensor parallel): their bandwidth adds up
    live_tokens: float | None = None  # tokens resident in the KV pool (usage x capacity)
    capacity_tokens: float | None = None
    pcie_bandwidth: float | None = None  # bytes/s per direction
    prefix_hits: bool | None = None  # the engine reports prefix-cache hits (None: no prefix signal)
    kv_tier: bool | None = None  # KV moves between the GPU and another tier (None: no tier signal)
    kv_usage: float | None = None  # the tree's kv_usage
    kv_ceiling: float = 0.9
    requests_running: float | None = None

    def kv_bytes(self, model: ModelShape | None = None, kv_dtype: str | None = None) -> float | None:
        model = model or self.model
        if model is None:
            return None
        try:
            return kv_bytes_per_token(model, kv_dtype or self.kv_dtype)
        except ValueError:
            return None

    def floor(
        self, kv_per_token: float | None, weight_bytes: float | None = None, live_tokens: float | None = None
    ) -> float | None:
        """Decode step floor in seconds, or None when a number is missing."""
        live = self.live_tokens if live_tokens is None else live_tokens
        if self.model is None or kv_per_token is None or not self.peak_bandwidth or live is None:
            return None
        if weight_bytes is None:  # a MoE step reads only the experts its running batch touches
            weight_bytes = weight_bytes_per_step(self.model, max(1, round(self.requests_running or 1)))
        weights = weight_bytes
        return decode_step_floor(weights, kv_per_token * live, self.peak_bandwidth * max(1, self.gpus))


def _floor_change(before: float | None, after: float | None) -> str:
    if before is None or after is None:
        return ""
    return f"; decode step floor {fmt_ms(before, trim=True)} -> {fmt_ms(after, trim=True)}"


Checked = tuple[bool, str | None, str | None]  # (keep the action?, its premise if unknown, its predicted effect)


def _gqa(facts: LedgerFacts) -> Checked:
    model = facts.model
    if model is None:
        return True, "if the model has no GQA (as many KV heads as attention heads)", None
    if model.kv_latent_dim or model.num_kv_heads < model.num_attention_heads:
        return False, None, None  # already MLA / GQA / MQA
    gqa = replace(model, num_kv_heads=min(GQA_KV_HEADS, model.num_kv_heads))
    before, after = facts.kv_bytes(), facts.kv_bytes(gqa)
    if before is None or after is None or after >= before:
        return True, None, None
    return (
        True,
        None,
        (
            f"GQA with {gqa.num_kv_heads} KV heads: {fmt_bytes(before)} -> {fmt_bytes(after)} per token"
            + _floor_change(facts.floor(before), facts.floor(after))
        ),
    )


def _eight_bit(dtype: str | None) -> bool | None:
    if not dtype or dtype == "auto":
        return None
    try:
        return dtype_bytes(dtype) <= 1
    except ValueError:
        return None


def _fp8_kv(facts: LedgerFacts) -> Checked:
    eight = _eight_bit(facts.kv_dtype or (facts.model.dtype if facts.model else None))
    if eight:
        return False, None, None
    if eight is None:
        return True, "if the KV cache is not 8-bit already", None
    before, after = facts.kv_bytes(), facts.kv_bytes(kv_dtype="fp8")
    if before is None or after is None:
        return True, None, None
    text = f"FP8 KV: {fmt_bytes(before)} -> {fmt_bytes(after)} per token" + _floor_change(
        facts.floor(before), facts.floor(after)
    )
    if facts.capacity_tokens:
        text += f"; the pool holds {facts.capacity_tokens:,.0f} -> {facts.capacity_tokens * before / after:,.0f} tokens"
    return True, None, text


def _fp8_weights(facts: LedgerFacts) -> Checked:
    model = facts.model
    if model is None:
        return True, "if the weights are not quantised already", None
    try:
        element = model.weight_element_bytes
    except ValueError:
        return True, None, None
    if element <= 1:
        return False, None, None
    if not model.weight_bytes:
        return True, None, None
    after = model.weight_bytes / element
    per_token = facts.kv_bytes()
    return (
        True,
        None,
        (
            f"weights read per step {fmt_bytes(model.weight_bytes)} -> {fmt_bytes(after)}"
            + _floor_change(facts.floor(per_token), facts.floor(per_token, weight_bytes=after))
        ),
    )


def _halve_resident(facts: LedgerFacts) -> Checked:
    per_token = facts.kv_bytes()
    if facts.live_tokens is None or per_token is None:
        return True, None, None
    resident = per_token * facts.live_tokens
    return (
        True,
        None,
        (
            f"halving resident KV ({fmt_bytes(resident)} -> {fmt_bytes(resident / 2)})"
            + _floor_change(facts.floor(per_token), facts.floor(per_token, live_tokens=facts.live_tokens / 2))
        ),
    )


def _offload(facts: LedgerFacts) -> Checked:
    if facts.kv_tier:
        return False, None, None  # KV already moves between tiers
    premise = "if there is no host KV tier yet" if facts.kv_tier is None else None
    per_token = facts.kv_bytes()
    if per_token is None:
        return True, premise, None
    pcie = facts.pcie_bandwidth or PCIE4_X16
    nbytes = per_token * PREFIX_TOKENS_EXAMPLE
    load = host_transfer_seconds(nbytes, DEFAULT_HOST_BANDWIDTH, pcie)
    text = (
        f"loading a {PREFIX_TOKENS_EXAMPLE:,}-token prefix from host memory: {fmt_bytes(nbytes)} in "
        f"{fmt_ms(load, trim=True)} over PCIe ({pcie / GB:.1f} GB/s)"
    )
    floor = facts.floor(per_token)
    if floor:
        text += f" = {load / floor:.1f} decode steps; hides only if prefetched that far ahead"
    return True, premise, text


def _prefix_caching(facts: LedgerFacts) -> Checked:
    if facts.prefix_hits:
        return False, None, None  # hits are reported: it is on
    return True, "if prefix caching is off" if facts.prefix_hits is None else None, None


def _raise_limit(facts: LedgerFacts) -> Checked:
    usage = facts.kv_usage
    if usage is None or math.isnan(usage):
        return True, "if the KV cache has room (its usage is not reported)", None
    if usage >= facts.kv_ceiling:
        return False, None, None  # memory does not allow it
    running = facts.requests_running
    room = running * (facts.kv_ceiling / usage - 1) if running and usage > 0 else math.inf
    if not math.isfinite(room):  # nothing running, or a usage too small to divide by
        return True, None, f"KV usage {fmt_pct(usage)}: the pool has room"
    more = math.floor(room)
    return (
        True,
        None,
        (
            f"KV usage {fmt_pct(usage)} with {running:.0f} running: room for about {more} more sequences of "
            f"this length before the {fmt_pct(facts.kv_ceiling)} ceiling"
        ),
    )


def _eager(facts: LedgerFacts) -> Checked:
    return True, "if the engine runs eagerly (--enforce-eager, --disable-cuda-graph)", None


def _overlap(facts: LedgerFacts) -> Checked:
    return True, "if scheduling does not overlap already", None


CHECKS: dict[str, Callable[[LedgerFacts], Checked]] = {
    "gqa_model": _gqa,
    "fp8_kv_cache": _fp8_kv,
    "fp8_weights": _fp8_weights,
    "cap_context": _halve_resident,
    "cap_sequences": _halve_resident,
    "kv_offload_prefetch": _offload,
    "enable_prefix_caching": _prefix_caching,
    "raise_sequence_limit": _raise_limit,
    "cuda_graphs": _eager,
    "async_scheduling": _overlap,
}
