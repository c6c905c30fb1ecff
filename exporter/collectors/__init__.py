"""The collectors. Importing this package imports every collector module, filling ``REGISTRY``.

One module per source (STYLE.md): ``engine`` (an engine's /metrics through its adapter),
``nvml`` (GPU counters through NVML), ``dcgm`` (an existing dcgm-exporter), and the simulated GPU
of ``kvdoctor demo`` (exporter/simulator/gpu.py, registered as ``simulated_gpu``).
"""

from __future__ import annotations

import importlib

from .base import REGISTRY, Collected, Collector, CollectorSpec, NotApplicable, SourceError, register

_MODULES = (
    f"{__name__}.engine",
    f"{__name__}.nvml",
    f"{__name__}.dcgm",
    "kvdoctor.exporter.simulator.gpu",  # simulated_gpu, written separately; absent until it exists
)

for _module in _MODULES:
    try:
        importlib.import_module(_module)
    except ModuleNotFoundError as _exc:
        if _exc.name != _module:
            raise
        continue

__all__ = ["REGISTRY", "Collected", "Collector", "CollectorSpec", "NotApplicable", "SourceError", "register"]
