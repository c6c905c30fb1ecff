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

The tree (docs/DESIGN.md "The decision tree"), first match wins. Its order answers the seed's
question first -- is decode slow because it cannot compute or cannot move data? -- and only then
asks whether requests wait for another reason:

 1. idle                    no tokens generated, no request running or waiting
 2. kv_thrashing            preemptions now (or over the window's last third with the pool still full;
                            or swapped-out requests) while the engine is slow
 3. kv_thrashing            KV moved into a GPU pool that stays at the ceiling, while slow
 4. kv_tier_miss            significant KV moved into the GPU while ITL or TTFT is over its SLO
 5. kv_capacity_pressure    KV pool at the ceiling and requests delayed (they wait, or TTFT is slow)
    (2-5: where the KV lives and whether it fits. First, because these hurt TTFT and every token even
    where the ITL of the requests still running looks fine, and a full pool delaying admission is a
    KV cause, not a queue.)
 6. memory_bandwidth_bound  ITL over the SLO; DRAM bandwidth high, SM not clearly above it
 7. compute_bound           ITL over the SLO; SM activity high
 8. host_overhead_bound     ITL over the SLO; the GPU mostly idle (both bandwidth and SM low)
 9. compute_bound           ITL over the SLO; no GPU counters, prefill-heavy traffic
10. memory_bandwidth_bound  ITL over the SLO otherwise (the decode prior; lower confidence)
    (6-10: decode is slow, and why. A slow decode always builds a queue, so these come before
    the queue: the queue is named as their consequence in the differential, never their verdict.)
11. request_queueing        decode on time (or unmeasured), requests wait and are delayed (TTFT over
                            its threshold, a queue that grows, or no TTFT to tell), KV pool has room
12. healthy                 a latency measured under the SLO (ITL p95, else the mean time per token)
13. healthy                 no latency measured and nothing slow: the headline says what went unchecked

A queue that neither delays TTFT nor grows is not slowness (step 11 needs a delay). The features
that pick the cause read the recent part of the window (``Thresholds.state_window_seconds``), the
part the slowness check reads, so after a change of cause the new verdict appears within one
state window and a scrape, and a cause that stopped cannot outvote the one present now. The one
longer memory is bounded: beside a full pool, preemptions over the window's last third (a thrash
sparser than the state window must not flicker to capacity pressure in its gaps), so a thrash that
stops beside a pool that stays full yields a third of the window and a scrape later (21 s at 1 s).

Beside the verdict, every other branch whose own condition holds (``differential``), the fallback
branches excepted, and the queue behind a slow decode (``QUEUE_CONSEQUENCE``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kvdoctor.signals.vocabulary import (
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

from .conditions import (
    TRUE,
    All,
    Any,
    Atom,
    Cmp,
    CmpFeatures,
    Condition,
    Named,
    Not,
    Param,
    Present,
    any_of,
    at_least_min,
    atoms,
    evaluate,
)
from .thresholds import Thresholds
from .verdicts import SLOW_VERDICTS
from .verdicts import verdict as catalogue_entry

SLO = Param("slo_seconds")  # the ITL SLO: per pod in PromQL (the SLO gauge each exporter publishes)

ACTIVE = any_of(
    "engine_active",
    Cmp("generation_tokens_per_second", ">", Param("idle_tokens_per_second")),
    # engines that count tokens only when a request ends (llama.cpp): a running request is work
    Cmp("requests_running", ">", Param("zero")),
    Cmp("requests_waiting", ">", Param("zero")),
)
AT_CEILING = Cmp("kv_usage", ">=", Param("kv_ceiling_ratio"))
# Preempting now: in the state sub-window, or (a sparse thrash: one preemption per 20 s escapes a 15 s
# state window) over the window's last third while the pool is still full -- the last third, not the
# whole window, so a thrash that stopped cannot outvote the capacity pressure present now for long.
# Preemptions that stopped with the pool no longer full are not quoted as current.
PREEMPTING = any_of(
    "preempting",
    Cmp("preemptions_per_minute", ">=", Param("preemptions_per_minute")),
    All((Cmp("preemptions_per_minute_late", ">=", Param("preemptions_per_minute")), AT_CEILING)),
)
# Full throughout the state sub-window: KV reloaded into such a pool evicts other KV. A pool that was
# full only before a change of cause (its high quantile still full, its floor not) is no reload.
FULL_THROUGHOUT = Cmp("kv_usage_floor", ">=", Param("kv_ceiling_ratio"))
TRANSFERS_SIGNIFICANT = any_of(
    "kv_transfers_significant",
    *map(at_least_min, ("kv_to_gpu_bytes_per_second", "pcie_receive_bytes_per_second", "slow_tier_hit_fraction")),
)
QUEUED = Cmp("requests_waiting", ">=", Param("queue_waiting_min"))
QUEUE_GROWING = Cmp("queue_growth_per_minute", ">=", Param("queue_growth_per_minute"))
TTFT_SLOW = Cmp("ttft_p95_seconds", ">=", Param("ttft_slow_seconds"))
NO_TTFT = Not(Present("ttft_p95_seconds"))
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
# Requests are held back: they wait, or their first token is slow. Beside a full KV pool that is
# admission limited by the pool (a KV cause); with room in the pool it is slowness only where the
# queue delays (QUEUE_DELAYS).
REQUESTS_DELAYED = Named("requests_delayed", Any((QUEUED, TTFT_SLOW)))
# A queue that delays: requests wait and TTFT is over its threshold, or the queue grows, or there is
# no TTFT histogram to tell. A steady short queue with TTFT on time delays nobody.
QUEUE_DELAYS = Named("queue_delays", All((QUEUED, Any((TTFT_SLOW, QUEUE_GROWING, NO_TTFT)))))
ENGINE_SLOW = Named("engine_slow", Any((ITL_SLOW, REQUESTS_DELAYED)))
# The queue a slow decode builds: listed in the differential beside any slow verdict but queueing.
QUEUE_CONSEQUENCE = QUEUED
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
    PREEMPTING,
    TRANSFERS_SIGNIFICANT,
    ITL_SLOW,
    ITL_FAST,
    REQUESTS_DELAYED,
    QUEUE_DELAYS,
    ENGINE_SLOW,
    PRECISE_GPU,
    BANDWIDTH_HIGH,
)

# What every verdict's evidence shows besides its own conditions: the state that explains it.
CONTEXT_FEATURES = ("itl_p95_seconds", "kv_usage", "requests_waiting", "preemptions_per_minute")


IDLE_STEP, KV_STEP, DECODE_STEP, ON_TIME_STEP = 1, 2, 3, 4


@dataclass(frozen=True)
class Branch:
    """One leaf of the tree: the verdict when ``condition`` holds and no earlier branch did."""

    id: str
    verdict: str
    step: int  # 1 idle, 2 where the KV lives, 3 why decode is slow, 4 decode on time: queue or healthy
    condition: Condition
    summary: str  # the branch in words, for evidence and docs
    context: tuple[str, ...] = ()  # further features its evidence shows (after CONTEXT_FEATURES)
    gpu_side: bool = False  # blames the GPU: at most 0.5 confident without GPU counters
    base_confidence: float | None = None  # a clean match; None: its verdict's (rules/verdicts.py)
    fallback: bool = False  # holds for want of a clearer answer: never listed in the differential

    @property
    def base(self) -> float:
        return catalogue_entry(self.verdict).base_confidence if self.base_confidence is None else self.base_confidence


_THRASHING_CONTEXT = ("requests_swapped", "kv_host_usage", "ttft_p95_seconds")
_GPU_CONTEXT = ("dram_bandwidth_ratio", "sm_active_ratio", "gpu_busy_ratio")


def _decode_slow(
    branch_id: str,
    verdict: str,
    summary: str,
    *cause: Condition,
    base_confidence: float | None = None,
    fallback: bool = False,
) -> Branch:
    """A branch of step 3, why decode is slow: ITL over the SLO and ``cause`` (none: ITL over the
    SLO alone), blamed on the GPU side, its evidence showing the GPU counters."""
    condition = All((ITL_SLOW, *cause)) if cause else ITL_SLOW
    return Branch(
        branch_id,
        verdict,
        DECODE_STEP,
        condition,
        summary,
        _GPU_CONTEXT,
        gpu_side=True,
        base_confidence=base_confidence,
        fallback=fallback,
    )


BRANCHES: tuple[Branch, ...] = (
    Branch("idle", "idle", IDLE_STEP, Not(ACTIVE), "no tokens generated, no request running or waiting"),
    Branch(
        "thrashing_preemptions",
        "kv_thrashing",
        KV_STEP,
        All((PREEMPTING, ENGINE_SLOW)),
        "the engine preempts requests (the KV pool ran out) and is slow",
        _THRASHING_CONTEXT,
    ),
    Branch(
        "thrashing_swapping",
        "kv_thrashing",
        KV_STEP,
        All((Cmp("requests_swapped", ">=", Param("requests_swapped_min")), ENGINE_SLOW)),
        "requests are swapped out to host memory (the KV pool ran out) and the engine is slow",
        _THRASHING_CONTEXT,
        base_confidence=0.85,
    ),
    Branch(
        "thrashing_reload",
        "kv_thrashing",
        KV_STEP,
        All((TRANSFERS_SIGNIFICANT, FULL_THROUGHOUT, ENGINE_SLOW)),
        "KV moves into a GPU pool that stays at the ceiling, and the engine is slow",
        _THRASHING_CONTEXT,
        base_confidence=0.8,
    ),
    Branch(
        "tier_miss",
        "kv_tier_miss",
        KV_STEP,
        All((TRANSFERS_SIGNIFICANT, Any((ITL_SLOW, TTFT_SLOW)))),
        "prefix hits are served from a slower tier while ITL or TTFT is over its SLO",
        ("ttft_p95_seconds",),
    ),
    Branch(
        "capacity_pressure",
        "kv_capacity_pressure",
        KV_STEP,
        All((AT_CEILING, REQUESTS_DELAYED)),
        "the KV pool is full and requests are delayed (they wait, or TTFT is over its threshold), no preemption yet",
        ("ttft_p95_seconds",),
    ),
    _decode_slow(
        "bandwidth_high",
        "memory_bandwidth_bound",
        "ITL over the SLO; DRAM bandwidth is high and SM activity is not clearly above it",
        BANDWIDTH_HIGH,
    ),
    _decode_slow(
        "sm_high",
        "compute_bound",
        "ITL over the SLO; SM activity is high and DRAM bandwidth is not",
        Cmp("sm_active_ratio", ">=", Param("sm_high_ratio")),
    ),
    _decode_slow(
        "gpu_idle",
        "host_overhead_bound",
        "ITL over the SLO while the GPU is mostly idle: the time goes to the host",
        Cmp("gpu_busy_ratio", "<", Param("host_overhead_gpu_max")),
    ),
    _decode_slow(
        "prefill_heavy_no_gpu",
        "compute_bound",
        "ITL over the SLO; no GPU counters; prefill-heavy traffic",
        Not(PRECISE_GPU),
        CmpFeatures(
            "prompt_tokens_per_second", ">=", "generation_tokens_per_second", scale=Param("prefill_heavy_ratio")
        ),
        base_confidence=0.45,
    ),
    _decode_slow(
        "decode_default",
        "memory_bandwidth_bound",
        "ITL over the SLO without a clearer cause: most likely bandwidth (decode re-reads weights and KV every token)",
        base_confidence=0.55,
        fallback=True,
    ),
    Branch(
        "request_queueing",
        "request_queueing",
        ON_TIME_STEP,
        All((QUEUE_DELAYS, Not(AT_CEILING))),
        "decode is on time (or unmeasured) but requests wait and are delayed while the KV pool has room (or its "
        "usage is unknown): the engine's sequence limit or the load",
        ("requests_running", "ttft_p95_seconds", "queue_growth_per_minute"),
    ),
    Branch("healthy", "healthy", ON_TIME_STEP, ITL_FAST, "a latency measured under the SLO and nothing delayed"),
    Branch(
        "unmeasured",
        "healthy",
        ON_TIME_STEP,
        TRUE,
        "nothing measured slow, but no latency measured either: the headline says what went unchecked",
        ("time_per_token_mean_seconds", "requests_running"),
        base_confidence=0.3,
        fallback=True,
    ),
)

# The branches the differential lists when their own condition holds: the slow causes, less the
# fallbacks (they hold for want of a clearer answer) and the queue (beside a slow verdict it is the
# consequence, listed as ``QUEUE_CONSEQUENCE``).
DIFFERENTIAL_BRANCHES: tuple[Branch, ...] = tuple(
    b for b in BRANCHES if b.verdict in SLOW_VERDICTS and not b.fallback and b.verdict != "request_queueing"
)

# The comparisons each branch's condition makes, in order (the tree is constant).
BRANCH_ATOMS: dict[str, tuple[Atom, ...]] = {b.id: tuple(atoms(b.condition)) for b in BRANCHES}
BRANCH_BY_ID = {b.id: b for b in BRANCHES}


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
