"""kvdoctor ledger: the KV/bandwidth arithmetic for a model on a GPU, with what-if rows."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kvdoctor.errors import UsageError
from kvdoctor.rules.ledger import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    GPU_CATALOGUE,
    GpuSpec,
    lookup_gpu,
    offload_feasibility,
    what_if_rows,
)
from kvdoctor.rules.model import COMMON_MODELS, ModelShape, load_model_shape
from kvdoctor.rules.units import BYTES_TABLE, fmt_bytes, fmt_duration

NAME = "ledger"
HELP = "KV bytes per token, decode floor and tokens/s ceiling for a model on a GPU, with what-ifs"
DESCRIPTION = """\
The ledger (roofline arithmetic): every decode step re-reads the weights and the KV cache of every
running sequence, so

  KV bytes per token = 2 x layers x kv_heads x head_dim x bytes per element
  decode step floor  = (weights + live KV) / peak HBM bandwidth;  tokens/s ceiling = 1 / floor

Then what-if rows (FP8 KV cache, half the context, a GQA model with 8 KV heads) with their change
against the baseline, and whether KV kept in host memory could keep up over PCIe.

examples:
  kvdoctor ledger --model Llama-3.1-8B --gpu H100 --context 8192 --batch 32
  kvdoctor ledger --model ./config.json --gpu "NVIDIA A100-SXM4-80GB" --kv-dtype fp8 --json
"""

KV_DTYPES = ("fp16", "bf16", "fp8")
DEFAULT_CONTEXT = 8192
DEFAULT_BATCH = 16


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        required=True,
        metavar="CONFIG.json|NAME",
        help=f"a Hugging Face config.json, or one of: {', '.join(COMMON_MODELS)}",
    )
    parser.add_argument(
        "--gpu",
        required=True,
        metavar="NAME",
        help=f"a catalogue name ({', '.join(GPU_CATALOGUE)}) or an NVML device name",
    )
    parser.add_argument(
        "--context",
        type=_positive_int,
        default=DEFAULT_CONTEXT,
        metavar="N",
        help=f"tokens of KV per sequence (default: {DEFAULT_CONTEXT})",
    )
    parser.add_argument(
        "--batch",
        type=_positive_int,
        default=DEFAULT_BATCH,
        metavar="N",
        help=f"concurrent sequences (default: {DEFAULT_BATCH})",
    )
    parser.add_argument(
        "--kv-dtype", choices=KV_DTYPES, default=None, help="KV-cache element type (default: the model's dtype)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")


def load_model(spec: str) -> ModelShape:
    """A ModelShape from a config.json path or a common model name; UsageError otherwise."""
    path = Path(spec).expanduser()
    if path.is_file():
        try:
            return load_model_shape(spec)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    wanted = spec.strip().lower()
    for name, shape in COMMON_MODELS.items():
        if wanted in (name.lower(), name.lower().replace("-", "")) or wanted.rsplit("/", 1)[-1] == name.lower():
            return shape
    if path.suffix == ".json" or "/" in spec or path.exists():
        what = "not a file" if path.exists() else "no such file"
        raise UsageError(f"{what}: {spec!r} (give a config.json, or one of {', '.join(COMMON_MODELS)})")
    raise UsageError(f"unknown model {spec!r}: not a file, and not one of {', '.join(COMMON_MODELS)}")


def load_gpu(spec: str) -> GpuSpec:
    gpu = lookup_gpu(spec)
    if gpu is None:
        raise UsageError(f"unknown GPU {spec!r} (known: {', '.join(GPU_CATALOGUE)})")
    return gpu


def _change(ratio: float) -> str:
    pct = (ratio - 1.0) * 100.0
    return "=" if abs(pct) < 0.05 else f"{pct:+.0f}%"


def compute(shape: ModelShape, gpu: GpuSpec, context: int, batch: int, kv_dtype: str | None) -> dict:
    """Everything the command prints, as one JSON-able dict."""
    rows = what_if_rows(shape, gpu, context, batch, kv_dtype)
    base = rows[0]
    offload = offload_feasibility(shape, gpu, context, batch, kv_dtype)
    return {
        "model": {
            "name": shape.name,
            "num_layers": shape.num_layers,
            "hidden_size": shape.hidden_size,
            "num_attention_heads": shape.num_attention_heads,
            "num_kv_heads": shape.num_kv_heads,
            "head_dim": shape.head_dim,
            "dtype": shape.dtype,
            "num_parameters": shape.num_parameters,
            "kv_latent_dim": shape.kv_latent_dim,
        },
        "gpu": {
            "name": gpu.name,
            "memory_bytes": gpu.memory_bytes,
            "peak_bandwidth": gpu.peak_bandwidth,
            "pcie_bandwidth": gpu.pcie_bandwidth,
        },
        "context_tokens": context,
        "batch": batch,
        "kv_dtype": base.kv_dtype,
        "gpu_memory_utilization": DEFAULT_GPU_MEMORY_UTILIZATION,
        "kv_bytes_per_token": base.ledger.kv_bytes_per_token,
        "live_kv_bytes": base.ledger.live_kv_bytes,
        "weight_bytes": base.ledger.weight_bytes,
        "weights_known": shape.num_parameters is not None,
        "step_floor_seconds": base.ledger.step_floor_seconds,
        "tokens_per_second_per_sequence": base.ledger.tokens_per_second_per_sequence,
        "tokens_per_second_total": base.ledger.tokens_per_second_total,
        "kv_pool_bytes": offload.pool_bytes,
        "fits": base.fits,
        "max_batch": base.max_batch,
        "what_if": [row.to_json() for row in rows],
        "offload": offload.to_json(),
    }


def render(result: dict) -> str:
    m, g = result["model"], result["gpu"]
    ctx, batch = result["context_tokens"], result["batch"]
    heads = f"{m['num_kv_heads']} KV heads of {m['num_attention_heads']}"
    if m["kv_latent_dim"]:
        heads = f"MLA latent {m['kv_latent_dim']}"
    lines = [
        f"{m['name']} ({m['num_layers']} layers, {heads}) on {g['name']} "
        f"({g['peak_bandwidth'] / 1e9:,.0f} GB/s, {g['memory_bytes'] / 1e9:.0f} GB): "
        f"{batch} x {ctx:,} tokens, KV {result['kv_dtype']}",
        "",
        f"  KV bytes per token    {fmt_bytes(result['kv_bytes_per_token'], BYTES_TABLE)}",
        f"  live KV               {fmt_bytes(result['live_kv_bytes'], BYTES_TABLE)}  "
        f"({batch} sequences x {ctx:,} tokens)",
        f"  weights               {fmt_bytes(result['weight_bytes'], BYTES_TABLE)}"
        if result["weights_known"]
        else "  weights               unknown (config lacks vocab_size or intermediate_size): the floor counts KV only",
        f"  decode step floor     {fmt_duration(result['step_floor_seconds'])}  ((weights + live KV) / peak bandwidth)",
        f"  tokens/s ceiling      {result['tokens_per_second_per_sequence']:,.1f} per sequence, "
        f"{result['tokens_per_second_total']:,.0f} total",
    ]
    pool = result["kv_pool_bytes"]
    share = f"{result['gpu_memory_utilization']:.0%} of {g['memory_bytes'] / 1e9:.0f} GB minus weights"
    if result["fits"]:
        lines.append(
            f"  fits in GPU memory?   yes: the KV pool ({fmt_bytes(pool, BYTES_TABLE)}, {share}) holds "
            f"{result['max_batch']:,} sequences of {ctx:,} tokens"
        )
    elif pool <= 0:
        lines.append(f"  fits in GPU memory?   no: the weights alone exceed {share.split(' minus')[0]}")
    else:
        lines.append(
            f"  fits in GPU memory?   no: the KV pool ({fmt_bytes(pool, BYTES_TABLE)}, {share}) holds only "
            f"{result['max_batch']:,} sequences of {ctx:,} tokens"
        )

    lines += [
        "",
        "what if                        KV/token   live KV    step floor  tokens/s   fits  change (floor, tokens/s)",
    ]
    for row in result["what_if"]:
        change = (
            "baseline"
            if row["name"] == "baseline"
            else f"{_change(row['step_floor_ratio'])}, {_change(row['tokens_per_second_ratio'])}"
        )
        flag = f"   {row['flag']}" if row["flag"] else ""
        lines.append(
            f"  {row['label']:<28} {fmt_bytes(row['kv_bytes_per_token'], BYTES_TABLE):<10} "
            f"{fmt_bytes(row['live_kv_bytes'], BYTES_TABLE):<10} "
            f"{fmt_duration(row['step_floor_seconds']):<11} {row['tokens_per_second_total']:<10,.0f} "
            f"{'yes' if row['fits'] else 'no':<5} {change}{flag}"
        )

    o = result["offload"]
    link = f"{o['link_bandwidth'] / 1e9:.1f} GB/s (min of host memory and PCIe)"
    lines += ["", f"host offload over {link}:"]
    if o["overflow_bytes"] <= 0:
        lines.append("  nothing to offload: the live KV fits in the GPU pool.")
    else:
        verdict = "hides behind the step" if o["hideable"] else "cannot hide behind the step"
        lines.append(
            f"  {fmt_bytes(o['overflow_bytes'], BYTES_TABLE)} of KV does not fit and would live on the host: moving it "
            f"takes {fmt_duration(o['transfer_seconds_per_step'])} per step "
            f"against a {fmt_duration(o['step_seconds'])} "
            f"step ({verdict})."
        )
        lines.append(
            f"  to hide it, {o['prefetch_hit_rate_needed']:.1%} of the host KV must already be on the "
            "GPU when the step reads it (prefetch hit rate)."
        )
    lines.append(
        f"  a prefix hit served from the host ({ctx:,} tokens, "
        f"{fmt_bytes(result['kv_bytes_per_token'] * ctx, BYTES_TABLE)}) "
        f"takes {fmt_duration(o['prefix_load_seconds'])} to load: {o['prefix_load_steps']:.1f} decode steps."
    )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    shape = load_model(args.model)
    gpu = load_gpu(args.gpu)
    try:
        result = compute(shape, gpu, args.context, args.batch, args.kv_dtype)
    except (ValueError, ZeroDivisionError) as exc:
        raise UsageError(f"cannot compute the ledger: {exc}") from None
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 0
