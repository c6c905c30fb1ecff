"""The collectors. Importing this package imports every collector module, filling ``REGISTRY``.

One module per source (STYLE.md): ``engine`` (an engine's /metrics through its adapter),
``nvml`` (GPU counters through NVML), ``dcgm`` (an existing dcgm-exporter), and the simulated GPU
of ``kvdoctor demo`` (exporter/simulator/gpu.py, registered as ``simulated_gpu``).
"""

from __future__ import annotations

from . import dcgm, engine, nvml  # noqa: F401  (each registers itself)
from .base import REGISTRY, Collected, Collector, CollectorSpec, NotApplicable, SourceError, register

from kvdoctor.exporter.simulator import gpu as _simulated_gpu  # noqa: F401,E402  (registers simulated_gpu)

__all__ = ["REGISTRY", "Collected", "Collector", "CollectorSpec", "NotApplicable", "SourceError", "register"]
