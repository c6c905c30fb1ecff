"""Ledger: how fast decode *can* be for a model on a GPU, and what each fix would buy.

A form (model from an uploaded ``config.json`` or a common shape, GPU, tensor-parallel GPUs,
context, batch, KV dtype) -> whether the deployment fits, then the ledger's KV bytes per token,
total KV, decode floor, tokens/s ceiling (each value's tooltip says how it was computed), what-if
rows, and whether host offload can hide behind the decode step. No I/O: the upload is read in the browser's
request, nothing is fetched.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import asdict

import dash
from dash import Input, Output, State, dcc, html, no_update

from kvdoctor.dashboard import components, ids, ledger_view
from kvdoctor.dashboard.wiring import each
from kvdoctor.ledger.arithmetic import DEFAULT_GPU_MEMORY_UTILIZATION, DEFAULT_HOST_BANDWIDTH
from kvdoctor.ledger.gpus import GPU_CATALOGUE, GPUS
from kvdoctor.ledger.model import COMMON_MODELS, KV_CACHE_DTYPES, ModelShape
from kvdoctor.signals.units import GIB, fmt_bytes_exact, fmt_ms, fmt_number
from kvdoctor.sources.model_files import load_model_shape

NAME = "Ledger"  # the nav link and the tab title
PATH = "/ledger"
UPLOADED = "__uploaded__"
MAX_UPLOAD_BYTES = 1_000_000
DEFAULT_MODEL = "Llama-3.1-8B" if "Llama-3.1-8B" in COMMON_MODELS else next(iter(COMMON_MODELS))
DEFAULT_GPU = "NVIDIA H100 80GB HBM3" if "NVIDIA H100 80GB HBM3" in GPU_CATALOGUE else next(iter(GPU_CATALOGUE))
# The form's plain inputs, in ``compute``'s argument order (after the model and the uploaded shape).
FORM_INPUTS = (
    ids.LEDGER_GPU,
    ids.LEDGER_CONTEXT,
    ids.LEDGER_BATCH,
    ids.LEDGER_KV_DTYPE,
    ids.LEDGER_HOST_BANDWIDTH,
    ids.LEDGER_GPU_MEMORY_UTILIZATION,
    ids.LEDGER_TP,
)


def register(app: dash.Dash) -> None:
    app.callback(
        Output(ids.LEDGER_UPLOADED_SHAPE, "data"),
        Output(ids.LEDGER_UPLOAD_STATUS, "children"),
        Output(ids.LEDGER_MODEL, "options"),
        Output(ids.LEDGER_MODEL, "value"),
        Input(ids.LEDGER_UPLOAD, "contents"),
        State(ids.LEDGER_UPLOAD, "filename"),
        State(ids.LEDGER_MODEL, "options"),
        prevent_initial_call=True,
    )(read_upload)
    app.callback(
        *each(Output, "children", ids.LEDGER_RESULT, ids.LEDGER_WHAT_IF, ids.LEDGER_OFFLOAD, ids.LEDGER_ERROR),
        Input(ids.LEDGER_MODEL, "value"),
        Input(ids.LEDGER_UPLOADED_SHAPE, "data"),
        *each(Input, "value", *FORM_INPUTS),
    )(compute)


def _model_options() -> list[dict]:
    return [{"label": name, "value": name} for name in COMMON_MODELS]


def layout(**_params) -> html.Div:
    def field(label, control, hint=""):
        return html.Label(
            [
                html.Span(label, className="field-label"),
                control,
                html.Span(hint, className="field-hint") if hint else None,
            ],
            className="field",
        )

    form = html.Div(
        [
            html.H3("Model, GPU and load"),
            field(
                "model",
                dcc.Dropdown(id=ids.LEDGER_MODEL, options=_model_options(), value=DEFAULT_MODEL, clearable=False),
            ),
            dcc.Upload(
                id=ids.LEDGER_UPLOAD,
                children=html.Div(["or drop a Hugging Face ", html.Code("config.json"), " here / click to choose one"]),
                className="upload",
                max_size=MAX_UPLOAD_BYTES,
                accept=".json,application/json",
            ),
            html.Div(id=ids.LEDGER_UPLOAD_STATUS, className="upload-status"),
            field(
                "GPU",
                dcc.Dropdown(
                    id=ids.LEDGER_GPU,
                    value=DEFAULT_GPU,
                    clearable=False,
                    options=[
                        {
                            "label": f"{g.label} ({g.peak_bandwidth / 1e9:,.0f} GB/s, {g.memory_bytes / GIB:.0f} GiB)",
                            "value": g.name,
                            "title": g.name,
                        }
                        for g in GPUS
                    ],
                ),
                "the NVML device name: nvidia-smi --query-gpu=name",
            ),
            field(
                "tensor-parallel GPUs",
                dcc.Input(id=ids.LEDGER_TP, type="number", min=1, step=1, value=1, debounce=True),
                "vLLM --tensor-parallel-size",
            ),
            field(
                "context (tokens per sequence)",
                dcc.Input(id=ids.LEDGER_CONTEXT, type="number", min=1, step=1, value=8192, debounce=True),
            ),
            field(
                "batch (concurrent sequences)",
                dcc.Input(id=ids.LEDGER_BATCH, type="number", min=1, step=1, value=16, debounce=True),
            ),
            field(
                "KV cache dtype",
                dcc.Dropdown(
                    id=ids.LEDGER_KV_DTYPE,
                    value="auto",
                    clearable=False,
                    options=[{"label": "model dtype" if d == "auto" else d, "value": d} for d in KV_CACHE_DTYPES],
                ),
            ),
            field(
                "host memory bandwidth (GB/s)",
                dcc.Input(
                    id=ids.LEDGER_HOST_BANDWIDTH,
                    type="number",
                    min=1,
                    value=round(DEFAULT_HOST_BANDWIDTH / 1e9, 1),
                    debounce=True,
                ),
                "8 channels of DDR5-4800",
            ),
            field(
                "GPU memory utilisation",
                dcc.Input(
                    id=ids.LEDGER_GPU_MEMORY_UTILIZATION,
                    type="number",
                    min=0.05,
                    max=1,
                    step=0.01,
                    debounce=True,
                    value=DEFAULT_GPU_MEMORY_UTILIZATION,
                ),
                "vLLM --gpu-memory-utilization",
            ),
            dcc.Store(id=ids.LEDGER_UPLOADED_SHAPE),
        ],
        className="ledger-form",
    )
    results = html.Div(
        [
            html.Div(id=ids.LEDGER_ERROR, className="form-error"),
            html.H3("The ledger"),
            html.Div(id=ids.LEDGER_RESULT),
            html.H3("What if"),
            html.Div(id=ids.LEDGER_WHAT_IF),
            html.H3("Host offload"),
            html.Div(id=ids.LEDGER_OFFLOAD),
        ],
        className="ledger-results",
    )
    return html.Div([form, results], className="page page-ledger")


def shape_from_upload(contents: str, filename: str | None) -> ModelShape:
    """A ``dcc.Upload`` data URL of a ``config.json`` -> ModelShape; ``ValueError`` with one line."""
    try:
        _, _, encoded = contents.partition(",")
        raw = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("the upload is not readable") from None
    if len(raw) > MAX_UPLOAD_BYTES:
        raise ValueError("config.json is larger than 1 MB")
    return load_model_shape(raw, default_name=filename.rsplit("/", 1)[-1] if filename else None)


def read_upload(contents, filename, options):
    if not contents:
        return no_update, no_update, no_update, no_update
    try:
        shape = shape_from_upload(contents, filename)
    except ValueError as exc:
        return (
            no_update,
            html.Span(f"could not read {filename or 'the file'}: {exc}", className="form-error"),
            no_update,
            no_update,
        )
    kv = f"MLA latent {shape.kv_latent_dim}" if shape.kv_latent_dim else f"{shape.num_kv_heads} KV heads"
    status = (
        f"read {shape.name}: {shape.num_layers} layers, {shape.num_attention_heads} heads, {kv}, "
        f"head dim {shape.head_dim}, {shape.dtype}"
    )
    if shape.is_moe:
        status += f", {shape.num_experts} experts ({shape.experts_per_token} active per token)"
    options = [o for o in (options or _model_options()) if o["value"] != UPLOADED]
    options.insert(0, {"label": f"uploaded: {shape.name}", "value": UPLOADED})
    return asdict(shape), status, options, UPLOADED


def compute(model, uploaded, gpu_name, context, batch, kv_dtype, host_gbps, memory_utilization, tp=1):
    try:
        if model == UPLOADED:
            if not uploaded:
                raise ValueError("upload a config.json first")
            shape = ModelShape(**uploaded)
        elif model in COMMON_MODELS:
            shape = COMMON_MODELS[model]
        else:
            raise ValueError("pick a model")
        if gpu_name not in GPU_CATALOGUE:
            raise ValueError("pick a GPU")
        if context is None or batch is None or host_gbps is None or memory_utilization is None or tp is None:
            raise ValueError("fill in every field")
        r = ledger_view.report(
            shape,
            GPU_CATALOGUE[gpu_name],
            int(context),
            int(batch),
            kv_dtype or "auto",
            float(host_gbps) * 1e9,
            float(memory_utilization),
            int(tp),
        )
    except (ValueError, TypeError) as exc:
        return None, None, None, str(exc)
    if r.baseline is None:
        return _does_not_fit(r), None, None, None

    b = r.baseline
    led = b.ledger
    per_gpu = " per GPU" if r.tp > 1 else ""
    result = components.key_value_table(
        [
            (
                "model",
                f"{r.model.name}: {r.model.num_layers} layers, {r.model.num_kv_heads} KV heads x head dim "
                f"{r.model.head_dim}, {r.model.dtype}",
            ),
            ("fits", _how(r, "kv_pool_bytes", f"yes, on {r.tp} GPU{'s' if r.tp > 1 else ''}")),
            ("weights", _how(r, "weight_bytes", fmt_bytes_exact(led.weight_bytes))),
            (
                "weights read per decode step",
                _how(r, "weight_bytes_per_step", fmt_bytes_exact(led.weight_bytes_per_step)),
            ),
            ("KV bytes per token", _how(r, "kv_bytes_per_token", fmt_bytes_exact(led.kv_bytes_per_token))),
            (f"total KV (context x batch){per_gpu}", fmt_bytes_exact(led.live_kv_bytes_per_gpu)),
            (
                "KV pool on this GPU",
                _how(
                    r,
                    "kv_pool_bytes",
                    f"{fmt_bytes_exact(r.pool_bytes)} ({'fits' if b.fits else 'does NOT fit'}; "
                    f"room for {b.max_batch:,} sequences of this context)",
                ),
            ),
            ("decode step floor", _how(r, "step_floor_seconds", fmt_ms(led.step_floor_seconds, 2, grouping=True))),
            ("tokens/s ceiling per sequence", fmt_number(led.tokens_per_second_per_sequence, "tokens/s")),
            ("tokens/s ceiling, whole batch", fmt_number(led.tokens_per_second_total, "tokens/s")),
        ],
        class_name="kv-table ledger-table",
    )

    what_if = components.table(
        ["case", "how", "KV/token", "total KV", "fits", "step floor", "tokens/s per seq", "vs now"],
        [
            [
                c.label,
                html.Code(c.flag) if c.flag else "–",
                fmt_bytes_exact(c.ledger.kv_bytes_per_token_per_gpu),
                fmt_bytes_exact(c.ledger.live_kv_bytes_per_gpu),
                "yes" if c.fits else "no",
                fmt_ms(c.ledger.step_floor_seconds, 2, grouping=True),
                fmt_number(c.ledger.tokens_per_second_per_sequence, "tokens/s"),
                "–" if c is b else f"{c.tokens_per_second_ratio:.2f}x tokens/s",
            ]
            for c in [b, *r.what_if]
        ],
        class_name="data-table what-if",
    )

    o = r.offload
    rows = [
        ("bandwidth host -> GPU", f"{o.link_bandwidth / 1e9:,.1f} GB/s (min of host memory and PCIe)"),
        (
            "loading one sequence's context from the host",
            f"{fmt_ms(o.prefix_load_seconds, 2, grouping=True)} ({o.prefix_load_steps:,.1f} decode steps)",
        ),
    ]
    if o.overflow_bytes <= 0:
        verdict = html.P("The KV fits in the GPU's pool: nothing needs to live on the host.", className="offload-ok")
    else:
        rows = [
            ("KV beyond the GPU pool", fmt_bytes_exact(o.overflow_bytes)),
            ("transfer time per step", fmt_ms(o.transfer_seconds_per_step, 2, grouping=True)),
            ("decode step (floor)", fmt_ms(o.step_seconds, 2, grouping=True)),
            ("prefetch hit rate needed", f"{o.prefetch_hit_rate_needed:.1%}"),
            *rows,
        ]
        verdict = (
            html.P(
                "Offload can hide behind the step: the transfer takes less than one decode step.",
                className="offload-ok",
            )
            if o.hideable
            else html.P(
                f"Offload cannot hide behind the step: at least {o.prefetch_hit_rate_needed:.0%} of "
                f"the offloaded KV must already be on the GPU (prefetched or reused) when each step starts.",
                className="offload-bad",
            )
        )
    offload = html.Div([components.key_value_table(rows, class_name="kv-table offload-table"), verdict])
    return result, what_if, offload, None


def _how(r: ledger_view.LedgerReport, figure: str, text: str) -> html.Span:
    """``text`` with how the ledger computed it as its tooltip."""
    fig = r.report.figure(figure)
    return html.Span(text, title=fig.how if fig else None)


def _does_not_fit(r: ledger_view.LedgerReport) -> html.Div:
    fit = r.fit
    suggestion = (
        f"The smallest number of tensor-parallel GPUs that fits: {fit.suggested_tp}."
        if fit.suggested_tp
        else "No tensor-parallel size up to 64 fits."
    )
    rows = [
        ("fits", f"no: {fit.reason}"),
        *[(f.label, html.Span(f.formatted(), title=f.how)) for f in r.report.figures],
    ]
    return html.Div(
        [
            html.P(f"Does not fit: {fit.reason}. {suggestion}", className="offload-bad"),
            components.key_value_table(rows, class_name="kv-table ledger-table"),
        ]
    )
