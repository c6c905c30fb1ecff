"""The ledger: the bandwidth and capacity arithmetic that says how fast decode *can* be.

Every decode step re-reads the weights it uses and the KV cache of every running sequence, so

    KV bytes per token    = 2 (K and V) x layers x KV heads x head_dim x bytes per element
                            (MLA: layers x (kv_lora_rank + qk_rope_head_dim) x bytes per element)
    weight bytes per step = all weights (dense); for a mixture of experts: the shared weights +
                            E x (1 - (1 - k/E)^B) distinct experts per MoE layer at batch B
    decode step floor     = (weight bytes per step + live KV bytes) / peak DRAM bandwidth, per GPU
    tokens/s ceiling      = 1 / floor per sequence (the batch shares the step)
    host transfer time    = bytes / min(host memory bandwidth, the GPU's host link)

Tensor parallelism over N GPUs splits the weights and the KV heads; where a model has fewer KV
heads than N each GPU keeps one (replicated), and an MLA latent is replicated on every GPU (as
vLLM does). The KV pool is counted as vLLM counts it (``kv_capacity``). Pure functions, no I/O;
the GPU catalogue is ``ledger/gpus.py``, the model's shape ``ledger/model.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from kvdoctor.signals.units import GB

from .gpus import PCIE_X16_BANDWIDTH, GpuSpec
from .model import ModelShape, dtype_bytes

PCIE4_X16 = PCIE_X16_BANDWIDTH[4]
PCIE5_X16 = PCIE_X16_BANDWIDTH[5]
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's --gpu-memory-utilization default
DEFAULT_BLOCK_SIZE = 16  # vLLM's KV block size on CUDA (the CPU build uses 128)
# Host side of a KV transfer: 8 channels of DDR5-4800 (38.4 GB/s each); PCIe is usually the limit.
DEFAULT_HOST_BANDWIDTH = 8 * 38.4 * GB
MAX_TENSOR_PARALLEL = 64
ALL_REDUCES_PER_LAYER = 2  # after attention and after the MLP


# ----------------------------------------------------------------------------- per token, per step


def kv_dtype_name(shape: ModelShape, kv_dtype: str | None) -> str:
    """The KV cache's dtype: ``kv_dtype``, or the model's for None, "" and vLLM's "auto"."""
    if kv_dtype in (None, "", "auto"):
        kv_dtype = shape.dtype
    return str(kv_dtype).lower().removeprefix("torch.")


def kv_bytes_per_token(shape: ModelShape, kv_dtype: str | None = None) -> float:
    """KV-cache bytes one token occupies, all layers, each KV head counted once."""
    elem = dtype_bytes(kv_dtype_name(shape, kv_dtype))
    if shape.kv_latent_dim:
        return shape.num_layers * shape.kv_latent_dim * elem
    return 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * elem


def check_tensor_parallel(shape: ModelShape, tp: int) -> None:
    """``ValueError`` unless vLLM can split ``shape`` over ``tp`` GPUs: ``tp`` divides the
    attention heads, and divides the KV heads or is a multiple of them."""
    if tp < 1:
        raise ValueError("--tp must be at least 1")
    heads, kv = shape.num_attention_heads, shape.num_kv_heads
    if heads % tp:
        raise ValueError(f"--tp {tp} does not divide the model's {heads} attention heads (vLLM requires it)")
    if not shape.kv_latent_dim and kv % tp and tp % kv:
        raise ValueError(f"--tp {tp} neither divides the model's {kv} KV heads nor is a multiple of them")


def tensor_parallel_sizes(shape: ModelShape, up_to: int = MAX_TENSOR_PARALLEL) -> list[int]:
    """The --tp values vLLM accepts for ``shape``, smallest first."""
    sizes = []
    for tp in range(1, up_to + 1):
        try:
            check_tensor_parallel(shape, tp)
        except ValueError:
            continue
        sizes.append(tp)
    return sizes


def kv_heads_per_gpu(shape: ModelShape, tp: int = 1) -> int:
    """KV heads each GPU holds: a share of them, at least one (replicated when fewer than GPUs)."""
    return max(1, shape.num_kv_heads // tp)


def kv_bytes_per_token_per_gpu(shape: ModelShape, tp: int = 1, kv_dtype: str | None = None) -> float:
    """KV-cache bytes one token occupies on each GPU of a ``tp``-way deployment."""
    if shape.kv_latent_dim or tp == 1:
        return kv_bytes_per_token(shape, kv_dtype)  # an MLA latent is replicated on every GPU
    elem = dtype_bytes(kv_dtype_name(shape, kv_dtype))
    return 2 * shape.num_layers * kv_heads_per_gpu(shape, tp) * shape.head_dim * elem


def expected_experts_touched(num_experts: int, experts_per_token: int, batch: int) -> float:
    """Distinct experts a MoE layer uses for ``batch`` tokens routed independently and uniformly,
    ``experts_per_token`` each: E x (1 - (1 - k/E)^B)."""
    if num_experts <= 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - experts_per_token / num_experts) ** max(0, batch))


def weight_bytes_per_step(shape: ModelShape, batch: int = 1) -> float:
    """Weight bytes one decode step of ``batch`` sequences reads, the whole model over all GPUs:
    every weight for a dense model; the shared weights plus the experts touched for a MoE."""
    if not shape.is_moe:
        return shape.weight_bytes
    shared = max(0.0, shape.weight_bytes - shape.routed_expert_bytes)
    touched = expected_experts_touched(shape.num_experts, shape.experts_per_token, batch)
    return shared + shape.moe_layers * touched * shape.expert_bytes


def decode_step_floor(weight_bytes: float, live_kv_bytes: float, peak_bandwidth: float) -> float:
    """Seconds: the fastest one decode step can be when bound by DRAM bandwidth."""
    if peak_bandwidth <= 0:
        raise ValueError("peak bandwidth must be positive")
    return (weight_bytes + live_kv_bytes) / peak_bandwidth


def host_transfer_seconds(nbytes: float, host_bandwidth: float, pcie_bandwidth: float) -> float:
    """Seconds to move ``nbytes`` of KV from host memory to the GPU."""
    return nbytes / min(host_bandwidth, pcie_bandwidth)


@dataclass(frozen=True)
class AllReduce:
    """What tensor parallelism's all-reduces add to a decode step (bandwidth term only)."""

    count_per_step: int  # 2 per layer
    bytes_per_gpu: float  # each GPU sends 2 (N - 1) / N of every message (ring all-reduce)
    link: str  # "NVLink (450 GB/s per direction)"
    link_bandwidth: float  # bytes/s per direction
    seconds: float  # bytes / link bandwidth; each all-reduce's latency is not counted


def all_reduce_cost(shape: ModelShape, gpu: GpuSpec, batch: int, tp: int) -> AllReduce | None:
    """The all-reduce traffic of one decode step at ``tp`` > 1, over NVLink where the GPU has it."""
    if tp <= 1:
        return None
    message = batch * shape.hidden_size * dtype_bytes(shape.dtype)
    count = ALL_REDUCES_PER_LAYER * shape.num_layers
    nbytes = count * message * 2 * (tp - 1) / tp
    if gpu.nvlink_bandwidth:
        bandwidth, link = gpu.nvlink_bandwidth / 2, "NVLink"
    else:
        bandwidth, link = gpu.pcie_bandwidth, f"PCIe {gpu.pcie_generation or '?'}.0 x16"
    return AllReduce(count, nbytes, f"{link} ({bandwidth / GB:,.1f} GB/s per direction)", bandwidth, nbytes / bandwidth)


@dataclass(frozen=True)
class Ledger:
    """The ledger for one model on ``tp`` GPUs at a given context and batch (per GPU where noted)."""

    kv_bytes_per_token: float  # all layers, each KV head once
    live_kv_bytes: float  # every GPU together (replicated KV heads counted on each GPU)
    weight_bytes: float
    step_floor_seconds: float
    tokens_per_second_per_sequence: float
    tokens_per_second_total: float
    weight_bytes_per_step: float = 0.0  # the whole model; = weight_bytes for a dense model
    tp: int = 1
    kv_bytes_per_token_per_gpu: float = 0.0
    live_kv_bytes_per_gpu: float = 0.0
    weight_bytes_per_step_per_gpu: float = 0.0


def compute_ledger(
    shape: ModelShape,
    peak_bandwidth: float,
    context_tokens: int,
    batch: int = 1,
    kv_dtype: str | None = None,
    tp: int = 1,
) -> Ledger:
    """Decode floor for ``batch`` sequences each holding ``context_tokens`` of KV, on ``tp`` GPUs
    of ``peak_bandwidth`` each."""
    per_gpu_token = kv_bytes_per_token_per_gpu(shape, tp, kv_dtype)
    live_per_gpu = per_gpu_token * context_tokens * batch
    step_weights = weight_bytes_per_step(shape, batch)
    floor = decode_step_floor(step_weights / tp, live_per_gpu, peak_bandwidth)
    return Ledger(
        kv_bytes_per_token=kv_bytes_per_token(shape, kv_dtype),
        live_kv_bytes=live_per_gpu * tp,
        weight_bytes=shape.weight_bytes,
        step_floor_seconds=floor,
        tokens_per_second_per_sequence=1.0 / floor,
        tokens_per_second_total=batch / floor,
        weight_bytes_per_step=step_weights,
        tp=tp,
        kv_bytes_per_token_per_gpu=per_gpu_token,
        live_kv_bytes_per_gpu=live_per_gpu,
        weight_bytes_per_step_per_gpu=step_weights / tp,
    )


def forward_flops(shape: ModelShape, new_tokens: float, attended_tokens: float = 0.0) -> float:
    """FLOPs of one forward pass over ``new_tokens`` tokens that each attend to ``attended_tokens``
    tokens on average: 2 x parameters per token (the matmuls) plus QK^T and AV (2 x 2 x layers x
    heads x head_dim per attended token)."""
    params = shape.num_parameters or 0.0
    attention = 4.0 * shape.num_layers * shape.num_attention_heads * shape.head_dim * attended_tokens
    return new_tokens * (2.0 * params + attention)


# ---------------------------------------------------------------------------- capacity and fit


def kv_pool_bytes(
    shape: ModelShape,
    gpu: GpuSpec,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    reserve_bytes: float = 0.0,
    tp: int = 1,
) -> float:
    """Each GPU's memory left for the KV cache: the engine's share (vLLM: ceil(memory x
    utilisation)) minus that GPU's weights and a reserve (activations, CUDA graphs: vLLM profiles
    them at start). Zero when the weights alone do not fit."""
    share = math.ceil(gpu.memory_bytes * gpu_memory_utilization)
    return max(0.0, share - shape.weight_bytes / tp - reserve_bytes)


@dataclass(frozen=True)
class KvCapacity:
    """The KV pool as vLLM counts it (vllm/v1/core/kv_cache_utils.py), per GPU.

    num_blocks = pool // (block_size x KV bytes per token per GPU)   (all layers' pages of a block)
    max_concurrency = num_blocks / ceil(max_model_len / block_size)
                      -> "Maximum concurrency for {max_model_len} tokens per request: {x:.2f}x"
    tokens = int(max_concurrency x max_model_len)  -> "GPU KV cache size: {tokens:,} tokens"
    (older vLLM releases logged num_blocks x block_size: the same when block_size divides it)
    """

    pool_bytes: float
    block_size: int
    bytes_per_block: float
    num_blocks: int
    max_model_len: int
    blocks_per_sequence: int
    max_concurrency: float
    tokens: int
    sequences: int  # whole sequences of max_model_len tokens the pool holds

    def to_json(self) -> dict[str, float | int]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def kv_capacity(
    shape: ModelShape,
    pool_bytes: float,
    max_model_len: int,
    block_size: int = DEFAULT_BLOCK_SIZE,
    tp: int = 1,
    kv_dtype: str | None = None,
) -> KvCapacity:
    """How many tokens and sequences a KV pool of ``pool_bytes`` per GPU holds (vLLM's arithmetic)."""
    if block_size < 1 or max_model_len < 1:
        raise ValueError("block size and context must be positive")
    per_block = block_size * kv_bytes_per_token_per_gpu(shape, tp, kv_dtype)
    blocks = int(max(0.0, pool_bytes) // per_block)
    per_sequence = math.ceil(max_model_len / block_size)
    concurrency = blocks / per_sequence
    return KvCapacity(
        pool_bytes=pool_bytes,
        block_size=block_size,
        bytes_per_block=per_block,
        num_blocks=blocks,
        max_model_len=max_model_len,
        blocks_per_sequence=per_sequence,
        max_concurrency=concurrency,
        tokens=int(concurrency * max_model_len),
        sequences=blocks // per_sequence,
    )


@dataclass(frozen=True)
class Fit:
    """Does the deployment start at all? The weights fit each GPU's share and the KV pool holds at
    least one sequence of the context (vLLM refuses to start otherwise)."""

    fits: bool
    reason: str  # why not ("" when it fits)
    tp: int
    weight_bytes_per_gpu: float
    engine_memory_bytes: float  # each GPU's share for the engine (or weights + the asked KV memory)
    pool_source: str  # how the pool was computed
    capacity: KvCapacity
    suggested_tp: int | None = None  # the smallest --tp that fits, when this one does not


@dataclass(frozen=True)
class Deployment:
    """One model served on ``tp`` GPUs of one kind: what the fit, the what-ifs and the offload
    questions start from. ``kv_cache_memory_bytes`` (vLLM's flag) fixes each GPU's KV pool; else
    ``gpu_memory_utilization`` of its memory less its weights is the pool."""

    shape: ModelShape
    gpu: GpuSpec
    context: int
    batch: int = 1
    kv_dtype: str | None = None
    tp: int = 1
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    kv_cache_memory_bytes: float | None = None
    block_size: int = DEFAULT_BLOCK_SIZE
    host_bandwidth: float = DEFAULT_HOST_BANDWIDTH

    def pool_bytes(self) -> float:
        """Each GPU's KV pool at the utilisation's share (``kv_pool_bytes``)."""
        return kv_pool_bytes(self.shape, self.gpu, self.gpu_memory_utilization, tp=self.tp)


def check_fit(d: Deployment, suggest: bool = True) -> Fit:
    """Whether ``shape`` runs on ``tp`` GPUs at ``context`` tokens, its KV capacity, and otherwise
    the smallest ``--tp`` that would run. ``kv_cache_memory_bytes`` (vLLM's flag) fixes the pool per
    GPU; else it is the utilisation's share of memory less the weights (an upper bound: vLLM also
    subtracts the activation peak it profiles at start)."""
    shape, gpu, context, tp, block_size = d.shape, d.gpu, d.context, d.tp, d.block_size
    gpu_memory_utilization, kv_cache_memory_bytes = d.gpu_memory_utilization, d.kv_cache_memory_bytes
    check_tensor_parallel(shape, tp)
    weights = shape.weight_bytes / tp
    if kv_cache_memory_bytes is not None:
        pool = float(kv_cache_memory_bytes)
        engine = weights + pool
        source = "--kv-cache-memory-bytes"
        too_big = engine > gpu.memory_bytes
        why_not = (
            f"the weights per GPU and the KV memory asked for exceed the GPU's memory ({gpu.memory_bytes / GB:,.1f} GB)"
        )
    else:
        engine = math.ceil(gpu.memory_bytes * gpu_memory_utilization)
        pool = max(0.0, engine - weights)
        source = f"{gpu_memory_utilization:g} x GPU memory - weights per GPU (vLLM also subtracts activations)"
        too_big = weights >= engine
        why_not = (
            f"the weights per GPU ({weights / GB:,.1f} GB) exceed the engine's share of GPU memory "
            f"({gpu_memory_utilization:g} x {gpu.memory_bytes / GB:,.1f} GB = {engine / GB:,.1f} GB)"
        )
    capacity = kv_capacity(shape, pool, context, block_size, tp, d.kv_dtype)
    reason = ""
    if too_big:
        reason = why_not
    elif capacity.sequences < 1:
        reason = (
            f"the KV pool ({pool / GB:,.2f} GB per GPU) holds {capacity.num_blocks * block_size:,} tokens, "
            f"less than one sequence of {context:,} tokens: vLLM refuses to start"
        )
    fit = Fit(not reason, reason, tp, weights, engine, source, capacity)
    if reason and suggest:
        for bigger in tensor_parallel_sizes(shape):
            if bigger > tp:
                other = check_fit(replace(d, tp=bigger), suggest=False)
                if other.fits:
                    return replace(fit, suggested_tp=bigger)
    return fit
