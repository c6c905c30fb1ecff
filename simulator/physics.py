"""The simulated engine: a vLLM-V1-like scheduler stepping over the ledger's roofline.

One engine step (what vLLM calls a scheduler iteration) is simulated at a time:

1. The scheduler serves running requests oldest first (one decode token each, or the next chunk
   of an unfinished prefill) within ``max_num_batched_tokens``. When a request needs a KV block and
   none is free, the newest running request is preempted: its blocks are freed and it goes back
   to the front of the queue to be recomputed (vLLM V1 preempts by recompute). Only then, and
   only if nothing was preempted, waiting requests are admitted first come first served, while
   their whole prompt fits with a small watermark left free for decode growth (what vLLM's V0
   block manager did; V1 allocates chunk by chunk and has no watermark, which preempts more).
2. The step's cost comes from the ledger (rules/ledger.py): HBM bytes = weights + the KV of every
   scheduled sequence (+ prefill activations), FLOPs = ``forward_flops``; the GPU time is the
   roofline max of bytes / (peak bandwidth x efficiency) and FLOPs / (peak FLOP/s x efficiency).
   KV loaded from the CPU tier crosses PCIe (``host_transfer_seconds``); what is not hidden behind
   the step's GPU time stalls it. Host overhead (scheduler, detokenisation) is added on top.
3. Time moves by the step's duration; every decode token observes its inter-token latency (a
   request resumed after preemption observes the whole stall, which is what bends the ITL curve
   into a knee), finished requests observe their request histograms.

The engine keeps vLLM's own counters and histograms (cumulative, with vLLM's bucket boundaries)
in ``VllmStats``; the GPU's cumulative DRAM bytes, SM-busy seconds and PCIe bytes in ``GpuCounters``
(the simulated GPU collector turns two readings into GPM-style ratios, as NVML GPM does).

Deterministic: all randomness comes from one ``random.Random(seed)``, and the state at a time
depends only on the seed, the start time and when scenarios were switched, not on how often it
was read. Time is whatever the injected ``clock`` says (``time.time`` by default).
"""

from __future__ import annotations

import bisect
import math
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from kvdoctor.rules.ledger import (
    DEFAULT_HOST_BANDWIDTH,
    GPU_CATALOGUE,
    GpuSpec,
    ModelShape,
    dtype_bytes,
    forward_flops,
    host_transfer_seconds,
    kv_bytes_per_token,
    kv_pool_bytes,
)

from .scenarios import CYCLE, CYCLE_PERIOD_SECONDS, Scenario, scenario_at

GIB = 1024**3

# vLLM 0.32's bucket boundaries (tests/fixtures/vllm-0.32-cpu), by histogram family.
_TOKENS_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0)
_REQUEST_SECONDS_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
_ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
HISTOGRAM_BUCKETS: dict[str, tuple[float, ...]] = {
    "vllm:request_prompt_tokens": _TOKENS_BUCKETS,
    "vllm:request_generation_tokens": _TOKENS_BUCKETS,
    "vllm:iteration_tokens_total": (
        1.0,
        8.0,
        16.0,
        32.0,
        64.0,
        128.0,
        256.0,
        512.0,
        1024.0,
        2048.0,
        4096.0,
        8192.0,
        16384.0,
    ),
    "vllm:request_max_num_generation_tokens": _TOKENS_BUCKETS,
    "vllm:request_params_n": (1.0, 2.0, 5.0, 10.0, 20.0),
    "vllm:request_params_max_tokens": _TOKENS_BUCKETS,
    "vllm:time_to_first_token_seconds": (
        0.001,
        0.005,
        0.01,
        0.02,
        0.04,
        0.06,
        0.08,
        0.1,
        0.25,
        0.5,
        0.75,
        1.0,
        2.5,
        5.0,
        7.5,
        10.0,
        20.0,
        40.0,
        80.0,
        160.0,
        640.0,
        2560.0,
    ),
    "vllm:inter_token_latency_seconds": _ITL_BUCKETS,
    "vllm:request_time_per_output_token_seconds": _ITL_BUCKETS,
    "vllm:e2e_request_latency_seconds": _REQUEST_SECONDS_BUCKETS,
    "vllm:request_queue_time_seconds": _REQUEST_SECONDS_BUCKETS,
    "vllm:request_inference_time_seconds": _REQUEST_SECONDS_BUCKETS,
    "vllm:request_prefill_time_seconds": _REQUEST_SECONDS_BUCKETS,
    "vllm:request_decode_time_seconds": _REQUEST_SECONDS_BUCKETS,
    "vllm:request_num_preemptions": (1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0),
    "vllm:request_prefill_kv_computed_tokens": _TOKENS_BUCKETS,
}

FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHE_TIERS = ("device", "host", "p2p", "disk", "external_unspecified")
TRANSFER_TYPES = ("CPU_to_GPU", "GPU_to_CPU")
ADMISSION_REJECTION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")

# NVML names of the catalogue's GPUs, for the simulated GPU's ``model`` label.
NVML_NAMES = {
    "A100-40GB": "NVIDIA A100-SXM4-40GB",
    "A100-80GB": "NVIDIA A100-SXM4-80GB",
    "A100-80GB-PCIE": "NVIDIA A100 80GB PCIe",
    "H100": "NVIDIA H100 80GB HBM3",
    "H100-NVL": "NVIDIA H100 NVL",
    "H200": "NVIDIA H200",
    "L40S": "NVIDIA L40S",
    "L4": "NVIDIA L4",
    "B200": "NVIDIA B200",
}


# The served model's Hugging Face config.json (meta-llama/Llama-2-7b-chat-hf): the demo hands it to
# the exporter as --model-config, so the exporter's ledger sees the same shape as the physics.
LLAMA_2_7B_CONFIG: dict = {
    "_name_or_path": "meta-llama/Llama-2-7b-chat-hf",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "max_position_embeddings": 4096,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "vocab_size": 32000,
}


@dataclass(frozen=True)
class EngineConfig:
    """The simulated deployment: model, GPU and the engine flags that matter to the physics.

    The default is Llama-2-7B (32 KV heads: 512 KiB of KV per token, 4x Llama-3.1-8B's) on one
    H100 SXM with vLLM's defaults: the pool holds ~100k tokens, so every KV effect shows within
    seconds, and the "use a GQA model" advice has something to say.
    """

    model_name: str = "meta-llama/Llama-2-7b-chat-hf"
    # The model: its config.json, or only its shape (then there is no config.json to hand out).
    # With neither, Llama-2-7B.
    model_config: Mapping | None = None
    shape: ModelShape | None = None
    gpu: GpuSpec = GPU_CATALOGUE["H100"]
    gpu_memory_utilization: float = 0.9
    activation_reserve_bytes: float = 3.0e9  # activations, CUDA graphs, sampler: not KV
    cuda_context_bytes: float = 0.55e9  # memory used outside the engine's share
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 4096
    kv_cache_dtype: str = "auto"
    memory_efficiency: float = 0.92  # share of peak HBM bandwidth a memory-bound step reaches
    compute_efficiency: float = 0.6  # share of peak FLOP/s a compute-bound step reaches
    pcie_efficiency: float = 0.8  # share of PCIe peak a bulk KV copy reaches
    host_bandwidth: float = DEFAULT_HOST_BANDWIDTH
    step_overhead_seconds: float = 0.0006  # scheduling and launches per step (CUDA graphs)
    sm_floor: float = 0.3  # SM activity of a memory-bound step: kernels resident, waiting on DRAM
    admission_watermark: float = 0.01  # share of blocks kept free when admitting
    step_jitter: float = 0.03  # relative standard deviation of a step's GPU time
    cpu_offload_bytes: float = 64 * GIB  # the offloading connector's CPU tier

    def __post_init__(self) -> None:
        if self.model_config is None and self.shape is None:
            object.__setattr__(self, "model_config", dict(LLAMA_2_7B_CONFIG))
        if self.shape is None:
            object.__setattr__(self, "shape", ModelShape.from_hf_config(dict(self.model_config), name=self.model_name))

    @property
    def kv_bytes_per_token(self) -> float:
        dtype = None if self.kv_cache_dtype == "auto" else self.kv_cache_dtype
        return kv_bytes_per_token(self.shape, dtype)

    @property
    def kv_pool_bytes(self) -> float:
        return kv_pool_bytes(self.shape, self.gpu, self.gpu_memory_utilization, self.activation_reserve_bytes)

    @property
    def num_gpu_blocks(self) -> int:
        return int(self.kv_pool_bytes // (self.kv_bytes_per_token * self.block_size))

    @property
    def capacity_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size

    @property
    def num_cpu_blocks(self) -> int:
        return int(self.cpu_offload_bytes // (self.kv_bytes_per_token * self.block_size))

    @property
    def gpu_name(self) -> str:
        return NVML_NAMES.get(self.gpu.name, f"NVIDIA {self.gpu.name}")

    @property
    def peak_flops(self) -> float:
        return self.gpu.peak_flops or 100e12

    @property
    def memory_used_bytes(self) -> float:
        """vLLM takes its whole share up front: weights, activations and the KV pool."""
        return self.gpu.memory_bytes * self.gpu_memory_utilization + self.cuda_context_bytes

    def activation_bytes(self, prefill_tokens: float) -> float:
        """HBM traffic of prefill activations: each layer reads and writes the hidden state a few
        times and the MLP's intermediate once (a rough constant; decode's is negligible)."""
        s = self.shape
        inter = 2.7 * s.hidden_size  # ~intermediate_size of Llama-style MLPs
        return prefill_tokens * s.num_layers * (8 * s.hidden_size + 3 * inter) * dtype_bytes(s.dtype)


class Histogram:
    """A cumulative Prometheus histogram: counts per bucket (``le`` inclusive) plus sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Iterable[float]):
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # last one is +Inf
        self.sum = 0.0

    def observe(self, value: float, n: int = 1) -> None:
        if n <= 0:
            return
        self.counts[bisect.bisect_left(self.bounds, value)] += n
        self.sum += value * n

    @property
    def count(self) -> int:
        return sum(self.counts)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Histogram):
            return NotImplemented
        return (self.bounds, self.counts, self.sum) == (other.bounds, other.counts, other.sum)

    __hash__ = None  # mutable

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, cumulative count) pairs, +Inf last."""
        out, running = [], 0
        for bound, n in zip((*self.bounds, math.inf), self.counts):
            running += n
            out.append((bound, running))
        return out


@dataclass
class VllmStats:
    """vLLM's metrics, as the engine would count them. Keys are family names."""

    counters: dict[str, float] = field(default_factory=dict)
    labelled: dict[str, dict[str, float]] = field(default_factory=dict)  # family -> label value -> count
    histograms: dict[str, Histogram] = field(default_factory=dict)

    @classmethod
    def new(cls) -> VllmStats:
        stats = cls()
        for name in (
            "vllm:num_preemptions",
            "vllm:prompt_tokens",
            "vllm:generation_tokens",
            "vllm:prefix_cache_queries",
            "vllm:prefix_cache_hits",
            "vllm:external_prefix_cache_queries",
            "vllm:external_prefix_cache_hits",
            "vllm:mm_cache_queries",
            "vllm:mm_cache_hits",
            "vllm:prompt_tokens_cached",
            "vllm:estimated_flops_per_gpu",
            "vllm:estimated_read_bytes_per_gpu",
            "vllm:estimated_write_bytes_per_gpu",
        ):
            stats.counters[name] = 0.0
        stats.labelled["vllm:request_success"] = dict.fromkeys(FINISHED_REASONS, 0.0)
        stats.labelled["vllm:prompt_tokens_by_source"] = dict.fromkeys(PROMPT_SOURCES, 0.0)
        stats.labelled["vllm:prompt_tokens_cached_by_source"] = dict.fromkeys(CACHE_TIERS, 0.0)
        stats.labelled["vllm:admission_rejections"] = dict.fromkeys(ADMISSION_REJECTION_REASONS, 0.0)
        stats.labelled["vllm:kv_offload_total_bytes"] = dict.fromkeys(TRANSFER_TYPES, 0.0)
        stats.labelled["vllm:kv_offload_total_time"] = dict.fromkeys(TRANSFER_TYPES, 0.0)
        stats.histograms = {name: Histogram(bounds) for name, bounds in HISTOGRAM_BUCKETS.items()}
        return stats

    def add(self, name: str, value: float) -> None:
        self.counters[name] += value

    def add_labelled(self, name: str, label: str, value: float) -> None:
        self.labelled[name][label] += value

    def observe(self, name: str, value: float, n: int = 1) -> None:
        self.histograms[name].observe(value, n)


@dataclass
class GpuCounters:
    """Cumulative GPU activity since start; two readings give GPM-style ratios and rates."""

    time: float  # the simulation time these totals are good to
    dram_bytes: float = 0.0  # bytes read and written in HBM
    sm_active_seconds: float = 0.0  # integral of the share of SMs busy
    pcie_rx_bytes: float = 0.0  # host -> device
    pcie_tx_bytes: float = 0.0  # device -> host


@dataclass
class EngineState:
    """An instant of the engine, as its gauges would read."""

    time: float
    scenario: str
    running: int
    waiting: int
    kv_usage: float
    used_blocks: int


class Request:
    __slots__ = (
        "arrival",
        "computed",
        "counted",
        "epoch",
        "first_scheduled",
        "first_token",
        "generated",
        "holds_shared",
        "host",
        "id",
        "last_token",
        "output",
        "preemptions",
        "private_blocks",
        "prompt",
        "shared",
        "target",
    )

    def __init__(self, rid: int, epoch: int, arrival: float, prompt: int, output: int, shared: int, host: int):
        self.id = rid
        self.epoch = epoch
        self.arrival = arrival
        self.prompt = prompt
        self.output = output
        self.shared = shared  # tokens of the shared (device-cached) prefix
        self.host = host  # tokens whose KV comes from the CPU tier
        self.computed = 0  # tokens with KV on the GPU
        self.target = prompt  # tokens the current prefill brings the KV up to
        self.generated = 0
        self.private_blocks = 0
        self.holds_shared = False
        self.first_scheduled: float | None = None
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.preemptions = 0
        self.counted = False  # prompt statistics are counted once, at the first admission

    @property
    def prefilling(self) -> bool:
        return self.computed < self.target


class Simulation:
    """The simulated engine and its GPU. Thread-safe: every public method takes the lock.

    ``warmup`` seconds of simulated traffic are run at construction, so the first scrape already
    shows the scenario's steady state (as if the engine had been serving for a while).
    """

    def __init__(
        self,
        scenario: str = "healthy",
        seed: int = 0,
        config: EngineConfig | None = None,
        clock: Callable[[], float] = time.time,
        warmup: float = 20.0,
        cycle_period: float = CYCLE_PERIOD_SECONDS,
    ):
        self.config = config or EngineConfig()
        if self.config.num_gpu_blocks < 2:
            raise ValueError(f"{self.config.shape.name} leaves no room for a KV cache on {self.config.gpu.name}")
        self.seed = seed
        self.cycle_period = cycle_period
        self._clock = clock
        self._lock = threading.RLock()
        self._rng = random.Random(seed)

        self.started = clock()  # wall time the scenario clock counts from (the cycle starts here)
        self.now = self.started - max(0.0, warmup)
        self.created = self.now  # what the engine reports as its metrics' creation time
        self.stats = VllmStats.new()
        self.gpu = GpuCounters(time=self.now)

        cfg = self.config
        self._kv_bytes = cfg.kv_bytes_per_token
        self._total_blocks = cfg.num_gpu_blocks
        # vLLM reserves one null block; usage is reported against the rest (see the fixtures).
        self._usable_blocks = self._total_blocks - 1
        self._watermark_blocks = int(cfg.admission_watermark * self._usable_blocks)
        self._free_blocks = self._usable_blocks
        self._shared_refs = 0
        self._shared_blocks = 0
        self.running: list[Request] = []
        self.waiting: deque[Request] = deque()
        self._next_id = 0
        self._epoch = 0
        self._in_flight = 0  # closed-loop clients' outstanding requests of this epoch
        self._next_arrival: float | None = None
        self._selection = scenario
        self._selected_at = self.started
        self._active = scenario_at(scenario, 0.0, cycle_period)
        self._first_wave = 0  # closed-loop requests still to create with spread-out lengths
        self._preempted_this_step = False
        self.steps = 0
        self._switch(self._active)
        self.advance_to(clock())

    # ------------------------------------------------------------------ public
    @property
    def scenario(self) -> str:
        """The selected scenario name (``cycle`` while cycling)."""
        return self._selection

    @property
    def active_scenario(self) -> Scenario:
        return self._active

    def set_scenario(self, name: str) -> None:
        """Switch the workload now: the previous clients disconnect (their requests are aborted)
        and the new ones start sending."""
        scenario_at(name, 0.0)  # validates the name
        with self._lock:
            self.advance_to(self._clock())
            self._selection = name
            self._selected_at = self.now
            self._switch(scenario_at(name, 0.0, self.cycle_period))

    def advance_to(self, t: float) -> None:
        """Simulate engine steps until time ``t`` (the last step may end a little after it)."""
        with self._lock:
            while self.now < t:
                self._follow_schedule()
                self._arrivals()
                if not self.running and not self.waiting:
                    self._idle_until(t)
                    continue
                self._step()

    def sync(self) -> None:
        """Advance to the clock's now."""
        self.advance_to(self._clock())

    def state(self) -> EngineState:
        with self._lock:
            used = self._usable_blocks - self._free_blocks
            return EngineState(
                self.now, self._active.name, len(self.running), len(self.waiting), used / self._usable_blocks, used
            )

    def gpu_reading(self) -> GpuCounters:
        """A copy of the cumulative GPU counters (advance first with ``sync``)."""
        with self._lock:
            g = self.gpu
            return GpuCounters(g.time, g.dram_bytes, g.sm_active_seconds, g.pcie_rx_bytes, g.pcie_tx_bytes)

    def snapshot(self) -> tuple[EngineState, VllmStats]:
        """The gauges and a deep copy of the counters, consistent with each other."""
        with self._lock:
            stats = VllmStats(
                counters=dict(self.stats.counters),
                labelled={k: dict(v) for k, v in self.stats.labelled.items()},
                histograms={},
            )
            for name, h in self.stats.histograms.items():
                copy = Histogram(h.bounds)
                copy.counts = list(h.counts)
                copy.sum = h.sum
                stats.histograms[name] = copy
            return self.state(), stats

    # ------------------------------------------------------------------ workload
    def _follow_schedule(self) -> None:
        if self._selection != CYCLE:
            return
        due = scenario_at(CYCLE, self.now - self._selected_at, self.cycle_period)
        if due.name != self._active.name:
            self._switch(due)

    def _switch(self, scenario: Scenario) -> None:
        aborted = list(self.running) + list(self.waiting)
        for req in self.running:
            self._release(req)
        self.running.clear()
        self.waiting.clear()
        if aborted:
            self.stats.add_labelled("vllm:request_success", "abort", len(aborted))
        self._epoch += 1
        self._in_flight = 0
        self._active = scenario
        self._next_arrival = self.now if scenario.arrival_rate > 0 else None
        self._first_wave = scenario.clients if scenario.arrival_rate <= 0 else 0

    def _new_request(self, at: float) -> Request:
        s = self._active
        rng = self._rng

        def draw(mean: int) -> int:
            return max(1, int(round(mean * (1.0 + rng.uniform(-s.length_jitter, s.length_jitter)))))

        prompt = min(draw(s.prompt_tokens), self.config.max_model_len - 1)
        output = draw(s.output_tokens)
        if self._first_wave:
            # Clients that all start at the same instant would finish in lockstep for the rest
            # of the run; a real fleet never is, so the first wave's answers are spread out.
            self._first_wave -= 1
            output = max(1, int(output * rng.uniform(0.05, 1.0)))
        output = max(1, min(output, self.config.max_model_len - prompt))
        bs = self.config.block_size
        shared = min(s.shared_prefix_tokens, prompt - 1) // bs * bs  # whole blocks are shared
        host = max(0, min(s.host_prefix_tokens, prompt - 1 - shared))
        self._next_id += 1
        return Request(self._next_id, self._epoch, at, prompt, output, shared, host)

    def _arrivals(self) -> None:
        s = self._active
        if s.arrival_rate > 0:
            while self._next_arrival is not None and self._next_arrival <= self.now:
                if len(self.waiting) >= s.max_waiting:
                    self.stats.add_labelled("vllm:admission_rejections", "max_num_queued_reqs", 1)
                else:
                    self.waiting.append(self._new_request(self._next_arrival))
                self._next_arrival += self._rng.expovariate(s.arrival_rate)
        else:
            while self._in_flight < s.clients:
                self.waiting.append(self._new_request(self.now))
                self._in_flight += 1

    def _idle_until(self, t: float) -> None:
        """Nothing to run: time passes with the GPU idle, until ``t`` or the next arrival."""
        nxt = self._next_arrival
        self.now = min(t, nxt) if nxt is not None and nxt > self.now else max(self.now, t)
        self.gpu.time = self.now

    # ------------------------------------------------------------------ KV blocks
    def _blocks_needed(self, req: Request, computed: int) -> int:
        """Blocks ``req`` must newly take to hold ``computed`` tokens: its private blocks, plus the
        shared prefix's blocks when it is the first running request to reference them."""
        bs = self.config.block_size
        private = -(-max(0, computed - req.shared) // bs) - req.private_blocks
        shared = req.shared // bs if req.shared and not req.holds_shared and self._shared_refs == 0 else 0
        return max(0, private) + shared

    def _allocate(self, req: Request, computed: int) -> bool:
        """Give ``req`` blocks for ``computed`` tokens; False (nothing taken) if they do not fit."""
        need = self._blocks_needed(req, computed)
        if need > self._free_blocks:
            return False
        if req.shared and not req.holds_shared:
            if self._shared_refs == 0:
                self._shared_blocks = req.shared // self.config.block_size
            self._shared_refs += 1
            req.holds_shared = True
        self._free_blocks -= need
        req.private_blocks = max(req.private_blocks, -(-max(0, computed - req.shared) // self.config.block_size))
        return True

    def _release(self, req: Request) -> None:
        self._free_blocks += req.private_blocks
        req.private_blocks = 0
        if req.holds_shared:
            req.holds_shared = False
            self._shared_refs -= 1
            if self._shared_refs == 0:
                self._free_blocks += self._shared_blocks
                self._shared_blocks = 0
        req.computed = 0

    def _make_room(self, req: Request, computed: int) -> bool:
        """Allocate for ``req``, preempting the newest running requests until it fits; False if
        ``req`` itself had to go (it was the newest)."""
        while not self._allocate(req, computed):
            victim = self.running[-1]
            self._preempt(victim)
            if victim is req:
                return False
        return True

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self._release(req)
        req.preemptions += 1
        req.target = req.prompt + req.generated  # recompute everything it had
        self.waiting.appendleft(req)
        self.stats.add("vllm:num_preemptions", 1)
        self._preempted_this_step = True

    # ------------------------------------------------------------------ one step
    def _step(self) -> None:
        cfg = self.config
        s = self._active
        budget = cfg.max_num_batched_tokens
        scheduled: list[tuple[Request, int]] = []
        self._preempted_this_step = False

        # 1. running requests, oldest first; preempt the newest when blocks run out
        bs = cfg.block_size
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            if req.computed < req.target:  # an unfinished prefill: its next chunk
                n = min(req.target - req.computed, budget)
                room = self._make_room(req, req.computed + n)
            else:  # decode: one token, a new block only when the last one is full
                n = 1
                room = (req.computed - req.shared) % bs != 0 or self._make_room(req, req.computed + 1)
            if not room:
                break  # it preempted itself: it was the newest, nothing runs after it
            scheduled.append((req, n))
            budget -= n
            i += 1

        # 2. admit waiting requests, first come first served (not in a step that had to preempt:
        #    the pool is exhausted). Like vLLM's V0 block manager, admission reserves the whole
        #    prompt and keeps a watermark of blocks free for the running requests' decode growth.
        load_bytes = 0.0
        if not self._preempted_this_step:
            while self.waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
                req = self.waiting[0]
                start = req.shared + req.host  # found in the prefix cache / loaded from the CPU tier
                n = min(req.target - start, budget)
                if self._free_blocks - self._blocks_needed(req, req.target) < self._watermark_blocks:
                    break
                self._allocate(req, req.target)
                self.waiting.popleft()
                req.computed = start
                load_bytes += req.host * self._kv_bytes
                if req.first_scheduled is None:
                    req.first_scheduled = self.now
                self._count_admission(req)
                self.running.append(req)
                scheduled.append((req, n))
                budget -= n

        if not scheduled:
            # nothing fits and nothing runs: wait for the next arrival (or a little while)
            self._idle_until(self.now + 0.01)
            return

        # 3. cost, from the ledger
        kv_read_tokens = 0  # every scheduled sequence's attention reads all its KV
        attended = 0.0  # sum over new tokens of the tokens each attends to
        prefill_tokens = 0
        for req, n in scheduled:
            kv_read_tokens += req.computed + n
            attended += n * (req.computed + n / 2.0)
            if req.computed < req.target:
                prefill_tokens += n
        new_tokens = cfg.max_num_batched_tokens - budget
        decode_tokens = new_tokens - prefill_tokens
        flops = forward_flops(cfg.shape, new_tokens, attended / new_tokens)
        weights = cfg.shape.weight_bytes
        hbm_bytes = weights + kv_read_tokens * self._kv_bytes + cfg.activation_bytes(prefill_tokens)
        t_mem = hbm_bytes / (cfg.gpu.peak_bandwidth * cfg.memory_efficiency)
        t_compute = flops / (cfg.peak_flops * cfg.compute_efficiency)
        jitter = max(0.5, 1.0 + self._rng.gauss(0.0, cfg.step_jitter))
        t_gpu = max(t_mem, t_compute) * jitter
        t_transfer = 0.0
        if load_bytes:
            t_transfer = host_transfer_seconds(
                load_bytes, cfg.host_bandwidth, cfg.gpu.pcie_bandwidth * cfg.pcie_efficiency
            )
        stall = max(0.0, t_transfer - s.transfer_overlap * t_gpu)
        t_host = cfg.step_overhead_seconds
        if s.host_overhead_seconds:
            t_host += s.host_overhead_seconds * max(0.5, 1.0 + self._rng.gauss(0.0, 0.08))
        dt = t_host + t_gpu + stall

        # 4. the GPU's view
        compute_share = t_compute / max(t_mem, t_compute)
        self.gpu.dram_bytes += hbm_bytes
        self.gpu.sm_active_seconds += t_gpu * max(cfg.sm_floor, compute_share)
        self.gpu.pcie_rx_bytes += load_bytes + 4.0 * (decode_tokens + prefill_tokens)  # + token ids
        self.gpu.pcie_tx_bytes += 4.0 * len(scheduled)  # sampled token ids
        if load_bytes:
            self.stats.add_labelled("vllm:kv_offload_total_bytes", "CPU_to_GPU", load_bytes)
            self.stats.add_labelled("vllm:kv_offload_total_time", "CPU_to_GPU", t_transfer)
        self.stats.add("vllm:estimated_flops_per_gpu", flops)
        self.stats.add("vllm:estimated_read_bytes_per_gpu", hbm_bytes)
        self.stats.add("vllm:estimated_write_bytes_per_gpu", (decode_tokens + prefill_tokens) * self._kv_bytes)
        self.stats.observe("vllm:iteration_tokens_total", decode_tokens + prefill_tokens)

        step_start = self.now
        self.now += dt
        self.gpu.time = self.now
        self.steps += 1
        self._finish_step(scheduled, step_start)

    def _count_admission(self, req: Request) -> None:
        st = self.stats
        local_hit = req.shared
        st.add("vllm:prefix_cache_queries", req.target)
        st.add("vllm:prefix_cache_hits", local_hit)
        # the offloading connector is configured: what the device cache misses is looked up there
        st.add("vllm:external_prefix_cache_queries", req.target - local_hit)
        st.add("vllm:external_prefix_cache_hits", req.host)
        if req.counted:
            return  # a resumed request: vLLM does not count recomputed prompt tokens again
        req.counted = True
        computed = req.prompt - req.shared - req.host
        st.add("vllm:prompt_tokens", req.prompt)
        st.add_labelled("vllm:prompt_tokens_by_source", "local_compute", computed)
        st.add_labelled("vllm:prompt_tokens_by_source", "local_cache_hit", req.shared)
        st.add_labelled("vllm:prompt_tokens_by_source", "external_kv_transfer", req.host)
        st.add("vllm:prompt_tokens_cached", req.shared + req.host)
        st.add_labelled("vllm:prompt_tokens_cached_by_source", "device", req.shared)
        st.add_labelled("vllm:prompt_tokens_cached_by_source", "host", req.host)
        st.observe("vllm:request_queue_time_seconds", self.now - req.arrival)
        st.observe("vllm:request_prefill_kv_computed_tokens", computed)

    def _finish_step(self, scheduled: list[tuple[Request, int]], step_start: float) -> None:
        now = self.now
        st = self.stats
        itl = st.histograms["vllm:inter_token_latency_seconds"]
        same_step = 0  # decode tokens whose previous token came at the end of the previous step
        tokens = 0
        finished: list[Request] = []
        for req, n in scheduled:
            was_prefilling = req.computed < req.target
            req.computed += n
            if req.computed < req.target:
                continue  # more prefill chunks to go: no token this step
            req.target = req.computed
            if req.first_token is None:  # the prefill just finished: the first token
                req.first_token = now
                st.observe("vllm:time_to_first_token_seconds", now - req.arrival)
            elif not was_prefilling and req.last_token == step_start:
                same_step += 1
            else:  # resumed after a preemption (or after waiting out a step): the whole stall
                itl.observe(now - req.last_token)
            req.last_token = now
            req.generated += 1
            tokens += 1
            if req.generated >= req.output:
                finished.append(req)
        itl.observe(now - step_start, same_step)
        st.add("vllm:generation_tokens", tokens)
        for req in finished:
            self._finish(req)

    def _finish(self, req: Request) -> None:
        now = self.now
        st = self.stats
        self.running.remove(req)
        self._release(req)
        if req.epoch == self._epoch and self._active.arrival_rate <= 0:
            self._in_flight -= 1
        st.add_labelled("vllm:request_success", "length", 1)
        st.observe("vllm:e2e_request_latency_seconds", now - req.arrival)
        st.observe("vllm:request_inference_time_seconds", now - req.first_scheduled)
        st.observe("vllm:request_prefill_time_seconds", req.first_token - req.first_scheduled)
        st.observe("vllm:request_decode_time_seconds", now - req.first_token)
        st.observe("vllm:request_prompt_tokens", req.prompt)
        st.observe("vllm:request_generation_tokens", req.generated)
        st.observe("vllm:request_max_num_generation_tokens", req.output)
        st.observe("vllm:request_params_n", 1)
        st.observe("vllm:request_params_max_tokens", req.output)
        st.observe("vllm:request_num_preemptions", req.preemptions)
        if req.generated > 1:
            st.observe("vllm:request_time_per_output_token_seconds", (now - req.first_token) / (req.generated - 1))
        if self._active.offload_store:
            # the offloading connector writes the request's new KV to the CPU tier (async, hidden)
            stored = (req.prompt + req.generated - req.host - req.shared) * self._kv_bytes
            st.add_labelled("vllm:kv_offload_total_bytes", "GPU_to_CPU", stored)
            st.add_labelled(
                "vllm:kv_offload_total_time",
                "GPU_to_CPU",
                host_transfer_seconds(
                    stored, self.config.host_bandwidth, self.config.gpu.pcie_bandwidth * self.config.pcie_efficiency
                ),
            )
            self.gpu.pcie_tx_bytes += stored
