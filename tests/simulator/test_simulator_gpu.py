"""The simulated GPU collector: the nvml collector's canonical signals, GPM-style, from the simulator."""

from __future__ import annotations

import socket
import subprocess
import time

import httpx
import pytest

from kvdoctor.exporter.collectors.base import REGISTRY
from kvdoctor.exporter.runtime import Exporter
from kvdoctor.exporter.settings import ExporterSettings
from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.collection import NotApplicable, SourceError
from kvdoctor.simulator.engine_server import EngineServer
from kvdoctor.simulator.gpu import HttpSource, SimulatedGpuCollector, for_engine_url, gpu_uuid
from kvdoctor.simulator.physics import Simulation
from tests.support import tools

T0 = 1_800_000_000.0

HEALTH_SIGNALS = frozenset(S.GPU_HEALTH_SIGNALS)
GPU_SIGNALS = {
    S.GPU_DRAM_BANDWIDTH_UTILIZATION,
    S.GPU_SM_ACTIVE,
    S.GPU_MEMORY_USED,
    S.GPU_MEMORY_TOTAL,
    S.GPU_PCIE_RX,
    S.GPU_PCIE_TX,
    S.GPU_DRAM_PEAK_BANDWIDTH,
} | HEALTH_SIGNALS


class Clock:
    def __init__(self):
        self.t = T0

    def __call__(self):
        return self.t


def by_name(collected) -> dict[str, list[tuple[dict, float]]]:
    out: dict[str, list] = {}
    for (name, labels), value in collected.samples.items():
        out.setdefault(name, []).append((dict(labels), value))
    return out


def test_the_exporter_does_not_register_it():
    assert "simulated_gpu" not in REGISTRY  # the demo plugs it in; the sidecar never imports the simulator


def test_first_reading_has_no_ratios_then_gpm_ratios():
    clock = Clock()
    sim = Simulation("bandwidth_bound", seed=0, clock=clock, warmup=10)
    collector = SimulatedGpuCollector.for_simulation(sim)
    first = by_name(collector.collect())
    assert (
        set(first) == {S.GPU_MEMORY_USED, S.GPU_MEMORY_TOTAL, S.GPU_DRAM_PEAK_BANDWIDTH} | HEALTH_SIGNALS
    )  # GPM: two samples
    clock.t += 2
    second = by_name(collector.collect())
    assert set(second) == GPU_SIGNALS
    for name in (S.GPU_DRAM_BANDWIDTH_UTILIZATION, S.GPU_SM_ACTIVE):
        ((labels, _),) = second[name]
        assert labels == {"gpu": "0", "uuid": gpu_uuid(0, 0), "model": "NVIDIA H100 80GB HBM3", "method": "gpm"}
    ((labels, _),) = second[S.GPU_MEMORY_USED]
    assert labels == {"gpu": "0", "uuid": gpu_uuid(0, 0), "model": "NVIDIA H100 80GB HBM3"}
    assert set(labels) == set(S.SIGNALS[S.GPU_MEMORY_USED].labels)
    dram = second[S.GPU_DRAM_BANDWIDTH_UTILIZATION][0][1]
    sm = second[S.GPU_SM_ACTIVE][0][1]
    assert dram >= 0.8 and sm < 0.5  # the bandwidth-bound workload, seen through the GPU
    assert second[S.GPU_DRAM_PEAK_BANDWIDTH][0][1] == 3350e9


def values(samples: dict, name: str, **labels: str) -> list[float]:
    return [v for lab, v in samples[name] if all(lab.get(k) == x for k, x in labels.items())]


def test_a_healthy_gpus_health_signals_every_family_with_its_declared_labels():
    clock = Clock()
    collector = SimulatedGpuCollector.for_simulation(Simulation("bandwidth_bound", seed=0, clock=clock, warmup=10))
    idle = by_name(collector.collect())
    clock.t += 2
    busy = by_name(collector.collect())
    for name, rows in busy.items():
        for labels, _ in rows:
            assert set(labels) == set(S.SIGNALS[name].labels), name
    assert values(busy, S.GPU_CLOCK, clock="sm") == values(busy, S.GPU_MAX_CLOCK, clock="sm") == [1980e6]
    assert values(busy, S.GPU_CLOCK, clock="memory") == values(busy, S.GPU_MAX_CLOCK, clock="memory")
    assert sorted(lab["reason"] for lab, _ in busy[S.GPU_CLOCK_THROTTLE_REASON]) == sorted(
        r for _, r in S.CLOCK_THROTTLE_REASONS
    )
    assert {v for _, v in busy[S.GPU_CLOCK_THROTTLE_REASON]} == {0.0}  # healthy: no reason active
    for name in (S.GPU_XID_ERRORS, S.GPU_ECC_ERRORS, S.GPU_REMAPPED_ROWS, S.GPU_PCIE_REPLAYS, S.GPU_ROW_REMAP_PENDING):
        assert {v for _, v in busy[name]} == {0.0}, name
    assert values(busy, S.GPU_PCIE_LINK_GENERATION) == values(busy, S.GPU_PCIE_LINK_MAX_GENERATION) == [5.0]
    assert values(busy, S.GPU_PCIE_LINK_WIDTH) == values(busy, S.GPU_PCIE_LINK_MAX_WIDTH) == [16.0]
    # power and heat follow the activity, under the limit
    (limit,) = values(busy, S.GPU_POWER_LIMIT)
    assert values(idle, S.GPU_POWER_DRAW)[0] < values(busy, S.GPU_POWER_DRAW)[0] < limit
    assert values(idle, S.GPU_TEMPERATURE)[0] < values(busy, S.GPU_TEMPERATURE)[0] < 80


@tools.requires_promtool
def test_the_exporters_page_with_the_health_families_passes_promtool_check_metrics():
    clock = Clock()
    collector = SimulatedGpuCollector.for_simulation(Simulation("healthy", clock=clock, warmup=2), count=2)
    exporter = Exporter(ExporterSettings(nvml=False, pod="p"), [collector])
    exporter.run_cycle()
    clock.t += 1
    exporter.run_cycle()
    page = exporter.metrics_bytes()
    for name in HEALTH_SIGNALS:
        assert f"# TYPE {name} ".encode() in page, name
    assert page.count(f"{S.GPU_CLOCK_THROTTLE_REASON}{{".encode()) == 2 * len(S.CLOCK_THROTTLE_REASONS)
    result = subprocess.run([tools.promtool(), "check", "metrics"], input=page, capture_output=True, timeout=30)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()


def test_tier_miss_shows_pcie_receive():
    clock = Clock()
    sim = Simulation("tier_miss", seed=0, clock=clock, warmup=10)
    collector = SimulatedGpuCollector.for_simulation(sim)
    collector.collect()
    clock.t += 3
    rx = by_name(collector.collect())[S.GPU_PCIE_RX][0][1]
    assert rx > 5e9


def test_several_gpus_mirror_the_device_with_their_own_identity():
    clock = Clock()
    collector = SimulatedGpuCollector.for_simulation(Simulation("healthy", clock=clock, warmup=2), count=8)
    collector.collect()
    clock.t += 1
    samples = by_name(collector.collect())
    assert sorted(labels["gpu"] for labels, _ in samples[S.GPU_SM_ACTIVE]) == [str(i) for i in range(8)]
    assert len({labels["uuid"] for labels, _ in samples[S.GPU_SM_ACTIVE]}) == 8
    assert len({value for _, value in samples[S.GPU_SM_ACTIVE]}) == 1


def test_for_engine_url_reads_the_simulated_engine_over_http():
    with EngineServer(Simulation("compute_bound", seed=0, warmup=5)) as srv:
        collector = for_engine_url(srv.metrics_url)
        try:
            collector.collect()
            time.sleep(0.6)  # real time: GPM-style ratios need the device to have moved on
            samples = by_name(collector.collect())
        finally:
            collector.close()
    assert set(samples) == GPU_SIGNALS
    assert samples[S.GPU_SM_ACTIVE][0][1] > 0.8


def test_not_applicable_without_an_engine_url():
    collector = for_engine_url(None)
    with pytest.raises(NotApplicable):
        collector.collect()


def test_not_applicable_when_the_engine_is_not_the_simulator():
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404)

    source = HttpSource("http://engine.invalid/gpu")
    source._client = httpx.Client(transport=httpx.MockTransport(handler))
    with pytest.raises(NotApplicable):
        SimulatedGpuCollector(source).collect()


def test_engine_gone_is_a_source_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    collector = SimulatedGpuCollector(HttpSource.for_engine(f"http://127.0.0.1:{port}/metrics", timeout=1))
    with pytest.raises(SourceError) as info:
        collector.collect()
    assert info.value.reason == "connection_refused"


def test_a_mangled_payload_is_a_source_error():
    source = HttpSource("http://engine.invalid/gpu")
    source._client = httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(200, json={"name": "x"})))
    with pytest.raises(SourceError) as info:
        SimulatedGpuCollector(source).collect()
    assert info.value.reason == "bad_payload"
