"""LMCache (KV tier for vLLM/SGLang): its ``lmcache:`` families appear on the engine's own
``/metrics``, next to the engine's, so this is a tier adapter (``TIER_ADAPTER``).

Source: LMCache/LMCache ``lmcache/observability.py`` (``PrometheusLogger``): counters created
without ``_total`` (exposed with it), multiprocess collection, labels ``model_name``,
``worker_id`` and, in newer releases, ``role`` and ``served_model_name``.

What maps, and why:
- ``lmcache:num_hit_tokens_total`` (tokens retrieved from LMCache into the GPU) ->
  ``kvdoctor_prefix_cache_hits_by_tier_total{tier="lmcache"}``: prefix hits served by a slower
  tier than the GPU pool, which the tier-miss rule looks for.
- GPU <-> LMCache traffic is counted in *tokens* only (``num_hit_tokens`` retrieved,
  ``num_stored_tokens`` stored). The page carries no bytes per token, so by default no
  ``kvdoctor_kv_transfer_bytes_total`` is produced; ``with_bytes_per_token(n)`` returns the same
  adapter with those two counters converted (n = KV bytes per token of the served model, which
  the ledger computes from the model shape).
- ``lmcache:num_remote_read_bytes_total`` / ``..._write_bytes_total`` are remote-backend <-> LMCache
  host traffic, not GPU transfers, and are deliberately not mapped (counting them as well would
  count a remote hit twice).
- ``served_model_name`` (newer releases: the engine's served name) becomes ``model_name``, so the
  tier's series line up with the engine's; older releases have only ``model_name`` (the model
  path), which is kept as it is. Per-worker series add up.
- On the engine's page these hits are the tokens vLLM counts as ``external_prefix_cache_hits``:
  ``normalise_page`` lets this tier name them instead of vLLM's ``external_unspecified`` tier,
  and adds them to the total hits only where vLLM counted no connector hits.
"""

from __future__ import annotations

from kvdoctor.signals import vocabulary as S

from .base import TIER_SIGNALS, EngineAdapter, MetricMap

_ENGINE_LABELS = {"served_model_name": "model_name"}

_HITS = MetricMap(
    ("lmcache:num_hit_tokens_total",),
    S.PREFIX_CACHE_HITS_BY_TIER,
    const_labels={"tier": "lmcache"},
)


def with_bytes_per_token(bytes_per_token: float) -> EngineAdapter:
    """The LMCache tier adapter with its token transfer counters converted to bytes."""
    if not bytes_per_token > 0:
        raise ValueError(f"bytes per token must be positive, got {bytes_per_token!r}")
    return EngineAdapter(
        name="lmcache",
        detect=TIER_ADAPTER.detect,
        maps=(
            _HITS,
            MetricMap(
                ("lmcache:num_hit_tokens_total",),
                S.KV_TRANSFER_BYTES,
                const_labels={"direction": "to_gpu", "tier": "lmcache"},
                scale=float(bytes_per_token),
            ),
            MetricMap(
                ("lmcache:num_stored_tokens_total",),
                S.KV_TRANSFER_BYTES,
                const_labels={"direction": "from_gpu", "tier": "lmcache"},
                scale=float(bytes_per_token),
            ),
        ),
        engine_labels=_ENGINE_LABELS,
        covers=TIER_SIGNALS,
    )


TIER_ADAPTER = EngineAdapter(
    name="lmcache",
    detect=(
        "lmcache:num_hit_tokens",
        "lmcache:num_hit_tokens_total",
        "lmcache:num_requested_tokens",
        "lmcache:num_requested_tokens_total",
        "lmcache:local_cache_usage",
        "lmcache:retrieve_hit_rate",
    ),
    maps=(_HITS,),
    engine_labels=_ENGINE_LABELS,
    covers=TIER_SIGNALS,
)
