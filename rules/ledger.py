"""The ledger: the bandwidth and capacity arithmetic that says how fast decode *can* be.

Every decode step re-reads the weights and the KV cache of every running sequence, so

    KV bytes per token = 2 (K and V) x layers x kv_heads x head_dim x bytes per element
    live KV bytes      = KV bytes per token x tokens resident
    decode step floor  = (weight bytes + live KV bytes) / peak DRAM bandwidth
    tokens/s ceiling   = 1 / floor (per sequence; the batch shares the step)
    host transfer time = bytes / min(host memory bandwidth, PCIe bandwidth)

Pure functions, no I/O. The model's shape and its loader are in ``rules/model.py``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from .model import ModelShape, dtype_bytes
from .units import GB


def kv_bytes_per_token(shape: ModelShape, kv_dtype: str | None = None) -> float:
    """KV-cache bytes one token occupies (all layers); ``kv_dtype`` defaults to the model dtype."""
    elem = dtype_bytes(kv_dtype or shape.dtype)
    if shape.kv_latent_dim:
        return shape.num_layers * shape.kv_latent_dim * elem
    return 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * elem


def decode_step_floor(weight_bytes: float, live_kv_bytes: float, peak_bandwidth: float) -> float:
    """Seconds: the fastest one decode step can be when bound by DRAM bandwidth."""
    if peak_bandwidth <= 0:
        raise ValueError("peak bandwidth must be positive")
    return (weight_bytes + live_kv_bytes) / peak_bandwidth


def host_transfer_seconds(nbytes: float, host_bandwidth: float, pcie_bandwidth: float) -> float:
    """Seconds to move ``nbytes`` of KV from host memory to the GPU."""
    return nbytes / min(host_bandwidth, pcie_bandwidth)


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_bytes: float
    peak_bandwidth: float  # bytes/s, HBM/GDDR theoretical peak
    pcie_bandwidth: float  # bytes/s per direction
    peak_flops: float | None = None  # dense BF16 tensor FLOP/s (no sparsity), for compute-bound steps


PCIE4_X16 = 31.5 * GB
PCIE5_X16 = 63 * GB
TFLOPS = 1e12

GPU_CATALOGUE: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        GpuSpec("A100-40GB", 40 * GB, 1555 * GB, PCIE4_X16, 312 * TFLOPS),
        GpuSpec("A100-80GB", 80 * GB, 2039 * GB, PCIE4_X16, 312 * TFLOPS),
        GpuSpec("A100-80GB-PCIE", 80 * GB, 1935 * GB, PCIE4_X16, 312 * TFLOPS),
        GpuSpec("H100", 80 * GB, 3350 * GB, PCIE5_X16, 989 * TFLOPS),
        GpuSpec("H100-NVL", 94 * GB, 3900 * GB, PCIE5_X16, 835 * TFLOPS),
        GpuSpec("H200", 141 * GB, 4800 * GB, PCIE5_X16, 989 * TFLOPS),
        GpuSpec("L40S", 48 * GB, 864 * GB, PCIE4_X16, 362 * TFLOPS),
        GpuSpec("L4", 24 * GB, 300 * GB, PCIE4_X16, 121 * TFLOPS),
        GpuSpec("B200", 180 * GB, 8000 * GB, PCIE5_X16, 2250 * TFLOPS),
    )
}

# NVML device names -> catalogue keys, most specific first.
_NVML_NAME_PATTERNS = (
    (r"A100.*PCIE.*80|A100.*80.*PCIE", "A100-80GB-PCIE"),
    (r"A100.*80", "A100-80GB"),
    (r"A100", "A100-40GB"),
    (r"H100.*NVL", "H100-NVL"),
    (r"H100", "H100"),
    (r"H200|GH200", "H200"),
    (r"L40S", "L40S"),
    (r"\bL4\b", "L4"),
    (r"B200", "B200"),
)


def lookup_gpu(name: str) -> GpuSpec | None:
    """A catalogue entry by key (``H100``) or by NVML device name (``NVIDIA H100 80GB HBM3``)."""
    key = name.strip()
    for k, spec in GPU_CATALOGUE.items():
        if k.lower() == key.lower():
            return spec
    for pattern, k in _NVML_NAME_PATTERNS:
        if re.search(pattern, key, re.IGNORECASE):
            return GPU_CATALOGUE[k]
    return None


@dataclass(frozen=True)
class Ledger:
    """The ledger for one model on one GPU at a given context and batch."""

    kv_bytes_per_token: float
    live_kv_bytes: float
    weight_bytes: float
    step_floor_seconds: float
    tokens_per_second_per_sequence: float
    tokens_per_second_total: float


def compute_ledger(
    shape: ModelShape, peak_bandwidth: float, context_tokens: int, batch: int = 1, kv_dtype: str | None = None
) -> Ledger:
    """Decode floor for ``batch`` sequences each holding ``context_tokens`` of KV."""
    per_token = kv_bytes_per_token(shape, kv_dtype)
    live = per_token * context_tokens * batch
    floor = decode_step_floor(shape.weight_bytes, live, peak_bandwidth)
    return Ledger(
        kv_bytes_per_token=per_token,
        live_kv_bytes=live,
        weight_bytes=shape.weight_bytes,
        step_floor_seconds=floor,
        tokens_per_second_per_sequence=1.0 / floor,
        tokens_per_second_total=batch / floor,
    )


# --------------------------------------------------------------------------- capacity and what-ifs

DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's --gpu-memory-utilization default
# Host side of a KV transfer: 8 channels of DDR5-4800 (38.4 GB/s each); PCIe is usually the limit.
DEFAULT_HOST_BANDWIDTH = 8 * 38.4 * GB


def kv_pool_bytes(
    shape: ModelShape,
    gpu: GpuSpec,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    reserve_bytes: float = 0.0,
) -> float:
    """GPU memory left for the KV cache: the engine's share of memory minus weights and a reserve
    (activations, CUDA graphs). Zero when the weights alone do not fit."""
    return max(0.0, gpu.memory_bytes * gpu_memory_utilization - shape.weight_bytes - reserve_bytes)


def forward_flops(shape: ModelShape, new_tokens: float, attended_tokens: float = 0.0) -> float:
    """FLOPs of one forward pass over ``new_tokens`` tokens that each attend to ``attended_tokens``
    tokens on average: 2 x parameters per token (the matmuls) plus QK^T and AV (2 x 2 x layers x
    heads x head_dim per attended token)."""
    params = shape.num_parameters or 0.0
    attention = 4.0 * shape.num_layers * shape.num_attention_heads * shape.head_dim * attended_tokens
    return new_tokens * (2.0 * params + attention)


@dataclass(frozen=True)
class WhatIf:
    """One row of the what-if table: a change, the ledger it gives, and the change vs the baseline."""

    name: str  # baseline | fp8_kv | half_context | gqa_8
    label: str  # what a person reads
    flag: str  # the vLLM flag (or the model change) that gets there; "" for the baseline
    kv_dtype: str
    context_tokens: int
    batch: int
    num_kv_heads: int
    ledger: Ledger
    fits: bool  # weights + live KV fit in the GPU's KV pool
    max_batch: int  # sequences of this context the pool holds
    kv_bytes_per_token_ratio: float  # vs the baseline (0.5 = halved)
    step_floor_ratio: float
    tokens_per_second_ratio: float

    def to_json(self) -> dict[str, str | int | float | bool]:
        return {
            "name": self.name,
            "label": self.label,
            "flag": self.flag,
            "kv_dtype": self.kv_dtype,
            "context_tokens": self.context_tokens,
            "batch": self.batch,
            "num_kv_heads": self.num_kv_heads,
            "kv_bytes_per_token": self.ledger.kv_bytes_per_token,
            "live_kv_bytes": self.ledger.live_kv_bytes,
            "weight_bytes": self.ledger.weight_bytes,
            "step_floor_seconds": self.ledger.step_floor_seconds,
            "tokens_per_second_per_sequence": self.ledger.tokens_per_second_per_sequence,
            "tokens_per_second_total": self.ledger.tokens_per_second_total,
            "fits": self.fits,
            "max_batch": self.max_batch,
            "kv_bytes_per_token_ratio": self.kv_bytes_per_token_ratio,
            "step_floor_ratio": self.step_floor_ratio,
            "tokens_per_second_ratio": self.tokens_per_second_ratio,
        }


def _kv_dtype_name(shape: ModelShape, kv_dtype: str | None) -> str:
    """The KV cache's dtype: ``kv_dtype``, or the model's for None, "" and vLLM's "auto"."""
    if kv_dtype in (None, "", "auto"):
        kv_dtype = shape.dtype
    return str(kv_dtype).lower().removeprefix("torch.")


def what_if_rows(
    shape: ModelShape,
    gpu: GpuSpec,
    context: int,
    batch: int = 1,
    kv_dtype: str | None = None,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
) -> list[WhatIf]:
    """The baseline and the cheap changes DESIGN.md orders actions by, each with its ledger.

    Rows: ``baseline``; ``fp8_kv`` (unless the KV cache is already 1 byte per element);
    ``half_context``; ``gqa_8`` (only for models with more than 8 KV heads and no MLA latent).
    ``kv_dtype`` None or "auto" means the model's dtype. Raises ``ValueError`` on a non-positive
    context or batch, or an unknown dtype.
    """
    if context <= 0 or batch <= 0:
        raise ValueError("context and batch must be positive")
    base_dtype = _kv_dtype_name(shape, kv_dtype)
    pool = kv_pool_bytes(shape, gpu, gpu_memory_utilization)
    variants: list[tuple[str, str, str, ModelShape, str, int]] = [
        ("baseline", "as configured", "", shape, base_dtype, context)
    ]
    if dtype_bytes(base_dtype) > 1:
        variants.append(("fp8_kv", "FP8 KV cache", "--kv-cache-dtype fp8", shape, "fp8", context))
    if context >= 2:
        variants.append(
            ("half_context", "half the context", f"--max-model-len {context // 2}", shape, base_dtype, context // 2)
        )
    if shape.num_kv_heads > 8 and not shape.kv_latent_dim:
        variants.append(
            (
                "gqa_8",
                "a GQA model with 8 KV heads",
                "(model choice: grouped-query attention)",
                replace(shape, num_kv_heads=8),
                base_dtype,
                context,
            )
        )

    rows: list[WhatIf] = []
    base: Ledger | None = None
    for name, label, flag, variant_shape, dtype, ctx in variants:
        ledger = compute_ledger(variant_shape, gpu.peak_bandwidth, ctx, batch, dtype)
        if base is None:
            base = ledger
        per_sequence = ledger.kv_bytes_per_token * ctx
        rows.append(
            WhatIf(
                name=name,
                label=label,
                flag=flag,
                kv_dtype=dtype,
                context_tokens=ctx,
                batch=batch,
                num_kv_heads=variant_shape.num_kv_heads,
                ledger=ledger,
                fits=ledger.live_kv_bytes <= pool and pool > 0,
                max_batch=int(pool // per_sequence) if per_sequence > 0 else 0,
                kv_bytes_per_token_ratio=ledger.kv_bytes_per_token / base.kv_bytes_per_token,
                step_floor_ratio=ledger.step_floor_seconds / base.step_floor_seconds,
                tokens_per_second_ratio=ledger.tokens_per_second_total / base.tokens_per_second_total,
            )
        )
    return rows


@dataclass(frozen=True)
class OffloadFeasibility:
    """Can KV living in host memory keep up with decode? (DESIGN.md: offload only if the ledger
    says the transfer can hide behind compute.)"""

    link_bandwidth: float  # bytes/s: min(host memory, PCIe)
    pool_bytes: float  # the GPU's KV pool
    overflow_bytes: float  # live KV that does not fit the pool and would live on the host
    transfer_seconds_per_step: float  # streaming that overflow in once per decode step
    step_seconds: float  # decode step floor with the KV that does fit
    prefetch_hit_rate_needed: float  # share of host KV that must already be on the GPU for the rest to hide
    hideable: bool  # the per-step transfer fits inside the step
    prefix_load_seconds: float  # loading one sequence's whole context from the host (a tier-miss hit)
    prefix_load_steps: float  # the same, in decode steps

    def to_json(self) -> dict[str, float | bool]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def offload_feasibility(
    shape: ModelShape,
    gpu: GpuSpec,
    context: int,
    batch: int = 1,
    kv_dtype: str | None = None,
    host_bandwidth: float = DEFAULT_HOST_BANDWIDTH,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
) -> OffloadFeasibility:
    """Transfer time per decode step against step time, and the prefetch hit rate that hides it.

    A decode step reads every resident token, so KV kept on the host must cross PCIe once per step
    unless it was prefetched: with a share ``h`` already on the GPU, the rest takes
    ``(1 - h) x transfer`` and hides when that is at most one step: ``h >= 1 - step / transfer``.
    """
    per_token = kv_bytes_per_token(shape, _kv_dtype_name(shape, kv_dtype))
    live = per_token * context * batch
    pool = kv_pool_bytes(shape, gpu, gpu_memory_utilization)
    overflow = max(0.0, live - pool)
    step = decode_step_floor(shape.weight_bytes, min(live, pool), gpu.peak_bandwidth)
    transfer = host_transfer_seconds(overflow, host_bandwidth, gpu.pcie_bandwidth) if overflow else 0.0
    needed = max(0.0, 1.0 - step / transfer) if transfer > 0 else 0.0
    prefix = host_transfer_seconds(per_token * context, host_bandwidth, gpu.pcie_bandwidth)
    return OffloadFeasibility(
        link_bandwidth=min(host_bandwidth, gpu.pcie_bandwidth),
        pool_bytes=pool,
        overflow_bytes=overflow,
        transfer_seconds_per_step=transfer,
        step_seconds=step,
        prefetch_hit_rate_needed=needed,
        hideable=transfer <= step,
        prefix_load_seconds=prefix,
        prefix_load_steps=prefix / step if step > 0 else float("inf"),
    )
