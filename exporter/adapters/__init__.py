"""Engine adapters: one module per engine, each defining ``ADAPTER`` (an ``EngineAdapter``).

``ADAPTERS`` maps ``--engine`` names to adapters; ``detect`` picks one from the family names a
scrape exposes. Modules that define ``TIER_ADAPTER`` instead (KV tiers such as LMCache, which
share the engine's /metrics or have their own endpoint) land in ``TIER_ADAPTERS``.
"""

from __future__ import annotations

import importlib
from typing import Iterable

from .base import EngineAdapter, MetricMap

# Order matters for detection: the first adapter whose ``detect`` families are present wins.
_MODULES = ("vllm", "sglang", "trtllm", "trtllm_triton", "tgi", "llamacpp", "lmcache", "dynamo_kvbm")

ADAPTERS: dict[str, EngineAdapter] = {}
TIER_ADAPTERS: dict[str, EngineAdapter] = {}

for _name in _MODULES:
    try:
        _mod = importlib.import_module(f"{__name__}.{_name}")
    except ModuleNotFoundError as _exc:
        if _exc.name != f"{__name__}.{_name}":
            raise
        continue
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


__all__ = ["ADAPTERS", "TIER_ADAPTERS", "EngineAdapter", "MetricMap", "detect"]
