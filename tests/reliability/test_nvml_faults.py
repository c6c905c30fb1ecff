"""NVML faults at the pynvml boundary, beyond tests/exporter/test_nvml_collector.py.

That file covers one GPU failing while the others report, and a lost GPU re-initialised with a
1 s, 2 s, ... backoff at the collector level. Here: the same fault seen through the exporter
(what /metrics says while a GPU is lost and after it comes back), on Hopper GPUs where the GPM
samples must survive the re-initialisations, a driver that stays down (the backoff doubles up to
its cap), no GPM sample buffers leaking across many losses, and a GPU that never comes back (the
survivors are re-enumerated and their labels follow them).
"""

from __future__ import annotations

import itertools

import pynvml
import pytest

from kvdoctor.exporter.collectors.nvml import BACKOFF_MAX, NvmlCollector
from kvdoctor.exporter.exposition import render_samples
from kvdoctor.exporter.runtime import Exporter
from kvdoctor.exporter.settings import ExporterSettings
from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.collection import SourceError
from kvdoctor.signals.window import labels_of
from tests.exporter.test_nvml_collector import Clock, FakeNvml, by_gpu, h100


def gpus_reporting(samples: dict, signal: str) -> set[str]:
    return {dict(labels)["gpu"] for (name, labels), _ in samples.items() if name == signal}


class Rig:
    """An exporter whose only source is the NVML collector over a FakeNvml, on a fake clock."""

    def __init__(self, n: int = 3):
        self.nv = FakeNvml([h100(uuid=f"GPU-{i}") for i in range(n)])
        self.clock = Clock()
        self.collector = NvmlCollector(self.nv, clock=self.clock)
        self.exporter = Exporter(ExporterSettings(nvml=False, interval=1.0), [self.collector])

    def cycle(self, seconds: float = 1.0) -> dict:
        self.clock.now += seconds
        return self.exporter.run_cycle().samples

    def errors(self, reason: str) -> float:
        latest = self.exporter.store.latest().samples
        return latest.get((S.SOURCE_ERRORS, labels_of(reason=reason, source="nvml")), 0.0)

    def up(self) -> float | None:
        return self.exporter.store.latest().samples.get((S.SOURCE_UP, labels_of(source="nvml")))


def test_a_lost_gpu_through_the_exporter_the_others_keep_reporting_then_it_returns():
    rig = Rig(3)
    rig.cycle()
    rig.cycle()
    assert gpus_reporting(rig.exporter.store.latest().samples, S.GPU_DRAM_BANDWIDTH_UTILIZATION) == {"0", "1", "2"}

    rig.nv.gpus[1].lost = True
    for _ in range(4):
        samples = rig.cycle()
        assert rig.up() == 1.0, "one lost GPU must not take the nvml source down"
        assert gpus_reporting(samples, S.GPU_MEMORY_USED) == {"0", "2"}
        assert b'gpu="1"' not in rig.exporter.metrics_bytes(), "a lost GPU's last values must not linger"
    assert rig.errors("gpu_lost") >= 4
    assert rig.exporter.status()["nvml"]["errors"]["gpu_lost"] >= 4

    rig.nv.gpus[1].lost = False
    for _ in range(6):  # the next re-initialisation finds it (backoff 1, 2, 4 s so far), then GPM needs two samples
        samples = rig.cycle()
    assert gpus_reporting(samples, S.GPU_MEMORY_USED) == {"0", "1", "2"}
    assert gpus_reporting(samples, S.GPU_DRAM_BANDWIDTH_UTILIZATION) == {"0", "1", "2"}
    gpu_samples = {k: v for k, v in samples.items() if "gpu" in dict(k[1])}
    assert by_gpu(gpu_samples, 1)[S.GPU_DRAM_BANDWIDTH_UTILIZATION + "[gpm]"] == pytest.approx(0.55)
    render_samples(samples).decode()  # the page renders with the GPU back


def test_hopper_gpm_keeps_working_across_reinitialisations_and_frees_its_samples():
    nv = FakeNvml([h100(uuid=f"GPU-{i}") for i in range(3)])
    clock = Clock()
    collector = NvmlCollector(nv, clock=clock)
    collector.collect()
    for loss in range(5):  # lost and back, five times
        nv.gpus[2].lost = True
        for _ in range(4):
            clock.now += 1.0
            inits = nv.inits
            out = collector.collect()
            assert by_gpu(out.samples, 0) and by_gpu(out.samples, 1) and not by_gpu(out.samples, 2)
            # New handles after a re-initialisation: no previous GPM sample for that one cycle only.
            reinitialised = nv.inits > inits
            for healthy in (0, 1):
                assert (S.GPU_SM_ACTIVE + "[gpm]" in by_gpu(out.samples, healthy)) is not reinitialised
        nv.gpus[2].lost = False
        for _ in range(4):
            clock.now += 2.0
            out = collector.collect()
        assert out.partial_errors == [] and S.GPU_SM_ACTIVE + "[gpm]" in by_gpu(out.samples, 2)
        live = [s for s in nv.samples if not s.freed]
        assert len(live) <= 2 * len(nv.gpus), f"{len(live)} GPM sample buffers alive after {loss + 1} losses"
    collector.close()
    assert all(s.freed for s in nv.samples)


def test_a_driver_that_stays_down_is_retried_with_a_doubling_backoff_up_to_its_cap():
    nv = FakeNvml([h100(uuid="GPU-0"), h100(uuid="GPU-1")])
    clock = Clock()
    collector = NvmlCollector(nv, clock=clock)
    collector.collect()
    start = clock.now
    nv.gpus[1].lost = True
    collector.collect()  # GPU 1 lost: re-initialise in 1 s
    nv.init_error = pynvml.NVML_ERROR_UNKNOWN  # ...and the driver refuses to come back
    attempts, reasons = [], set()
    inits_before = nv.calls.count("nvmlInit")
    while clock.now - start < 400:
        clock.now += 0.5
        calls_before = nv.calls.count("nvmlInit")
        try:
            out = collector.collect()
            assert clock.now - start < 1.0 and by_gpu(out.samples, 0), "GPU 0 reports until NVML goes down"
        except SourceError as exc:
            reasons.add(exc.reason)
        if nv.calls.count("nvmlInit") > calls_before:
            attempts.append(clock.now - start)
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert attempts[0] == 1.0 and gaps[:5] == [2.0, 4.0, 8.0, 16.0, 32.0]
    assert all(g == BACKOFF_MAX for g in gaps[6:]) and max(gaps) == BACKOFF_MAX
    assert reasons == {"nvml_reinit_failed", "nvml_reinit_pending"}
    assert len(attempts) == nv.calls.count("nvmlInit") - inits_before

    nv.init_error = None
    nv.gpus[1].lost = False
    clock.now += BACKOFF_MAX
    out = collector.collect()
    assert by_gpu(out.samples, 0) and by_gpu(out.samples, 1) and out.partial_errors == []


def test_a_gpu_that_never_comes_back_leaves_the_survivors_correctly_labelled():
    nv = FakeNvml([h100(uuid="GPU-a"), h100(uuid="GPU-b"), h100(uuid="GPU-c")])
    clock = Clock()
    collector = NvmlCollector(nv, clock=clock)
    collector.collect()
    nv.gpus[1].lost = True
    collector.collect()
    del nv.gpus[1]  # fell off the bus: NVML enumerates two GPUs from now on, GPU-c at index 1
    clock.now += 1.0
    out = collector.collect()
    by_uuid = {
        dict(labels)["uuid"]: dict(labels)["gpu"]
        for (name, labels), _ in out.samples.items()
        if name == S.GPU_MEMORY_USED
    }
    assert by_uuid == {"GPU-a": "0", "GPU-c": "1"}
    assert out.partial_errors == []
