"""The ledger as people read it: every figure with its name, what it is and how it was computed.

``build_report`` runs the ledger for one deployment (model, GPU, ``--tp``, context, batch, KV
memory) and returns ``Figure`` rows: ``name`` is the ``--json`` key, ``label`` what the CLI and the
dashboard print, ``how`` the arithmetic with this deployment's numbers. Whether the deployment
fits comes first: when it does not, the floor and the what-ifs are not computed (they would
describe a deployment that cannot start), but the per-token and weight figures still are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvdoctor.signals.units import BYTES_TABLE, GB, MB, fmt_bytes, fmt_bytes_exact, fmt_duration

from .arithmetic import (
    AllReduce,
    Deployment,
    Fit,
    Ledger,
    all_reduce_cost,
    check_fit,
    compute_ledger,
    expected_experts_touched,
    kv_bytes_per_token,
    kv_bytes_per_token_per_gpu,
    kv_dtype_name,
    kv_heads_per_gpu,
    weight_bytes_per_step,
)
from .model import dtype_bytes
from .whatif import OffloadFeasibility, WhatIf, offload_feasibility, what_if_rows

BYTES, SECONDS, TOKENS, SEQUENCES, TIMES, TOKENS_PER_SECOND = "bytes", "seconds", "tokens", "sequences", "x", "tokens/s"


def sequences(n: int) -> str:
    return f"{n:,} sequence" + ("" if n == 1 else "s")


def fmt_size(nbytes: float) -> str:
    """Exact bytes below a megabyte (``70,272 B (68.6 KiB)``), else ``17.2 GB`` / ``2.1 MB``."""
    return fmt_bytes_exact(nbytes) if nbytes < MB else fmt_bytes(nbytes, BYTES_TABLE)


@dataclass(frozen=True)
class Figure:
    """One number of the ledger: its ``--json`` key, what it is, its value and how it was computed."""

    name: str
    label: str
    value: float
    unit: str
    how: str

    def formatted(self) -> str:
        if self.unit == BYTES:
            return fmt_size(self.value)
        if self.unit == SECONDS:
            return f"{self.value * 1e6:,.1f} µs" if self.value < 1e-3 else fmt_duration(self.value)
        if self.unit == TIMES:
            return f"{self.value:,.2f}x"
        if self.unit == TOKENS_PER_SECOND:
            return f"{self.value:,.1f} tokens/s"
        return f"{self.value:,.0f} {self.unit}"

    def to_json(self) -> dict[str, str | float]:
        return {"name": self.name, "label": self.label, "value": self.value, "unit": self.unit, "how": self.how}


@dataclass(frozen=True)
class LedgerRequest(Deployment):
    """One deployment to account for, and where its GPU's peak bandwidth came from."""

    peak_source: str = "catalogue"


@dataclass(frozen=True)
class LedgerReport:
    request: LedgerRequest
    fit: Fit
    figures: list[Figure]
    ledger: Ledger | None = None  # None when the deployment does not fit
    what_if: list[WhatIf] = field(default_factory=list)
    offload: OffloadFeasibility | None = None
    all_reduce: AllReduce | None = None

    def figure(self, name: str) -> Figure | None:
        return next((f for f in self.figures if f.name == name), None)

    def to_json(self) -> dict[str, Any]:
        r, s = self.request, self.request.shape
        return {
            "model": {
                "name": s.name,
                "source": s.source,
                "num_layers": s.num_layers,
                "hidden_size": s.hidden_size,
                "num_attention_heads": s.num_attention_heads,
                "num_kv_heads": s.num_kv_heads,
                "head_dim": s.head_dim,
                "dtype": s.dtype,
                "weight_dtype": s.weight_dtype or s.dtype,
                "num_parameters": s.num_parameters,
                "weight_source": s.weight_source,
                "kv_latent_dim": s.kv_latent_dim,
                "num_experts": s.num_experts,
                "experts_per_token": s.experts_per_token,
                "moe_layers": s.moe_layers,
            },
            "gpu": {**r.gpu.to_json(), "peak_source": r.peak_source},
            "tp": r.tp,
            "context_tokens": r.context,
            "batch": r.batch,
            "kv_dtype": kv_dtype_name(s, r.kv_dtype),
            "block_size": r.block_size,
            "gpu_memory_utilization": None if r.kv_cache_memory_bytes is not None else r.gpu_memory_utilization,
            "kv_cache_memory_bytes": r.kv_cache_memory_bytes,
            "fits": self.fit.fits,
            "reason": self.fit.reason,
            "suggestion": {"tp": self.fit.suggested_tp, "flag": f"--tp {self.fit.suggested_tp}"}
            if self.fit.suggested_tp
            else None,
            **{f.name: f.value for f in self.figures},
            "capacity": self.fit.capacity.to_json(),
            "figures": [f.to_json() for f in self.figures],
            "what_if": [row.to_json() for row in self.what_if],
            "offload": self.offload.to_json() if self.offload else None,
        }


def build_report(request: LedgerRequest) -> LedgerReport:
    """The ledger of ``request``: fit first, then (if it fits) the floor, what-ifs and offload.
    ``ValueError`` on inputs the arithmetic refuses (a --tp vLLM would refuse, a bad dtype...)."""
    r = request
    if r.context < 1 or r.batch < 1:
        raise ValueError("context and batch must be positive")
    fit = check_fit(r)
    figures = _model_figures(r) + _capacity_figures(r, fit)
    if not fit.fits:
        return LedgerReport(r, fit, figures)
    ledger = compute_ledger(r.shape, r.gpu.peak_bandwidth, r.context, r.batch, r.kv_dtype, r.tp)
    all_reduce = all_reduce_cost(r.shape, r.gpu, r.batch, r.tp)
    figures += _floor_figures(r, ledger, all_reduce)
    pool = fit.capacity.pool_bytes
    rows = what_if_rows(r, pool)
    offload = offload_feasibility(r, pool)
    return LedgerReport(r, fit, figures, ledger, rows, offload, all_reduce)


def _model_figures(r: LedgerRequest) -> list[Figure]:
    s, dtype = r.shape, kv_dtype_name(r.shape, r.kv_dtype)
    elem = dtype_bytes(dtype)
    if s.kv_latent_dim:
        kv_how = f"{s.num_layers} layers x {s.kv_latent_dim} MLA latent (kv_lora_rank + qk_rope_head_dim)"
    else:
        kv_how = f"2 (K and V) x {s.num_layers} layers x {s.num_kv_heads} KV heads x {s.head_dim} head dim"
    kv_how += f" x {elem:g} B ({dtype})"
    out = [Figure("kv_bytes_per_token", "KV bytes per token", kv_bytes_per_token(s, r.kv_dtype), BYTES, kv_how)]
    if r.tp > 1:
        if s.kv_latent_dim:
            how = "the MLA latent is replicated on every GPU (vLLM)"
        elif s.num_kv_heads < r.tp:
            how = f"1 KV head per GPU: {s.num_kv_heads} KV heads replicated over {r.tp} GPUs"
        else:
            how = f"{kv_heads_per_gpu(s, r.tp)} of the {s.num_kv_heads} KV heads on each of {r.tp} GPUs"
        out.append(
            Figure(
                "kv_bytes_per_token_per_gpu",
                "KV bytes per token, per GPU",
                kv_bytes_per_token_per_gpu(s, r.tp, r.kv_dtype),
                BYTES,
                how,
            )
        )
    if s.weight_bytes_exact:
        weights_how = s.weight_source
    else:
        weights_how = (
            f"{(s.num_parameters or 0) / 1e9:,.2f} B parameters x {s.weight_element_bytes:g} B "
            f"({s.weight_dtype or s.dtype}), {s.weight_source}"
        )
    out.append(Figure("weight_bytes", "weights", s.weight_bytes, BYTES, weights_how))
    step = weight_bytes_per_step(s, r.batch)
    if s.is_moe:
        touched = expected_experts_touched(s.num_experts, s.experts_per_token, r.batch)
        step_how = (
            f"shared weights {fmt_size(s.weight_bytes - s.routed_expert_bytes)} + {s.moe_layers} MoE layers x "
            f"{touched:,.2f} of {s.num_experts} experts touched at batch {r.batch} "
            f"({s.num_experts} x (1 - (1 - {s.experts_per_token}/{s.num_experts})^{r.batch})) x "
            f"{fmt_size(s.expert_bytes)} per expert"
        )
    else:
        step_how = "dense: every weight, every step"
    out.append(Figure("weight_bytes_per_step", "weights read per decode step (all GPUs)", step, BYTES, step_how))
    if r.tp > 1:
        out.append(
            Figure("weight_bytes_per_gpu", "weights per GPU", s.weight_bytes / r.tp, BYTES, f"weights / {r.tp} GPUs")
        )
    return out


def _capacity_figures(r: LedgerRequest, fit: Fit) -> list[Figure]:
    cap = fit.capacity
    per_gpu = " per GPU" if r.tp > 1 else ""
    if r.kv_cache_memory_bytes is not None:
        pool_how = "--kv-cache-memory-bytes, as given"
    else:
        pool_how = (
            f"{r.gpu_memory_utilization:g} x {r.gpu.memory_bytes / GB:,.1f} GB memory - "
            f"{fit.weight_bytes_per_gpu / GB:,.1f} GB weights{per_gpu}; an upper bound: vLLM also subtracts the "
            "activation peak it profiles (its log line 'Available KV cache memory' is the real pool: pass it as "
            "--kv-cache-memory-bytes)"
        )
    block = f"{cap.num_blocks:,} blocks of {cap.block_size} tokens ({fmt_bytes(cap.bytes_per_block)} each)"
    return [
        Figure("kv_pool_bytes", f"KV pool{per_gpu}", cap.pool_bytes, BYTES, pool_how),
        Figure(
            "kv_cache_tokens",
            "KV cache size",
            cap.tokens,
            TOKENS,
            f"{block}; counted as vLLM logs 'GPU KV cache size': int(max concurrency x {cap.max_model_len:,})",
        ),
        Figure(
            "max_concurrency",
            f"max concurrency at {cap.max_model_len:,} tokens",
            cap.max_concurrency,
            TIMES,
            f"{cap.num_blocks:,} blocks / {cap.blocks_per_sequence:,} blocks per sequence, as vLLM logs it",
        ),
        Figure(
            "sequences_that_fit",
            f"sequences of {cap.max_model_len:,} tokens that fit",
            cap.sequences,
            SEQUENCES,
            f"{cap.num_blocks:,} blocks // {cap.blocks_per_sequence:,} blocks per sequence",
        ),
    ]


def _floor_figures(r: LedgerRequest, led: Ledger, all_reduce: AllReduce | None) -> list[Figure]:
    per_gpu = " per GPU" if r.tp > 1 else ""
    live_how = f"{sequences(r.batch)} x {r.context:,} tokens x KV bytes per token{per_gpu}"
    floor_how = (
        f"all {sequences(r.batch)} resident: (weights read per step{per_gpu} "
        f"{fmt_size(led.weight_bytes_per_step_per_gpu)} + live KV{per_gpu} {fmt_size(led.live_kv_bytes_per_gpu)}) / "
        f"{r.gpu.peak_bandwidth / GB:,.0f} GB/s peak ({r.peak_source})"
    )
    out = [
        Figure(
            "live_kv_bytes_per_gpu" if r.tp > 1 else "live_kv_bytes",
            f"live KV{per_gpu}",
            led.live_kv_bytes_per_gpu,
            BYTES,
            live_how,
        ),
        Figure(
            "step_floor_seconds",
            f"decode step floor{per_gpu}",
            led.step_floor_seconds,
            SECONDS,
            floor_how,
        ),
        Figure(
            "tokens_per_second_per_sequence",
            "tokens/s ceiling per sequence",
            led.tokens_per_second_per_sequence,
            TOKENS_PER_SECOND,
            "1 / decode step floor",
        ),
        Figure(
            "tokens_per_second_total",
            "tokens/s ceiling, whole batch",
            led.tokens_per_second_total,
            TOKENS_PER_SECOND,
            f"{sequences(r.batch)} / decode step floor",
        ),
    ]
    if all_reduce is not None:
        out.append(
            Figure(
                "all_reduce_seconds",
                "all-reduce per step (not in the floor)",
                all_reduce.seconds,
                SECONDS,
                f"{all_reduce.count_per_step} all-reduces ({r.shape.num_layers} layers x 2) of {r.batch:,} x "
                f"{r.shape.hidden_size:,} x {dtype_bytes(r.shape.dtype):g} B, a ring sends 2 x ({r.tp} - 1) / {r.tp} "
                f"of each: {fmt_size(all_reduce.bytes_per_gpu)} per GPU over {all_reduce.link}; "
                "each all-reduce's latency is not counted",
            )
        )
    return out
