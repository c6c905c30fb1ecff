"""kvdoctor ledger: the KV/bandwidth arithmetic for a model on a GPU, with what-if rows."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

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
    from kvdoctor.rules.ledger import COMMON_MODELS, GPU_CATALOGUE

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


def load_model(spec: str):
    """A ModelShape from a config.json path or a common model name; UsageError otherwise."""
    from kvdoctor.errors import UsageError
    from kvdoctor.rules.ledger import COMMON_MODELS, ModelShape, dtype_bytes

    path = Path(spec).expanduser()
    if path.is_file():
        try:
            config = json.loads(path.read_text())
        except UnicodeDecodeError:
            raise UsageError(f"{spec!r} is not a text file") from None
        except json.JSONDecodeError as exc:
            raise UsageError(f"{spec!r} is not JSON ({exc.msg} at line {exc.lineno})") from None
        except OSError as exc:
            raise UsageError(f"cannot read {spec!r}: {exc.strerror or exc}") from None
        if not isinstance(config, dict):
            raise UsageError(f"{spec!r} is not a model config (expected a JSON object)")
        try:
            shape = ModelShape.from_hf_config(config, name=config.get("_name_or_path") or path.parent.name or path.stem)
            dtype_bytes(shape.dtype)
        except ValueError as exc:
            raise UsageError(f"{spec}: {exc}") from None
        if shape.num_layers <= 0 or shape.num_kv_heads <= 0 or shape.head_dim <= 0:
            raise UsageError(f"{spec}: model config has a non-positive layer, head or head_dim count")
        return shape
    wanted = spec.strip().lower()
    for name, shape in COMMON_MODELS.items():
        if wanted in (name.lower(), name.lower().replace("-", "")) or wanted.rsplit("/", 1)[-1] == name.lower():
            return shape
    if path.suffix == ".json" or "/" in spec or path.exists():
        what = "not a file" if path.exists() else "no such file"
        raise UsageError(f"{what}: {spec!r} (give a config.json, or one of {', '.join(COMMON_MODELS)})")
    raise UsageError(f"unknown model {spec!r}: not a file, and not one of {', '.join(COMMON_MODELS)}")


def load_gpu(spec: str):
    from kvdoctor.errors import UsageError
    from kvdoctor.rules.ledger import GPU_CATALOGUE, lookup_gpu

    gpu = lookup_gpu(spec)
    if gpu is None:
        raise UsageError(f"unknown GPU {spec!r} (known: {', '.join(GPU_CATALOGUE)})")
    return gpu


def _bytes(n: float) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.1f} GB"
    if n >= 1e6:
        return f"{n / 1e6:.1f} MB"
    return f"{n / 1024:.1f} KiB"


def _ms(seconds: float) -> str:
    if math.isinf(seconds):
        return "inf"
    return f"{seconds * 1e3:.2f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _change(ratio: float) -> str:
    pct = (ratio - 1.0) * 100.0
    return "=" if abs(pct) < 0.05 else f"{pct:+.0f}%"


def compute(shape, gpu, context: int, batch: int, kv_dtype: str | None) -> dict:
    """Everything the command prints, as one JSON-able dict."""
    from kvdoctor.rules.ledger import DEFAULT_GPU_MEMORY_UTILIZATION, offload_feasibility, what_if_rows

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
        f"  KV bytes per token    {_bytes(result['kv_bytes_per_token'])}",
        f"  live KV               {_bytes(result['live_kv_bytes'])}  ({batch} sequences x {ctx:,} tokens)",
        f"  weights               {_bytes(result['weight_bytes'])}"
        if result["weights_known"]
        else "  weights               unknown (config lacks vocab_size or intermediate_size): the floor counts KV only",
        f"  decode step floor     {_ms(result['step_floor_seconds'])}  ((weights + live KV) / peak bandwidth)",
        f"  tokens/s ceiling      {result['tokens_per_second_per_sequence']:,.1f} per sequence, "
        f"{result['tokens_per_second_total']:,.0f} total",
    ]
    pool = result["kv_pool_bytes"]
    share = f"{result['gpu_memory_utilization']:.0%} of {g['memory_bytes'] / 1e9:.0f} GB minus weights"
    if result["fits"]:
        lines.append(
            f"  fits in GPU memory?   yes: the KV pool ({_bytes(pool)}, {share}) holds "
            f"{result['max_batch']:,} sequences of {ctx:,} tokens"
        )
    elif pool <= 0:
        lines.append(f"  fits in GPU memory?   no: the weights alone exceed {share.split(' minus')[0]}")
    else:
        lines.append(
            f"  fits in GPU memory?   no: the KV pool ({_bytes(pool)}, {share}) holds only "
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
            f"  {row['label']:<28} {_bytes(row['kv_bytes_per_token']):<10} {_bytes(row['live_kv_bytes']):<10} "
            f"{_ms(row['step_floor_seconds']):<11} {row['tokens_per_second_total']:<10,.0f} "
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
            f"  {_bytes(o['overflow_bytes'])} of KV does not fit and would live on the host: moving it "
            f"takes {_ms(o['transfer_seconds_per_step'])} per step against a {_ms(o['step_seconds'])} "
            f"step ({verdict})."
        )
        lines.append(
            f"  to hide it, {o['prefetch_hit_rate_needed']:.1%} of the host KV must already be on the "
            "GPU when the step reads it (prefetch hit rate)."
        )
    lines.append(
        f"  a prefix hit served from the host ({ctx:,} tokens, {_bytes(result['kv_bytes_per_token'] * ctx)}) "
        f"takes {_ms(o['prefix_load_seconds'])} to load: {o['prefix_load_steps']:.1f} decode steps."
    )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from kvdoctor.errors import UsageError

    shape = load_model(args.model)
    gpu = load_gpu(args.gpu)
    try:
        result = compute(shape, gpu, args.context, args.batch, args.kv_dtype)
    except (ValueError, ZeroDivisionError) as exc:
        raise UsageError(f"cannot compute the ledger: {exc}") from None
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 0
