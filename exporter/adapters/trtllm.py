"""TensorRT-LLM ``trtllm-serve``: Prometheus text on ``/prometheus/metrics`` (``/metrics`` is JSON).

Source: NVIDIA/TensorRT-LLM ``tensorrt_llm/metrics/collector.py`` (``MetricsCollector``; labels
``model_name``, ``engine_type``). Request metrics need ``return_perf_metrics: true``, the
iteration metrics (KV, queue) ``enable_iter_perf_stats: true``; releases up to 1.1 exposed only
the five request-level families (success, e2e, TTFT, TPOT, queue time).

Notes:
- ``trtllm_time_per_output_token_seconds`` is a per-request mean (TPOT), the closest TRT-LLM has
  to an inter-token latency histogram; it is mapped to ITL with that caveat.
- ``trtllm_prompt_cache_hit_tokens_total{cache_tier}`` names the tier (``gpu``/``host``/``disk``);
  ``gpu`` becomes the canonical ``device``. Levels sharing a tier are summed.
- ``trtllm_kv_cache_onboard_bytes_total`` (host -> GPU) and ``..._offload_bytes_total``
  (GPU -> host) are the secondary-pool transfers.
- KV capacity is ``trtllm_kv_cache_max_blocks x trtllm_kv_cache_tokens_per_block``; KV usage is
  ``trtllm_kv_cache_utilization`` (0..1), or used / max blocks where only the parts are there.
- ``trtllm_kv_cache_host_utilization`` (0..1) is the secondary (host) pool's usage;
  ``trtllm_kv_cache_hit_rate`` the executor's reused / (reused + missed) blocks, 0..1.
- ``trtllm_prompt_tokens_total`` adds each finished request's input tokens (``MetricNames.PROMPT_TOKENS``),
  prefix hits included, as the canonical signal means.
- No preemption counter: ``trtllm_num_paused_requests`` is the number paused right now.
- Generations: releases before the ``trtllm_`` prefix (TensorRT-LLM 1.0, NVIDIA/TensorRT-LLM#5785)
  exposed the five request families unprefixed (``time_to_first_token_seconds`` ...): names too
  generic to recognise or map safely, so not read; Dynamo re-exports them with a ``trtllm_``
  prefix, which is read.
"""

from __future__ import annotations

from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.units import RATIO

from .base import EngineAdapter, MetricMap, Ratio, kv_transfers

_TIERS = {"gpu": "device", "host": "host", "disk": "disk"}

ADAPTER = EngineAdapter(
    name="trtllm",
    detect=(
        "trtllm_kv_cache_utilization",
        "trtllm_num_requests_running",
        "trtllm_num_requests_waiting",
        "trtllm_time_to_first_token_seconds",
        "trtllm_e2e_request_latency_seconds",
        "trtllm_request_success",
        "trtllm_request_success_total",
    ),
    maps=(
        MetricMap(
            (
                "trtllm_kv_cache_utilization",
                Ratio(("trtllm_kv_cache_used_blocks", {}), ("trtllm_kv_cache_max_blocks", {})),
            ),
            S.KV_CACHE_USAGE,
            unit=RATIO,
        ),
        MetricMap(("trtllm_kv_cache_host_utilization",), S.KV_CACHE_HOST_USAGE, unit=RATIO),
        MetricMap(("trtllm_kv_cache_max_blocks",), S.KV_CACHE_CAPACITY, times=("trtllm_kv_cache_tokens_per_block", {})),
        MetricMap(("trtllm_num_requests_running",), S.REQUESTS_RUNNING),
        MetricMap(("trtllm_num_requests_waiting",), S.REQUESTS_WAITING),
        MetricMap(("trtllm_prompt_tokens_total",), S.PREFIX_CACHE_QUERIES),
        MetricMap(("trtllm_prompt_cached_tokens_total",), S.PREFIX_CACHE_HITS),
        *(
            MetricMap(
                ("trtllm_prompt_cache_hit_tokens_total",),
                S.PREFIX_CACHE_HITS_BY_TIER,
                match={"cache_tier": engine_tier},
                const_labels={"tier": tier},
            )
            for engine_tier, tier in _TIERS.items()
        ),
        MetricMap(("trtllm_kv_cache_hit_rate",), S.PREFIX_CACHE_HIT_RATIO, unit=RATIO),
        *kv_transfers("trtllm_kv_cache_onboard_bytes_total", "trtllm_kv_cache_offload_bytes_total", "host"),
        MetricMap(("trtllm_time_per_output_token_seconds",), S.INTER_TOKEN_LATENCY),
        MetricMap(("trtllm_time_to_first_token_seconds",), S.TIME_TO_FIRST_TOKEN),
        MetricMap(("trtllm_generation_tokens_total",), S.GENERATION_TOKENS),
        MetricMap(("trtllm_prompt_tokens_total",), S.PROMPT_TOKENS),
    ),
    prefixes=("trtllm_",),
)
