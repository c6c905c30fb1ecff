"""Engine adapters: one module per engine, each defining ``ADAPTER`` (an ``EngineAdapter``).

``ADAPTERS`` maps ``--engine`` names to adapters; ``detect`` picks one from the family names a
scrape exposes. Modules that define ``TIER_ADAPTER`` instead (KV tiers such as LMCache, which
share the engine's /metrics or have their own endpoint) land in ``TIER_ADAPTERS``.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping

from kvdoctor.rules.window import SeriesKey

from .base import EngineAdapter, MetricMap

# Order matters for detection: the first adapter whose ``detect`` families are present wins.
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
    """The engine adapter whose identifying families appear among ``names``, or None."""
    present = set(names)
    for adapter in ADAPTERS.values():
        if any(n in present for n in adapter.detect):
            return adapter
    return None


def normalise_page(
    adapter: EngineAdapter, raw, extra_labels: Mapping[str, str] | None = None
) -> dict[SeriesKey, float]:
    """One scrape's raw samples -> canonical samples, live or replayed: every KV-tier adapter
    (with the engine's name in its ``engine`` label), then the engine adapter, whose value wins
    where both produce the same series."""
    extra = dict(extra_labels or {})
    tier_labels = {**extra, "engine": adapter.name}
    out: dict[SeriesKey, float] = {}
    for tier in TIER_ADAPTERS.values():
        out.update(tier.normalise(raw, tier_labels))
    out.update(adapter.normalise(raw, extra))
    return out


__all__ = ["ADAPTERS", "TIER_ADAPTERS", "EngineAdapter", "MetricMap", "detect", "normalise_page"]
