"""The decision tree, written once as data: its named conditions and its branches in order.

The features it compares are in ``rules/features.py``, the predicates in ``rules/conditions.py``,
the words of a verdict in ``rules/render.py``. Evaluated twice from this one definition:

- in Python (``rules/diagnosis.py``): the features are computed on the window, then the branches
  are tried in order;
- as PromQL (``rules/promql.py``): each feature becomes a recording rule over the canonical
  signals, and each verdict an alert whose expression is its branch's condition *and not* the
  conditions of every branch before it -- so exactly one verdict alert fires for a scenario.

Semantics shared by both halves: a feature with no data is *missing*; a comparison on a missing
feature is false (PromQL drops the sample); ``Not`` is evaluated for engines that are active.

The tree (DESIGN.md "The decision tree"), first match wins:

 1. idle                    no tokens generated in the window
 2. kv_thrashing            preemptions, or KV moved into a GPU pool that sits at the ceiling
 3. kv_tier_miss            significant KV moved into the GPU (transfers, PCIe, hits off-GPU)
 4. kv_capacity_pressure    KV pool at the ceiling and requests waiting, no preemption yet
 5. healthy                 ITL p95 under the SLO and not rising
 6. memory_bandwidth_bound  DRAM bandwidth high, SM not clearly above it
 7. compute_bound           SM activity high (bandwidth not high, or clearly below SM)
 8. host_overhead_bound     the GPU mostly idle (both bandwidth and SM low) while decode is slow
 9. compute_bound           no GPU counters, prefill-heavy traffic
10. memory_bandwidth_bound  otherwise (the decode prior; lower confidence)
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
)
from .thresholds import Thresholds

ACTIVE = Named(
    "engine_active",
    Any(
        (
            Cmp("generation_tokens_per_second", ">", Param("idle_tokens_per_second")),
            # an engine without a token counter: requests in the batch are the next best sign of work
            All((Cmp("requests_running", ">", Param("zero")), Not(Present("generation_tokens_per_second")))),
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
SLOW = Named(
    "itl_slow",
    Any(
        (
            Cmp("itl_p95_seconds", ">=", Param("slo_seconds")),
            All(
                (
                    CmpFeatures(
                        "itl_late_median_seconds", ">=", "itl_early_median_seconds", scale=Param("trend_ratio")
                    ),
                    Cmp("itl_late_median_seconds", ">=", Param("trend_min_slo_fraction", "slo_seconds")),
                )
            ),
        )
    ),
)
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
NAMED_CONDITIONS: tuple[Named, ...] = (ACTIVE, TRANSFERS_SIGNIFICANT, SLOW, PRECISE_GPU, BANDWIDTH_HIGH)


@dataclass(frozen=True)
class Branch:
    """One leaf of the tree: the verdict when ``condition`` holds and no earlier branch did."""

    id: str
    verdict: str
    step: int  # DESIGN.md's step: 1 idle, 2 capacity/placement, 3 healthy, 4 bottleneck
    condition: Condition
    summary: str  # the branch in words, for evidence and docs


BRANCHES: tuple[Branch, ...] = (
    Branch("idle", "idle", 1, Not(ACTIVE), "no tokens generated in the window"),
    Branch(
        "thrashing_preemptions",
        "kv_thrashing",
        2,
        Cmp("preemptions_per_minute", ">=", Param("preemptions_per_minute")),
        "the engine is preempting requests: the KV pool ran out",
    ),
    Branch(
        "thrashing_reload",
        "kv_thrashing",
        2,
        All((TRANSFERS_SIGNIFICANT, AT_CEILING)),
        "KV moves into a GPU pool that sits at the ceiling",
    ),
    Branch(
        "tier_miss",
        "kv_tier_miss",
        2,
        TRANSFERS_SIGNIFICANT,
        "prefix hits are served from a slower tier while the GPU pool has room",
    ),
    Branch(
        "capacity_pressure",
        "kv_capacity_pressure",
        2,
        All((AT_CEILING, QUEUE_BACKED_UP)),
        "the KV pool is full and requests wait, no preemption yet",
    ),
    Branch("healthy", "healthy", 3, Not(SLOW), "ITL p95 under the SLO and not rising"),
    Branch(
        "bandwidth_high",
        "memory_bandwidth_bound",
        4,
        BANDWIDTH_HIGH,
        "DRAM bandwidth is high and SM activity is not clearly above it",
    ),
    Branch(
        "sm_high",
        "compute_bound",
        4,
        Cmp("sm_active_ratio", ">=", Param("sm_high_ratio")),
        "SM activity is high and DRAM bandwidth is not",
    ),
    Branch(
        "gpu_idle",
        "host_overhead_bound",
        4,
        Cmp("gpu_busy_ratio", "<", Param("host_overhead_gpu_max")),
        "the GPU is mostly idle while decode is slow: the time goes to the host",
    ),
    Branch(
        "prefill_heavy_no_gpu",
        "compute_bound",
        4,
        All(
            (
                Not(PRECISE_GPU),
                CmpFeatures(
                    "prompt_tokens_per_second", ">=", "generation_tokens_per_second", scale=Param("prefill_heavy_ratio")
                ),
            )
        ),
        "no GPU counters; prefill-heavy traffic",
    ),
    Branch(
        "decode_default",
        "memory_bandwidth_bound",
        4,
        TRUE,
        "slow decode without a clearer cause: most likely bandwidth (decode re-reads weights and KV every token)",
    ),
)

# The comparisons each branch's condition makes, in order (the tree is constant).
BRANCH_ATOMS: dict[str, tuple[Atom, ...]] = {b.id: tuple(atoms(b.condition)) for b in BRANCHES}

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
        )
    )


TREE_SIGNALS = TreeSignals()
