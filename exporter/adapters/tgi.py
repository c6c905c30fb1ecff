"""Hugging Face Text Generation Inference (router ``/metrics``; the project is in maintenance mode).

Sources: huggingface/text-generation-inference ``router/src/server.rs`` (bucket set-up and
descriptions), ``docs/source/reference/metrics.md``. Rendered by the Rust
``metrics-exporter-prometheus``: counters have no ``_total`` suffix, no labels besides
``method``/``err``, histograms only for the families given buckets (``*duration``,
``tgi_request_input_length``, ``tgi_request_generated_tokens``, ...).

Notes:
- No KV occupancy, capacity, preemption or prefix-cache metric, and no TTFT histogram.
- ``tgi_request_mean_time_per_token_duration`` is a per-request mean time per token; it is the
  only per-token latency TGI has and is mapped to ITL with that caveat.
- Token totals are the ``_sum`` of the per-request histograms ``tgi_request_input_length`` and
  ``tgi_request_generated_tokens`` (successful requests only; the input length is the whole
  prompt, prefix-cache hits of TGI 3 included, as the canonical prompt tokens mean).
- Running is ``tgi_batch_current_size`` (requests in the running batch).
"""

from __future__ import annotations

from kvdoctor.signals import vocabulary as S

from .base import EngineAdapter, MetricMap

ADAPTER = EngineAdapter(
    name="tgi",
    detect=("tgi_queue_size", "tgi_batch_current_size", "tgi_request_duration", "tgi_request_success"),
    maps=(
        MetricMap(("tgi_batch_current_size",), S.REQUESTS_RUNNING),
        MetricMap(("tgi_queue_size",), S.REQUESTS_WAITING),
        MetricMap(("tgi_request_mean_time_per_token_duration",), S.INTER_TOKEN_LATENCY),
        MetricMap(("tgi_request_input_length_sum",), S.PROMPT_TOKENS),
        MetricMap(("tgi_request_generated_tokens_sum",), S.GENERATION_TOKENS),
    ),
    prefixes=("tgi_",),
)
