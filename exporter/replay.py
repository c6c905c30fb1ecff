"""Replaying raw engine pages: the engine adapters as a ``signals.trace.RawNormaliser``.

A trace may hold an engine's own families (``vllm:*``, ``sglang:*``, dcgm-exporter's ``DCGM_FI_*``)
as ``kvdoctor record --engine-url`` captured them; ``kvdoctor diagnose --replay`` normalises them
snapshot by snapshot exactly as the engine collector normalises a live scrape.
"""

from __future__ import annotations

from kvdoctor.exporter.adapters import ADAPTERS, TIER_ADAPTERS, EngineAdapter, detect, normalise_page
from kvdoctor.exporter.collectors.dcgm import WANTED as DCGM_WANTED
from kvdoctor.exporter.collectors.dcgm import normalise_dcgm
from kvdoctor.signals.trace import RawSample
from kvdoctor.signals.window import SeriesKey


class AdapterNormaliser:
    """The engine adapter (recognised from the family names, or forced) plus dcgm-exporter's map."""

    def __init__(self, engine: str | None = None):
        if engine is not None and engine not in ADAPTERS:
            raise ValueError(f"unknown engine {engine!r} (choose from {', '.join(sorted(ADAPTERS))})")
        self._forced = ADAPTERS[engine] if engine else None
        self._adapter: EngineAdapter | None = self._forced
        self._dcgm = False

    @property
    def engine(self) -> str | None:
        return self._adapter.name if self._adapter is not None else None

    @property
    def known(self) -> str:
        return ", ".join(ADAPTERS)

    def select(self, names: set[str]) -> frozenset[str]:
        self._adapter = self._forced or detect(names)
        dcgm = DCGM_WANTED & names
        self._dcgm = bool(dcgm)
        wanted: set[str] = set(dcgm)
        if self._adapter is not None:
            wanted |= self._adapter.wanted_names() | set(self._adapter.detect)
            for tier in TIER_ADAPTERS.values():
                wanted |= tier.wanted_names()
        return frozenset(wanted)

    def normalise(self, raw: list[RawSample]) -> dict[SeriesKey, float]:
        samples: dict[SeriesKey, float] = {}
        if self._adapter is not None:
            samples.update(normalise_page(self._adapter, raw))
        if self._dcgm:
            samples.update(normalise_dcgm(raw))
        return samples
