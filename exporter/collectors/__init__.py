"""The collectors. Importing this package imports every collector module, filling ``REGISTRY``.

One module per source: ``engine`` (an engine's /metrics through its adapter),
``nvml`` (GPU counters through NVML), ``dcgm`` (an existing dcgm-exporter). The demo's simulated
GPU is not registered here: ``kvdoctor demo`` plugs it in (``build_exporter(extra_collectors=)``),
so the sidecar never imports the simulator.
"""

from __future__ import annotations

from kvdoctor.exporter.collectors import dcgm, engine, nvml
from kvdoctor.exporter.collectors.base import REGISTRY, CollectorSpec, register

__all__ = ["REGISTRY", "CollectorSpec", "dcgm", "engine", "nvml", "register"]
