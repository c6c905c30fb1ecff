"""The collector contract and the registry of collectors.

A collector reads one source (NVML, an engine's /metrics, dcgm-exporter, the simulator) and
returns canonical samples. Collectors may raise: the runtime wraps every call, so a failing
source never fails the scrape. "Not applicable here" (no GPU, no URL configured) is
reported with ``NotApplicable`` and is not an error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvdoctor.signals.collection import Collector

__all__ = ["REGISTRY", "CollectorSpec", "markdown_table", "register"]


@dataclass(frozen=True)
class CollectorSpec:
    """A registered collector: its name (``--collector.NAME``, ``KVDOCTOR_COLLECTOR_NAME``)."""

    name: str
    description: str
    enabled_by_default: bool
    factory: Callable[..., Collector]  # factory(settings) -> Collector


REGISTRY: dict[str, CollectorSpec] = {}


def register(name: str, description: str, enabled_by_default: bool):
    """Class/function decorator adding a collector factory to the registry."""

    def deco(factory):
        REGISTRY[name] = CollectorSpec(name, description, enabled_by_default, factory)
        return factory

    return deco


def markdown_table() -> str:
    """The README's collector table, generated from the registry (tests/test_readme.py checks it)."""
    rows = ["| collector | what it reads | enabled by default |", "|---|---|---|"]
    for spec in REGISTRY.values():
        rows.append(f"| `{spec.name}` | {spec.description} | {'yes' if spec.enabled_by_default else 'no'} |")
    return "\n".join(rows)
