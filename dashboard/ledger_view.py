"""The Ledger page's numbers: ``kvdoctor.rules.ledger`` applied to the form's inputs. Pure.

Every formula is the ledger's (``what_if_rows``, ``offload_feasibility``, ``kv_pool_bytes``);
this module only checks the form's inputs and bundles the answers for the page.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvdoctor.rules.ledger import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    DEFAULT_HOST_BANDWIDTH,
    GpuSpec,
    OffloadFeasibility,
    WhatIf,
    kv_pool_bytes,
    offload_feasibility,
    what_if_rows,
)
from kvdoctor.rules.model import ModelShape, dtype_bytes

KV_DTYPES = ("auto", "bfloat16", "float16", "fp8", "float32")


@dataclass(frozen=True)
class LedgerReport:
    model: ModelShape
    gpu: GpuSpec
    pool_bytes: float  # the GPU's KV pool
    baseline: WhatIf
    what_if: list[WhatIf]  # the cheap changes, baseline excluded
    offload: OffloadFeasibility


def report(
    shape: ModelShape,
    gpu: GpuSpec,
    context_tokens: int,
    batch: int,
    kv_dtype: str = "auto",
    host_bandwidth: float = DEFAULT_HOST_BANDWIDTH,
    memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
) -> LedgerReport:
    """The ledger for the form's inputs; raises ``ValueError`` with one line on inputs out of range."""
    if context_tokens < 1 or batch < 1:
        raise ValueError("context and batch must be at least 1")
    if not 0 < memory_utilization <= 1:
        raise ValueError("GPU memory utilisation must be in (0, 1]")
    if host_bandwidth <= 0:
        raise ValueError("host bandwidth must be positive")
    dtype = None if kv_dtype in ("", "auto") else kv_dtype
    if dtype is not None:
        dtype_bytes(dtype)  # an unknown dtype fails here, with the list of known ones
    rows = what_if_rows(shape, gpu, context_tokens, batch, dtype, memory_utilization)
    return LedgerReport(
        model=shape,
        gpu=gpu,
        pool_bytes=kv_pool_bytes(shape, gpu, memory_utilization),
        baseline=rows[0],
        what_if=rows[1:],
        offload=offload_feasibility(shape, gpu, context_tokens, batch, dtype, host_bandwidth, memory_utilization),
    )
