"""TensorRT-LLM behind Triton Inference Server (the ``tensorrtllm`` backend), Triton's ``/metrics``
(port 8002).

Sources: NVIDIA/TensorRT-LLM ``triton_backend/inflight_batcher_llm/src/custom_metrics_reporter/
custom_metrics_reporter.cc`` (current) and triton-inference-server/tensorrtllm_backend
``inflight_batcher_llm/src/custom_metrics_reporter/custom_metrics_reporter.cc`` (2024). Every
family is a gauge labelled ``model`` (the Triton model, e.g. ``tensorrt_llm``) and ``version``.

Notes:
- KV usage is ``nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}`` (0..1); older
  backends had no ``fraction`` (used/max of two samples: not expressible as a row), so they give
  no KV usage.
- Running is ``request_type="active"`` (the executor's numActiveRequests, the same field
  ``trtllm-serve`` exposes as running); waiting is ``request_type="waiting"`` (newer backends).
- Token totals come from the ``_sum`` of the per-response histograms ``nv_llm_input_token_len``
  and ``nv_llm_output_token_len`` (newer backends).
- KV capacity is ``max x tokens_per`` (a product: see the report). ``reused`` counts blocks
  without a matching miss count, so no prefix hit ratio. No TTFT/ITL histogram: Triton's own
  ``nv_inference_first_response_histogram_ms`` is in milliseconds in its ``le`` labels, which a
  row's ``scale`` cannot rescale.
"""

from __future__ import annotations

from kvdoctor.rules import signals as S

from .base import EngineAdapter, MetricMap

_KV = "nv_trt_llm_kv_cache_block_metrics"
_REQ = "nv_trt_llm_request_metrics"

ADAPTER = EngineAdapter(
    name="trtllm_triton",
    detect=(_REQ, _KV),
    maps=(
        MetricMap((_KV,), S.KV_CACHE_USAGE, match={"kv_cache_block_type": "fraction"}),
        MetricMap(
            (_KV,),
            S.KV_CACHE_CAPACITY,
            match={"kv_cache_block_type": "max"},
            times=(_KV, {"kv_cache_block_type": "tokens_per"}),
        ),
        MetricMap((_REQ,), S.REQUESTS_RUNNING, match={"request_type": "active"}),
        MetricMap((_REQ,), S.REQUESTS_WAITING, match={"request_type": "waiting"}),
        MetricMap(("nv_llm_input_token_len_sum",), S.PROMPT_TOKENS),
        MetricMap(("nv_llm_output_token_len_sum",), S.GENERATION_TOKENS),
    ),
    engine_labels={"model": "model_name"},
    cannot_provide=(
        S.PREEMPTIONS,
        S.KV_TRANSFER_BYTES,
        S.PREFIX_CACHE_QUERIES,
        S.PREFIX_CACHE_HITS,
        S.PREFIX_CACHE_HITS_BY_TIER,
        S.PREFIX_CACHE_HIT_RATIO,
        S.INTER_TOKEN_LATENCY,
        S.TIME_TO_FIRST_TOKEN,
    ),
)
