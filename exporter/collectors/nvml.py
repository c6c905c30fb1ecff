"""The NVML collector: per-GPU bandwidth, SM activity, PCIe traffic, memory and health, through ``pynvml``.

Per GPU (labels ``gpu`` = NVML index, ``uuid``, ``model`` = NVML name):

- Hopper and newer (``nvmlGpmQueryDeviceSupport``): GPM. Each cycle takes one GPM sample and
  compares it with the previous one: ``DRAM_BW_UTIL`` (id 10, % of theoretical peak bandwidth)
  and ``SM_UTIL`` (id 2, % of SMs busy) / 100, ``PCIE_TX/RX_PER_SEC`` (ids 20/21, MiB/s) x 2**20;
  ``method="gpm"``. The first cycle has no previous sample, so those four appear from the second.
- Older GPUs: ``nvmlDeviceGetUtilizationRates`` ``.memory`` and ``.gpu`` / 100 with
  ``method="nvml_util"`` (duty cycles: the fraction of time memory was read or written / a kernel
  ran, NOT bandwidth) and ``nvmlDeviceGetPcieThroughput`` (KB/s, taken as KiB/s) x 1024.
- Memory used/total from ``nvmlDeviceGetMemoryInfo`` v2 (falls back to v1).
- Peak DRAM bandwidth (``kvdoctor_gpu_dram_peak_bandwidth_bytes_per_second``): ``--gpu-peak-bandwidth``
  if given; else the GPU catalogue's datasheet figure for the exact NVML device name
  (``ledger/gpus.py``); else, for a GPU the catalogue lacks, computed from the device: bus width
  (bits, ``nvmlDeviceGetMemoryBusWidth``) x max memory clock (MHz,
  ``nvmlDeviceGetMaxClockInfo(NVML_CLOCK_MEM)``) x 2 / 8 (``ledger.gpus.nvml_peak_bandwidth``: the
  factor 2 is double data rate; H100 SXM 5120 bit x 2619 MHz x 2 / 8 = 3.35 TB/s).

- Health, every cycle (``HEALTH_FIELDS``, one row per reading): temperature, power draw and the
  enforced limit (mW / 1000), SM and memory clocks (MHz x 10**6) with their maxima, the PCIe link's
  generation and width with their maxima, the PCIe replay counter, the four ECC counters
  (corrected/uncorrected x volatile/aggregate); then the clock throttle reasons
  (``nvmlDeviceGetCurrentClocksEventReasons``, older drivers ``...ClocksThrottleReasons``) as a state
  set, one series per reason of ``vocabulary.CLOCK_THROTTLE_REASONS``, and
  ``nvmlDeviceGetRemappedRows`` (corrected and uncorrected rows, pending, failure). The maxima are
  fixed for a device: read once per NVML initialisation. XID errors: NVML has no counter, only
  events, so each GPU gets its own event set registered for ``nvmlEventTypeXidCriticalError`` and
  each cycle drains it with ``nvmlEventSetWait(set, 0)`` (no waiting: ``NVML_ERROR_TIMEOUT`` says it
  is empty), counting the events into ``kvdoctor_gpu_xid_errors_total`` and keeping the last code;
  XIDs before the exporter started are not seen (the kernel log has them).
  A reading the GPU does not support (``NVML_ERROR_NOT_SUPPORTED``, a driver without the function,
  or an nvidia-ml-py without it) is skipped from then on: asked once per initialisation, never an
  error, listed by the check. Any other error on a health reading skips that reading this cycle
  and counts ``gpu_health_error``; the GPU's other signals still report.

Isolation: NVML is initialised lazily, on the first ``collect``. No library, no driver, or no GPU
-> ``NotApplicable``. A GPU whose query raises ``NVMLError`` reports nothing that cycle and adds
``gpu_error`` to ``partial_errors``; the others report. ``NVML_ERROR_GPU_IS_LOST`` marks the GPU
lost (``gpu_lost`` each cycle) and NVML is shut down and initialised again after 1, 2, 4, ... s
(at most 60 s) until the GPU answers; the others keep reporting in between. ``gpu_filter`` (see
exporter/gpu_filter.py) is called every cycle with ``[(index, uuid, name), ...]`` and returns the
GPUs to report.

``scripts/gpu_check.sh`` (``main(["--check"])`` here) reads the real GPUs twice and prints what it
found, for a GPU machine.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pynvml  # nvidia-ml-py: importing it loads no driver library (nvmlInit does)

from kvdoctor.exporter.collectors.base import register
from kvdoctor.exporter.gpu_filter import make_gpu_filter
from kvdoctor.ledger.gpus import DATA_RATE, lookup_gpu, nvml_peak_bandwidth
from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.collection import Collected, NotApplicable, SourceError
from kvdoctor.signals.units import KIB, MIB
from kvdoctor.signals.window import SeriesKey

GpuIdentity = tuple[int, str, str]  # (NVML index, UUID, name): what gpu_filter receives
GpuFilter = Callable[[Sequence[GpuIdentity]], Sequence[GpuIdentity]]

GPM_MIN_INTERVAL = 0.1  # seconds between two GPM samples, at least
BACKOFF_INITIAL = 1.0
BACKOFF_MAX = 60.0

# GPM metric ids (nvidia-ml-py NVML_GPM_METRIC_*), and how each becomes a canonical value.
GPM_SM_UTIL, GPM_DRAM_BW_UTIL, GPM_PCIE_TX_PER_SEC, GPM_PCIE_RX_PER_SEC = 2, 10, 20, 21
GPM_METRICS: tuple[tuple[int, str, float, bool], ...] = (  # (id, signal, scale, has method label)
    (GPM_DRAM_BW_UTIL, S.GPU_DRAM_BANDWIDTH_UTILIZATION, 0.01, True),
    (GPM_SM_UTIL, S.GPU_SM_ACTIVE, 0.01, True),
    (GPM_PCIE_TX_PER_SEC, S.GPU_PCIE_TX, MIB, False),
    (GPM_PCIE_RX_PER_SEC, S.GPU_PCIE_RX, MIB, False),
)


MAX_XID_EVENTS_PER_CYCLE = 64  # events drained per GPU and cycle; the rest wait for the next


@dataclass(frozen=True)
class HealthField:
    """One NVML health reading: ``pynvml.<call>(handle, *args) x scale`` -> ``signal{labels}``."""

    name: str  # as the check prints it and the GPU's unsupported set records it
    call: str
    args: tuple[str, ...]  # names of pynvml constants passed after the handle
    signal: str
    scale: float = 1.0
    labels: tuple[tuple[str, str], ...] = ()
    static: bool = False  # fixed for the device: read once per NVML initialisation


def _ecc(error: str, scope: str, error_const: str, scope_const: str) -> HealthField:
    return HealthField(
        f"ecc_{error}_{scope}",
        "nvmlDeviceGetTotalEccErrors",
        (error_const, scope_const),
        S.GPU_ECC_ERRORS,
        labels=(("error", error), ("scope", scope)),
    )


HEALTH_FIELDS: tuple[HealthField, ...] = (
    HealthField("temperature", "nvmlDeviceGetTemperature", ("NVML_TEMPERATURE_GPU",), S.GPU_TEMPERATURE),
    HealthField("power_draw", "nvmlDeviceGetPowerUsage", (), S.GPU_POWER_DRAW, 1e-3),
    HealthField("power_limit", "nvmlDeviceGetEnforcedPowerLimit", (), S.GPU_POWER_LIMIT, 1e-3),
    HealthField("sm_clock", "nvmlDeviceGetClockInfo", ("NVML_CLOCK_SM",), S.GPU_CLOCK, 1e6, (("clock", S.CLOCK_SM),)),
    HealthField(
        "memory_clock", "nvmlDeviceGetClockInfo", ("NVML_CLOCK_MEM",), S.GPU_CLOCK, 1e6, (("clock", S.CLOCK_MEMORY),)
    ),
    HealthField(
        "max_sm_clock",
        "nvmlDeviceGetMaxClockInfo",
        ("NVML_CLOCK_SM",),
        S.GPU_MAX_CLOCK,
        1e6,
        (("clock", S.CLOCK_SM),),
        static=True,
    ),
    HealthField(
        "max_memory_clock",
        "nvmlDeviceGetMaxClockInfo",
        ("NVML_CLOCK_MEM",),
        S.GPU_MAX_CLOCK,
        1e6,
        (("clock", S.CLOCK_MEMORY),),
        static=True,
    ),
    HealthField("pcie_link_generation", "nvmlDeviceGetCurrPcieLinkGeneration", (), S.GPU_PCIE_LINK_GENERATION),
    HealthField("pcie_link_width", "nvmlDeviceGetCurrPcieLinkWidth", (), S.GPU_PCIE_LINK_WIDTH),
    HealthField(
        "pcie_link_max_generation",
        "nvmlDeviceGetMaxPcieLinkGeneration",
        (),
        S.GPU_PCIE_LINK_MAX_GENERATION,
        static=True,
    ),
    HealthField("pcie_link_max_width", "nvmlDeviceGetMaxPcieLinkWidth", (), S.GPU_PCIE_LINK_MAX_WIDTH, static=True),
    HealthField("pcie_replays", "nvmlDeviceGetPcieReplayCounter", (), S.GPU_PCIE_REPLAYS),
    _ecc(S.ERROR_CORRECTED, S.SCOPE_VOLATILE, "NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_VOLATILE_ECC"),
    _ecc(S.ERROR_UNCORRECTED, S.SCOPE_VOLATILE, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_VOLATILE_ECC"),
    _ecc(S.ERROR_CORRECTED, S.SCOPE_AGGREGATE, "NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_AGGREGATE_ECC"),
    _ecc(S.ERROR_UNCORRECTED, S.SCOPE_AGGREGATE, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_AGGREGATE_ECC"),
)
# The readings beyond the table, by the names the unsupported set records.
THROTTLE_CALLS = (  # newest name first; drivers before R535 only have the second
    ("clocks_event_reasons", "nvmlDeviceGetCurrentClocksEventReasons"),
    ("clocks_throttle_reasons", "nvmlDeviceGetCurrentClocksThrottleReasons"),
)
REMAPPED_ROWS = "remapped_rows"
XID_EVENTS = "xid_events"


peak_bandwidth = nvml_peak_bandwidth  # bytes/s from NVML's bus width (bits) and max memory clock (MHz)


def catalogue_peak_bandwidth(name: str) -> float | None:
    """The ledger's catalogue figure for an NVML device name, if the ledger knows the GPU."""
    spec = lookup_gpu(name)
    return spec.peak_bandwidth if spec is not None else None


@dataclass
class GpuState:
    """What the collector knows about one GPU between cycles."""

    index: int
    uuid: str
    name: str
    handle: Any = None
    lost: bool = False
    gpm: bool = False
    peak_bandwidth: float | None = None
    peak_source: str = ""  # "override", "catalogue", "nvml" or ""
    gpm_samples: list = field(default_factory=list)  # two GPM sample buffers, used in turn
    gpm_prev: int | None = None  # which buffer holds the previous sample
    gpm_prev_time: float = 0.0
    gpm_values: dict = field(default_factory=dict)  # the last values computed (reused if sampled too soon)
    last_error: str = ""
    unsupported: set[str] = field(default_factory=set)  # health readings this GPU does not support
    static_values: dict[str, float] = field(default_factory=dict)  # health readings fixed for the device
    xid_events: Any = None  # the NVML event set watching for XIDs, or None
    xid_count: int = 0
    last_xid: int = 0
    health_error: str = ""  # the last health reading that failed this cycle, for the check
    series_keys: dict[tuple[str, ...], SeriesKey] = field(default_factory=dict)  # built once per identity

    @property
    def identity(self) -> GpuIdentity:
        return (self.index, self.uuid, self.name)


class NvmlCollector:
    """Per-GPU counters through NVML (``pynvml`` from nvidia-ml-py, injectable for tests)."""

    name = "nvml"

    def __init__(
        self,
        pynvml_module: Any = None,
        gpu_filter: GpuFilter | None = None,
        peak_bandwidth_override: float | None = None,
        extra_labels: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        backoff_initial: float = BACKOFF_INITIAL,
        backoff_max: float = BACKOFF_MAX,
    ):
        self._nv = pynvml if pynvml_module is None else pynvml_module
        self._filter = gpu_filter
        self._peak_override = peak_bandwidth_override
        self.extra_labels = dict(extra_labels or {})
        self._clock = clock
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._backoff = backoff_initial
        self._reinit_at: float | None = None
        self._initialised = False
        self.gpus: list[GpuState] = []

    # ------------------------------------------------------------------ NVML lifetime

    def _error_value(self, exc: BaseException) -> int | None:
        return getattr(exc, "value", None)

    def _init(self) -> None:
        nv = self._nv
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            if self._error_value(exc) in (nv.NVML_ERROR_LIBRARY_NOT_FOUND, nv.NVML_ERROR_DRIVER_NOT_LOADED):
                raise NotApplicable(str(exc)) from None
            raise SourceError("nvml_init_failed", f"nvmlInit: {exc}") from None
        try:
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as exc:
            self._shutdown()
            raise SourceError("nvml_init_failed", f"nvmlDeviceGetCount: {exc}") from None
        if count == 0:
            self._shutdown()
            raise NotApplicable("NVML sees no GPU")
        previous = {g.index: g for g in self.gpus}  # keeps a lost GPU's identity for its labels
        self.gpus = []
        for index in range(count):
            before = previous.get(index)
            gpu = GpuState(index, before.uuid if before else "", before.name if before else "")
            self._identify(gpu)
            if before is not None and before.uuid == gpu.uuid:  # the same GPU: its XID counter goes on
                gpu.xid_count, gpu.last_xid = before.xid_count, before.last_xid
            self.gpus.append(gpu)
        self._initialised = True

    def _identify(self, gpu: GpuState) -> None:
        """Handle, identity, peak bandwidth and GPM support of one GPU (handle None on failure)."""
        nv = self._nv
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(gpu.index)
            gpu.uuid = _text(nv.nvmlDeviceGetUUID(handle))
            gpu.name = _text(nv.nvmlDeviceGetName(handle))
        except nv.NVMLError as exc:
            gpu.handle, gpu.last_error = None, str(exc)
            if self._error_value(exc) == nv.NVML_ERROR_GPU_IS_LOST:
                self._mark_lost(gpu)
            return
        gpu.handle, gpu.last_error = handle, ""
        gpu.series_keys.clear()  # its labels may have changed
        gpu.peak_bandwidth, gpu.peak_source = self._peak(gpu)
        gpu.gpm = self._gpm_supported(gpu)
        self._watch_xid(gpu)

    def _watch_xid(self, gpu: GpuState) -> None:
        """Register an event set for the GPU's XID errors; where NVML refuses, XIDs are unsupported."""
        nv = self._nv
        self._free_events(gpu)
        try:
            events = nv.nvmlEventSetCreate()
        except (nv.NVMLError, AttributeError):
            gpu.unsupported.add(XID_EVENTS)
            return
        try:
            nv.nvmlDeviceRegisterEvents(gpu.handle, nv.nvmlEventTypeXidCriticalError, events)
        except (nv.NVMLError, AttributeError):  # not supported, or not permitted (some containers, vGPU)
            with contextlib.suppress(Exception):
                nv.nvmlEventSetFree(events)
            gpu.unsupported.add(XID_EVENTS)
            return
        gpu.xid_events = events

    def _free_events(self, gpu: GpuState) -> None:
        if gpu.xid_events is not None:
            with contextlib.suppress(Exception):  # freeing is best effort
                self._nv.nvmlEventSetFree(gpu.xid_events)
        gpu.xid_events = None

    def _peak(self, gpu: GpuState) -> tuple[float | None, str]:
        """The override, else the catalogue's datasheet figure, else NVML's bus width x clock."""
        if self._peak_override:
            return float(self._peak_override), "override"
        figure = catalogue_peak_bandwidth(gpu.name)
        if figure:
            return figure, "catalogue"
        width, mhz = self._bus_and_clock(gpu)
        return (peak_bandwidth(width, mhz), "nvml") if width and mhz else (None, "")

    def _bus_and_clock(self, gpu: GpuState) -> tuple[int, int]:
        """(memory bus width in bits, max memory clock in MHz) from NVML; zeros where unsupported."""
        nv = self._nv
        try:
            return int(nv.nvmlDeviceGetMemoryBusWidth(gpu.handle)), int(
                nv.nvmlDeviceGetMaxClockInfo(gpu.handle, nv.NVML_CLOCK_MEM)
            )
        except (nv.NVMLError, AttributeError):  # not supported, or an nvidia-ml-py without the call
            return 0, 0

    def _gpm_supported(self, gpu: GpuState) -> bool:
        nv = self._nv
        try:
            if not nv.nvmlGpmQueryDeviceSupport(gpu.handle).isSupportedDevice:
                return False
            gpu.gpm_samples = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
        except (nv.NVMLError, AttributeError):
            self._free_gpm(gpu)
            return False
        return True

    def _free_gpm(self, gpu: GpuState) -> None:
        for sample in gpu.gpm_samples:
            with contextlib.suppress(Exception):  # freeing is best effort
                self._nv.nvmlGpmSampleFree(sample)
        gpu.gpm_samples, gpu.gpm_prev = [], None

    def _shutdown(self) -> None:
        for gpu in self.gpus:
            self._free_gpm(gpu)
            self._free_events(gpu)
        with contextlib.suppress(Exception):  # shutting down is best effort
            self._nv.nvmlShutdown()
        self._initialised = False

    def _mark_lost(self, gpu: GpuState) -> None:
        gpu.lost = True
        if self._reinit_at is None:
            self._reinit_at = self._clock() + self._backoff
            self._backoff = min(self._backoff * 2, self._backoff_max)

    def _reinit(self) -> None:
        """Shut NVML down and initialise it again, hoping the lost GPU comes back.

        Every handle is taken afresh, so the healthy GPUs lose their previous GPM sample too and
        show no GPM ratios for that one cycle.
        """
        self._reinit_at = None
        self._shutdown()
        try:
            self._init()
        except (NotApplicable, SourceError) as exc:
            self._reinit_at = self._clock() + self._backoff
            self._backoff = min(self._backoff * 2, self._backoff_max)
            raise SourceError("nvml_reinit_failed", f"re-initialising NVML after a lost GPU: {exc}") from None

    def close(self) -> None:
        if self._initialised:
            self._shutdown()

    # ------------------------------------------------------------------ one cycle

    def collect(self) -> Collected:
        if not self._initialised:
            if self._reinit_at is not None and self._clock() < self._reinit_at:
                raise SourceError("nvml_reinit_pending", "NVML is down after a lost GPU; retrying with backoff")
            if self._reinit_at is not None:
                self._reinit()
            else:
                self._init()
        elif self._reinit_at is not None and self._clock() >= self._reinit_at:
            self._reinit()
        out = Collected()
        for gpu in self._selected():
            if gpu.handle is None and not gpu.lost:
                self._identify(gpu)  # its enumeration failed earlier: try again
            if gpu.lost or gpu.handle is None:
                out.partial_errors.append("gpu_lost" if gpu.lost else "gpu_error")
                continue
            try:
                samples = self._read(gpu, out.partial_errors)
            except self._nv.NVMLError as exc:
                gpu.last_error = str(exc)
                if self._error_value(exc) == self._nv.NVML_ERROR_GPU_IS_LOST:
                    self._mark_lost(gpu)
                    out.partial_errors.append("gpu_lost")
                else:
                    out.partial_errors.append("gpu_error")
                continue
            gpu.last_error = ""
            out.samples.update(samples)
        if not any(g.lost for g in self.gpus):
            self._backoff, self._reinit_at = self._backoff_initial, None
        if not out.samples and out.partial_errors:
            raise SourceError(
                out.partial_errors[0],
                "no GPU could be read: "
                + "; ".join(f"GPU {g.index}: {g.last_error or 'lost'}" for g in self.gpus if g.last_error or g.lost),
            )
        return out

    def _selected(self) -> list[GpuState]:
        if self._filter is None:
            return list(self.gpus)
        try:
            chosen = self._filter([g.identity for g in self.gpus])
        except SourceError:
            raise
        except ValueError as exc:
            raise SourceError("gpu_filter_error", str(exc)) from None
        keep = {(index, uuid) for index, uuid, _ in chosen}
        selected = [g for g in self.gpus if (g.index, g.uuid) in keep]
        if not selected:
            raise NotApplicable("the GPU filter selects none of the GPUs NVML sees")
        return selected

    def _read(self, gpu: GpuState, errors: list[str]) -> dict[SeriesKey, float]:
        nv = self._nv
        labels = {"gpu": str(gpu.index), "uuid": gpu.uuid, "model": gpu.name, **self.extra_labels}
        keys = gpu.series_keys  # the same keys every cycle: built once (some 30 per GPU)

        def key(name: str, **more: str) -> SeriesKey:
            found = keys.get((name, *more.values()))
            if found is None:
                found = keys[(name, *more.values())] = (name, tuple(sorted({**labels, **more}.items())))
            return found

        out: dict[SeriesKey, float] = {}
        memory = self._memory_info(gpu)
        out[key(S.GPU_MEMORY_USED)] = float(memory.used)
        out[key(S.GPU_MEMORY_TOTAL)] = float(memory.total)
        if gpu.peak_bandwidth:
            out[key(S.GPU_DRAM_PEAK_BANDWIDTH)] = gpu.peak_bandwidth
        self._read_health(gpu, key, out, errors)
        if gpu.gpm:
            values = self._gpm_values(gpu)
            if values is not None:
                for _, signal, _, with_method in GPM_METRICS:
                    if signal in values:
                        out[key(signal, method=S.METHOD_GPM) if with_method else key(signal)] = values[signal]
                return out
        rates = self._optional(nv.nvmlDeviceGetUtilizationRates, gpu.handle)
        if rates is not None:
            out[key(S.GPU_DRAM_BANDWIDTH_UTILIZATION, method=S.METHOD_NVML_UTIL)] = rates.memory / 100.0
            out[key(S.GPU_SM_ACTIVE, method=S.METHOD_NVML_UTIL)] = rates.gpu / 100.0
        for counter, signal in (
            (nv.NVML_PCIE_UTIL_TX_BYTES, S.GPU_PCIE_TX),
            (nv.NVML_PCIE_UTIL_RX_BYTES, S.GPU_PCIE_RX),
        ):
            kib_per_s = self._optional(nv.nvmlDeviceGetPcieThroughput, gpu.handle, counter)
            if kib_per_s is not None:
                out[key(signal)] = float(kib_per_s) * KIB
        return out

    def _read_health(
        self, gpu: GpuState, key: Callable[..., SeriesKey], out: dict[SeriesKey, float], errors: list[str]
    ) -> None:
        """The health readings into ``out``; a failed one adds ``gpu_health_error`` to ``errors`` once."""
        gpu.health_error = ""
        failed = False
        for hf in HEALTH_FIELDS:
            if hf.static and hf.name in gpu.static_values:
                value: Any = gpu.static_values[hf.name]
            else:
                value = self._health(gpu, hf.name, hf.call, *(getattr(self._nv, a) for a in hf.args))
                if value is _FAILED:
                    failed = True
                    continue
                if value is None:
                    continue
                value = float(value) * hf.scale
                if hf.static:
                    gpu.static_values[hf.name] = value
            out[key(hf.signal, **dict(hf.labels))] = value
        mask = _FAILED
        for name, call in THROTTLE_CALLS:
            mask = self._health(gpu, name, call)
            if mask is not None or name not in gpu.unsupported:
                break
        if mask is _FAILED:
            failed = True
        elif mask is not None:
            for reason, state in S.throttle_reason_states(int(mask)).items():
                out[key(S.GPU_CLOCK_THROTTLE_REASON, reason=reason)] = state
        rows = self._health(gpu, REMAPPED_ROWS, "nvmlDeviceGetRemappedRows")
        if rows is _FAILED:
            failed = True
        elif rows is not None:
            corrected, uncorrected, pending, failure = rows
            out[key(S.GPU_REMAPPED_ROWS, error=S.ERROR_CORRECTED)] = float(corrected)
            out[key(S.GPU_REMAPPED_ROWS, error=S.ERROR_UNCORRECTED)] = float(uncorrected)
            out[key(S.GPU_ROW_REMAP_PENDING)] = 1.0 if pending else 0.0
            out[key(S.GPU_ROW_REMAP_FAILURE)] = 1.0 if failure else 0.0
        if gpu.xid_events is not None:
            failed = not self._drain_xid(gpu) or failed
            out[key(S.GPU_XID_ERRORS)] = float(gpu.xid_count)
            out[key(S.GPU_LAST_XID)] = float(gpu.last_xid)
        if failed:
            errors.append("gpu_health_error")

    def _health(self, gpu: GpuState, name: str, call: str, *args: Any) -> Any:
        """``pynvml.<call>(handle, *args)``; None where the GPU does not support it (recorded, never
        asked again), ``_FAILED`` on another error. A lost GPU propagates."""
        if name in gpu.unsupported:
            return None
        nv = self._nv
        try:
            return getattr(nv, call)(gpu.handle, *args)
        except AttributeError:  # an nvidia-ml-py without the call
            gpu.unsupported.add(name)
            return None
        except nv.NVMLError as exc:
            code = self._error_value(exc)
            if code in (nv.NVML_ERROR_NOT_SUPPORTED, nv.NVML_ERROR_FUNCTION_NOT_FOUND):
                gpu.unsupported.add(name)
                return None
            if code == nv.NVML_ERROR_GPU_IS_LOST:
                raise
            gpu.health_error = f"{call}: {exc}"
            return _FAILED

    def _drain_xid(self, gpu: GpuState) -> bool:
        """Count the XID events waiting in the GPU's event set, without waiting; False on an error."""
        nv = self._nv
        for _ in range(MAX_XID_EVENTS_PER_CYCLE):
            try:
                data = nv.nvmlEventSetWait(gpu.xid_events, 0)
            except nv.NVMLError as exc:
                code = self._error_value(exc)
                if code == nv.NVML_ERROR_TIMEOUT:
                    return True  # no more events
                if code == nv.NVML_ERROR_GPU_IS_LOST:
                    raise
                gpu.health_error = f"nvmlEventSetWait: {exc}"
                return False
            if data.eventType & nv.nvmlEventTypeXidCriticalError:
                gpu.xid_count += 1
                gpu.last_xid = int(data.eventData)
        return True

    def _optional(self, fn: Callable, *args):
        """``fn(*args)``, or None where the GPU does not support it (other errors propagate)."""
        nv = self._nv
        try:
            return fn(*args)
        except nv.NVMLError as exc:
            if self._error_value(exc) in (nv.NVML_ERROR_NOT_SUPPORTED, nv.NVML_ERROR_FUNCTION_NOT_FOUND):
                return None
            raise

    def _memory_info(self, gpu: GpuState):
        nv = self._nv
        version = getattr(nv, "nvmlMemory_v2", None)
        if version is not None:
            try:
                return nv.nvmlDeviceGetMemoryInfo(gpu.handle, version=version)
            except nv.NVMLError as exc:
                # an older driver refuses the v2 structure: ask with v1
                if self._error_value(exc) not in (
                    nv.NVML_ERROR_NOT_SUPPORTED,
                    nv.NVML_ERROR_FUNCTION_NOT_FOUND,
                    nv.NVML_ERROR_INVALID_ARGUMENT,
                    getattr(nv, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH", None),
                ):
                    raise
        return nv.nvmlDeviceGetMemoryInfo(gpu.handle)

    def _gpm_values(self, gpu: GpuState) -> dict[str, float] | None:
        """This cycle's GPM values, or None when GPM turned out unusable (then: the fallback)."""
        nv = self._nv
        now = self._clock()
        if gpu.gpm_prev is not None and now - gpu.gpm_prev_time < GPM_MIN_INTERVAL:
            return gpu.gpm_values  # sampled too recently for a meaningful difference
        current = 1 - gpu.gpm_prev if gpu.gpm_prev is not None else 0
        try:
            nv.nvmlGpmSampleGet(gpu.handle, gpu.gpm_samples[current])
            values: dict[str, float] = {}
            if gpu.gpm_prev is not None:
                request = nv.c_nvmlGpmMetricsGet_t()
                request.version = nv.NVML_GPM_METRICS_GET_VERSION
                request.numMetrics = len(GPM_METRICS)
                request.sample1 = gpu.gpm_samples[gpu.gpm_prev]
                request.sample2 = gpu.gpm_samples[current]
                for i, (metric_id, _, _, _) in enumerate(GPM_METRICS):
                    request.metrics[i].metricId = metric_id
                nv.nvmlGpmMetricsGet(request)
                for i, (_, signal, scale, _) in enumerate(GPM_METRICS):
                    metric = request.metrics[i]
                    if metric.nvmlReturn == nv.NVML_SUCCESS:
                        values[signal] = float(metric.value) * scale
        except nv.NVMLError as exc:
            if self._error_value(exc) not in (nv.NVML_ERROR_NOT_SUPPORTED, nv.NVML_ERROR_FUNCTION_NOT_FOUND):
                raise
            self._free_gpm(gpu)  # GPM refused on this GPU (vGPU, MIG, ...): use the fallback from now on
            gpu.gpm = False
            return None
        gpu.gpm_prev, gpu.gpm_prev_time, gpu.gpm_values = current, now, values
        return values


_FAILED = object()  # a health reading that failed this cycle (not: unsupported)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@register(
    "nvml",
    "per-GPU bandwidth, SM activity, PCIe, memory and health (clocks, power, errors) through NVML (GPM on Hopper+)",
    True,
)
def nvml_collector(settings) -> NvmlCollector:
    """Factory: ``--gpu-filter``, ``--gpu-peak-bandwidth``, ``--pod``. NVML itself starts on first collect."""
    gpu_filter = None
    spec = getattr(settings, "gpu_filter", None)
    if spec:
        gpu_filter = make_gpu_filter(spec)
    pod = getattr(settings, "pod", None)
    return NvmlCollector(
        gpu_filter=gpu_filter,
        peak_bandwidth_override=getattr(settings, "gpu_peak_bandwidth", None),
        extra_labels={"pod": pod} if pod else None,
    )


# ---------------------------------------------------------------------- the GPU machine check


def check(pynvml_module: Any = None, pause: float = 0.5, out=None) -> int:
    """Read every GPU twice through the real NVML path and print what was read; 0 if all read."""
    out = out or sys.stdout
    collector = NvmlCollector(pynvml_module)
    try:
        collector.collect()
        time.sleep(pause)  # GPM needs two samples
        cpu, wall = time.process_time(), time.perf_counter()
        collected = collector.collect()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    except NotApplicable as exc:
        print(f"gpu check: NVML is not available here: {exc}", file=sys.stderr)
        return 1
    except SourceError as exc:
        print(f"gpu check: NVML failed ({exc.reason}): {exc}", file=sys.stderr)
        return 1
    try:
        for gpu in collector.gpus:
            print(f"GPU {gpu.index}: {gpu.name} {gpu.uuid}", file=out)
            method = S.METHOD_GPM if gpu.gpm else S.METHOD_NVML_UTIL
            print(f"  GPM supported: {'yes' if gpu.gpm else 'no'} (method={method})", file=out)
            if gpu.lost or gpu.last_error:
                print(f"  ERROR: {gpu.last_error or 'lost'}", file=out)
                continue
            for (name, labels), value in sorted(collected.samples.items()):
                if dict(labels).get("gpu") == str(gpu.index):
                    more = ",".join(f"{k}={v}" for k, v in labels if k not in _IDENTITY_LABELS)
                    print(f"  {name}{f' [{more}]' if more else ''} = {value:.6g}", file=out)
            print(f"  not supported here: {', '.join(sorted(gpu.unsupported)) or 'none'}", file=out)
            if gpu.health_error:
                print(f"  health reading failed: {gpu.health_error}", file=out)
            _print_peak(collector, gpu, out)
        print(
            f"one collection of {len(collector.gpus)} GPU(s): {cpu * 1e3:.2f} ms CPU, {wall * 1e3:.2f} ms wall "
            f"({cpu * 100:.3f} % of a core at 1 Hz)",
            file=out,
        )
        if collected.partial_errors:
            print(f"partial errors: {', '.join(collected.partial_errors)}", file=out)
    finally:
        collector.close()
    return 1 if collected.partial_errors else 0


_IDENTITY_LABELS = frozenset(("gpu", "uuid", "model", "pod"))


def _print_peak(collector: NvmlCollector, gpu: GpuState, out) -> None:
    """NVML's bus width, max memory clock and the peak they give, next to the catalogue's row."""
    width, mhz = collector._bus_and_clock(gpu)
    if width and mhz:
        print(
            f"  NVML: memory bus {width} bit x max memory clock {mhz} MHz x {DATA_RATE} / 8 = "
            f"{peak_bandwidth(width, mhz) / 1e9:,.0f} GB/s",
            file=out,
        )
    else:
        print("  NVML: memory bus width / max memory clock not available", file=out)
    row = lookup_gpu(gpu.name)
    if row is None:
        print(f"  catalogue: no row for {gpu.name!r} (the NVML figure above is used)", file=out)
    else:
        published = (
            f"bus {row.bus_width_bits} bit x {row.max_memory_clock_mhz} MHz, "
            if row.bus_width_bits and row.max_memory_clock_mhz
            else "bus width and clock not published, "
        )
        print(f"  catalogue ({row.label}): {published}datasheet peak {row.peak_bandwidth / 1e9:,.0f} GB/s", file=out)
        if width and mhz:
            ratio = peak_bandwidth(width, mhz) / row.peak_bandwidth
            print(f"  NVML's peak / the datasheet's = {ratio:.3f}", file=out)
    used = f"{gpu.peak_bandwidth / 1e9:,.0f} GB/s ({gpu.peak_source})" if gpu.peak_bandwidth else "unknown"
    print(f"  peak bandwidth used: {used}", file=out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/gpu_check.sh", description="Read the GPUs through NVML once and print what was read."
    )
    parser.add_argument("--check", action="store_true", required=True, help="run the check (the only mode)")
    parser.add_argument("--pause", type=float, default=0.5, help="seconds between the two readings (GPM)")
    args = parser.parse_args(argv)
    return check(pause=args.pause)


if __name__ == "__main__":
    sys.exit(main())
