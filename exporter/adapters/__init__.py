"""Engine adapters: one module per engine, each defining ``ADAPTER`` (an ``EngineAdapter``).

``ADAPTERS`` maps ``--engine`` names to adapters; ``detect`` picks one from the family names a
scrape exposes. Modules that define ``TIER_ADAPTER`` instead (KV tiers such as LMCache, which
share the engine's /metrics or have their own endpoint) land in ``TIER_ADAPTERS``.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping

from kvdoctor.signals.vocabulary import PREFIX_CACHE_HITS, PREFIX_CACHE_HITS_BY_TIER
from kvdoctor.signals.window import SeriesKey

from .base import UNATTRIBUTED_TIER, EngineAdapter, MetricMap, Ratio

# Order matters for detection: among the adapters that recognise a page equally surely, the
# first one here wins.
_MODULES = ("vllm", "sglang", "trtllm", "trtllm_triton", "tgi", "llamacpp", "lmcache", "dynamo_kvbm")

ADAPTERS: dict[str, EngineAdapter] = {}
TIER_ADAPTERS: dict[str, EngineAdapter] = {}

for _name in _MODULES:
    _mod = importlib.import_module(f"{__name__}.{_name}")
    if hasattr(_mod, "ADAPTER"):
        ADAPTERS[_mod.ADAPTER.name] = _mod.ADAPTER
    if hasattr(_mod, "TIER_ADAPTER"):
        TIER_ADAPTERS[_mod.TIER_ADAPTER.name] = _mod.TIER_ADAPTER


def detect(names: Iterable[str]) -> EngineAdapter | None:
    """The engine adapter that recognises a page with these family and sample names, or None.

    An adapter whose identifying families are present beats one that only finds some other
    family it reads (a page with vLLM's TTFT histogram and LMCache's counters is vLLM's); ties
    go to the first adapter in ``_MODULES``, so a page mixing several engines' families always
    resolves the same way.
    """
    present = set(names)
    best, best_score = None, 0
    for adapter in ADAPTERS.values():
        score = adapter.recognises(present)
        if score > best_score:
            best, best_score = adapter, score
    return best


def normalise_page(
    adapter: EngineAdapter, raw, extra_labels: Mapping[str, str] | None = None
) -> dict[SeriesKey, float]:
    """One scrape's raw samples -> canonical samples, live or replayed: every KV-tier adapter
    (with the engine's name in its ``engine`` label), then the engine adapter, whose value wins
    where both produce the same series.

    Prefix hits count every tier once: a KV tier on the page names the hits its engine could
    only call ``external_unspecified``, so those engine series give way to the tier's; and
    where the engine counted no such hits at all (vLLM before ``external_prefix_cache_hits``),
    the tier's hits are added to ``prefix_cache_hits_total`` too.
    """
    raw = raw if isinstance(raw, list) else list(raw)
    extra = dict(extra_labels or {})
    tier_labels = {**extra, "engine": adapter.name}
    tiers: dict[SeriesKey, float] = {}
    for tier in TIER_ADAPTERS.values():
        tiers.update(tier.normalise(raw, tier_labels))
    engine = adapter.normalise(raw, extra)
    tier_hits = {key: v for key, v in tiers.items() if key[0] == PREFIX_CACHE_HITS_BY_TIER}
    if tier_hits:
        unattributed = [
            key for key in engine if key[0] == PREFIX_CACHE_HITS_BY_TIER and ("tier", UNATTRIBUTED_TIER) in key[1]
        ]
        for key in unattributed:
            del engine[key]
        if not unattributed:
            for (_, labels), v in tier_hits.items():
                total = (PREFIX_CACHE_HITS, tuple(kv for kv in labels if kv[0] != "tier"))
                into = engine if total in engine else tiers
                into[total] = into.get(total, 0.0) + v
    return {**tiers, **engine}


__all__ = [
    "ADAPTERS",
    "TIER_ADAPTERS",
    "UNATTRIBUTED_TIER",
    "EngineAdapter",
    "MetricMap",
    "Ratio",
    "detect",
    "normalise_page",
]
