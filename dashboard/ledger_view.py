"""The Ledger page's numbers: ``kvdoctor.ledger.report`` applied to the form's inputs. Pure.

Every formula is the ledger's (``build_report``: fit first, then the floor, the what-if rows and
host offload); this module only checks the form's inputs and bundles the answers for the page.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvdoctor.ledger.arithmetic import DEFAULT_GPU_MEMORY_UTILIZATION, DEFAULT_HOST_BANDWIDTH, Fit, Ledger
from kvdoctor.ledger.gpus import GpuSpec
from kvdoctor.ledger.model import ModelShape, dtype_bytes
from kvdoctor.ledger.report import LedgerReport as Report
from kvdoctor.ledger.report import LedgerRequest, build_report
from kvdoctor.ledger.whatif import OffloadFeasibility, WhatIf


@dataclass(frozen=True)
class LedgerReport:
    model: ModelShape
    gpu: GpuSpec
    tp: int
    fit: Fit  # does it start at all; the KV capacity as vLLM counts it
    pool_bytes: float  # each GPU's KV pool
    report: Report  # every figure with its label and how it was computed
    baseline: WhatIf | None  # None when the deployment does not fit
    what_if: list[WhatIf]  # the cheap changes, baseline excluded
    offload: OffloadFeasibility | None

    @property
    def ledger(self) -> Ledger | None:
        return self.report.ledger


def report(
    shape: ModelShape,
    gpu: GpuSpec,
    context_tokens: int,
    batch: int,
    kv_dtype: str = "auto",
    host_bandwidth: float = DEFAULT_HOST_BANDWIDTH,
    memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    tp: int = 1,
) -> LedgerReport:
    """The ledger for the form's inputs; raises ``ValueError`` with one line on inputs out of range."""
    if context_tokens < 1 or batch < 1 or tp < 1:
        raise ValueError("context, batch and tensor-parallel GPUs must be at least 1")
    if not 0 < memory_utilization <= 1:
        raise ValueError("GPU memory utilisation must be in (0, 1]")
    if host_bandwidth <= 0:
        raise ValueError("host bandwidth must be positive")
    dtype = None if kv_dtype in ("", "auto") else kv_dtype
    if dtype is not None:
        dtype_bytes(dtype)  # an unknown dtype fails here, with the list of known ones
    r = build_report(
        LedgerRequest(
            shape=shape,
            gpu=gpu,
            context=context_tokens,
            batch=batch,
            kv_dtype=dtype,
            tp=tp,
            gpu_memory_utilization=memory_utilization,
            host_bandwidth=host_bandwidth,
        )
    )
    rows = r.what_if
    return LedgerReport(
        model=shape,
        gpu=gpu,
        tp=tp,
        fit=r.fit,
        pool_bytes=r.fit.capacity.pool_bytes,
        report=r,
        baseline=rows[0] if rows else None,
        what_if=rows[1:],
        offload=r.offload,
    )
