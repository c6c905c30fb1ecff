"""What to do about a verdict: two groups of actions, each checked against the facts.

- **Mitigate now** (minutes, no redeploy): route traffic away or add replicas, shed or cap load.
- **Fix** (a redeploy): engine flags, an FP8 KV cache, quantised weights, a context cap, a GQA
  model, a KV tier, bigger or more GPUs.

Within a group the cheaper change comes first (``cost``). An action whose premise is known to be
false is dropped (a GQA model when the model already has fewer KV heads than attention heads;
prefix caching when prefix hits are reported; a host tier when KV already moves between tiers;
FP8 KV when the KV cache is already 8-bit); one whose premise is unknown says so
(``premise``: "if the model has no GQA"). With the model's shape each fix carries the ledger's
predicted effect ("FP8 KV: 128 KiB -> 64 KiB per token; decode step floor 21.4 -> 15.2 ms").
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .action_checks import CHECKS, LedgerFacts

MITIGATE = "mitigate"
FIX = "fix"
GROUP_TITLES = {MITIGATE: "Mitigate now (minutes, no redeploy)", FIX: "Fix (a redeploy)"}
SHOWN_PER_GROUP = 3  # the CLI and the dashboard show this many per group; --json has them all


@dataclass(frozen=True)
class Action:
    id: str
    title: str
    group: str  # MITIGATE or FIX
    cost: int  # order within the group: the cheaper change first
    flag_vllm: str | None
    flag_sglang: str | None
    why: str
    effect: str | None = None  # the ledger's predicted effect, where it can compute one
    premise: str | None = None  # "if ...": what the action assumes and the facts do not say
    flag_llamacpp: str | None = None

    def to_json(self) -> dict[str, str | int | None]:
        return {
            "id": self.id,
            "title": self.title,
            "group": self.group,
            "cost": self.cost,
            "flag_vllm": self.flag_vllm,
            "flag_sglang": self.flag_sglang,
            "flag_llamacpp": self.flag_llamacpp,
            "why": self.why,
            "premise": self.premise,
            "effect": self.effect,
        }


# The catalogue; VERDICT_ACTIONS says which apply to a verdict.
CATALOGUE: tuple[Action, ...] = (
    Action(
        "route_away",
        "Route traffic away from this replica, or add replicas",
        MITIGATE,
        1,
        None,
        None,
        "fewer requests here relieve the KV pool, the queue and every decode step, within minutes",
    ),
    Action(
        "shed_load",
        "Cap concurrency or shed load at the gateway (a max in-flight per replica, rate limits)",
        MITIGATE,
        2,
        None,
        None,
        "keeps the replica inside what it serves on time while the fix rolls out",
    ),
    Action(
        "raise_sequence_limit",
        "Raise the engine's sequence limit, where KV memory allows",
        FIX,
        1,
        "--max-num-seqs <n>",
        "--max-running-requests <n>",
        "requests wait for a batch slot, not for memory: a bigger batch admits them",
        flag_llamacpp="--parallel <n> (with -c scaled: the context is split among the slots)",
    ),
    Action(
        "cuda_graphs",
        "Run with CUDA graphs (drop eager mode)",
        FIX,
        1,
        "remove --enforce-eager",
        "remove --disable-cuda-graph",
        "kernel launches from Python dominate small decode steps",
    ),
    Action(
        "async_scheduling",
        "Overlap scheduling with execution",
        FIX,
        1,
        "--async-scheduling",
        "on by default (do not pass --disable-overlap-schedule)",
        "the CPU prepares step n+1 while the GPU runs step n",
    ),
    Action(
        "fp8_kv_cache",
        "Quantise the KV cache to FP8",
        FIX,
        2,
        "--kv-cache-dtype fp8",
        "--kv-cache-dtype fp8_e4m3",
        "halves the bytes per token: twice the tokens fit, and each decode step reads half the KV",
        flag_llamacpp="--cache-type-k q8_0 --cache-type-v q8_0",
    ),
    Action(
        "more_kv_memory",
        "Give the KV pool more GPU memory",
        FIX,
        2,
        "--gpu-memory-utilization 0.95",
        "--mem-fraction-static 0.9",
        "a bigger pool holds more sequences before it runs out",
    ),
    Action(
        "host_resources",
        "Give the engine's pod dedicated CPU (no throttling) and fast tokenisation",
        FIX,
        2,
        None,
        None,
        "a throttled or oversubscribed CPU shows up as GPU idle time between steps",
    ),
    Action(
        "limit_prefill",
        "Limit the prefill work per step (chunked prefill budget)",
        FIX,
        3,
        "--max-num-batched-tokens <n>",
        "--chunked-prefill-size <n>",
        "long prefills share each step with decode and stretch every token",
        flag_llamacpp="--ubatch-size <n>",
    ),
    Action(
        "enable_prefix_caching",
        "Enable prefix caching",
        FIX,
        3,
        "--enable-prefix-caching",
        "on by default (do not pass --disable-radix-cache)",
        "shared prefixes are computed once",
        flag_llamacpp="--cache-reuse <n>",
    ),
    Action(
        "cap_context",
        "Cap the context length",
        FIX,
        4,
        "--max-model-len <tokens>",
        "--context-length <tokens>",
        "long contexts dominate resident KV; a cap bounds the worst request",
        flag_llamacpp="-c <tokens>",
    ),
    Action(
        "cap_sequences",
        "Lower the sequence limit",
        FIX,
        4,
        "--max-num-seqs <n>",
        "--max-running-requests <n>",
        "fewer sequences in the batch: less resident KV and no preemption, at some throughput",
        flag_llamacpp="--parallel <n>",
    ),
    Action(
        "fp8_weights",
        "Serve quantised weights (FP8, or INT4 with care)",
        FIX,
        5,
        "--quantization fp8",
        "--quantization fp8",
        "every decode step re-reads all weights; fewer bytes, faster step",
    ),
    Action(
        "prefix_aware_routing",
        "Route requests by prefix so hot prefixes stay on one replica's GPU",
        FIX,
        5,
        None,
        "--schedule-policy lpm",
        "a hit on the device tier is free; a hit on a slower tier costs a transfer",
    ),
    Action(
        "kv_offload_prefetch",
        "Add a host KV tier with prefetch, only if the transfer hides behind compute",
        FIX,
        6,
        "--kv-offloading-backend native --kv-offloading-size <GiB>",
        "--enable-hierarchical-cache",
        "recomputing a long prefix costs more than loading it, if the load overlaps decode",
    ),
    Action(
        "disaggregate_prefill",
        "Separate prefill and decode (disaggregated serving)",
        FIX,
        6,
        '--kv-transfer-config \'{"kv_connector":"NixlConnector","kv_role":"kv_both"}\'',
        "--disaggregation-mode prefill|decode",
        "prefill compute no longer stalls decode steps",
    ),
    Action(
        "gqa_model",
        "Serve a GQA/MQA variant of the model (fewer KV heads)",
        FIX,
        7,
        None,
        None,
        "KV bytes per token scale with the number of KV heads; every decode step re-reads them all",
    ),
    Action(
        "bigger_gpus",
        "Serve on GPUs with more HBM (memory and bandwidth), or shard over more GPUs (tensor parallel)",
        FIX,
        8,
        "--tensor-parallel-size <n>",
        "--tp-size <n>",
        "when the per-replica fixes are in, the model and its KV need more memory and bandwidth",
    ),
)
ACTION_BY_ID = {a.id: a for a in CATALOGUE}

_LOAD = ("route_away", "shed_load")
VERDICT_ACTIONS: dict[str, tuple[str, ...]] = {
    "idle": (),
    "healthy": (),
    "kv_thrashing": (
        *_LOAD,
        "fp8_kv_cache",
        "more_kv_memory",
        "cap_context",
        "cap_sequences",
        "fp8_weights",
        "kv_offload_prefetch",
        "gqa_model",
        "bigger_gpus",
    ),
    # a tier already exists: adding one is not an action here
    "kv_tier_miss": (
        "route_away",
        "fp8_kv_cache",
        "more_kv_memory",
        "prefix_aware_routing",
        "gqa_model",
        "bigger_gpus",
    ),
    "kv_capacity_pressure": (
        *_LOAD,
        "fp8_kv_cache",
        "more_kv_memory",
        "cap_context",
        "fp8_weights",
        "gqa_model",
        "bigger_gpus",
    ),
    "request_queueing": (*_LOAD, "raise_sequence_limit", "fp8_kv_cache", "bigger_gpus"),
    "memory_bandwidth_bound": (
        *_LOAD,
        "fp8_kv_cache",
        "cap_context",
        "cap_sequences",
        "fp8_weights",
        "gqa_model",
        "bigger_gpus",
    ),
    "compute_bound": (
        *_LOAD,
        "limit_prefill",
        "enable_prefix_caching",
        "cap_sequences",
        "disaggregate_prefill",
        "bigger_gpus",
    ),
    "host_overhead_bound": ("route_away", "cuda_graphs", "async_scheduling", "host_resources"),
}


def plan_actions(verdict: str, facts: LedgerFacts | None = None) -> list[Action]:
    """The verdict's actions: "mitigate now" then "fix", each group cheapest first, each checked
    against ``facts`` (dropped where its premise is false, its premise stated where unknown)."""
    facts = facts or LedgerFacts()
    out: list[Action] = []
    for action_id in VERDICT_ACTIONS.get(verdict, ()):
        check = CHECKS.get(action_id)
        keep, premise, effect = check(facts) if check else (True, None, None)
        if keep:
            out.append(replace(ACTION_BY_ID[action_id], premise=premise, effect=effect))
    return sorted(out, key=lambda a: (a.group != MITIGATE, a.cost))  # stable: the listed order breaks ties


def shown(actions: list[Action], per_group: int = SHOWN_PER_GROUP) -> dict[str, list[Action]]:
    """The first ``per_group`` actions of each group, by group (what a page or the CLI shows)."""
    groups: dict[str, list[Action]] = {MITIGATE: [], FIX: []}
    for action in actions:
        if len(groups[action.group]) < per_group:
            groups[action.group].append(action)
    return {g: a for g, a in groups.items() if a}


__all__ = [
    "ACTION_BY_ID",
    "CATALOGUE",
    "FIX",
    "GROUP_TITLES",
    "MITIGATE",
    "Action",
    "plan_actions",
    "shown",
]
