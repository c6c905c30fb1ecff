"""TensorRT-LLM behind Triton Inference Server (the ``tensorrtllm`` backend), Triton's ``/metrics``
(port 8002).

Sources: NVIDIA/TensorRT-LLM ``triton_backend/inflight_batcher_llm/src/custom_metrics_reporter/
custom_metrics_reporter.cc`` (current) and triton-inference-server/tensorrtllm_backend
``inflight_batcher_llm/src/custom_metrics_reporter/custom_metrics_reporter.cc`` (2024); the
example pages of the backend's README (23.11, 2024, current), kept under
tests/fixtures/published/trtllm_triton/. Every family is a gauge labelled ``model`` (the Triton
model, e.g. ``tensorrt_llm``) and ``version``.

Generations:
- 23.11 (November 2023): ``nv_trt_llm_request_statistics`` and
  ``nv_trt_llm_kv_cache_block_statistics``; blocks ``max``/``free``/``used``/``tokens_per``, no
  ``fraction``: KV usage is derived from its parts, used / max.
- 2024: renamed ``..._metrics``; still no ``fraction`` (used / max again).
- Current: ``fraction`` (0..1, read as published where present, even where it disagrees with
  used / max), ``request_type="waiting"``, and the ``nv_llm_input/output_token_len`` histograms.

Notes:
- Running is ``request_type="active"`` (the executor's numActiveRequests, the same field
  ``trtllm-serve`` exposes as running); waiting is ``request_type="waiting"`` (current backends).
- Token totals come from the ``_sum`` of the per-response histograms ``nv_llm_input_token_len``
  (input tokens per request, prefix hits included) and ``nv_llm_output_token_len``.
- KV capacity is ``max x tokens_per``. ``reused`` counts blocks without a matching miss count, so
  no prefix hit ratio. No TTFT/ITL histogram: Triton's own
  ``nv_inference_first_response_histogram_ms`` is in milliseconds in its ``le`` labels, which a
  row's ``scale`` cannot rescale.
"""

from __future__ import annotations

from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.units import RATIO

from .base import EngineAdapter, MetricMap, Ratio

_KV = "nv_trt_llm_kv_cache_block_metrics"
_REQ = "nv_trt_llm_request_metrics"
_KV_2023 = "nv_trt_llm_kv_cache_block_statistics"
_REQ_2023 = "nv_trt_llm_request_statistics"


def _blocks(family: str, block_type: str):
    return (family, {"kv_cache_block_type": block_type})


ADAPTER = EngineAdapter(
    name="trtllm_triton",
    detect=(_REQ, _KV, _REQ_2023, _KV_2023),
    maps=(
        MetricMap(
            (
                _blocks(_KV, "fraction"),
                Ratio(_blocks(_KV, "used"), _blocks(_KV, "max")),
                Ratio(_blocks(_KV_2023, "used"), _blocks(_KV_2023, "max")),
            ),
            S.KV_CACHE_USAGE,
            unit=RATIO,
        ),
        MetricMap((_blocks(_KV, "max"),), S.KV_CACHE_CAPACITY, times=_blocks(_KV, "tokens_per")),
        MetricMap(
            (_blocks(_KV_2023, "max"),), S.KV_CACHE_CAPACITY, times=_blocks(_KV_2023, "tokens_per"), unless=(_KV,)
        ),
        MetricMap(((_REQ, {"request_type": "active"}), (_REQ_2023, {"request_type": "active"})), S.REQUESTS_RUNNING),
        MetricMap(((_REQ, {"request_type": "waiting"}),), S.REQUESTS_WAITING),
        MetricMap(("nv_llm_input_token_len_sum",), S.PROMPT_TOKENS),
        MetricMap(("nv_llm_output_token_len_sum",), S.GENERATION_TOKENS),
    ),
    engine_labels={"model": "model_name"},
    prefixes=("nv_trt_llm_",),
)
