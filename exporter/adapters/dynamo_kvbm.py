"""NVIDIA Dynamo KV Block Manager (KVBM): its own ``/metrics`` endpoint (``DYN_KVBM_METRICS=true``,
port ``DYN_KVBM_METRICS_PORT``, default 6880), so a tier adapter (``TIER_ADAPTER``).

Sources: ai-dynamo/dynamo ``lib/llm/src/block_manager/metrics_kvbm.rs`` and
``lib/runtime/src/metrics/prometheus_names.rs`` (module ``kvbm``). Rust ``prometheus`` crate:
fixed ``kvbm_`` prefix, counters without ``_total``, no labels.

The trap: in ``offload_*`` names ``h2d`` is host -> **disk**, while in ``onboard_*`` names ``h2d``
is host -> device. Only transfers that cross the GPU boundary are mapped:

    onboard_blocks_h2d  host   -> GPU   to_gpu   tier=host
    onboard_blocks_d2d  disk   -> GPU   to_gpu   tier=disk
    offload_blocks_d2h  GPU    -> host  from_gpu tier=host
    offload_blocks_d2d  GPU    -> disk  from_gpu tier=disk
    offload_blocks_h2d  host   -> disk  (no GPU: never mapped)
    on/offload_bytes_object          object storage <-> GPU, already in bytes (tier=object)

Block counters need a bytes-per-block factor that the page does not carry (block size x layers
x KV heads x head dim x 2 x dtype bytes, fixed per deployment). By default they are skipped;
``with_bytes_per_block(n)`` returns the adapter with them converted. ``kvbm_matched_tokens`` (tokens
served from KVBM's tiers) maps to ``kvdoctor_prefix_cache_hits_by_tier_total{tier="kvbm"}``.
"""

from __future__ import annotations

from kvdoctor.signals import vocabulary as S

from .base import TIER_SIGNALS, EngineAdapter, MetricMap, kv_transfers

# (family, direction, tier): the GPU-boundary block counters. kvbm_offload_blocks_h2d (host ->
# disk) and the object-storage block counters (their bytes are exposed directly) are left out.
_BLOCK_COUNTERS = (
    ("kvbm_onboard_blocks_h2d", "to_gpu", "host"),
    ("kvbm_onboard_blocks_d2d", "to_gpu", "disk"),
    ("kvbm_offload_blocks_d2h", "from_gpu", "host"),
    ("kvbm_offload_blocks_d2d", "from_gpu", "disk"),
)

_ALWAYS = (
    MetricMap(("kvbm_matched_tokens",), S.PREFIX_CACHE_HITS_BY_TIER, const_labels={"tier": "kvbm"}),
    *kv_transfers("kvbm_onboard_bytes_object", "kvbm_offload_bytes_object", "object"),
)

_DETECT = ("kvbm_matched_tokens", "kvbm_offload_blocks_d2h", "kvbm_onboard_blocks_h2d", "kvbm_host_cache_hit_rate")


def with_bytes_per_block(bytes_per_block: float) -> EngineAdapter:
    """The KVBM tier adapter with its GPU-boundary block counters converted to bytes."""
    if not bytes_per_block > 0:
        raise ValueError(f"bytes per block must be positive, got {bytes_per_block!r}")
    blocks = tuple(
        MetricMap(
            (family,),
            S.KV_TRANSFER_BYTES,
            const_labels={"direction": direction, "tier": tier},
            scale=float(bytes_per_block),
        )
        for family, direction, tier in _BLOCK_COUNTERS
    )
    return EngineAdapter(name="dynamo_kvbm", detect=_DETECT, maps=_ALWAYS + blocks, keep_labels=(), covers=TIER_SIGNALS)


TIER_ADAPTER = EngineAdapter(name="dynamo_kvbm", detect=_DETECT, maps=_ALWAYS, keep_labels=(), covers=TIER_SIGNALS)
