"""One engine step on the simulated GPU: how long it takes, and what the GPU's counters see of it.

The cost comes from the ledger (ledger/arithmetic.py): HBM bytes = weights + the KV of every scheduled
sequence (+ prefill activations), FLOPs = ``forward_flops``; the GPU time is the roofline max of
bytes / (peak bandwidth x efficiency) and FLOPs / (peak FLOP/s x efficiency). KV loaded from the
CPU tier crosses PCIe (``EngineConfig.host_copy_seconds``); what is not hidden behind the step's GPU time
stalls it. Host overhead (scheduler, detokenisation) is added on top.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from kvdoctor.ledger.arithmetic import forward_flops

from .deployment import EngineConfig
from .scenarios import Scenario

TOKEN_ID_BYTES = 4.0  # a token id crossing PCIe: prompt and sampled tokens


@dataclass(frozen=True)
class StepLoad:
    """What one step schedules, as far as its cost goes."""

    sequences: int  # requests scheduled
    new_tokens: int  # tokens computed: prefill chunks plus one per decoding request
    prefill_tokens: int
    kv_read_tokens: int  # every scheduled sequence's attention reads all its KV
    attended: float  # sum over new tokens of the tokens each attends to
    host_load_bytes: float  # KV loaded from the CPU tier over PCIe before the step

    @property
    def decode_tokens(self) -> int:
        return self.new_tokens - self.prefill_tokens


@dataclass(frozen=True)
class StepCost:
    flops: float
    hbm_bytes: float  # read and written in HBM
    gpu_seconds: float  # the roofline time, with the step's jitter
    sm_busy_seconds: float  # GPU time weighted by the share of SMs busy
    transfer_seconds: float  # the CPU tier's KV over PCIe
    seconds: float  # the step's duration: host overhead + GPU time + the transfer not hidden behind it


def step_cost(
    config: EngineConfig, scenario: Scenario, load: StepLoad, kv_bytes_per_token: float, rng: random.Random
) -> StepCost:
    """The step's cost on each GPU (tensor parallel: its share of the weights, KV and FLOPs, and
    the all-reduces); draws its jitter (and the host overhead's) from ``rng``."""
    cfg = config
    flops = forward_flops(cfg.shape, load.new_tokens, load.attended / load.new_tokens) / cfg.tensor_parallel
    hbm_bytes = (
        cfg.weight_bytes_per_gpu + load.kv_read_tokens * kv_bytes_per_token + cfg.activation_bytes(load.prefill_tokens)
    )
    t_mem = hbm_bytes / (cfg.gpu.peak_bandwidth * cfg.memory_efficiency)
    t_compute = flops / (cfg.peak_flops * cfg.compute_efficiency)
    jitter = max(0.5, 1.0 + rng.gauss(0.0, cfg.step_jitter))
    t_gpu = max(t_mem, t_compute) * jitter
    t_transfer = 0.0
    if load.host_load_bytes:
        t_transfer = cfg.host_copy_seconds(load.host_load_bytes)
    stall = max(0.0, t_transfer - scenario.transfer_overlap * t_gpu)
    t_host = cfg.step_overhead_seconds
    if scenario.host_overhead_seconds:
        t_host += scenario.host_overhead_seconds * max(0.5, 1.0 + rng.gauss(0.0, 0.08))
    compute_share = t_compute / max(t_mem, t_compute)
    return StepCost(
        flops=flops,
        hbm_bytes=hbm_bytes,
        gpu_seconds=t_gpu,
        sm_busy_seconds=t_gpu * max(cfg.sm_floor, compute_share),
        transfer_seconds=t_transfer,
        seconds=t_host + t_gpu + cfg.all_reduce_seconds(load.sequences) + stall,
    )


@dataclass
class GpuCounters:
    """Cumulative GPU activity since start; two readings give GPM-style ratios and rates."""

    time: float  # the simulation time these totals are good to
    dram_bytes: float = 0.0  # bytes read and written in HBM
    sm_active_seconds: float = 0.0  # integral of the share of SMs busy
    pcie_rx_bytes: float = 0.0  # host -> device
    pcie_tx_bytes: float = 0.0  # device -> host

    def add_step(self, load: StepLoad, cost: StepCost) -> None:
        self.dram_bytes += cost.hbm_bytes
        self.sm_active_seconds += cost.sm_busy_seconds
        self.pcie_rx_bytes += load.host_load_bytes + TOKEN_ID_BYTES * load.new_tokens
        self.pcie_tx_bytes += TOKEN_ID_BYTES * load.sequences  # the sampled token ids
