"""kvdoctor ledger: the KV/bandwidth arithmetic for a model on a GPU, with what-if rows."""

from __future__ import annotations

import argparse
import json
import sys

from kvdoctor import arguments, flags
from kvdoctor.errors import UsageError
from kvdoctor.ledger.arithmetic import DEFAULT_BLOCK_SIZE, DEFAULT_GPU_MEMORY_UTILIZATION, DEFAULT_HOST_BANDWIDTH
from kvdoctor.ledger.gpus import GPUS, GpuSpec, UnknownGpuError, custom_gpu, resolve_gpu, short_name
from kvdoctor.ledger.model import COMMON_MODELS, KV_CACHE_DTYPES, ModelShape
from kvdoctor.ledger.report import LedgerReport, LedgerRequest, build_report, fmt_size, sequences
from kvdoctor.signals.units import GB, fmt_duration
from kvdoctor.sources.model_files import load_model as load_model_source

NAME = "ledger"
HELP = "does it fit, KV bytes per token, decode floor and tokens/s ceiling for a model on GPUs, with what-ifs"
DESCRIPTION = """\
The ledger (roofline arithmetic). First: does the deployment start at all (the weights fit each
GPU's share of memory and the KV pool holds one sequence of --context)? If not, it says why and the
smallest --tp that fits, and exits 1. Then, since every decode step re-reads the weights it uses and
the KV cache of every running sequence:

  KV bytes per token    = 2 x layers x KV heads x head_dim x bytes  (MLA: layers x latent x bytes)
  weights read per step = all weights (dense); shared + experts touched at this batch (MoE)
  decode step floor     = (weights read per step + live KV) / peak DRAM bandwidth, per GPU
  tokens/s ceiling      = 1 / floor per sequence

and the KV pool as vLLM counts it (its 'GPU KV cache size' and 'Maximum concurrency' log lines),
what-if rows (FP8 KV cache, half the context, a GQA model), and whether KV kept in host memory could
keep up. Every figure says how it was computed; --json uses the same names.

--model takes a config.json, a model folder (a Hugging Face snapshot: its safetensors index gives
the weight bytes exactly), a Hugging Face id already in the local cache (never downloaded), or a
built-in name; a Hugging Face id of a built-in model, or of its -Instruct/-chat/-it variant, takes the
built-in shape (and says so). --gpu takes the exact NVML device name (nvidia-smi --query-gpu=name)
or a short name meaning one GPU ("H100 SXM", "A100 PCIe 80GB", L40S); an ambiguous one (H100: SXM,
PCIe or NVL) lists the candidates.

examples:
  kvdoctor ledger --model Llama-3.1-8B --gpu "NVIDIA H100 80GB HBM3" --context 8192 --batch 32
  kvdoctor ledger --model ~/models/Llama-3.1-70B-Instruct --gpu "H100 SXM" --tp 4 --json
  kvdoctor ledger --model meta-llama/Llama-3.1-8B-Instruct --gpu L4 --kv-cache-memory-bytes 8e9
  kvdoctor ledger --list-gpus --json
"""
EXIT_STATUS = """\
exit status: 0 it fits, 1 it does not fit (the smallest --tp that does is named), 2 bad input (a flag
out of range, an unknown or ambiguous GPU, an unknown model, a --context longer than the model
takes, a block size vLLM refuses), 3 an internal error. With --json a failure is one JSON object
on stdout too."""

DEFAULT_CONTEXT = 8192
DEFAULT_BATCH = 16
EXIT_DOES_NOT_FIT = 1


# vLLM's --block-size choices (its CacheConfig's BlockSize); any other it refuses at start.
VLLM_BLOCK_SIZES = (1, 8, 16, 32, 64, 128)
MAX_TP = 1024
MAX_CONTEXT = 2**31 - 1
MAX_BATCH = 10**9
MAX_BYTES = 1e15  # a petabyte: more than any GPU's memory or bandwidth per second
_tp = arguments.ranged(int, 1, MAX_TP, "GPUs", low_open=False)
_context = arguments.ranged(int, 1, MAX_CONTEXT, "tokens", low_open=False)
_batch = arguments.ranged(int, 1, MAX_BATCH, "sequences", low_open=False)
_bytes = arguments.ranged(float, 0, MAX_BYTES, "bytes")
_bandwidth = arguments.ranged(float, 0, MAX_BYTES, "bytes/s")
_block_size = arguments.one_of(VLLM_BLOCK_SIZES, "the block sizes vLLM accepts")


def _fraction(text: str) -> float:
    return arguments.checked(text, float, "a number", lambda v: 0 < v <= 1, "more than 0 up to 1")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    flags.add(
        parser,
        "--model",
        help="(required) a config.json, a model folder, a Hugging Face id (in the local cache, or one of these "
        "and their -Instruct/-chat/-it variants) or one of: " + ", ".join(COMMON_MODELS),
    )
    parser.add_argument(
        "--gpu",
        metavar="NAME",
        help="the NVML device name (e.g. 'NVIDIA H100 80GB HBM3') or a short name that means one GPU ('H100 SXM', "
        "'A100 PCIe 80GB', L40S, ...); see --list-gpus",
    )
    parser.add_argument(
        "--gpu-peak-bandwidth",
        type=_bandwidth,
        metavar="BYTES_PER_S",
        help="peak DRAM bandwidth of one GPU (replaces the catalogue's; with --gpu-memory-bytes, for a GPU it lacks)",
    )
    parser.add_argument(
        "--gpu-memory-bytes",
        type=_bytes,
        metavar="BYTES",
        help="memory of one GPU (replaces the catalogue's)",
    )
    parser.add_argument("--tp", type=_tp, default=1, metavar="N", help="tensor-parallel GPUs (default: 1)")
    parser.add_argument(
        "--context",
        type=_context,
        metavar="N",
        help=f"tokens of KV per sequence, vLLM's --max-model-len (default: {DEFAULT_CONTEXT}, or the model's "
        "longest if shorter; at most its max_position_embeddings, or its rope-scaled length)",
    )
    parser.add_argument(
        "--batch",
        type=_batch,
        default=DEFAULT_BATCH,
        metavar="N",
        help=f"concurrent sequences (default: {DEFAULT_BATCH})",
    )
    parser.add_argument(
        "--kv-dtype", choices=KV_CACHE_DTYPES, default=None, help="KV-cache element type (default: the model's dtype)"
    )
    pool = parser.add_mutually_exclusive_group()
    pool.add_argument(
        "--kv-cache-memory-bytes",
        type=_bytes,
        metavar="BYTES",
        help="vLLM's --kv-cache-memory-bytes: each GPU's KV pool, exactly",
    )
    pool.add_argument(
        "--gpu-memory-utilization",
        type=_fraction,
        default=DEFAULT_GPU_MEMORY_UTILIZATION,
        metavar="U",
        help=f"vLLM's --gpu-memory-utilization (default: {DEFAULT_GPU_MEMORY_UTILIZATION}): pool = U x memory - weights"
        " per GPU",
    )
    parser.add_argument(
        "--block-size",
        type=_block_size,
        default=DEFAULT_BLOCK_SIZE,
        metavar="N",
        help=f"vLLM's KV block size in tokens: {', '.join(map(str, VLLM_BLOCK_SIZES))} (default: {DEFAULT_BLOCK_SIZE}; "
        "the CPU build uses 128)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument(
        "--list-gpus",
        action="store_true",
        help="print the GPU catalogue (NVML names, the short names --gpu takes, figures) and exit; --json: as JSON",
    )


def load_model(spec: str) -> ModelShape:
    """A ModelShape from a config.json, a model folder, a cached Hugging Face id or a built-in
    name; UsageError (one line) otherwise."""
    try:
        return load_model_source(spec)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def load_gpu(spec: str) -> GpuSpec:
    """The catalogue's row for an NVML device name or a short name meaning one GPU; UsageError
    listing the candidates (an ambiguous name) or the closest names (an unknown one) otherwise."""
    try:
        return resolve_gpu(spec)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def resolve_gpu_args(args: argparse.Namespace) -> tuple[GpuSpec, str]:
    """The GPU of ``--gpu`` with ``--gpu-peak-bandwidth`` / ``--gpu-memory-bytes`` applied, and
    where its peak bandwidth came from."""
    peak, memory = args.gpu_peak_bandwidth, args.gpu_memory_bytes
    base = None
    if args.gpu:
        try:
            base = resolve_gpu(args.gpu)
        except UnknownGpuError as exc:
            if peak is None or getattr(exc, "candidates", None):
                raise UsageError(str(exc)) from None
    elif peak is None:
        raise UsageError("give --gpu NAME (see --list-gpus), or --gpu-peak-bandwidth and --gpu-memory-bytes")
    if peak is None and memory is None and base is not None:
        return base, f"catalogue: {base.label}"
    try:
        gpu = custom_gpu(peak or (base.peak_bandwidth if base else 0.0), memory, base)
    except ValueError as exc:
        raise UsageError(f"unknown GPU {args.gpu!r}: {exc}" if args.gpu and base is None else str(exc)) from None
    return gpu, "--gpu-peak-bandwidth" if peak else f"catalogue: {gpu.label}"


def check_context(shape: ModelShape, context: int) -> None:
    """Refuses a --context longer than the model takes, first and in vLLM's words (it refuses
    such a --max-model-len at start)."""
    limit = shape.max_model_len
    if limit is not None and context > limit:
        raise UsageError(
            f"--context {context:,} is longer than {shape.name} takes ({shape.max_model_len_source} in its "
            f'config.json): vLLM refuses it too ("User-specified max_model_len ({context}) is greater than the '
            f'derived max_model_len"); give --context {limit:,} or less'
        )


def compute(args: argparse.Namespace) -> LedgerReport:
    if not args.model:
        raise UsageError("--model is required: a config.json, a model folder, a Hugging Face id or a built-in name")
    shape = load_model(args.model)
    if args.context is None:
        args.context = min(DEFAULT_CONTEXT, shape.max_model_len or DEFAULT_CONTEXT)
    check_context(shape, args.context)
    gpu, peak_source = resolve_gpu_args(args)
    request = LedgerRequest(
        shape=shape,
        gpu=gpu,
        context=args.context,
        batch=args.batch,
        kv_dtype=None if args.kv_dtype in (None, "auto") else args.kv_dtype,
        tp=args.tp,
        gpu_memory_utilization=args.gpu_memory_utilization,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        block_size=args.block_size,
        host_bandwidth=DEFAULT_HOST_BANDWIDTH,
        peak_source=peak_source,
    )
    try:
        return build_report(request)
    except (ValueError, ZeroDivisionError) as exc:
        raise UsageError(f"cannot compute the ledger: {exc}") from None


def run(args: argparse.Namespace) -> int:
    if args.list_gpus:
        print(json.dumps(catalogue_json(), indent=2) if args.json else catalogue_table())
        return 0
    report = compute(args)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        if report.request.shape.note:
            print(f"kvdoctor ledger: note: {report.request.shape.note}", file=sys.stderr)
        print(render(report))
    return 0 if report.fit.fits else EXIT_DOES_NOT_FIT


# ------------------------------------------------------------------------------------ printing


def catalogue_json() -> dict[str, list[dict[str, object]]]:
    """The catalogue as ``--list-gpus --json`` prints it: each row with the short name ``--gpu`` takes."""
    return {"gpus": [{"short_name": short_name(g), **g.to_json()} for g in GPUS]}


def catalogue_table() -> str:
    rows = [("NVML device name", "short name", "memory", "peak DRAM", "host link", "source")]
    for g in GPUS:
        rows.append(
            (
                g.name,
                short_name(g),
                f"{g.memory_bytes / 2**30:.0f} GiB",
                f"{g.peak_bandwidth / GB:,.0f} GB/s",
                g.host_link,
                g.source,
            )
        )
    return table(rows, right=(2, 3))


def table(rows: list[tuple[str, ...]], right: tuple[int, ...] = (), indent: str = "") -> str:
    """Rows in columns as wide as their widest cell (the last column unpadded): aligned whatever
    the figures' size. ``right``: the columns aligned right."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [
            cell.rjust(w) if i in right else (cell if i == len(row) - 1 else cell.ljust(w))
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append((indent + "  ".join(cells)).rstrip())
    return "\n".join(lines)


def _change(ratio: float) -> str:
    pct = (ratio - 1.0) * 100.0
    return "=" if abs(pct) < 0.05 else f"{pct:+.0f}%"


def _figure_lines(report: LedgerReport, names: tuple[str, ...]) -> list[str]:
    # the value column is as wide as the report's widest figure (22 at least): aligned at any size
    label_width = max([42, *(len(f.label) for f in report.figures)])
    value_width = max([22, *(len(f.formatted()) + 1 for f in report.figures)])
    lines = []
    for name in names:
        fig = report.figure(name)
        if fig is not None:
            lines.append(f"  {fig.label:<{label_width}} {fig.formatted():<{value_width}} {fig.how}")
    return lines


def render(report: LedgerReport) -> str:
    r, fit = report.request, report.fit
    s, g = r.shape, r.gpu
    kind = (
        f"MLA latent {s.kv_latent_dim}" if s.kv_latent_dim else f"{s.num_kv_heads} KV heads of {s.num_attention_heads}"
    )
    if s.is_moe:
        kind += f", {s.num_experts} experts ({s.experts_per_token} active)"
    gpus = f"{r.tp} x " if r.tp > 1 else ""
    lines = [
        f"{s.name} ({s.num_layers} layers, {kind}) on {gpus}{g.name} ({g.label or 'custom'}: "
        f"{g.peak_bandwidth / GB:,.0f} GB/s, {g.memory_bytes / 2**30:,.0f} GiB), --tp {r.tp}: "
        f"{sequences(r.batch)} x {r.context:,} tokens, KV {report.to_json()['kv_dtype']}",
        "",
    ]
    cap = fit.capacity
    if fit.fits:
        lines.append(
            f"fits: yes. Each GPU's KV pool ({fmt_size(cap.pool_bytes)}) holds {sequences(cap.sequences)} "
            f"of {r.context:,} tokens."
        )
        if cap.sequences < r.batch:
            lines.append(
                f"  but not all {sequences(r.batch)} of the batch: the rest wait in the queue or are preempted "
                "(the host-offload section below says whether a host tier could hold them)."
            )
    else:
        lines.append(f"DOES NOT FIT: {fit.reason}.")
        lines.append(
            f"  smallest --tp that fits: {fit.suggested_tp} (run again with --tp {fit.suggested_tp})"
            if fit.suggested_tp
            else "  no --tp up to 64 fits: quantise the weights, shorten --context, or pick a bigger GPU."
        )
        lines.append("  No decode floor: it would describe a deployment that cannot start.")
    lines += ["", "model"]
    lines += _figure_lines(
        report,
        (
            "kv_bytes_per_token",
            "kv_bytes_per_token_per_gpu",
            "weight_bytes",
            "weight_bytes_per_gpu",
            "weight_bytes_per_step",
        ),
    )
    lines += ["", "KV pool, counted as vLLM does"]
    lines += _figure_lines(report, ("kv_pool_bytes", "kv_cache_tokens", "max_concurrency", "sequences_that_fit"))
    if report.ledger is None:
        return "\n".join(lines)
    lines += ["", "decode floor"]
    lines += _figure_lines(
        report,
        (
            "live_kv_bytes",
            "live_kv_bytes_per_gpu",
            "step_floor_seconds",
            "tokens_per_second_per_sequence",
            "tokens_per_second_total",
            "all_reduce_seconds",
        ),
    )
    lines += _what_if_lines(report) + _offload_lines(report)
    return "\n".join(lines)


def _what_if_lines(report: LedgerReport) -> list[str]:
    per_gpu = " per GPU" if report.request.tp > 1 else ""
    rows = []
    for row in report.what_if:
        led = row.ledger
        change = (
            "baseline"
            if row.name == "baseline"
            else f"{_change(row.step_floor_ratio)}, {_change(row.tokens_per_second_ratio)}"
        )
        flag = f"   {row.flag}" if row.flag else ""
        rows.append(
            (
                row.label,
                fmt_size(led.kv_bytes_per_token_per_gpu).split(" (")[0],
                fmt_size(led.live_kv_bytes_per_gpu),
                fmt_duration(led.step_floor_seconds),
                f"{led.tokens_per_second_total:,.0f}",
                "yes" if row.fits else "no",
                change + flag,
            )
        )
    # each column as wide as its widest cell, at least as wide as the header's (aligned at any size)
    heads = ("KV/token", "live KV", "step floor", "tokens/s", "fits", "change (floor, tokens/s)")
    least = (30, 11, 11, 11, 10, 5)
    widths = [max([least[i], *(len(r[i]) + 1 for r in rows)]) for i in range(len(least))]
    header = f"what if (KV and floor{per_gpu})".ljust(widths[0] + 3)
    header += "".join(h.ljust(w + 1) for h, w in zip(heads[:-1], widths[1:], strict=True)) + heads[-1]
    lines = ["", header]
    for r in rows:
        cells = "".join(c.ljust(w + 1) for c, w in zip(r[:-1], widths, strict=True))
        lines.append(f"  {cells}{r[-1]}")
    return lines


def _offload_lines(report: LedgerReport) -> list[str]:
    o, r = report.offload, report.request
    if o is None:
        return []
    link = (
        f"{o.link_bandwidth / GB:.1f} GB/s per GPU (min of host memory and the GPU's {r.gpu.host_link or 'host link'})"
    )
    lines = ["", f"host offload over {link}:"]
    if o.overflow_bytes <= 0:
        lines.append("  nothing to offload: the live KV fits in the GPU pool.")
    else:
        verdict = "hides behind the step" if o.hideable else "cannot hide behind the step"
        lines.append(
            f"  {fmt_size(o.overflow_bytes)} of KV per GPU does not fit and would live on the host: moving it "
            f"takes {fmt_duration(o.transfer_seconds_per_step)} per step against a {fmt_duration(o.step_seconds)} "
            f"step floor with only the KV that fits ({verdict})."
        )
        lines.append(
            f"  to hide it, {o.prefetch_hit_rate_needed:.1%} of the host KV must already be on the "
            "GPU when the step reads it (prefetch hit rate)."
        )
    per_token = report.ledger.kv_bytes_per_token_per_gpu if report.ledger else 0.0
    lines.append(
        f"  a prefix hit served from the host ({r.context:,} tokens, {fmt_size(per_token * r.context)} per GPU) "
        f"takes {fmt_duration(o.prefix_load_seconds)} to load: {o.prefix_load_steps:.1f} decode steps."
    )
    return lines
