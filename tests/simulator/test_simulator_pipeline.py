"""Each demo scenario, through the production path, lands in its branch of the decision tree.

Simulated engine over loopback HTTP -> the engine collector and the vLLM adapter -> the simulated
GPU collector -> the exporter's store -> ``rules.diagnosis`` with the demo's context (its SLO).
The clock is injected into both the simulation and the exporter, so a cycle is one simulated
second and the whole run takes a moment of real time.
"""

from __future__ import annotations

import pytest

from kvdoctor.commands.demo import DEFAULT_SLO_MS
from kvdoctor.exporter.assembly import build_exporter
from kvdoctor.exporter.settings import load_settings
from kvdoctor.signals import vocabulary as S
from kvdoctor.simulator import gpu as simulated_gpu
from kvdoctor.simulator.engine_server import EngineServer
from kvdoctor.simulator.physics import Simulation
from kvdoctor.simulator.scenarios import SCENARIOS

CYCLES = 8
SETTLED = 3  # cycles after which the verdict must hold (the first one has no GPU ratios yet)


class Clock:
    def __init__(self):
        self.t = 1_800_000_000.0

    def __call__(self):
        return self.t


def run_pipeline(scenario: str, cycles: int = CYCLES):
    clock = Clock()
    sim = Simulation(scenario, seed=0, clock=clock, warmup=20)
    with EngineServer(sim) as engine:
        settings = load_settings(
            engine_url=engine.metrics_url,
            engine="vllm",
            nvml=False,
            port=0,
            scrape_timeout=5,
            gpu_peak_bandwidth=sim.config.gpu.peak_bandwidth,
            slo_ms=DEFAULT_SLO_MS,
        )
        exporter = build_exporter(
            settings, clock=clock, extra_collectors=[simulated_gpu.for_engine_url(engine.metrics_url, 5)]
        )
        verdicts = []
        try:
            for _ in range(cycles):
                clock.t += 1.0
                snapshot = exporter.run_cycle()
                verdicts.append((exporter.diagnosis() or {}).get("verdict"))
        finally:
            exporter.stop()
    return verdicts, snapshot, exporter


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_scenario_lands_in_its_branch(scenario):
    verdicts, snapshot, _ = run_pipeline(scenario)
    expected = SCENARIOS[scenario].expected_verdict
    assert verdicts[SETTLED:] == [expected] * (CYCLES - SETTLED), verdicts
    up = {dict(labels)["source"]: v for (name, labels), v in snapshot.samples.items() if name == S.SOURCE_UP}
    assert up == {"engine": 1.0, "simulated_gpu": 1.0}
