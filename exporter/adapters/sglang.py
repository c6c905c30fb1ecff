"""SGLang (``--enable-metrics``), ``/metrics`` on the server port.

Sources: sgl-project/sglang ``python/sglang/srt/observability/metrics_collector.py`` (current;
``python/sglang/srt/metrics/collector.py`` before the move, ``metrics_collector.py`` in the 2024
``sglang/srt/metrics`` package), ``scheduler_metrics_mixin.py``, ``hicache_pool_stats.py``,
``docs/references/production_metrics.md``; real pages under tests/fixtures/published/sglang/.

Generations (every row lists the newest name first):
- Late 2024 (SGLang 0.3.x, the first Prometheus support, sgl-project/sglang#1853): the model is in
  a ``name`` label (mapped to ``model_name``), running/waiting are ``sglang:num_requests_running``
  / ``sglang:num_requests_waiting``, and ``sglang:cache_hit_rate`` is a **percent** (10.61 means
  10.61 %): the scheduler set it to ``100 * hit/total``.
- 2025 on: ``model_name`` label, ``sglang:num_running_reqs`` / ``sglang:num_queue_reqs``, and
  ``cache_hit_rate`` a 0..1 ratio. The family is declared ``percent_or_ratio``: a sample with the
  2024 ``name`` label, or above 1, is a percent; otherwise a ratio.

Traps, all checked in the source:
- ``sglang:num_retracted_reqs`` is a gauge of the retractions *since the last log interval* (the
  scheduler resets it to 0 after every log), not a total: never a preemption counter. The total
  is ``sglang:num_retracted_requests_total`` (counter, current) or ``sglang:total_retracted_reqs``
  (a cumulative gauge, mid-2025 builds).
- ``sglang:cache_hit_rate`` is computed per prefill batch and set to 0 on every decode log, so it
  reads 0 in decode-only stretches; the token counters are the trustworthy hit ratio:
  hits = ``sglang:cached_tokens_total`` (all ``cache_source``), queries = ``sglang:prompt_tokens_total``
  (every prompt token is looked up in the radix cache). Builds older than ``cached_tokens_total``
  yield queries without hits: treat missing hits as unknown, not zero.
- ``sglang:prompt_tokens_total`` adds each finished request's full prompt length
  (``observe_one_finished_request``), prefix hits included, as the canonical signal means.
- ``sglang:token_usage`` is a 0..1 fraction; on hybrid SWA models it is max(full, swa).
- ``sglang:time_per_output_token_seconds`` (old name) was already per token, like its successor
  ``sglang:inter_token_latency_seconds``.
- HiCache host pool: ``sglang:hicache_host_used_tokens`` / ``sglang:hicache_host_total_tokens``
  (both gauges, published only with ``--enable-hierarchical-cache``) give the host usage ratio.
- Scheduler metrics carry ``tp_rank``, ``pp_rank``, ``moe_ep_rank`` and, with DP attention,
  ``dp_rank``; only ``dp_rank`` is kept (one KV pool per DP rank). Gauges of one DP rank from
  several TP/PP ranks (``--enable-metrics-for-all-schedulers``) fold onto one series, last one wins.
- HiCache byte counters ``sglang:load_back_bytes_total`` (host -> GPU) and
  ``sglang:hicache_backup_bytes_total`` (GPU -> host) are mapped from SGLang 0.5.x scrapes seen in
  public benchmark code; their definition was not found in the indexed upstream source (unsure).
  The token counters ``sglang:load_back_tokens_total`` / ``sglang:evicted_tokens_total`` are not
  converted (no bytes-per-token on the page).
"""

from __future__ import annotations

from kvdoctor.signals import vocabulary as S

from .base import PERCENT_OR_RATIO, EngineAdapter, MetricMap, Ratio, kv_transfers


def _tier_hits(labels, value):
    # ``cache_source="total"`` is SGLang's fallback when it could not split a hit by tier.
    source = labels.get("cache_source")
    return None if source in (None, "", "total") else value


ADAPTER = EngineAdapter(
    name="sglang",
    detect=(
        "sglang:token_usage",
        "sglang:num_queue_reqs",
        "sglang:num_running_reqs",
        "sglang:time_to_first_token_seconds",
        "sglang:prompt_tokens",
        "sglang:prompt_tokens_total",
        "sglang:num_requests_running",
        "sglang:num_requests_waiting",
    ),
    maps=(
        MetricMap(("sglang:token_usage",), S.KV_CACHE_USAGE),
        MetricMap(("sglang:max_total_num_tokens",), S.KV_CACHE_CAPACITY),
        MetricMap(
            (Ratio(("sglang:hicache_host_used_tokens", {}), ("sglang:hicache_host_total_tokens", {})),),
            S.KV_CACHE_HOST_USAGE,
        ),
        MetricMap(("sglang:num_running_reqs", "sglang:num_requests_running"), S.REQUESTS_RUNNING),
        MetricMap(("sglang:num_queue_reqs", "sglang:num_requests_waiting"), S.REQUESTS_WAITING),
        MetricMap(("sglang:num_retracted_requests_total", "sglang:total_retracted_reqs"), S.PREEMPTIONS),
        MetricMap(("sglang:prompt_tokens_total",), S.PREFIX_CACHE_QUERIES),
        MetricMap(("sglang:cached_tokens_total",), S.PREFIX_CACHE_HITS),
        MetricMap(
            ("sglang:cached_tokens_total",),
            S.PREFIX_CACHE_HITS_BY_TIER,
            rename_labels={"cache_source": "tier"},
            value=_tier_hits,
        ),
        MetricMap(
            ("sglang:cache_hit_rate",), S.PREFIX_CACHE_HIT_RATIO, unit=PERCENT_OR_RATIO, percent_labels=("name",)
        ),
        *kv_transfers("sglang:load_back_bytes_total", "sglang:hicache_backup_bytes_total", "host"),
        MetricMap(
            ("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
            S.INTER_TOKEN_LATENCY,
        ),
        MetricMap(("sglang:time_to_first_token_seconds",), S.TIME_TO_FIRST_TOKEN),
        MetricMap(("sglang:generation_tokens_total",), S.GENERATION_TOKENS),
        MetricMap(("sglang:prompt_tokens_total",), S.PROMPT_TOKENS),
    ),
    engine_labels={"dp_rank": "dp_rank", "name": "model_name"},
    prefixes=("sglang:",),
)
