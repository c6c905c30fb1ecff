"""The NVML collector at the pynvml call boundary.

``FakeNvml`` stands in for the ``pynvml`` module: the functions the collector calls, over a list of
fake GPUs. Its constants and its exception classes are nvidia-ml-py's own (taken from the real
``pynvml`` module, which imports without a driver), so an error raised here is exactly what the
real binding raises: ``pynvml.NVMLError(NVML_ERROR_GPU_IS_LOST)`` is an ``NVMLError_GpuIsLost``.
The real path runs on a GPU machine through scripts/gpu_check.sh.
"""

from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pynvml
import pytest

from kvdoctor.exporter.collectors.nvml import NvmlCollector, check, nvml_collector, peak_bandwidth
from kvdoctor.exporter.settings import ExporterSettings
from kvdoctor.ledger.gpus import lookup_gpu
from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.collection import NotApplicable, SourceError
from kvdoctor.signals.units import MIB


@dataclass
class FakeGpu:
    name: str
    uuid: str
    bus_width: int
    mem_clock: int
    total: int = 80 * 1024 * MIB
    used: int = 60 * 1024 * MIB
    gpm: bool = True
    gpm_values: dict = field(default_factory=lambda: {10: 55.0, 2: 30.0, 20: 100.0, 21: 2000.0})
    util: tuple = (95, 80)  # (gpu %, memory %)
    pcie_kb: tuple = (1000, 250000)  # (tx, rx) KB/s
    errors: dict = field(default_factory=dict)  # function name -> NVML error code it raises
    lost: bool = False
    gpm_samples_taken: int = 0
    # health
    temperature: int = 47  # degrees C
    power_mw: tuple = (412_000, 700_000)  # (draw, enforced limit) in mW
    sm_clock: tuple = (1980, 1980)  # (current, max) MHz
    mem_clock_now: int | None = None  # current memory clock MHz (None: mem_clock, the maximum)
    throttle_mask: int = 0
    pcie_link: tuple = (5, 16, 5, 16)  # (generation, width, max generation, max width)
    pcie_replays: int = 0
    ecc: dict = field(default_factory=lambda: {(0, 0): 3, (1, 0): 0, (0, 1): 12, (1, 1): 1})  # (error, scope)
    remapped_rows: tuple = (2, 0, 0, 0)  # (corrected, uncorrected, pending, failure)
    xids: list = field(default_factory=list)  # XID events waiting to be read


@dataclass
class FakeEventSet:
    handle: int = -1
    types: int = 0
    freed: bool = False


@dataclass
class FakeSample:
    device: int = -1
    seq: int = -1
    freed: bool = False


class FakeMetricsGet:
    """Stands in for pynvml.c_nvmlGpmMetricsGet_t (whose sample fields need real GPM handles)."""

    def __init__(self):
        self.version = 0
        self.numMetrics = 0
        self.sample1 = self.sample2 = None
        self.metrics = [SimpleNamespace(metricId=0, nvmlReturn=-1, value=0.0) for _ in range(8)]


class FakeNvml:
    def __init__(self, gpus: list[FakeGpu], init_error: int | None = None):
        for name in dir(pynvml):  # nvidia-ml-py's own constants and exception classes
            if name.startswith(("NVML_", "NVMLError", "nvmlEventType")) or name == "nvmlMemory_v2":
                setattr(self, name, getattr(pynvml, name))
        self.c_nvmlGpmMetricsGet_t = FakeMetricsGet
        self.gpus = gpus
        self.init_error = init_error
        self.inits = self.shutdowns = 0
        self.calls: list[str] = []
        self.samples: list[FakeSample] = []
        self.event_sets: list[FakeEventSet] = []

    def _gpu(self, handle: int, fn: str) -> FakeGpu:
        self.calls.append(fn)
        gpu = self.gpus[handle]
        if gpu.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        if fn in gpu.errors:
            raise pynvml.NVMLError(gpu.errors[fn])
        return gpu

    def nvmlInit(self):
        self.calls.append("nvmlInit")
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.inits += 1

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        self._gpu(index, "nvmlDeviceGetHandleByIndex")
        return index

    def nvmlDeviceGetUUID(self, handle):
        return self._gpu(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, handle):
        return self._gpu(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        gpu = self._gpu(handle, "nvmlDeviceGetMemoryInfo" if version is None else "nvmlDeviceGetMemoryInfo_v2")
        if version is not None:
            assert version == pynvml.nvmlMemory_v2
        return SimpleNamespace(total=gpu.total, used=gpu.used, free=gpu.total - gpu.used, reserved=0)

    def nvmlDeviceGetMemoryBusWidth(self, handle):
        return self._gpu(handle, "nvmlDeviceGetMemoryBusWidth").bus_width

    def nvmlDeviceGetMaxClockInfo(self, handle, clock_type):
        gpu = self._gpu(handle, "nvmlDeviceGetMaxClockInfo")
        return {pynvml.NVML_CLOCK_MEM: gpu.mem_clock, pynvml.NVML_CLOCK_SM: gpu.sm_clock[1]}[clock_type]

    def nvmlDeviceGetClockInfo(self, handle, clock_type):
        gpu = self._gpu(handle, "nvmlDeviceGetClockInfo")
        memory = gpu.mem_clock if gpu.mem_clock_now is None else gpu.mem_clock_now
        return {pynvml.NVML_CLOCK_MEM: memory, pynvml.NVML_CLOCK_SM: gpu.sm_clock[0]}[clock_type]

    def nvmlDeviceGetTemperature(self, handle, sensor):
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._gpu(handle, "nvmlDeviceGetTemperature").temperature

    def nvmlDeviceGetPowerUsage(self, handle):
        return self._gpu(handle, "nvmlDeviceGetPowerUsage").power_mw[0]

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        return self._gpu(handle, "nvmlDeviceGetEnforcedPowerLimit").power_mw[1]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return self._gpu(handle, "nvmlDeviceGetCurrentClocksEventReasons").throttle_mask

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle):
        return self._gpu(handle, "nvmlDeviceGetCurrentClocksThrottleReasons").throttle_mask

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle):
        return self._gpu(handle, "nvmlDeviceGetCurrPcieLinkGeneration").pcie_link[0]

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle):
        return self._gpu(handle, "nvmlDeviceGetCurrPcieLinkWidth").pcie_link[1]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle):
        return self._gpu(handle, "nvmlDeviceGetMaxPcieLinkGeneration").pcie_link[2]

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle):
        return self._gpu(handle, "nvmlDeviceGetMaxPcieLinkWidth").pcie_link[3]

    def nvmlDeviceGetPcieReplayCounter(self, handle):
        return self._gpu(handle, "nvmlDeviceGetPcieReplayCounter").pcie_replays

    def nvmlDeviceGetTotalEccErrors(self, handle, error_type, counter_type):
        return self._gpu(handle, "nvmlDeviceGetTotalEccErrors").ecc[(error_type, counter_type)]

    def nvmlDeviceGetRemappedRows(self, handle):
        return self._gpu(handle, "nvmlDeviceGetRemappedRows").remapped_rows

    def nvmlEventSetCreate(self):
        self.calls.append("nvmlEventSetCreate")
        events = FakeEventSet()
        self.event_sets.append(events)
        return events

    def nvmlEventSetFree(self, events):
        events.freed = True

    def nvmlDeviceRegisterEvents(self, handle, event_types, events):
        self._gpu(handle, "nvmlDeviceRegisterEvents")
        assert event_types == pynvml.nvmlEventTypeXidCriticalError and events.handle == -1
        events.handle, events.types = handle, event_types

    def nvmlEventSetWait(self, events, timeout_ms):
        assert timeout_ms == 0, "the collector must never wait for an event"
        assert not events.freed
        gpu = self._gpu(events.handle, "nvmlEventSetWait")
        if not gpu.xids:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        return SimpleNamespace(eventType=events.types, eventData=gpu.xids.pop(0), device=events.handle)

    def nvmlGpmQueryDeviceSupport(self, handle):
        return SimpleNamespace(version=1, isSupportedDevice=int(self._gpu(handle, "nvmlGpmQueryDeviceSupport").gpm))

    def nvmlGpmSampleAlloc(self):
        sample = FakeSample()
        self.samples.append(sample)
        return sample

    def nvmlGpmSampleFree(self, sample):
        sample.freed = True

    def nvmlGpmSampleGet(self, handle, sample):
        gpu = self._gpu(handle, "nvmlGpmSampleGet")
        assert not sample.freed
        gpu.gpm_samples_taken += 1
        sample.device, sample.seq = handle, gpu.gpm_samples_taken
        return sample

    def nvmlGpmMetricsGet(self, request):
        assert request.version == pynvml.NVML_GPM_METRICS_GET_VERSION
        one, two = request.sample1, request.sample2
        gpu = self._gpu(two.device, "nvmlGpmMetricsGet")
        # The collector must compare this GPU's previous sample with its newest one.
        assert one.device == two.device and two.seq == one.seq + 1 == gpu.gpm_samples_taken
        for metric in request.metrics[: request.numMetrics]:
            metric.value = gpu.gpm_values[metric.metricId]
            metric.nvmlReturn = pynvml.NVML_SUCCESS
        return request

    def nvmlDeviceGetUtilizationRates(self, handle):
        gpu = self._gpu(handle, "nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=gpu.util[0], memory=gpu.util[1])

    def nvmlDeviceGetPcieThroughput(self, handle, counter):
        gpu = self._gpu(handle, "nvmlDeviceGetPcieThroughput")
        return gpu.pcie_kb[0] if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else gpu.pcie_kb[1]


def h100(uuid="GPU-h100-0", **kw) -> FakeGpu:
    return FakeGpu("NVIDIA H100 80GB HBM3", uuid, 5120, 2619, **kw)


def a100(uuid="GPU-a100-0", **kw) -> FakeGpu:
    return FakeGpu("NVIDIA A100-SXM4-80GB", uuid, 5120, 1593, gpm=False, **kw)


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def collector_for(nv: FakeNvml, **kw) -> tuple[NvmlCollector, Clock]:
    clock = Clock()
    return NvmlCollector(nv, clock=clock, **kw), clock


IDENTITY = ("gpu", "uuid", "model", "pod", "method")


def by_gpu(samples: dict, index: int) -> dict:
    """name (+ [method]) (+ {other=labels}) -> value for one GPU."""
    out = {}
    for (name, labels), v in samples.items():
        d = dict(labels)
        if d["gpu"] == str(index):
            more = ",".join(f"{k}={v}" for k, v in sorted(d.items()) if k not in IDENTITY)
            out[name + (f"[{d['method']}]" if "method" in d else "") + (f"{{{more}}}" if more else "")] = v
    return out


HEALTH_SIGNALS = frozenset(S.GPU_HEALTH_SIGNALS)


def without_health(got: dict) -> dict:
    return {k: v for k, v in got.items() if k.split("[")[0].split("{")[0] not in HEALTH_SIGNALS}


def health_of(got: dict) -> dict:
    return {k: v for k, v in got.items() if k.split("[")[0].split("{")[0] in HEALTH_SIGNALS}


def test_gpm_path_on_hopper():
    nv = FakeNvml([h100()])
    collector, clock = collector_for(nv)
    assert nv.inits == 0  # lazy: nothing touches NVML before the first collection
    first = without_health(by_gpu(collector.collect().samples, 0))
    assert first == {
        S.GPU_MEMORY_USED: 60 * 1024 * MIB,
        S.GPU_MEMORY_TOTAL: 80 * 1024 * MIB,
        S.GPU_DRAM_PEAK_BANDWIDTH: 3350e9,  # the catalogue's datasheet figure for the exact NVML name
    }
    clock.now += 1.0
    second = collector.collect()
    got = by_gpu(second.samples, 0)
    assert got[f"{S.GPU_DRAM_BANDWIDTH_UTILIZATION}[gpm]"] == pytest.approx(0.55)
    assert got[f"{S.GPU_SM_ACTIVE}[gpm]"] == pytest.approx(0.30)
    assert got[S.GPU_PCIE_TX] == 100.0 * MIB and got[S.GPU_PCIE_RX] == 2000.0 * MIB
    assert "nvmlDeviceGetUtilizationRates" not in nv.calls
    assert second.partial_errors == []
    labels = dict(next(iter(second.samples))[1])
    assert {k: labels[k] for k in ("gpu", "uuid", "model")} == {
        "gpu": "0",
        "uuid": "GPU-h100-0",
        "model": "NVIDIA H100 80GB HBM3",
    }
    clock.now += 1.0
    collector.collect()  # a third reading pairs samples 2 and 3 (the fake checks it)


def test_fallback_path_before_hopper():
    nv = FakeNvml([a100()])
    collector, _ = collector_for(nv)
    got = without_health(by_gpu(collector.collect().samples, 0))
    assert got == {
        S.GPU_MEMORY_USED: 60 * 1024 * MIB,
        S.GPU_MEMORY_TOTAL: 80 * 1024 * MIB,
        S.GPU_DRAM_PEAK_BANDWIDTH: 2039e9,
        f"{S.GPU_DRAM_BANDWIDTH_UTILIZATION}[nvml_util]": 0.80,
        f"{S.GPU_SM_ACTIVE}[nvml_util]": 0.95,
        S.GPU_PCIE_TX: 1000 * 1024.0,
        S.GPU_PCIE_RX: 250000 * 1024.0,
    }
    assert "nvmlGpmSampleGet" not in nv.calls


@pytest.mark.parametrize(
    ("gpu", "catalogue"),
    [
        (h100(), "H100"),
        (a100(), "A100-80GB"),
        (FakeGpu("NVIDIA L40S", "u", 384, 9001), "L40S"),
        (FakeGpu("NVIDIA L4", "u", 192, 6251), "L4"),
    ],
)
def test_peak_bandwidth_formula_matches_the_catalogue(gpu, catalogue):
    """bus width x max memory clock x 2 (double data rate) / 8 reproduces the data sheets."""
    assert peak_bandwidth(gpu.bus_width, gpu.mem_clock) == pytest.approx(
        lookup_gpu(catalogue).peak_bandwidth, rel=0.002
    )


def test_peak_bandwidth_override_wins_then_the_catalogue_then_the_device():
    nv = FakeNvml([h100(), a100(uuid="GPU-a", errors={"nvmlDeviceGetMemoryBusWidth": pynvml.NVML_ERROR_NOT_SUPPORTED})])
    collector, _ = collector_for(nv, peak_bandwidth_override=1.5e12)
    out = collector.collect().samples
    assert by_gpu(out, 0)[S.GPU_DRAM_PEAK_BANDWIDTH] == by_gpu(out, 1)[S.GPU_DRAM_PEAK_BANDWIDTH] == 1.5e12
    # a GPU the catalogue knows: its datasheet figure, whatever NVML reports
    nv = FakeNvml([a100(errors={"nvmlDeviceGetMemoryBusWidth": pynvml.NVML_ERROR_NOT_SUPPORTED}), h100(uuid="GPU-h")])
    collector, _ = collector_for(nv)
    out = collector.collect().samples
    assert by_gpu(out, 0)[S.GPU_DRAM_PEAK_BANDWIDTH] == lookup_gpu("NVIDIA A100-SXM4-80GB").peak_bandwidth == 2039e9
    assert by_gpu(out, 1)[S.GPU_DRAM_PEAK_BANDWIDTH] == 3350e9
    assert [g.peak_source for g in collector.gpus] == ["catalogue", "catalogue"]


def test_a_gpu_the_catalogue_lacks_gets_its_peak_from_bus_width_and_clock():
    unknown = FakeGpu("NVIDIA H900", "GPU-x", 5120, 2619, gpm=False)
    nv = FakeNvml([unknown])
    collector, _ = collector_for(nv)
    out = collector.collect().samples
    assert by_gpu(out, 0)[S.GPU_DRAM_PEAK_BANDWIDTH] == 5120 * 2619e6 * 2 / 8
    assert collector.gpus[0].peak_source == "nvml"
    assert "nvmlDeviceGetMaxClockInfo" in nv.calls  # the fake checks it asked for NVML_CLOCK_MEM
    # neither catalogue nor NVML: no peak series at all, never a guess
    mute = FakeGpu(
        "NVIDIA H900",
        "GPU-y",
        5120,
        2619,
        gpm=False,
        errors={"nvmlDeviceGetMaxClockInfo": pynvml.NVML_ERROR_NOT_SUPPORTED},
    )
    collector, _ = collector_for(FakeNvml([mute]))
    assert S.GPU_DRAM_PEAK_BANDWIDTH not in by_gpu(collector.collect().samples, 0)


def test_one_gpu_failing_does_not_stop_the_others():
    nv = FakeNvml(
        [
            h100(uuid="GPU-0"),
            a100(uuid="GPU-1", errors={"nvmlDeviceGetMemoryInfo_v2": pynvml.NVML_ERROR_UNKNOWN}),
            a100(uuid="GPU-2"),
        ]
    )
    collector, _ = collector_for(nv)
    collected = collector.collect()
    assert by_gpu(collected.samples, 0) and by_gpu(collected.samples, 2)
    assert by_gpu(collected.samples, 1) == {}
    assert collected.partial_errors == ["gpu_error"]
    nv.gpus[1].errors.clear()  # the fault goes away: the GPU reports again, no re-initialisation
    collected = collector.collect()
    assert by_gpu(collected.samples, 1) and collected.partial_errors == [] and nv.inits == 1


def test_a_lost_gpu_is_reinitialised_with_backoff_while_the_others_report():
    nv = FakeNvml([a100(uuid="GPU-0"), a100(uuid="GPU-1")])
    collector, clock = collector_for(nv)
    collector.collect()
    nv.gpus[1].lost = True
    start = clock.now

    def cycle(at: float):
        clock.now = start + at
        collected = collector.collect()
        assert by_gpu(collected.samples, 0), "the healthy GPU keeps reporting"
        return collected

    assert cycle(0.0).partial_errors == ["gpu_lost"] and nv.inits == 1
    assert by_gpu(cycle(0.5).samples, 1) == {} and nv.inits == 1  # lost GPUs are not queried...
    assert cycle(1.0).partial_errors == ["gpu_lost"] and (nv.inits, nv.shutdowns) == (2, 1)  # ...until 1 s: re-init
    assert cycle(2.9).partial_errors == ["gpu_lost"] and nv.inits == 2  # still lost: next try after 2 s more
    nv.gpus[1].lost = False
    recovered = cycle(3.0)
    assert nv.inits == 3 and recovered.partial_errors == [] and by_gpu(recovered.samples, 1)
    nv.gpus[1].lost = True  # lost again later: the backoff starts over at 1 s
    cycle(10.0)
    cycle(10.9)
    assert nv.inits == 3
    cycle(11.0)
    assert nv.inits == 4


def test_all_gpus_failing_is_a_source_error():
    nv = FakeNvml([a100(errors={"nvmlDeviceGetMemoryInfo_v2": pynvml.NVML_ERROR_UNKNOWN})])
    collector, _ = collector_for(nv)
    with pytest.raises(SourceError) as caught:
        collector.collect()
    assert caught.value.reason == "gpu_error"


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED])
def test_no_driver_is_not_applicable(code):
    collector, _ = collector_for(FakeNvml([h100()], init_error=code))
    with pytest.raises(NotApplicable):
        collector.collect()


def test_no_gpu_is_not_applicable_and_other_init_errors_are_errors():
    collector, _ = collector_for(FakeNvml([]))
    with pytest.raises(NotApplicable):
        collector.collect()
    collector, _ = collector_for(FakeNvml([h100()], init_error=pynvml.NVML_ERROR_NO_PERMISSION))
    with pytest.raises(SourceError) as caught:
        collector.collect()
    assert caught.value.reason == "nvml_init_failed"


def test_gpu_filter_is_applied_every_cycle():
    nv = FakeNvml([h100(uuid="GPU-0"), a100(uuid="GPU-1")])
    seen = []
    chosen = {"GPU-1"}

    def only(gpus):
        seen.append(list(gpus))
        return [g for g in gpus if g[1] in chosen]

    collector, _ = collector_for(nv, gpu_filter=only)
    out = collector.collect().samples
    assert seen[0] == [(0, "GPU-0", "NVIDIA H100 80GB HBM3"), (1, "GPU-1", "NVIDIA A100-SXM4-80GB")]
    assert {dict(lab)["gpu"] for _, lab in out} == {"1"}
    chosen.clear()
    with pytest.raises(NotApplicable):
        collector.collect()
    assert len(seen) == 2


def test_gpu_filter_errors_become_source_errors():
    def broken(gpus):
        raise ValueError("CUDA_VISIBLE_DEVICES names no GPU")

    collector, _ = collector_for(FakeNvml([h100()]), gpu_filter=broken)
    with pytest.raises(SourceError) as caught:
        collector.collect()
    assert caught.value.reason == "gpu_filter_error"

    def pending(gpus):
        raise SourceError("gpu_filter_pending", "no list yet")

    collector, _ = collector_for(FakeNvml([h100()]), gpu_filter=pending)
    with pytest.raises(SourceError) as caught:
        collector.collect()
    assert caught.value.reason == "gpu_filter_pending"


def test_memory_info_v1_when_v2_is_refused():
    nv = FakeNvml([a100(errors={"nvmlDeviceGetMemoryInfo_v2": pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH})])
    collector, _ = collector_for(nv)
    assert by_gpu(collector.collect().samples, 0)[S.GPU_MEMORY_USED] == 60 * 1024 * MIB
    assert "nvmlDeviceGetMemoryInfo" in nv.calls


def test_gpm_refused_at_run_time_falls_back():
    nv = FakeNvml([h100(errors={"nvmlGpmSampleGet": pynvml.NVML_ERROR_NOT_SUPPORTED})])
    collector, _ = collector_for(nv)
    got = by_gpu(collector.collect().samples, 0)
    assert got[f"{S.GPU_DRAM_BANDWIDTH_UTILIZATION}[nvml_util]"] == 0.80
    assert all(s.freed for s in nv.samples) and len(nv.samples) == 2


def test_close_frees_gpm_samples_and_shuts_nvml_down():
    nv = FakeNvml([h100()])
    collector, _ = collector_for(nv)
    collector.collect()
    collector.close()
    assert nv.shutdowns == 1 and all(s.freed for s in nv.samples)


def test_check_prints_each_gpu(capsys):
    nv = FakeNvml([h100(), a100(uuid="GPU-a")])
    assert check(nv, pause=0.15) == 0
    text = capsys.readouterr().out
    assert "GPU 0: NVIDIA H100 80GB HBM3 GPU-h100-0" in text and "GPM supported: yes" in text
    assert "GPM supported: no (method=nvml_util)" in text
    assert "NVML: memory bus 5120 bit x max memory clock 2619 MHz x 2 / 8 = 3,352 GB/s" in text
    assert "catalogue (H100 SXM 80GB): bus 5120 bit x 2619 MHz, datasheet peak 3,350 GB/s" in text
    assert "NVML's peak / the datasheet's = 1.001" in text and "peak bandwidth used: 3,350 GB/s (catalogue)" in text


def test_check_prints_the_nvml_figure_for_a_gpu_the_catalogue_lacks(capsys):
    nv = FakeNvml([FakeGpu("NVIDIA RTX PRO 6000 Blackwell Server Edition", "u", 512, 14001, gpm=False)])
    assert check(nv, pause=0.15) == 0
    text = capsys.readouterr().out
    assert "NVML: memory bus 512 bit x max memory clock 14001 MHz x 2 / 8 = 1,792 GB/s" in text
    assert "catalogue: no row for 'NVIDIA RTX PRO 6000 Blackwell Server Edition'" in text
    assert "peak bandwidth used: 1,792 GB/s (nvml)" in text


def test_check_without_nvml_says_so_in_one_line(capsys):
    assert check(FakeNvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "NVML is not available" in err


@pytest.mark.skipif(
    bool(ctypes.util.find_library("nvidia-ml")), reason="this machine has NVML; scripts/gpu_check.sh covers it"
)
def test_real_pynvml_without_a_driver_is_not_applicable():
    collector = nvml_collector(ExporterSettings(gpu_filter="all", gpu_peak_bandwidth=2e12, nvml=True))
    with pytest.raises(NotApplicable):
        collector.collect()


# ---------------------------------------------------------------------------------- GPU health

THROTTLE_REASONS = [reason for _, reason in S.CLOCK_THROTTLE_REASONS]


def test_health_readings_in_canonical_units_with_their_labels():
    nv = FakeNvml([h100(mem_clock_now=1593, pcie_replays=4)])
    collector, _ = collector_for(nv)
    collected = collector.collect()
    got = health_of(by_gpu(collected.samples, 0))
    expected = {
        S.GPU_TEMPERATURE: 47.0,
        S.GPU_POWER_DRAW: 412.0,
        S.GPU_POWER_LIMIT: 700.0,
        S.GPU_CLOCK + "{clock=sm}": 1980e6,
        S.GPU_CLOCK + "{clock=memory}": 1593e6,
        S.GPU_MAX_CLOCK + "{clock=sm}": 1980e6,
        S.GPU_MAX_CLOCK + "{clock=memory}": 2619e6,
        S.GPU_PCIE_LINK_GENERATION: 5.0,
        S.GPU_PCIE_LINK_WIDTH: 16.0,
        S.GPU_PCIE_LINK_MAX_GENERATION: 5.0,
        S.GPU_PCIE_LINK_MAX_WIDTH: 16.0,
        S.GPU_PCIE_REPLAYS: 4.0,
        S.GPU_ECC_ERRORS + "{error=corrected,scope=volatile}": 3.0,
        S.GPU_ECC_ERRORS + "{error=uncorrected,scope=volatile}": 0.0,
        S.GPU_ECC_ERRORS + "{error=corrected,scope=aggregate}": 12.0,
        S.GPU_ECC_ERRORS + "{error=uncorrected,scope=aggregate}": 1.0,
        S.GPU_REMAPPED_ROWS + "{error=corrected}": 2.0,
        S.GPU_REMAPPED_ROWS + "{error=uncorrected}": 0.0,
        S.GPU_ROW_REMAP_PENDING: 0.0,
        S.GPU_ROW_REMAP_FAILURE: 0.0,
        S.GPU_XID_ERRORS: 0.0,
        S.GPU_LAST_XID: 0.0,
        **{S.GPU_CLOCK_THROTTLE_REASON + f"{{reason={r}}}": 0.0 for r in THROTTLE_REASONS},
    }
    assert got == expected
    assert collected.partial_errors == []
    # every health sample carries the GPU's identity and only the labels its signal declares
    for (name, labels), _ in collected.samples.items():
        assert set(dict(labels)) == set(S.SIGNALS[name].labels), name


def test_throttle_reasons_are_a_state_set_one_series_per_reason():
    nv = FakeNvml([a100(throttle_mask=0x4 | 0x40)])  # SW power cap and HW thermal slowdown
    collector, _ = collector_for(nv)
    got = by_gpu(collector.collect().samples, 0)
    states = {r: got[S.GPU_CLOCK_THROTTLE_REASON + f"{{reason={r}}}"] for r in THROTTLE_REASONS}
    assert {r for r, v in states.items() if v == 1.0} == {"sw_power_cap", "hw_thermal_slowdown"}
    assert set(states.values()) == {0.0, 1.0} and len(states) == 9
    nv.gpus[0].throttle_mask = 0x1  # idle now
    got = by_gpu(collector.collect().samples, 0)
    assert [r for r in THROTTLE_REASONS if got[S.GPU_CLOCK_THROTTLE_REASON + f"{{reason={r}}}"]] == ["gpu_idle"]


def test_a_driver_before_clocks_event_reasons_is_read_through_the_throttle_call():
    nv = FakeNvml(
        [
            a100(
                throttle_mask=0x20,
                errors={"nvmlDeviceGetCurrentClocksEventReasons": pynvml.NVML_ERROR_FUNCTION_NOT_FOUND},
            )
        ]
    )
    collector, _ = collector_for(nv)
    for _ in range(3):
        got = by_gpu(collector.collect().samples, 0)
        assert got[S.GPU_CLOCK_THROTTLE_REASON + "{reason=sw_thermal_slowdown}"] == 1.0
    assert nv.calls.count("nvmlDeviceGetCurrentClocksEventReasons") == 1
    assert nv.calls.count("nvmlDeviceGetCurrentClocksThrottleReasons") == 3


ECC_SERIES = {
    S.GPU_ECC_ERRORS + f"{{error={e},scope={s}}}"
    for e in ("corrected", "uncorrected")
    for s in ("volatile", "aggregate")
}
REMAP_SERIES = {S.GPU_REMAPPED_ROWS + "{error=corrected}", S.GPU_REMAPPED_ROWS + "{error=uncorrected}"} | {
    S.GPU_ROW_REMAP_PENDING,
    S.GPU_ROW_REMAP_FAILURE,
}


@pytest.mark.parametrize(
    ("call", "absent", "per_cycle"),  # per_cycle: calls a GPU that supports it gets each cycle
    [
        ("nvmlDeviceGetTemperature", {S.GPU_TEMPERATURE}, 1),
        ("nvmlDeviceGetPowerUsage", {S.GPU_POWER_DRAW}, 1),
        ("nvmlDeviceGetEnforcedPowerLimit", {S.GPU_POWER_LIMIT}, 1),
        ("nvmlDeviceGetClockInfo", {S.GPU_CLOCK + "{clock=sm}", S.GPU_CLOCK + "{clock=memory}"}, 2),
        ("nvmlDeviceGetCurrPcieLinkGeneration", {S.GPU_PCIE_LINK_GENERATION}, 1),
        ("nvmlDeviceGetCurrPcieLinkWidth", {S.GPU_PCIE_LINK_WIDTH}, 1),
        ("nvmlDeviceGetMaxPcieLinkGeneration", {S.GPU_PCIE_LINK_MAX_GENERATION}, 0),
        ("nvmlDeviceGetMaxPcieLinkWidth", {S.GPU_PCIE_LINK_MAX_WIDTH}, 0),
        ("nvmlDeviceGetPcieReplayCounter", {S.GPU_PCIE_REPLAYS}, 1),
        ("nvmlDeviceGetTotalEccErrors", ECC_SERIES, 4),  # ECC off, or a GeForce: all four counters
        ("nvmlDeviceGetRemappedRows", REMAP_SERIES, 1),  # before Ampere
        ("nvmlDeviceRegisterEvents", {S.GPU_XID_ERRORS, S.GPU_LAST_XID}, 0),
    ],
)
def test_a_reading_the_gpu_does_not_support_is_skipped_asked_once_and_never_an_error(call, absent, per_cycle):
    nv = FakeNvml([a100(errors={call: pynvml.NVML_ERROR_NOT_SUPPORTED}), a100(uuid="GPU-other")])
    collector, _ = collector_for(nv)
    complete = set(health_of(by_gpu(collector.collect().samples, 1)))
    asked = nv.calls.count(call)
    for _ in range(3):
        collected = collector.collect()
        got = by_gpu(collected.samples, 0)
        assert set(health_of(got)) == complete - absent, "only that reading is missing"
        assert S.GPU_MEMORY_USED in got and f"{S.GPU_SM_ACTIVE}[nvml_util]" in got
        assert collected.partial_errors == []
    assert nv.calls.count(call) - asked == 3 * per_cycle, "the GPU that does not support it is never asked again"


def test_an_nvidia_ml_py_without_a_call_skips_that_reading():
    class OldPynvml(FakeNvml):
        def __getattribute__(self, name):
            if name in ("nvmlDeviceGetRemappedRows", "nvmlDeviceGetCurrentClocksEventReasons", "nvmlEventSetCreate"):
                raise AttributeError(name)
            return super().__getattribute__(name)

    nv = OldPynvml([a100(throttle_mask=0x4)])
    collector, _ = collector_for(nv)
    collected = collector.collect()
    got = by_gpu(collected.samples, 0)
    assert S.GPU_ROW_REMAP_PENDING not in got and S.GPU_XID_ERRORS not in got
    assert got[S.GPU_CLOCK_THROTTLE_REASON + "{reason=sw_power_cap}"] == 1.0  # through the older call
    assert collected.partial_errors == []
    assert collector.gpus[0].unsupported == {"remapped_rows", "clocks_event_reasons", "xid_events"}


def test_a_failing_health_reading_skips_that_reading_this_cycle_and_counts_an_error():
    nv = FakeNvml([a100(errors={"nvmlDeviceGetTemperature": pynvml.NVML_ERROR_UNKNOWN})])
    collector, _ = collector_for(nv)
    collected = collector.collect()
    got = by_gpu(collected.samples, 0)
    assert S.GPU_TEMPERATURE not in got and S.GPU_POWER_DRAW in got and S.GPU_MEMORY_USED in got
    assert collected.partial_errors == ["gpu_health_error"]
    assert "nvmlDeviceGetTemperature" in collector.gpus[0].health_error
    nv.gpus[0].errors.clear()  # a passing fault: the reading is asked again and comes back
    collected = collector.collect()
    assert by_gpu(collected.samples, 0)[S.GPU_TEMPERATURE] == 47.0 and collected.partial_errors == []


def test_a_gpu_lost_during_a_health_reading_is_lost():
    nv = FakeNvml([a100(errors={"nvmlDeviceGetPcieReplayCounter": pynvml.NVML_ERROR_GPU_IS_LOST}), a100(uuid="GPU-1")])
    collector, _ = collector_for(nv)
    collected = collector.collect()
    assert by_gpu(collected.samples, 0) == {} and by_gpu(collected.samples, 1)
    assert collected.partial_errors == ["gpu_lost"] and collector.gpus[0].lost


def test_fixed_readings_are_asked_once_per_initialisation():
    nv = FakeNvml([a100()])
    collector, _ = collector_for(nv)
    for _ in range(4):
        got = by_gpu(collector.collect().samples, 0)
        assert got[S.GPU_PCIE_LINK_MAX_WIDTH] == 16.0 and got[S.GPU_MAX_CLOCK + "{clock=sm}"] == 1980e6
    assert nv.calls.count("nvmlDeviceGetMaxPcieLinkGeneration") == 1
    assert nv.calls.count("nvmlDeviceGetMaxPcieLinkWidth") == 1
    assert nv.calls.count("nvmlDeviceGetCurrPcieLinkWidth") == 4  # the current link is read every cycle


def test_xid_errors_are_counted_from_nvml_events_without_waiting():
    nv = FakeNvml([a100(uuid="GPU-0"), a100(uuid="GPU-1")])
    collector, clock = collector_for(nv)
    got = by_gpu(collector.collect().samples, 1)
    assert (got[S.GPU_XID_ERRORS], got[S.GPU_LAST_XID]) == (0.0, 0.0)
    nv.gpus[1].xids.extend([13, 31])
    out = collector.collect().samples
    assert (by_gpu(out, 1)[S.GPU_XID_ERRORS], by_gpu(out, 1)[S.GPU_LAST_XID]) == (2.0, 31.0)
    assert by_gpu(out, 0)[S.GPU_XID_ERRORS] == 0.0, "each GPU its own event set"
    nv.gpus[1].xids.append(48)
    out = collector.collect().samples
    assert (by_gpu(out, 1)[S.GPU_XID_ERRORS], by_gpu(out, 1)[S.GPU_LAST_XID]) == (3.0, 48.0)
    # a re-initialisation (another GPU lost and back) keeps the count: a counter, not a reset
    nv.gpus[0].lost = True
    collector.collect()
    nv.gpus[0].lost = False
    clock.now += 1.0
    out = collector.collect().samples
    assert nv.inits == 2 and by_gpu(out, 1)[S.GPU_XID_ERRORS] == 3.0
    collector.close()
    assert all(events.freed for events in nv.event_sets)


def test_more_xid_events_than_one_cycle_drains_wait_for_the_next():
    nv = FakeNvml([a100(xids=[43] * 100)])
    collector, _ = collector_for(nv)
    assert by_gpu(collector.collect().samples, 0)[S.GPU_XID_ERRORS] == 64
    assert by_gpu(collector.collect().samples, 0)[S.GPU_XID_ERRORS] == 100


def test_check_prints_the_health_readings_and_what_is_not_supported(capsys):
    nv = FakeNvml([a100(throttle_mask=0x4, errors={"nvmlDeviceGetRemappedRows": pynvml.NVML_ERROR_NOT_SUPPORTED})])
    assert check(nv, pause=0.15) == 0
    text = capsys.readouterr().out
    assert f"{S.GPU_CLOCK_THROTTLE_REASON} [reason=sw_power_cap] = 1" in text
    assert f"{S.GPU_POWER_LIMIT} = 700" in text and f"{S.GPU_CLOCK} [clock=sm] = 1.98e+09" in text
    assert "not supported here: remapped_rows" in text
    assert "one collection of 1 GPU(s):" in text and "% of a core at 1 Hz" in text


@pytest.mark.skipif(
    bool(ctypes.util.find_library("nvidia-ml")), reason="this machine has NVML; scripts/gpu_check.sh covers it"
)
def test_gpu_check_script_runs_from_a_bare_checkout_without_an_installed_kvdoctor(tmp_path):
    """A GPU machine with a copy of the repository and no install: the script assembles the package
    from the sources (every folder it imports), reaches NVML and says in one line that it is absent."""
    bare = tmp_path / "python"  # this interpreter without site: numpy and pynvml importable, kvdoctor not
    site = sysconfig.get_paths()["purelib"]
    bare.write_text(f'#!/bin/sh\nPYTHONPATH="{site}${{PYTHONPATH:+:$PYTHONPATH}}" exec {sys.executable} -S "$@"\n')
    bare.chmod(0o755)
    assert subprocess.run([bare, "-c", "import kvdoctor"], capture_output=True, cwd=tmp_path).returncode != 0
    script = Path(__file__).resolve().parents[2] / "scripts/gpu_check.sh"
    done = subprocess.run(
        ["bash", script],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHON": str(bare)},
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.startswith("gpu check: NVML is not available here") and done.stderr.count("\n") == 1
