"""What-ifs and host offload: the ledger applied to the cheap changes, and to KV kept in host memory.

``what_if_rows`` gives the baseline and each cheap change (FP8 KV, half the context, a GQA
model) with its ledger and its change against the baseline; ``offload_feasibility``
says whether KV living in host memory could keep up with decode. Pure, per GPU of a ``tp``-way
deployment; the arithmetic is ``ledger/arithmetic.py``'s.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvdoctor.signals.records import attributes

from .arithmetic import (
    Deployment,
    Ledger,
    compute_ledger,
    decode_step_floor,
    kv_bytes_per_token_per_gpu,
    kv_capacity,
    kv_dtype_name,
    weight_bytes_per_step,
)
from .model import ModelShape, dtype_bytes

# ---------------------------------------------------------------------------------- what-ifs


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
    fits: bool  # the batch's live KV fits in each GPU's KV pool
    max_batch: int  # sequences of this context the pool holds (vLLM's block arithmetic)
    kv_bytes_per_token_ratio: float  # vs the baseline (0.5 = halved)
    step_floor_ratio: float
    tokens_per_second_ratio: float

    def to_json(self) -> dict[str, str | int | float | bool]:
        return {
            **attributes(self, "name label flag kv_dtype context_tokens batch num_kv_heads"),
            **attributes(
                self.ledger,
                "kv_bytes_per_token kv_bytes_per_token_per_gpu live_kv_bytes live_kv_bytes_per_gpu weight_bytes "
                "weight_bytes_per_step step_floor_seconds tokens_per_second_per_sequence tokens_per_second_total",
            ),
            **attributes(self, "fits max_batch kv_bytes_per_token_ratio step_floor_ratio tokens_per_second_ratio"),
        }


def what_if_rows(d: Deployment, pool_bytes: float | None = None) -> list[WhatIf]:
    """The baseline and the cheap changes, each with its ledger.

    Rows: ``baseline``; ``fp8_kv`` (unless the KV cache is already 1 byte per element);
    ``half_context``; ``gqa_8`` (only for models with more than 8 KV heads and no MLA latent).
    ``pool_bytes`` is each GPU's KV pool (default: ``kv_pool_bytes``). Raises ``ValueError`` on a
    non-positive context or batch, or an unknown dtype.
    """
    shape, context, batch, tp = d.shape, d.context, d.batch, d.tp
    if context <= 0 or batch <= 0:
        raise ValueError("context and batch must be positive")
    base_dtype = kv_dtype_name(shape, d.kv_dtype)
    pool = d.pool_bytes() if pool_bytes is None else pool_bytes
    variants: list[tuple[str, str, str, ModelShape, str, int]] = [
        ("baseline", "as configured", "", shape, base_dtype, context)
    ]
    if dtype_bytes(base_dtype) > 1:
        variants.append(("fp8_kv", "FP8 KV cache", "--kv-cache-dtype fp8", shape, "fp8", context))
    if context >= 2:
        half = ("half_context", "half the context", f"--max-model-len {context // 2}", shape, base_dtype, context // 2)
        variants.append(half)
    if shape.num_kv_heads > 8 and not shape.kv_latent_dim:
        gqa = replace(shape, num_kv_heads=8)
        variants.append(
            (
                "gqa_8",
                "a GQA model with 8 KV heads",
                "(model choice: grouped-query attention)",
                gqa,
                base_dtype,
                context,
            )
        )

    rows: list[WhatIf] = []
    base: Ledger | None = None
    for name, label, flag, variant, dtype, ctx in variants:
        ledger = compute_ledger(variant, d.gpu.peak_bandwidth, ctx, batch, dtype, tp)
        base = base or ledger
        rows.append(
            WhatIf(
                name=name,
                label=label,
                flag=flag,
                kv_dtype=dtype,
                context_tokens=ctx,
                batch=batch,
                num_kv_heads=variant.num_kv_heads,
                ledger=ledger,
                fits=0 < ledger.live_kv_bytes_per_gpu <= pool,
                max_batch=kv_capacity(variant, pool, ctx, d.block_size, tp, dtype).sequences,
                kv_bytes_per_token_ratio=ledger.kv_bytes_per_token / base.kv_bytes_per_token,
                step_floor_ratio=ledger.step_floor_seconds / base.step_floor_seconds,
                tokens_per_second_ratio=ledger.tokens_per_second_total / base.tokens_per_second_total,
            )
        )
    return rows


# ---------------------------------------------------------------------------------- offload


@dataclass(frozen=True)
class OffloadFeasibility:
    """Can KV living in host memory keep up with decode? (Offload pays only where the
    transfer can hide behind compute.) Per GPU: each has its own host link."""

    link_bandwidth: float  # bytes/s: min(host memory, the GPU's host link)
    pool_bytes: float  # each GPU's KV pool
    overflow_bytes: float  # live KV per GPU that does not fit its pool and would live on the host
    transfer_seconds_per_step: float  # streaming that overflow in once per decode step
    step_seconds: float  # decode step floor with only the KV that fits in the pool
    prefetch_hit_rate_needed: float  # share of host KV that must already be on the GPU for the rest to hide
    hideable: bool  # the per-step transfer fits inside the step
    prefix_load_seconds: float  # loading one sequence's whole context from the host (a tier-miss hit)
    prefix_load_steps: float  # the same, in decode steps

    def to_json(self) -> dict[str, float | bool]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def offload_feasibility(d: Deployment, pool_bytes: float | None = None) -> OffloadFeasibility:
    """Transfer time per decode step against step time, and the prefetch hit rate that hides it.

    A decode step reads every resident token, so KV kept on the host must cross the host link once
    per step unless it was prefetched: with a share ``h`` already on the GPU, the rest takes
    ``(1 - h) x transfer`` and hides when that is at most one step: ``h >= 1 - step / transfer``.
    """
    per_token = kv_bytes_per_token_per_gpu(d.shape, d.tp, d.kv_dtype)
    live = per_token * d.context * d.batch
    pool = d.pool_bytes() if pool_bytes is None else pool_bytes
    overflow = max(0.0, live - pool)
    step = decode_step_floor(weight_bytes_per_step(d.shape, d.batch) / d.tp, min(live, pool), d.gpu.peak_bandwidth)
    link = min(d.host_bandwidth, d.gpu.host_bandwidth)
    transfer = overflow / link
    needed = max(0.0, 1.0 - step / transfer) if transfer > 0 else 0.0
    prefix = per_token * d.context / link
    return OffloadFeasibility(
        link_bandwidth=link,
        pool_bytes=pool,
        overflow_bytes=overflow,
        transfer_seconds_per_step=transfer,
        step_seconds=step,
        prefetch_hit_rate_needed=needed,
        hideable=transfer <= step,
        prefix_load_seconds=prefix,
        prefix_load_steps=prefix / step if step > 0 else float("inf"),
    )
