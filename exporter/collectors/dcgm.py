"""The dcgm-exporter collector: GPU counters from an existing dcgm-exporter's /metrics.

Where dcgm-exporter already runs (GPU Operator clusters), its profiling fields are the next best
thing after NVML GPM, and the only bandwidth measure on pre-Hopper GPUs that is not a duty cycle.
Its device fields give the same GPU health signals the NVML collector reads. ``FIELDS`` is the one
mapping table (field -> canonical signal, scale, labels):

==============================================  ====================================================  =======
dcgm-exporter field                             canonical signal                                      scale
==============================================  ====================================================  =======
``DCGM_FI_PROF_DRAM_ACTIVE`` (0..1)             ``kvdoctor_gpu_dram_bandwidth_utilization_ratio``     1
``DCGM_FI_PROF_SM_ACTIVE`` (0..1)               ``kvdoctor_gpu_sm_active_ratio``                      1
``DCGM_FI_PROF_PCIE_RX_BYTES`` (B/s)            ``kvdoctor_gpu_pcie_receive_bytes_per_second``        1
``DCGM_FI_PROF_PCIE_TX_BYTES`` (B/s)            ``kvdoctor_gpu_pcie_transmit_bytes_per_second``       1
``DCGM_FI_DEV_FB_USED`` (MiB)                   ``kvdoctor_gpu_memory_used_bytes``                    2**20
``DCGM_FI_DEV_FB_TOTAL`` (MiB)                  ``kvdoctor_gpu_memory_total_bytes``                   2**20
``DCGM_FI_DEV_GPU_TEMP`` (C)                    ``kvdoctor_gpu_temperature_celsius``                  1
``DCGM_FI_DEV_POWER_USAGE`` (W)                 ``kvdoctor_gpu_power_draw_watts``                     1
``DCGM_FI_DEV_ENFORCED_POWER_LIMIT`` (W)        ``kvdoctor_gpu_power_limit_watts``                    1
``DCGM_FI_DEV_SM_CLOCK``, ``_MEM_CLOCK`` (MHz)  ``kvdoctor_gpu_clock_hertz{clock=sm|memory}``         10**6
``DCGM_FI_DEV_MAX_SM_CLOCK``, ``_MAX_MEM_CLOCK``  ``kvdoctor_gpu_max_clock_hertz{clock}``             10**6
``DCGM_FI_DEV_CLOCKS_EVENT_REASONS`` (mask)     ``kvdoctor_gpu_clock_throttle_reason{reason}``        bits
``DCGM_FI_DEV_CLOCK_THROTTLE_REASONS`` (mask)   the same (the field's name before DCGM 3.3)           bits
``DCGM_FI_DEV_XID_ERRORS`` (last XID)           ``kvdoctor_gpu_last_xid``                             1
``DCGM_FI_DEV_ECC_SBE/DBE_VOL/AGG_TOTAL``       ``kvdoctor_gpu_ecc_errors_total{error,scope}``        1
``DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS``       ``kvdoctor_gpu_remapped_rows_total{error=corrected}``  1
``DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS``     ``kvdoctor_gpu_remapped_rows_total{error=uncorrected}``  1
``DCGM_FI_DEV_ROW_REMAP_PENDING``, ``_FAILURE``  ``kvdoctor_gpu_row_remap_pending``, ``..._failure``   1
``DCGM_FI_DEV_PCIE_LINK_GEN``, ``_WIDTH``       ``kvdoctor_gpu_pcie_link_generation``, ``..._width_lanes``  1
``DCGM_FI_DEV_PCIE_MAX_LINK_GEN``, ``_WIDTH``   ``kvdoctor_gpu_pcie_link_max_generation``, ``..._max_width_lanes``  1
``DCGM_FI_DEV_PCIE_REPLAY_COUNTER``             ``kvdoctor_gpu_pcie_replays_total``                   1
==============================================  ====================================================  =======

SBE (single-bit) ECC errors are the corrected ones, DBE (double-bit) the uncorrected; VOL is
volatile, AGG aggregate. The clock-event mask has NVML's bits (``vocabulary.CLOCK_THROTTLE_REASONS``)
and becomes the same state set. DCGM has no XID counter (only the last XID's code), so
``kvdoctor_gpu_xid_errors_total`` comes from NVML alone. In dcgm-exporter's default counters
(etc/default-counters.csv) the clocks, temperature, power draw, PCIe replays, last XID and
remapped rows are on; the ECC counters are commented out; the power limit, the maxima, the
clock-event mask, the row-remap pending flag and the PCIe link fields have to be added to its
counters file. Missing fields are simply absent. A value at or above DCGM's blank sentinels (a field
the GPU does not support: ``DCGM_FT_FP64_BLANK`` = 2**47 and up) is skipped.

Labels: ``gpu`` -> ``gpu``, ``UUID`` -> ``uuid``, ``modelName`` -> ``model``; the two ratios carry
``method="dcgm"``. dcgm-exporter's ``pod``/``namespace``/``container`` labels (the workload using
the GPU) are not carried: ``pod`` is kvdoctor's own label. Series of MIG instances (with a
``GPU_I_ID`` label) are skipped; the whole-GPU series is used. ``DCGM_FI_PROF_SM_ACTIVE`` and the
PCIe fields are off in dcgm-exporter's default counter list.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kvdoctor.exporter.collectors.base import register
from kvdoctor.exporter.gpu_filter import make_gpu_filter
from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.collection import Collected, NotApplicable, SourceError
from kvdoctor.signals.units import MIB
from kvdoctor.signals.window import SeriesKey

from .engine import configured_url, parse_exposition, scrape_options
from .http import DEFAULT_MAX_BODY_BYTES, DEFAULT_TIMEOUT_SECONDS, HttpExposition


@dataclass(frozen=True)
class DcgmField:
    """Where one dcgm-exporter field goes: ``signal{labels}`` = value x ``scale``."""

    signal: str
    scale: float = 1.0
    labels: tuple[tuple[str, str], ...] = ()
    bitmask: bool = False  # a clock-event mask, expanded into the throttle-reason state set


MHZ = 1e6
DCGM_BLANK = float(2**47)  # DCGM_FT_FP64_BLANK; the integer blanks (DCGM_FT_INT64_BLANK, ...) are larger
_DCGM = (("method", S.METHOD_DCGM),)
_SM, _MEM = (("clock", S.CLOCK_SM),), (("clock", S.CLOCK_MEMORY),)


def _ecc(error: str, scope: str) -> DcgmField:
    return DcgmField(S.GPU_ECC_ERRORS, labels=(("error", error), ("scope", scope)))


FIELDS: dict[str, DcgmField] = {
    "DCGM_FI_PROF_DRAM_ACTIVE": DcgmField(S.GPU_DRAM_BANDWIDTH_UTILIZATION, labels=_DCGM),
    "DCGM_FI_PROF_SM_ACTIVE": DcgmField(S.GPU_SM_ACTIVE, labels=_DCGM),
    "DCGM_FI_PROF_PCIE_RX_BYTES": DcgmField(S.GPU_PCIE_RX),
    "DCGM_FI_PROF_PCIE_TX_BYTES": DcgmField(S.GPU_PCIE_TX),
    "DCGM_FI_DEV_FB_USED": DcgmField(S.GPU_MEMORY_USED, MIB),
    "DCGM_FI_DEV_FB_TOTAL": DcgmField(S.GPU_MEMORY_TOTAL, MIB),
    "DCGM_FI_DEV_GPU_TEMP": DcgmField(S.GPU_TEMPERATURE),
    "DCGM_FI_DEV_POWER_USAGE": DcgmField(S.GPU_POWER_DRAW),
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": DcgmField(S.GPU_POWER_LIMIT),
    "DCGM_FI_DEV_SM_CLOCK": DcgmField(S.GPU_CLOCK, MHZ, _SM),
    "DCGM_FI_DEV_MEM_CLOCK": DcgmField(S.GPU_CLOCK, MHZ, _MEM),
    "DCGM_FI_DEV_MAX_SM_CLOCK": DcgmField(S.GPU_MAX_CLOCK, MHZ, _SM),
    "DCGM_FI_DEV_MAX_MEM_CLOCK": DcgmField(S.GPU_MAX_CLOCK, MHZ, _MEM),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": DcgmField(S.GPU_CLOCK_THROTTLE_REASON, bitmask=True),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": DcgmField(S.GPU_CLOCK_THROTTLE_REASON, bitmask=True),
    "DCGM_FI_DEV_XID_ERRORS": DcgmField(S.GPU_LAST_XID),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": _ecc(S.ERROR_CORRECTED, S.SCOPE_VOLATILE),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": _ecc(S.ERROR_UNCORRECTED, S.SCOPE_VOLATILE),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": _ecc(S.ERROR_CORRECTED, S.SCOPE_AGGREGATE),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": _ecc(S.ERROR_UNCORRECTED, S.SCOPE_AGGREGATE),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": DcgmField(S.GPU_REMAPPED_ROWS, labels=(("error", S.ERROR_CORRECTED),)),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": DcgmField(S.GPU_REMAPPED_ROWS, labels=(("error", S.ERROR_UNCORRECTED),)),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": DcgmField(S.GPU_ROW_REMAP_PENDING),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": DcgmField(S.GPU_ROW_REMAP_FAILURE),
    "DCGM_FI_DEV_PCIE_LINK_GEN": DcgmField(S.GPU_PCIE_LINK_GENERATION),
    "DCGM_FI_DEV_PCIE_LINK_WIDTH": DcgmField(S.GPU_PCIE_LINK_WIDTH),
    "DCGM_FI_DEV_PCIE_MAX_LINK_GEN": DcgmField(S.GPU_PCIE_LINK_MAX_GENERATION),
    "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH": DcgmField(S.GPU_PCIE_LINK_MAX_WIDTH),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": DcgmField(S.GPU_PCIE_REPLAYS),
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
        if field is None or "GPU_I_ID" in labels or "gpu" not in labels or not value < DCGM_BLANK:
            continue
        canonical = {dst: labels[src] for src, dst in GPU_LABELS.items() if src in labels}
        canonical.update(field.labels)
        canonical.update(extra_labels or {})
        if field.bitmask:
            for reason, state in S.throttle_reason_states(int(value)).items():
                out[(field.signal, tuple(sorted({**canonical, "reason": reason}.items())))] = state
            continue
        out[(field.signal, tuple(sorted(canonical.items())))] = value * field.scale
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


@register("dcgm", "GPU counters and health from an existing dcgm-exporter (--dcgm-url)", True)
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
