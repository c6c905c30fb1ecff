"""The decision tree, written once as data: its named conditions and its branches in order.

The features it compares are in ``rules/features.py``, the predicates in ``rules/conditions.py``,
the words of a verdict in ``rules/render.py``. Evaluated twice from this one definition:

- in Python (``rules/diagnosis.py``): the features are computed on the window, then the branches
  are tried in order;
- as PromQL (``rules/promql.py``): each feature becomes a recording rule over the canonical
  signals, and each verdict an alert whose expression is its branch's condition *and not* the
  conditions of every branch before it -- so exactly one verdict alert fires for a scenario.

Semantics shared by both halves: a feature with no data is *missing*; a comparison on a missing
feature is false (PromQL drops the sample); ``Not`` of a condition holds where it was not shown to
hold. So a claim needs a measurement: ``healthy`` needs a latency measured under the SLO, and a
slow verdict needs the engine measured slow (ITL over the SLO, or requests that wait).

The tree (DESIGN.md "The decision tree"), first match wins:

 1. idle                    no tokens generated, no request running or waiting
 2. kv_thrashing            preemptions (or swapped-out requests) while the engine is slow
 3. kv_thrashing            KV moved into a GPU pool that sits at the ceiling, while slow
 4. kv_tier_miss            significant KV moved into the GPU while ITL or TTFT is over its SLO
 5. kv_capacity_pressure    KV pool at the ceiling and requests delayed (waiting, or TTFT over its SLO)
 6. request_queueing        requests wait while the KV pool has room (or its usage is unknown)
 7. healthy                 a latency measured under the SLO (ITL p95, else the mean time per token)
 8. memory_bandwidth_bound  ITL over the SLO; DRAM bandwidth high, SM not clearly above it
 9. compute_bound           ITL over the SLO; SM activity high
10. host_overhead_bound     ITL over the SLO; the GPU mostly idle (both bandwidth and SM low)
11. compute_bound           ITL over the SLO; no GPU counters, prefill-heavy traffic
12. memory_bandwidth_bound  ITL over the SLO otherwise (the decode prior; lower confidence)
13. healthy                 no latency measured and nothing slow: the headline says what went unchecked
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .conditions import TRUE, All, Any, Atom, Cmp, CmpFeatures, Condition, Named, Not, Param, Present, atoms, evaluate
from .signals import (
    GENERATION_TOKENS,
    GPU_DRAM_BANDWIDTH_UTILIZATION,
    GPU_PCIE_RX,
    GPU_SM_ACTIVE,
    INTER_TOKEN_LATENCY,
    KV_CACHE_USAGE,
    KV_TRANSFER_BYTES,
    PREEMPTIONS,
    PREFIX_CACHE_HITS_BY_TIER,
    PROMPT_TOKENS,
    REQUESTS_RUNNING,
    REQUESTS_WAITING,
    TIME_TO_FIRST_TOKEN,
)
from .thresholds import Thresholds

SLO = Param("slo_seconds")  # the ITL SLO: per pod in PromQL (the SLO gauge each exporter publishes)

ACTIVE = Named(
    "engine_active",
    Any(
        (
            Cmp("generation_tokens_per_second", ">", Param("idle_tokens_per_second")),
            # engines that count tokens only when a request ends (llama.cpp): a running request is work
            Cmp("requests_running", ">", Param("zero")),
            Cmp("requests_waiting", ">", Param("zero")),
        )
    ),
)
AT_CEILING = Cmp("kv_usage", ">=", Param("kv_ceiling_ratio"))
TRANSFERS_SIGNIFICANT = Named(
    "kv_transfers_significant",
    Any(
        (
            Cmp("kv_to_gpu_bytes_per_second", ">=", Param("kv_to_gpu_bytes_per_second_min")),
            Cmp("pcie_receive_bytes_per_second", ">=", Param("pcie_receive_bytes_per_second_min")),
            Cmp("slow_tier_hit_fraction", ">=", Param("slow_tier_hit_fraction_min")),
        )
    ),
)
QUEUE_BACKED_UP = Cmp("requests_waiting", ">=", Param("queue_waiting_min"))
TTFT_SLOW = Cmp("ttft_p95_seconds", ">=", Param("ttft_slow_seconds"))
NO_ITL_HISTOGRAM = Not(Present("itl_p95_seconds"))
# The latency measure: the ITL p95 where the engine has the histogram, else the mean time per token.
ITL_SLOW = Named(
    "itl_slow",
    Any(
        (
            Cmp("itl_p95_seconds", ">=", SLO),
            All((NO_ITL_HISTOGRAM, Cmp("time_per_token_mean_seconds", ">=", SLO))),
        )
    ),
)
ITL_FAST = Named(
    "itl_fast",
    Any(
        (
            Cmp("itl_p95_seconds", "<", SLO),
            All((NO_ITL_HISTOGRAM, Cmp("time_per_token_mean_seconds", "<", SLO))),
        )
    ),
)
REQUESTS_DELAYED = Named("requests_delayed", Any((QUEUE_BACKED_UP, TTFT_SLOW)))
ENGINE_SLOW = Named("engine_slow", Any((ITL_SLOW, REQUESTS_DELAYED)))
PRECISE_GPU = Named("gpu_counters_precise", Any((Present("dram_bandwidth_ratio"), Present("sm_active_ratio"))))
BANDWIDTH_HIGH = Named(
    "gpu_bandwidth_high",
    All(
        (
            Cmp("dram_bandwidth_ratio", ">=", Param("bandwidth_high_ratio")),
            Not(CmpFeatures("sm_active_ratio", ">=", "dram_bandwidth_ratio", offset=Param("clearly_above_margin"))),
        )
    ),
)
# Recorded by the PromQL half, in this order (later ones may use the earlier ones).
NAMED_CONDITIONS: tuple[Named, ...] = (
    ACTIVE,
    TRANSFERS_SIGNIFICANT,
    ITL_SLOW,
    ITL_FAST,
    REQUESTS_DELAYED,
    ENGINE_SLOW,
    PRECISE_GPU,
    BANDWIDTH_HIGH,
)

# What every verdict's evidence shows besides its own conditions: the state that explains it.
CONTEXT_FEATURES = ("itl_p95_seconds", "kv_usage", "requests_waiting", "preemptions_per_minute")


@dataclass(frozen=True)
class Branch:
    """One leaf of the tree: the verdict when ``condition`` holds and no earlier branch did."""

    id: str
    verdict: str
    step: int  # DESIGN.md's step: 1 idle, 2 capacity/placement/queue, 3 healthy, 4 bottleneck
    condition: Condition
    summary: str  # the branch in words, for evidence and docs
    context: tuple[str, ...] = ()  # further features its evidence shows (after CONTEXT_FEATURES)
    gpu_side: bool = False  # blames the GPU: at most 0.5 confident without GPU counters


_THRASHING_CONTEXT = ("requests_swapped", "kv_host_usage", "ttft_p95_seconds")
_GPU_CONTEXT = ("dram_bandwidth_ratio", "sm_active_ratio", "gpu_busy_ratio")

BRANCHES: tuple[Branch, ...] = (
    Branch("idle", "idle", 1, Not(ACTIVE), "no tokens generated, no request running or waiting"),
    Branch(
        "thrashing_preemptions",
        "kv_thrashing",
        2,
        All((Cmp("preemptions_per_minute", ">=", Param("preemptions_per_minute")), ENGINE_SLOW)),
        "the engine preempts requests (the KV pool ran out) and is slow",
        _THRASHING_CONTEXT,
    ),
    Branch(
        "thrashing_swapping",
        "kv_thrashing",
        2,
        All((Cmp("requests_swapped", ">=", Param("requests_swapped_min")), ENGINE_SLOW)),
        "requests are swapped out to host memory (the KV pool ran out) and the engine is slow",
        _THRASHING_CONTEXT,
    ),
    Branch(
        "thrashing_reload",
        "kv_thrashing",
        2,
        All((TRANSFERS_SIGNIFICANT, AT_CEILING, ENGINE_SLOW)),
        "KV moves into a GPU pool that sits at the ceiling, and the engine is slow",
        _THRASHING_CONTEXT,
    ),
    Branch(
        "tier_miss",
        "kv_tier_miss",
        2,
        All((TRANSFERS_SIGNIFICANT, Any((ITL_SLOW, TTFT_SLOW)))),
        "prefix hits are served from a slower tier while ITL or TTFT is over its SLO",
        ("ttft_p95_seconds",),
    ),
    Branch(
        "capacity_pressure",
        "kv_capacity_pressure",
        2,
        All((AT_CEILING, REQUESTS_DELAYED)),
        "the KV pool is full and requests are delayed (they wait, or TTFT is over its SLO), no preemption yet",
        ("ttft_p95_seconds",),
    ),
    Branch(
        "request_queueing",
        "request_queueing",
        2,
        All((QUEUE_BACKED_UP, Not(AT_CEILING))),
        "requests wait while the KV pool has room (or its usage is unknown): the engine's sequence limit",
        ("requests_running", "ttft_p95_seconds"),
    ),
    Branch("healthy", "healthy", 3, ITL_FAST, "a latency measured under the SLO and nothing delayed"),
    Branch(
        "bandwidth_high",
        "memory_bandwidth_bound",
        4,
        All((ITL_SLOW, BANDWIDTH_HIGH)),
        "ITL over the SLO; DRAM bandwidth is high and SM activity is not clearly above it",
        _GPU_CONTEXT,
        gpu_side=True,
    ),
    Branch(
        "sm_high",
        "compute_bound",
        4,
        All((ITL_SLOW, Cmp("sm_active_ratio", ">=", Param("sm_high_ratio")))),
        "ITL over the SLO; SM activity is high and DRAM bandwidth is not",
        _GPU_CONTEXT,
        gpu_side=True,
    ),
    Branch(
        "gpu_idle",
        "host_overhead_bound",
        4,
        All((ITL_SLOW, Cmp("gpu_busy_ratio", "<", Param("host_overhead_gpu_max")))),
        "ITL over the SLO while the GPU is mostly idle: the time goes to the host",
        _GPU_CONTEXT,
        gpu_side=True,
    ),
    Branch(
        "prefill_heavy_no_gpu",
        "compute_bound",
        4,
        All(
            (
                ITL_SLOW,
                Not(PRECISE_GPU),
                CmpFeatures(
                    "prompt_tokens_per_second", ">=", "generation_tokens_per_second", scale=Param("prefill_heavy_ratio")
                ),
            )
        ),
        "ITL over the SLO; no GPU counters; prefill-heavy traffic",
        _GPU_CONTEXT,
        gpu_side=True,
    ),
    Branch(
        "decode_default",
        "memory_bandwidth_bound",
        4,
        ITL_SLOW,
        "ITL over the SLO without a clearer cause: most likely bandwidth (decode re-reads weights and KV every token)",
        _GPU_CONTEXT,
        gpu_side=True,
    ),
    Branch(
        "unmeasured",
        "healthy",
        3,
        TRUE,
        "nothing measured slow, but no latency measured either: the headline says what went unchecked",
        ("time_per_token_mean_seconds", "requests_running"),
    ),
)

# The comparisons each branch's condition makes, in order (the tree is constant).
BRANCH_ATOMS: dict[str, tuple[Atom, ...]] = {b.id: tuple(atoms(b.condition)) for b in BRANCHES}
BRANCH_BY_ID = {b.id: b for b in BRANCHES}

VERDICTS = (
    "idle",
    "healthy",
    "kv_thrashing",
    "kv_tier_miss",
    "kv_capacity_pressure",
    "request_queueing",
    "memory_bandwidth_bound",
    "compute_bound",
    "host_overhead_bound",
)
SLOW_VERDICTS = VERDICTS[2:]


def parameters(thresholds: Thresholds, slo_seconds: float) -> dict[str, float]:
    """What ``Param`` names resolve to: every threshold, the SLO, and zero."""
    return {**thresholds.as_dict(), "slo_seconds": float(slo_seconds), "zero": 0.0}


def choose_branch(values: Mapping[str, float], params: Mapping[str, float]) -> Branch:
    """The first branch whose condition holds (the last one always does)."""
    for branch in BRANCHES:
        if evaluate(branch.condition, values, params):
            return branch
    raise AssertionError("the tree's last branch must always hold")  # pragma: no cover


def precedence_condition(index: int) -> Condition:
    """Branch ``index``'s own condition and-not every earlier branch's: what its alert encodes."""
    terms: list[Condition] = [BRANCHES[index].condition]
    for earlier in BRANCHES[:index]:
        c = earlier.condition
        terms.append(c.term if isinstance(c, Not) else Not(c))
    return All(tuple(terms))


@dataclass(frozen=True)
class TreeSignals:
    """Signals grouped by what is missing when they are absent (for ``Diagnosis.missing``)."""

    gpu: tuple[str, ...] = (GPU_DRAM_BANDWIDTH_UTILIZATION, GPU_SM_ACTIVE, GPU_PCIE_RX)
    engine: tuple[str, ...] = field(
        default=(
            GENERATION_TOKENS,
            PROMPT_TOKENS,
            REQUESTS_RUNNING,
            REQUESTS_WAITING,
            PREEMPTIONS,
            KV_CACHE_USAGE,
            KV_TRANSFER_BYTES,
            PREFIX_CACHE_HITS_BY_TIER,
            INTER_TOKEN_LATENCY,
            TIME_TO_FIRST_TOKEN,
        )
    )


TREE_SIGNALS = TreeSignals()
