"""What a diagnosis needs beyond its samples -- the latency SLO, the model's shape, the GPU and its
peak bandwidth -- and how an exporter publishes it so that every client diagnoses alike.

The exporter publishes its ``Context`` three ways, all written and read here:

- ``kvdoctor_inter_token_latency_slo_seconds`` (a gauge; ``kvdoctor_time_to_first_token_slo_seconds``
  beside it where a TTFT SLO is set) and ``kvdoctor_context_info`` (an info
  gauge: 1, labelled with the model's shape, the GPU and its peak bandwidth) on its page and in its
  stored window, so a window read from the exporter, from Prometheus or from a recorded trace
  carries the context it was diagnosed with (``published_context``);
- ``/api/v1/status``'s ``context`` object (``context_to_json`` / ``context_from_json``).

``resolve(given, published)``: what the caller was told wins (``--slo-ms``), then what the
window's exporter published, then the defaults.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from kvdoctor.ledger.model import ModelShape
from kvdoctor.signals.vocabulary import CONTEXT_INFO, ITL_SLO, TTFT_SLO

from .thresholds import DEFAULT_SLO_SECONDS

# Where a context's SLO came from, as the diagnosis reports it.
GIVEN = "given"
PUBLISHED = "published by the exporter"
DEFAULT = "default"

_MODEL_PREFIX = "model_"  # the info metric's labels for the shape's fields (the name is ``model``)
_SHAPE_FIELDS = {f.name: str(f.type) for f in fields(ModelShape)}


@dataclass(frozen=True)
class Context:
    """What the window cannot say: the model's shape, the GPU, its peak bandwidth, the latency SLO.

    ``slo_seconds`` None: the SLO the window's exporter published, else ``DEFAULT_SLO_SECONDS``.
    """

    model: ModelShape | None = None
    gpu_peak_bandwidth: float | None = None  # bytes/s of one GPU; else from the window or the catalogue
    slo_seconds: float | None = None  # ITL SLO compared with the ITL p95
    kv_dtype: str | None = None  # the engine's KV cache dtype (e.g. "fp8"); default: the model's dtype
    gpu_model: str | None = None  # the GPU's name, as NVML gives it
    slo_source: str = DEFAULT  # GIVEN, PUBLISHED or DEFAULT (set by ``resolve``)
    ttft_slo_seconds: float | None = None  # TTFT SLO (a p95), for the TTFT burn alerts; None: none set

    @property
    def slo(self) -> float:
        """The SLO in seconds, the default where none is known."""
        return DEFAULT_SLO_SECONDS if self.slo_seconds is None else float(self.slo_seconds)


def resolve(given: Context | None, published: Context | None) -> Context:
    """``given``'s fields, ``published``'s where ``given`` has none, then the defaults."""
    given = given or Context()
    published = published or Context()
    slo, source = None, DEFAULT  # left None: a later resolve may still find a published one
    if given.slo_seconds is not None:
        slo, source = float(given.slo_seconds), given.slo_source if given.slo_source != DEFAULT else GIVEN
    elif published.slo_seconds is not None:
        slo, source = float(published.slo_seconds), PUBLISHED
    return Context(
        model=given.model or published.model,
        gpu_peak_bandwidth=given.gpu_peak_bandwidth or published.gpu_peak_bandwidth,
        slo_seconds=slo,
        kv_dtype=given.kv_dtype or published.kv_dtype,
        gpu_model=given.gpu_model or published.gpu_model,
        slo_source=source,
        ttft_slo_seconds=given.ttft_slo_seconds or published.ttft_slo_seconds,
    )


# ------------------------------------------------------------------------------ as samples


def published_samples(ctx: Context) -> list[tuple[str, dict[str, str], float]]:
    """``(name, labels, value)`` of the SLO gauges (the TTFT one only where it is set) and the info
    metric for ``ctx``."""
    ttft: list[tuple[str, dict[str, str], float]] = (
        [(TTFT_SLO, {}, float(ctx.ttft_slo_seconds))] if ctx.ttft_slo_seconds else []
    )
    return [(ITL_SLO, {}, ctx.slo), *ttft, (CONTEXT_INFO, info_labels(ctx), 1.0)]


def info_labels(ctx: Context) -> dict[str, str]:
    """The info metric's labels: every known fact as text (an unknown one is left out)."""
    labels: dict[str, str] = {}
    if ctx.model is not None:
        for name, value in asdict(ctx.model).items():
            if value is not None and value != "":
                key = "model" if name == "name" else _MODEL_PREFIX + name
                labels[key] = repr(value) if isinstance(value, float) else str(value)
    if ctx.gpu_model:
        labels["gpu_model"] = ctx.gpu_model
    if ctx.gpu_peak_bandwidth:
        labels["peak_bandwidth_bytes_per_second"] = repr(float(ctx.gpu_peak_bandwidth))
    if ctx.kv_dtype:
        labels["kv_dtype"] = ctx.kv_dtype
    return labels


def context_from_info(labels: Mapping[str, str], slo_seconds: float | None = None) -> Context:
    """The context an info metric's labels describe (facts it cannot parse are left unknown)."""
    shape: dict[str, Any] = {}
    if labels.get("model"):
        shape["name"] = labels["model"]
    for key, text in labels.items():
        name = key.removeprefix(_MODEL_PREFIX)
        if key.startswith(_MODEL_PREFIX) and name in _SHAPE_FIELDS and name != "name":
            value = _typed(text, _SHAPE_FIELDS[name])
            if value is not None:
                shape[name] = value
    return Context(
        model=_shape(shape),
        gpu_peak_bandwidth=_positive(labels.get("peak_bandwidth_bytes_per_second")),
        slo_seconds=slo_seconds,
        kv_dtype=labels.get("kv_dtype") or None,
        gpu_model=labels.get("gpu_model") or None,
    )


def published_context(info: Sequence[Mapping[str, str]], slo_values: Sequence[float]) -> Context:
    """The context a window's exporter published: its info metric's labels (the last of them)
    and the newest of its SLO samples (NaN: none)."""
    slo = next((float(v) for v in reversed(slo_values) if v == v and v > 0 and math.isfinite(v)), None)
    return context_from_info(info[-1] if info else {}, slo)


# ---------------------------------------------------------------------------------- as JSON


def context_to_json(ctx: Context) -> dict[str, Any]:
    """``/api/v1/status``'s ``context`` object (and the diagnosis' own)."""
    return {
        "slo_seconds": ctx.slo,
        "slo_source": ctx.slo_source,
        "ttft_slo_seconds": ctx.ttft_slo_seconds,
        "model": asdict(ctx.model) if ctx.model is not None else None,
        "kv_dtype": ctx.kv_dtype,
        "gpu_model": ctx.gpu_model,
        "gpu_peak_bandwidth_bytes_per_second": ctx.gpu_peak_bandwidth,
    }


def context_from_json(payload: Mapping[str, Any]) -> Context:
    """Inverse of ``context_to_json``; ``ValueError`` on a malformed object."""
    if not isinstance(payload, Mapping):
        raise ValueError("the context is not a JSON object")
    model = payload.get("model")
    if model is not None and not isinstance(model, Mapping):
        raise ValueError("the context's model is not a JSON object")
    shape = None
    if model:
        known = {k: v for k, v in model.items() if k in _SHAPE_FIELDS}
        shape = _shape(known)
        if shape is None:
            raise ValueError("the context's model lacks the shape's fields")
    slo = payload.get("slo_seconds")
    return Context(
        model=shape,
        gpu_peak_bandwidth=_positive(payload.get("gpu_peak_bandwidth_bytes_per_second")),
        slo_seconds=_positive(slo),
        kv_dtype=str(payload["kv_dtype"]) if payload.get("kv_dtype") else None,
        gpu_model=str(payload["gpu_model"]) if payload.get("gpu_model") else None,
        ttft_slo_seconds=_positive(payload.get("ttft_slo_seconds")),
    )


def with_slo(ctx: Context, slo_seconds: float | None) -> Context:
    return replace(ctx, slo_seconds=slo_seconds)


def _shape(values: Mapping[str, Any]) -> ModelShape | None:
    try:
        return ModelShape(**values)
    except TypeError:  # a required field missing
        return None


def _typed(text: str, annotation: str) -> Any:
    """``text`` as the field's type (``int``, ``float``, ``str``, optional ones); None if it is not."""
    try:
        if annotation.startswith("int"):
            return int(text)
        if annotation.startswith("float"):
            return float(text)
    except ValueError:
        return None
    return text


def _positive(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number > 0 and math.isfinite(number) else None
