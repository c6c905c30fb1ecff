"""llama.cpp ``llama-server --metrics``.

Sources: ggml-org/llama.cpp ``examples/server/server.cpp`` (``handle_metrics``, early 2025: had
``kv_cache_usage_ratio`` = used KV cells / n_ctx and ``kv_cache_tokens``), and the current
``tools/server`` ``server_task_result_metrics::to_metrics()`` (dropped the KV gauges, added
``prompt_tokens_cached_total``). No labels.

Notes:
- Values are written with ``std::ostream << double`` (6 significant digits), so counters above
  1e6 move in steps (``1.36238e+06``): short-window rates of large counters are coarse.
- ``llamacpp:prompt_tokens_total`` counts prompt tokens *processed*, excluding tokens reused from
  the cache. Prefix queries are therefore processed + cached (two rows adding up); old builds
  have no cached counter, so they give queries without hits (hits unknown, not zero).
- Running is ``requests_processing`` (busy slots), waiting ``requests_deferred``.
- No latency histograms (``prompt_tokens_seconds`` / ``predicted_tokens_seconds`` are lifetime
  averages), no preemption, no tiers, and no capacity (n_ctx is not on the page).
"""

from __future__ import annotations

from kvdoctor.rules import signals as S

from .base import EngineAdapter, MetricMap

ADAPTER = EngineAdapter(
    name="llamacpp",
    detect=(
        "llamacpp:requests_processing",
        "llamacpp:requests_deferred",
        "llamacpp:prompt_tokens",
        "llamacpp:prompt_tokens_total",
        "llamacpp:kv_cache_usage_ratio",
    ),
    maps=(
        MetricMap(("llamacpp:kv_cache_usage_ratio",), S.KV_CACHE_USAGE),
        MetricMap(("llamacpp:requests_processing",), S.REQUESTS_RUNNING),
        MetricMap(("llamacpp:requests_deferred",), S.REQUESTS_WAITING),
        MetricMap(("llamacpp:prompt_tokens_cached_total",), S.PREFIX_CACHE_HITS),
        MetricMap(
            ("llamacpp:prompt_tokens_total",), S.PREFIX_CACHE_QUERIES, requires=("llamacpp:prompt_tokens_cached_total",)
        ),
        MetricMap(("llamacpp:prompt_tokens_cached_total",), S.PREFIX_CACHE_QUERIES),
        MetricMap(("llamacpp:tokens_predicted_total",), S.GENERATION_TOKENS),
        MetricMap(("llamacpp:prompt_tokens_total",), S.PROMPT_TOKENS),
    ),
    cannot_provide=(
        S.KV_CACHE_CAPACITY,
        S.PREEMPTIONS,
        S.KV_TRANSFER_BYTES,
        S.PREFIX_CACHE_HITS_BY_TIER,
        S.INTER_TOKEN_LATENCY,
        S.TIME_TO_FIRST_TOKEN,
    ),
)
