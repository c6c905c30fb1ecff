"""The demo's workloads: what the simulated clients ask of the simulated engine.

A scenario is only a workload (how many clients, how long their prompts and answers are, where
their prefix KV lives, how much CPU work each engine step needs); the symptoms come out of the
physics (physics.py), not out of the scenario. Each scenario is sized so that, on the default
engine (Llama-2-7B, an MHA model whose KV cache is 4x Llama-3's per token, on one H100), the
signals land clearly inside one branch of the decision tree (rules/tree.py, docs/DESIGN.md):

=================  ===========================================================================
healthy            16 chat clients sharing a 512-token system prompt: KV ~7%, ITL ~7.5 ms
                   (decode at this batch is bound by reading the weights: DRAM ~85%, but fast)
bandwidth_bound    24 long-context clients (2.5k-token prompts): KV ~72%, every step re-reads
                   ~50 GB, DRAM bandwidth ~0.85 with SM ~0.35, ITL ~19 ms (floor ~16 ms)
kv_thrashing       256 clients with 2k-token answers: KV demand ~4x the pool, ~8 recompute
                   preemptions/s, KV oscillating between ~0.98 and 1.0, a queue of ~130, and
                   ITL samples of whole seconds from resumed requests (the knee)
tier_miss          multi-turn sessions whose 3k-token history sits in CPU memory: every turn
                   is a prefix hit loaded over PCIe (~20 GB/s), not hidden behind compute;
                   KV ~75% (room on the GPU: a tier miss, not thrashing)
capacity_pressure  3.5k-token prompts arriving at 16/s, 48-token answers: KV >= 0.9, the queue
                   grows by a few requests a second, no preemption (short answers fit the
                   watermark)
host_overhead      12 clients but ~110 ms of CPU work per engine step (a starved or GIL-bound
                   front end): requests running, DRAM ~4% and SM ~2%, ITL ~120 ms
compute_bound      16 clients sending 3k-token prompts for 16-token answers: every step is a
                   full 8,192-token prefill chunk, SM ~0.95, DRAM ~0.2, ITL ~75-180 ms
=================  ===========================================================================

``cycle`` walks through them in ``CYCLE_ORDER``, ``CYCLE_PERIOD_SECONDS`` each (both explained below).

A queue behind the workload (``with_queue``; ``kvdoctor demo --queue``, ``POST /scenario`` with
``"queue"``): in a real incident a slow engine has requests piling up behind it. The engine's
sequence limit (vLLM ``--max-num-seqs``) is set to the workload's own concurrency, so the running
batch, and with it every per-token symptom, stays what it was, and more clients come than it runs:

=========  ================================================================================
none       the workload alone (the table above)
steady     a tenth more clients than the engine runs (closed loop, at least one): that many
           wait at every instant, each for a slot to free, so TTFT carries the wait (under a
           second on ``healthy``) but the queue does not grow
growing    the same, and ``GROWING_CLIENTS_PER_SECOND`` more clients joining every second (each
           sends its next request when one ends): the engine's slots are full, so more arrive
           than it serves, the queue grows by that many a second and TTFT rises with it, until
           ``max_waiting`` turns newcomers away
=========  ================================================================================

The open-loop ``capacity_pressure`` already has a growing queue (a full pool delaying admission):
``growing`` leaves it so, ``steady`` caps its queue at ``STEADY_OPEN_LOOP_WAITING`` (arrivals over
it are rejected, as vLLM's queue limit does). Only ``healthy`` changes its expected verdict: a
steady queue on a fast engine delays nobody (still ``healthy``), a growing one is
``request_queueing``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

CYCLE = "cycle"
# The exporter diagnoses the last 60 s and the tree reads medians and rates over it, so a verdict
# follows a workload change after about half a window (a whole one after preemptions stop): a
# phase needs well over 60 s to show its own verdict for a good part of it.
CYCLE_PERIOD_SECONDS = 90.0


@dataclass(frozen=True)
class Scenario:
    """One workload. Lengths are means; each request draws within +-``length_jitter``.

    clients               closed loop: this many requests in flight, a new one as soon as one ends
    arrival_rate          open loop instead (requests/s, Poisson) when > 0; ``clients`` is ignored
    prompt_tokens         prompt length
    output_tokens         answer length (requests stop at ``max_tokens``: finished_reason=length)
    shared_prefix_tokens  leading prompt tokens every request shares (device prefix-cache hits)
    host_prefix_tokens    leading prompt tokens whose KV sits in the CPU tier and is loaded over PCIe
    transfer_overlap      share of a step's PCIe load hidden behind that step's GPU work (0..1)
    host_overhead_seconds CPU time per engine step the GPU waits for (scheduler, detokenisation)
    offload_store         the offloading connector writes finished requests' KV to CPU memory
    max_waiting           open loop: queue length at which new requests are rejected
    max_running           the engine's sequence limit for this workload (vLLM --max-num-seqs; 0: the
                          deployment's): clients beyond it wait in the queue
    clients_joining       closed loop: more clients come every second and stay (a growing queue)
    queue                 the queue behind the workload (``QUEUE_CHOICES``; ``with_queue`` sets it)
    expected_verdict      the rules verdict this workload should produce
    """

    name: str
    summary: str
    expected_verdict: str
    clients: int = 0
    arrival_rate: float = 0.0
    prompt_tokens: int = 512
    output_tokens: int = 256
    length_jitter: float = 0.2
    shared_prefix_tokens: int = 0
    host_prefix_tokens: int = 0
    transfer_overlap: float = 0.0
    host_overhead_seconds: float = 0.0
    offload_store: bool = False
    max_waiting: int = 1000
    max_running: int = 0
    clients_joining: float = 0.0
    queue: str = "none"


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "healthy",
            "16 chat clients sharing a system prompt; modest load",
            "healthy",
            clients=16,
            prompt_tokens=768,
            output_tokens=384,
            shared_prefix_tokens=512,
        ),
        Scenario(
            "bandwidth_bound",
            "20 long-context clients: every step re-reads weights plus ~40 GB of KV",
            "memory_bandwidth_bound",
            clients=24,
            prompt_tokens=2500,
            output_tokens=1500,
        ),
        Scenario(
            "kv_thrashing",
            "160 clients with long answers: KV demand far above the pool, recompute preemptions",
            "kv_thrashing",
            clients=256,
            prompt_tokens=128,
            output_tokens=2000,
        ),
        Scenario(
            "tier_miss",
            "multi-turn sessions whose history lives in CPU memory: prefix hits served over PCIe",
            "kv_tier_miss",
            clients=24,
            prompt_tokens=3200,
            output_tokens=64,
            host_prefix_tokens=3000,
            transfer_overlap=0.0,
            offload_store=True,
        ),
        Scenario(
            "capacity_pressure",
            "long prompts arriving faster than they finish: KV >= 90%, queue growing",
            "kv_capacity_pressure",
            arrival_rate=16.0,
            prompt_tokens=3500,
            output_tokens=48,
            length_jitter=0.05,
            max_waiting=5000,
        ),
        Scenario(
            "host_overhead",
            "light load, ~110 ms of CPU work per engine step: the GPU waits on the host",
            "host_overhead_bound",
            clients=12,
            prompt_tokens=512,
            output_tokens=256,
            host_overhead_seconds=0.11,
        ),
        Scenario(
            "compute_bound",
            "prefill-heavy traffic: 4k-token prompts, 16-token answers",
            "compute_bound",
            clients=16,
            prompt_tokens=3000,
            output_tokens=16,
            length_jitter=0.05,
        ),
    )
}

# Ascending precedence in the decision tree: a phase whose branch comes earlier in the tree takes
# over as soon as its evidence appears, while one that comes later must wait until the previous
# phase's evidence has left the diagnosis window. Only the wrap-around (kv_thrashing -> healthy)
# waits a whole window.
CYCLE_ORDER: tuple[str, ...] = (
    "healthy",
    "host_overhead",
    "compute_bound",
    "bandwidth_bound",
    "capacity_pressure",
    "tier_miss",
    "kv_thrashing",
)

SCENARIO_CHOICES: tuple[str, ...] = (*SCENARIOS, CYCLE)

QUEUE_NONE, QUEUE_STEADY, QUEUE_GROWING = "none", "steady", "growing"
QUEUE_CHOICES: tuple[str, ...] = (QUEUE_NONE, QUEUE_STEADY, QUEUE_GROWING)
# steady: this share more clients than the engine runs at once (at least one) wait at every instant
STEADY_EXTRA_SHARE = 0.1
# growing: clients joining per second on top; the engine's slots stay full, so the queue grows by
# this many a second whatever the workload's own speed (a minute of it: 60 more waiting)
GROWING_CLIENTS_PER_SECOND = 1.0
# steady on an open-loop workload: its queue is capped here (arrivals over it are rejected)
STEADY_OPEN_LOOP_WAITING = 24


def check_queue(queue: str) -> str:
    if queue not in QUEUE_CHOICES:
        raise ValueError(f"unknown queue {queue!r} (choose from {', '.join(QUEUE_CHOICES)})")
    return queue


def with_queue(scenario: Scenario, queue: str) -> Scenario:
    """``scenario`` with ``queue`` behind it (the module's docstring says what each mode does)."""
    if check_queue(queue) == QUEUE_NONE:
        return scenario
    if scenario.arrival_rate > 0:  # open loop: its queue already grows with its arrivals
        if queue == QUEUE_STEADY:
            summary = f"{scenario.summary}; its queue capped at {STEADY_OPEN_LOOP_WAITING}"
            return replace(scenario, summary=summary, max_waiting=STEADY_OPEN_LOOP_WAITING, queue=queue)
        return replace(scenario, summary=f"{scenario.summary}; its queue grows", queue=queue)
    extra = max(1, math.ceil(scenario.clients * STEADY_EXTRA_SHARE))
    summary = f"{scenario.summary}; {extra} more clients than the engine runs at once"
    growth = GROWING_CLIENTS_PER_SECOND if queue == QUEUE_GROWING else 0.0
    if growth:
        summary += f", and {growth:g} more joining every second: a growing queue"
    expected = scenario.expected_verdict
    if expected == "healthy" and growth:
        expected = "request_queueing"  # decode on time, requests delayed by a queue that grows
    return replace(
        scenario,
        summary=summary,
        expected_verdict=expected,
        clients=scenario.clients + extra,
        max_running=scenario.clients,
        clients_joining=growth,
        queue=queue,
    )


def scenario_at(name: str, elapsed: float, period: float = CYCLE_PERIOD_SECONDS) -> Scenario:
    """The scenario in force ``elapsed`` seconds after ``name`` was selected (``cycle`` walks)."""
    if name == CYCLE:
        index = int(max(0.0, elapsed) // period) % len(CYCLE_ORDER)
        return SCENARIOS[CYCLE_ORDER[index]]
    try:
        return SCENARIOS[name]
    except KeyError:
        raise ValueError(f"unknown scenario {name!r} (choose from {', '.join(SCENARIO_CHOICES)})") from None
