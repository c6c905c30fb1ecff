"""vLLM /metrics (V1 engine, and the V0 engine of releases up to 0.10) -> canonical signals.

Names checked against vLLM's sources (``vllm/v1/metrics/loggers.py``, the V0
``vllm/engine/metrics.py``, the offloading connector's ``metrics.py``) and against real pages:
vLLM 0.32 captures (tests/fixtures/vllm-0.32-cpu/) and the published ones under
tests/fixtures/published/vllm/. Every V1 metric carries ``model_name`` and ``engine`` (the
data-parallel rank, which becomes ``dp_rank`` here because ``engine`` is kvdoctor's engine-name
label); V0 metrics carry ``model_name`` only.

Renames (newest first in each row; the first name present in a scrape wins, so an engine that
exposes both during a deprecation window is not counted twice):

- ``kv_cache_usage_perc`` <- ``gpu_cache_usage_perc`` (renamed in 0.9). Both are 0..1 fractions
  despite the ``perc`` in the name ("1 means 100 percent usage"), declared and checked as ratios.
- ``inter_token_latency_seconds`` <- ``time_per_output_token_seconds`` (per-token histogram in V0
  and V1; deprecated 0.11, hidden 0.12). The per-request mean
  ``request_time_per_output_token_seconds`` is a different quantity and is not mapped.
- ``prefix_cache_queries/hits_total`` <- ``gpu_prefix_cache_queries/hits_total``. The old names
  counted **blocks** up to vLLM 0.8 and tokens from 0.9 (vllm-project/vllm#18003) until they were
  removed. hits/queries, the ratio the rules use, is the same in either unit; only on vLLM <= 0.8
  are the absolute counts blocks instead of tokens.
- KV offload bytes: ``kv_offload_load_bytes_total`` / ``kv_offload_store_bytes_total`` (newer,
  direction in the name) <- ``kv_offload_total_bytes_total{transfer_type="CPU_to_GPU"|"GPU_to_CPU"}``
  (deprecated; newer vLLM still emits it with the same bytes, so it is read only when the new
  names are absent). Transfers to/from vLLM's shared-storage backend (``transfer_type``
  ``SHARED_STORAGE_to_GPU``/``GPU_to_SHARED_STORAGE``, old name only) get ``tier="shared_storage"``.

V0 only (``legacy_only``): ``num_requests_swapped`` (requests swapped out to CPU, the swap
preemption mode), ``cpu_cache_usage_perc`` (the CPU swap pool, 0..1) and the gauge
``gpu_prefix_cache_hit_rate`` (0..1; -1 while prefix caching is off, which the ratio check drops).

Prefix hits, every tier once: ``prefix_cache_hits_total`` counts GPU (local) hits and
``external_prefix_cache_hits_total`` the tokens a KV connector (LMCache, the offloading
connector, NIXL, ...) supplied beyond them; the canonical hits are their sum, the share of
prompt tokens not computed. The queries stay the local ones (every prompt token is looked up
locally; the connector is asked only for the rest). The tier split is vLLM's own
``prompt_tokens_cached_by_source_total`` (which sums to the same two counters); where a page has
the connector counters but no such split, local hits become ``tier="device"`` and connector hits
``tier="external_unspecified"`` (named by a KV-tier adapter on the same page when there is one).

``prompt_tokens_total``: V1 adds each request's full prompt length at its first token, prefix
hits included (vllm/v1/metrics/stats.py ``update_from_output``), as the canonical signal means.
V0 adds each prefill chunk's ``token_chunk_size`` (cached tokens included), so a request
preempted by recompute is counted again when it is prefilled again.

KV capacity comes from the info-style ``cache_config_info`` gauge: ``kv_cache_size_tokens`` when
present (newer builds), else ``num_gpu_blocks`` x ``block_size``. That series carries ``engine``
but no ``model_name`` label in vLLM, so the capacity sample has ``dp_rank`` but no ``model_name``.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.units import RATIO

from .base import UNATTRIBUTED_TIER, EngineAdapter, MetricMap


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


_EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"
_HITS_BY_SOURCE = "vllm:prompt_tokens_cached_by_source_total"

ADAPTER = EngineAdapter(
    name="vllm",
    detect=(
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "vllm:generation_tokens_total",
    ),
    maps=(
        MetricMap(("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), S.KV_CACHE_USAGE, unit=RATIO),
        MetricMap(("vllm:cpu_cache_usage_perc",), S.KV_CACHE_HOST_USAGE, unit=RATIO),
        MetricMap(("vllm:cache_config_info",), S.KV_CACHE_CAPACITY, value=kv_capacity_tokens),
        MetricMap(("vllm:num_preemptions_total",), S.PREEMPTIONS),
        MetricMap(("vllm:num_requests_swapped",), S.REQUESTS_SWAPPED),
        MetricMap(("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"), S.PREFIX_CACHE_QUERIES),
        MetricMap(("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"), S.PREFIX_CACHE_HITS),
        MetricMap((_EXTERNAL_HITS,), S.PREFIX_CACHE_HITS),
        MetricMap((_HITS_BY_SOURCE,), S.PREFIX_CACHE_HITS_BY_TIER, rename_labels={"source": "tier"}),
        MetricMap(
            ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
            S.PREFIX_CACHE_HITS_BY_TIER,
            const_labels={"tier": "device"},
            requires=(_EXTERNAL_HITS,),
            unless=(_HITS_BY_SOURCE,),
        ),
        MetricMap(
            (_EXTERNAL_HITS,),
            S.PREFIX_CACHE_HITS_BY_TIER,
            const_labels={"tier": UNATTRIBUTED_TIER},
            unless=(_HITS_BY_SOURCE,),
        ),
        MetricMap(("vllm:gpu_prefix_cache_hit_rate",), S.PREFIX_CACHE_HIT_RATIO, unit=RATIO),
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
    # Everything else is there when the feature is on (offload bytes only with an offloading
    # connector configured); V0's swap gauges and hit-rate gauge only on V0 pages. Generation
    # seconds are for engines without an ITL histogram.
    prefixes=("vllm:",),
    legacy_only=(S.REQUESTS_SWAPPED, S.KV_CACHE_HOST_USAGE, S.PREFIX_CACHE_HIT_RATIO),
)
