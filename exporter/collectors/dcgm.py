"""The dcgm-exporter collector: GPU counters from an existing dcgm-exporter's /metrics.

Where dcgm-exporter already runs (GPU Operator clusters), its profiling fields are the next best
thing after NVML GPM, and the only bandwidth measure on pre-Hopper GPUs that is not a duty cycle:

======================================  ===============================================  =======
dcgm-exporter field                     canonical signal                                 scale
======================================  ===============================================  =======
``DCGM_FI_PROF_DRAM_ACTIVE`` (0..1)     ``kvdoctor_gpu_dram_bandwidth_utilization_ratio``  1
``DCGM_FI_PROF_SM_ACTIVE`` (0..1)       ``kvdoctor_gpu_sm_active_ratio``                   1
``DCGM_FI_PROF_PCIE_RX_BYTES`` (B/s)    ``kvdoctor_gpu_pcie_receive_bytes_per_second``     1
``DCGM_FI_PROF_PCIE_TX_BYTES`` (B/s)    ``kvdoctor_gpu_pcie_transmit_bytes_per_second``    1
``DCGM_FI_DEV_FB_USED`` (MiB)           ``kvdoctor_gpu_memory_used_bytes``                 2**20
``DCGM_FI_DEV_FB_TOTAL`` (MiB)          ``kvdoctor_gpu_memory_total_bytes``                2**20
======================================  ===============================================  =======

Labels: ``gpu`` -> ``gpu``, ``UUID`` -> ``uuid``, ``modelName`` -> ``model``; the two ratios carry
``method="dcgm"``. dcgm-exporter's ``pod``/``namespace``/``container`` labels (the workload using
the GPU) are not carried: ``pod`` is kvdoctor's own label. Series of MIG instances (with a
``GPU_I_ID`` label) are skipped; the whole-GPU series is used. ``DCGM_FI_PROF_SM_ACTIVE`` and the
PCIe fields are off in dcgm-exporter's default counter list; missing fields are simply absent.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from kvdoctor.exporter.collectors.base import register
from kvdoctor.exporter.gpu_filter import make_gpu_filter
from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.collection import Collected, NotApplicable, SourceError
from kvdoctor.signals.units import MIB
from kvdoctor.signals.window import SeriesKey

from .engine import configured_url, parse_exposition, scrape_options
from .http import DEFAULT_MAX_BODY_BYTES, DEFAULT_TIMEOUT_SECONDS, HttpExposition

# dcgm-exporter field -> (canonical signal, scale, method label or None)
FIELDS: dict[str, tuple[str, float, str | None]] = {
    "DCGM_FI_PROF_DRAM_ACTIVE": (S.GPU_DRAM_BANDWIDTH_UTILIZATION, 1.0, S.METHOD_DCGM),
    "DCGM_FI_PROF_SM_ACTIVE": (S.GPU_SM_ACTIVE, 1.0, S.METHOD_DCGM),
    "DCGM_FI_PROF_PCIE_RX_BYTES": (S.GPU_PCIE_RX, 1.0, None),
    "DCGM_FI_PROF_PCIE_TX_BYTES": (S.GPU_PCIE_TX, 1.0, None),
    "DCGM_FI_DEV_FB_USED": (S.GPU_MEMORY_USED, MIB, None),
    "DCGM_FI_DEV_FB_TOTAL": (S.GPU_MEMORY_TOTAL, MIB, None),
}
WANTED = frozenset(FIELDS)
GPU_LABELS = {"gpu": "gpu", "UUID": "uuid", "modelName": "model"}


def normalise_dcgm(
    samples: Iterable[tuple[str, Mapping[str, str], float]], extra_labels: Mapping[str, str] | None = None
) -> dict[SeriesKey, float]:
    """dcgm-exporter samples -> canonical GPU samples (the pure half of the collector)."""
    out: dict[SeriesKey, float] = {}
    for name, labels, value in samples:
        field = FIELDS.get(name)
        if field is None or "GPU_I_ID" in labels or "gpu" not in labels:
            continue
        target, scale, method = field
        canonical = {dst: labels[src] for src, dst in GPU_LABELS.items() if src in labels}
        if method is not None:
            canonical["method"] = method
        canonical.update(extra_labels or {})
        out[(target, tuple(sorted(canonical.items())))] = value * scale
    return out


class DcgmCollector:
    """GPU counters from dcgm-exporter (``http://HOST:9400/metrics``)."""

    name = "dcgm"

    def __init__(
        self,
        url: str | None,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        extra_labels: Mapping[str, str] | None = None,
        gpu_filter=None,
    ):
        self.url = url or None
        self.extra_labels = dict(extra_labels or {})
        self._filter = gpu_filter  # same policy as NVML's: dcgm-exporter reports every GPU of the node
        self._http = HttpExposition(url, timeout, max_body_bytes) if url else None

    def collect(self) -> Collected:
        if self._http is None:
            raise NotApplicable("no dcgm-exporter URL configured")
        samples = normalise_dcgm(parse_exposition(self._http.iter_text(), WANTED), self.extra_labels)
        if not samples:
            raise SourceError("no_dcgm_fields", f"{self.url} has none of {', '.join(sorted(FIELDS))}")
        if self._filter is not None:
            samples = self._filtered(samples)
        return Collected(samples)

    def _filtered(self, samples: dict[SeriesKey, float]) -> dict[SeriesKey, float]:
        """Keep the GPUs the filter selects (the pod's engine GPUs, not the whole node)."""
        seen = {}
        for _, labels in samples:
            d = dict(labels)
            if "uuid" in d:
                seen[d["uuid"]] = (int(d["gpu"]), d["uuid"], d.get("model", ""))
        try:
            keep = {uuid for _, uuid, _ in self._filter(sorted(seen.values()))}
        except ValueError as exc:
            raise SourceError("gpu_filter_error", str(exc)) from None
        return {key: v for key, v in samples.items() if dict(key[1]).get("uuid") in keep}

    def close(self) -> None:
        if self._http is not None:
            self._http.close()


@register("dcgm", "GPU counters from an existing dcgm-exporter (--dcgm-url)", True)
def dcgm_collector(settings) -> DcgmCollector:
    """Factory: ``--dcgm-url`` (none: not applicable), ``--scrape-timeout``, ``--max-body-bytes``."""
    return DcgmCollector(
        configured_url(settings, "dcgm_url", "dcgm-exporter"),
        **scrape_options(settings),
        gpu_filter=_gpu_filter(settings),
    )


def _gpu_filter(settings):
    spec = getattr(settings, "gpu_filter", None)
    if not spec:
        return None
    return make_gpu_filter(spec)
