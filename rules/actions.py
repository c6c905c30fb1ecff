"""What to do about a verdict: ordered actions with the engine flags and, when the ledger can
compute it, the predicted effect ("FP8 KV: 128 KiB -> 64 KiB per token; decode floor 11.2 -> 9.8 ms").

Order (DESIGN.md): the change that pays most for least effort first -- a GQA/MQA model, an FP8 KV
cache, caps on context and concurrency, prefix caching, and only then a host/remote KV tier with
prefetch, and only if the ledger says the transfer can hide behind compute. Each verdict lists its
actions from one catalogue in that spirit: the cheapest fix for that cause first.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .ledger import DEFAULT_HOST_BANDWIDTH, PCIE4_X16, decode_step_floor, host_transfer_seconds, kv_bytes_per_token
from .model import ModelShape, dtype_bytes
from .units import GB, fmt_bytes, fmt_ms

GQA_KV_HEADS = 8
PREFIX_TOKENS_EXAMPLE = 1000


@dataclass(frozen=True)
class Action:
    id: str
    title: str
    flag_vllm: str | None
    flag_sglang: str | None
    why: str
    effect: str | None = None

    def to_json(self) -> dict[str, str | None]:
        return {
            "id": self.id,
            "title": self.title,
            "flag_vllm": self.flag_vllm,
            "flag_sglang": self.flag_sglang,
            "why": self.why,
            "effect": self.effect,
        }


# The catalogue; VERDICT_ACTIONS says which apply to a verdict, in which order.
CATALOGUE: tuple[Action, ...] = (
    Action(
        "gqa_model",
        "Serve a GQA/MQA variant of the model (fewer KV heads)",
        None,
        None,
        "KV bytes per token scale with the number of KV heads; every decode step re-reads them all",
    ),
    Action(
        "fp8_kv_cache",
        "Quantise the KV cache to FP8",
        "--kv-cache-dtype fp8",
        "--kv-cache-dtype fp8_e4m3",
        "halves the bytes per token: twice the tokens fit, and each decode step reads half the KV",
    ),
    Action(
        "fp8_weights",
        "Quantise the weights (FP8, or INT4 with care)",
        "--quantization fp8",
        "--quantization fp8",
        "every decode step re-reads all weights; fewer bytes, faster step",
    ),
    Action(
        "more_kv_memory",
        "Give the KV pool more GPU memory",
        "--gpu-memory-utilization 0.95",
        "--mem-fraction-static 0.9",
        "a bigger pool holds more sequences before it runs out",
    ),
    Action(
        "cap_context",
        "Cap the context length",
        "--max-model-len <tokens>",
        "--context-length <tokens>",
        "long contexts dominate resident KV; a cap bounds the worst request",
    ),
    Action(
        "cap_sequences",
        "Cap concurrent sequences",
        "--max-num-seqs <n>",
        "--max-running-requests <n>",
        "fewer sequences in the batch: less resident KV and no preemption, at some throughput",
    ),
    Action(
        "enable_prefix_caching",
        "Enable prefix caching",
        "--enable-prefix-caching",
        "on by default (do not pass --disable-radix-cache)",
        "shared prefixes are computed once",
    ),
    Action(
        "prefix_aware_routing",
        "Route requests by prefix so hot prefixes stay on one replica's GPU",
        None,
        "--schedule-policy lpm",
        "a hit on the device tier is free; a hit on the host tier costs a transfer",
    ),
    Action(
        "limit_prefill",
        "Limit the prefill work per step (chunked prefill budget)",
        "--max-num-batched-tokens <n>",
        "--chunked-prefill-size <n>",
        "long prefills share each step with decode and stretch every token",
    ),
    Action(
        "disaggregate_prefill",
        "Separate prefill and decode (disaggregated serving)",
        '--kv-transfer-config \'{"kv_connector":"NixlConnector","kv_role":"kv_both"}\'',
        "--disaggregation-mode prefill|decode",
        "prefill compute no longer stalls decode steps",
    ),
    Action(
        "cuda_graphs",
        "Run with CUDA graphs (drop eager mode)",
        "remove --enforce-eager",
        "remove --disable-cuda-graph",
        "kernel launches from Python dominate small decode steps",
    ),
    Action(
        "async_scheduling",
        "Overlap scheduling with execution",
        "--async-scheduling",
        "on by default (do not pass --disable-overlap-schedule)",
        "the CPU prepares step n+1 while the GPU runs step n",
    ),
    Action(
        "host_resources",
        "Give the engine's pod dedicated CPU (no throttling) and fast tokenisation",
        None,
        None,
        "a throttled or oversubscribed CPU shows up as GPU idle time between steps",
    ),
    Action(
        "kv_offload_prefetch",
        "Add a host KV tier with prefetch, only if the transfer hides behind compute",
        "--kv-offloading-backend native --kv-offloading-size <GiB>",
        "--enable-hierarchical-cache",
        "recomputing a long prefix costs more than loading it, if the load overlaps decode",
    ),
    Action(
        "scale_out",
        "Add replicas (or GPUs) for this model",
        None,
        None,
        "when every per-replica fix is in, the load is simply more than one replica holds",
    ),
)
ACTION_BY_ID = {a.id: a for a in CATALOGUE}

VERDICT_ACTIONS: dict[str, tuple[str, ...]] = {
    "idle": (),
    "healthy": (),
    "kv_thrashing": (
        "gqa_model",
        "fp8_kv_cache",
        "more_kv_memory",
        "cap_context",
        "cap_sequences",
        "kv_offload_prefetch",
        "scale_out",
    ),
    "kv_tier_miss": ("fp8_kv_cache", "more_kv_memory", "prefix_aware_routing", "kv_offload_prefetch"),
    "kv_capacity_pressure": (
        "gqa_model",
        "fp8_kv_cache",
        "more_kv_memory",
        "cap_context",
        "cap_sequences",
        "scale_out",
    ),
    "memory_bandwidth_bound": ("gqa_model", "fp8_kv_cache", "fp8_weights", "cap_context", "cap_sequences", "scale_out"),
    "compute_bound": ("enable_prefix_caching", "limit_prefill", "disaggregate_prefill", "cap_sequences", "scale_out"),
    "host_overhead_bound": ("cuda_graphs", "async_scheduling", "host_resources"),
}


@dataclass(frozen=True)
class LedgerFacts:
    """What the ledger needs, gathered from the context and the window."""

    model: ModelShape | None = None
    kv_dtype: str | None = None  # the engine's KV cache dtype; defaults to the model's dtype
    peak_bandwidth: float | None = None  # bytes/s of one GPU
    gpus: int = 1  # GPUs sharing the model (tensor parallel): their bandwidth adds up
    live_tokens: float | None = None  # tokens resident in the KV pool (usage x capacity)
    capacity_tokens: float | None = None
    pcie_bandwidth: float | None = None  # bytes/s per direction

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
        weights = self.model.weight_bytes if weight_bytes is None else weight_bytes
        return decode_step_floor(weights, kv_per_token * live, self.peak_bandwidth * max(1, self.gpus))


def _floor_change(facts: LedgerFacts, before: float | None, after: float | None) -> str:
    if before is None or after is None:
        return ""
    return f"; decode floor {fmt_ms(before, trim=True)} -> {fmt_ms(after, trim=True)}"


def _effect(action_id: str, facts: LedgerFacts) -> tuple[bool, str | None]:
    """(keep the action?, predicted effect). An action that cannot help this model is dropped."""
    model = facts.model
    per_token = facts.kv_bytes()
    if action_id == "gqa_model":
        if model is None:
            return True, None
        if model.kv_latent_dim or model.num_kv_heads <= GQA_KV_HEADS:
            return False, None  # already MLA / GQA / MQA
        gqa = replace(model, num_kv_heads=GQA_KV_HEADS)
        after = facts.kv_bytes(gqa)
        if per_token is None or after is None:  # a KV dtype the ledger does not know
            return True, None
        return True, (
            f"GQA with {GQA_KV_HEADS} KV heads: {fmt_bytes(per_token)} -> {fmt_bytes(after)} per token"
            + _floor_change(facts, facts.floor(per_token), facts.floor(after))
        )
    if action_id == "fp8_kv_cache":
        if model is None:
            return True, None
        try:
            if dtype_bytes(facts.kv_dtype or model.dtype) <= 1:
                return False, None  # already 8-bit
        except ValueError:
            return True, None
        after = facts.kv_bytes(kv_dtype="fp8")
        if per_token is None or after is None:
            return True, None
        text = f"FP8 KV: {fmt_bytes(per_token)} -> {fmt_bytes(after)} per token"
        text += _floor_change(facts, facts.floor(per_token), facts.floor(after))
        if facts.capacity_tokens:
            ratio = per_token / after
            text += f"; the pool holds {facts.capacity_tokens:,.0f} -> {facts.capacity_tokens * ratio:,.0f} tokens"
        return True, text
    if action_id == "fp8_weights":
        if model is None or not model.weight_bytes:
            return True, None
        try:
            if dtype_bytes(model.dtype) <= 1:
                return False, None
            after = model.weight_bytes / dtype_bytes(model.dtype)
        except ValueError:
            return True, None
        return True, (
            f"weights read per step {fmt_bytes(model.weight_bytes)} -> {fmt_bytes(after)}"
            + _floor_change(facts, facts.floor(per_token), facts.floor(per_token, weight_bytes=after))
        )
    if action_id in ("cap_context", "cap_sequences"):
        if facts.live_tokens is None or per_token is None:
            return True, None
        before = facts.floor(per_token)
        after = facts.floor(per_token, live_tokens=facts.live_tokens / 2)
        resident = per_token * facts.live_tokens
        text = f"halving resident KV ({fmt_bytes(resident)} -> {fmt_bytes(resident / 2)})"
        return True, text + _floor_change(facts, before, after)
    if action_id == "kv_offload_prefetch":
        if per_token is None:
            return True, None
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
        return True, text
    return True, None


def plan_actions(verdict: str, facts: LedgerFacts | None = None) -> list[Action]:
    """The verdict's actions in its order, each with its predicted effect where computable."""
    facts = facts or LedgerFacts()
    out: list[Action] = []
    for action_id in VERDICT_ACTIONS.get(verdict, ()):
        keep, effect = _effect(action_id, facts)
        if keep:
            out.append(replace(ACTION_BY_ID[action_id], effect=effect))
    return out
