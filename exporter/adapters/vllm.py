"""vLLM (V1 engine) /metrics -> canonical signals.

Names checked against vLLM's sources (``vllm/v1/metrics/loggers.py``, the offloading connector's
``metrics.py``) and against real captures of vLLM 0.32 (tests/fixtures/vllm-0.32-cpu/). Every
engine metric carries ``model_name`` and ``engine`` (the data-parallel rank, which becomes
``dp_rank`` here because ``engine`` is kvdoctor's engine-name label).

Renames (newest first in each row; the first name present in a scrape wins, so an engine that
exposes both during a deprecation window is not counted twice):

- ``kv_cache_usage_perc`` <- ``gpu_cache_usage_perc`` (renamed in 0.9; both are 0..1 fractions).
- ``inter_token_latency_seconds`` <- ``time_per_output_token_seconds`` (per-token histogram;
  deprecated 0.11, hidden 0.12). The per-request mean ``request_time_per_output_token_seconds``
  is a different quantity and is not mapped.
- ``prefix_cache_queries/hits_total`` <- ``gpu_prefix_cache_queries/hits_total``. The old names
  counted **blocks** up to vLLM 0.8 and tokens from 0.9 (vllm-project/vllm#18003) until they were
  removed. They are mapped as they are: hits/queries, the ratio the rules use, is the same in
  either unit; only on vLLM <= 0.8 are the absolute counts blocks instead of tokens (a factor of
  the block size, usually 16) -- do not compare them with ``prompt_tokens_total`` there.
- KV offload bytes: ``kv_offload_load_bytes_total`` / ``kv_offload_store_bytes_total`` (newer,
  direction in the name) <- ``kv_offload_total_bytes_total{transfer_type="CPU_to_GPU"|"GPU_to_CPU"}``
  (deprecated; newer vLLM still emits it with the same bytes, so it is read only when the new
  names are absent). Transfers to/from vLLM's shared-storage backend (``transfer_type``
  ``SHARED_STORAGE_to_GPU``/``GPU_to_SHARED_STORAGE``, old name only) get ``tier="shared_storage"``.

KV capacity comes from the info-style ``cache_config_info`` gauge: ``kv_cache_size_tokens`` when
present (newer builds), else ``num_gpu_blocks`` x ``block_size``. That series carries ``engine``
but no ``model_name`` label in vLLM, so the capacity sample has ``dp_rank`` but no ``model_name``.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvdoctor.rules import signals as S

from .base import EngineAdapter, MetricMap


def kv_capacity_tokens(labels: Mapping[str, str], value: float) -> float | None:
    """Tokens the KV pool holds, from ``cache_config_info``'s labels (None if not known yet)."""
    size = _number(labels.get("kv_cache_size_tokens"))
    if size is not None and size > 0:
        return size
    blocks, block_size = _number(labels.get("num_gpu_blocks")), _number(labels.get("block_size"))
    if blocks is None or block_size is None or blocks <= 0 or block_size <= 0:
        return None
    return blocks * block_size


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:  # vLLM writes "None" before the pool is sized
        return None


def _offload(direction: str, tier: str, new_name: str | None, transfer_type: str) -> MetricMap:
    old = ("vllm:kv_offload_total_bytes_total", {"transfer_type": transfer_type})
    return MetricMap(
        sources=(new_name, old) if new_name else (old,),
        target=S.KV_TRANSFER_BYTES,
        const_labels={"direction": direction, "tier": tier},
    )


ADAPTER = EngineAdapter(
    name="vllm",
    detect=(
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "vllm:generation_tokens_total",
    ),
    maps=(
        MetricMap(("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), S.KV_CACHE_USAGE),
        MetricMap(("vllm:cache_config_info",), S.KV_CACHE_CAPACITY, value=kv_capacity_tokens),
        MetricMap(("vllm:num_preemptions_total",), S.PREEMPTIONS),
        MetricMap(("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"), S.PREFIX_CACHE_QUERIES),
        MetricMap(("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"), S.PREFIX_CACHE_HITS),
        MetricMap(
            ("vllm:prompt_tokens_cached_by_source_total",),
            S.PREFIX_CACHE_HITS_BY_TIER,
            rename_labels={"source": "tier"},
        ),
        MetricMap(("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"), S.INTER_TOKEN_LATENCY),
        MetricMap(("vllm:time_to_first_token_seconds",), S.TIME_TO_FIRST_TOKEN),
        MetricMap(("vllm:num_requests_running",), S.REQUESTS_RUNNING),
        MetricMap(("vllm:num_requests_waiting",), S.REQUESTS_WAITING),
        MetricMap(("vllm:generation_tokens_total",), S.GENERATION_TOKENS),
        MetricMap(("vllm:prompt_tokens_total",), S.PROMPT_TOKENS),
        _offload("to_gpu", "cpu", "vllm:kv_offload_load_bytes_total", "CPU_to_GPU"),
        _offload("from_gpu", "cpu", "vllm:kv_offload_store_bytes_total", "GPU_to_CPU"),
        _offload("to_gpu", "shared_storage", None, "SHARED_STORAGE_to_GPU"),
        _offload("from_gpu", "shared_storage", None, "GPU_to_SHARED_STORAGE"),
    ),
    keep_labels=("model_name",),
    engine_labels={"engine": "dp_rank"},
    # vLLM exports prefix-cache counters, so the ratio gauge (for engines with only a ratio) is
    # never produced; everything else is there when the feature is on (offload bytes only with an
    # offloading connector configured).
    cannot_provide=(S.PREFIX_CACHE_HIT_RATIO,),
)
