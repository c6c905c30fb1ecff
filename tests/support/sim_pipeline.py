"""The demo's pipeline on simulated time: ``kvdoctor demo``'s engine, GPU and exporter, one clock.

The simulated vLLM engine serves its /metrics over loopback HTTP, the exporter scrapes it and the
simulated GPU through the production collectors and the vLLM adapter and diagnoses every cycle
with the demo's context (its SLO), exactly as ``kvdoctor demo`` does -- but the clock is injected
into both the simulation and the exporter, so a collection cycle is ``interval`` simulated seconds
and minutes of an incident take seconds of real time, the same every run (the seed fixes it).

    with SimulatedDemo("bandwidth_bound", queue="growing") as demo:
        demo.run(30)                         # 30 simulated seconds, one cycle per interval
        demo.diagnosis()["verdict"]          # what GET /api/v1/diagnosis answers now
        demo.switch("host_overhead")         # POST /scenario, in simulated time
        demo.http_diagnosis()                # the real GET /api/v1/diagnosis (serve=True)

Used by the demo's scenario tests (tests/simulator/test_simulator_queue.py and
test_simulator_cause_change.py) and by the onset benchmark's cause -> cause pairs (bench/bench_onset.py).
"""

from __future__ import annotations

from typing import Any, Self

import httpx

from kvdoctor.commands.demo import DEFAULT_SLO_MS
from kvdoctor.exporter.app import create_app
from kvdoctor.exporter.assembly import build_exporter
from kvdoctor.exporter.server import serve_in_thread
from kvdoctor.exporter.settings import load_settings
from kvdoctor.simulator import gpu as simulated_gpu
from kvdoctor.simulator.engine_server import EngineServer
from kvdoctor.simulator.physics import Simulation
from tests.support.demo import InProcess

T0 = 1_800_000_000.0


class Clock:
    """The one clock of the simulation and the exporter; moved by hand."""

    def __init__(self, t: float = T0):
        self.t = t

    def __call__(self) -> float:
        return self.t


class SimulatedDemo(InProcess):
    """The demo's engine (with ``queue`` behind ``scenario``), simulated GPU and exporter on one
    clock; ``serve=True`` also serves the exporter's HTTP API (``http_diagnosis``).
    ``diagnosis_window``: the seconds the live diagnosis reads (the exporter's default: 60); at a
    sparse ``interval`` pass the window the rules for that interval read (``sized_for_interval``)."""

    def __init__(
        self,
        scenario: str = "healthy",
        *,
        queue: str = "none",
        interval: float = 1.0,
        seed: int = 0,
        warmup: float = 20.0,
        slo_ms: float = DEFAULT_SLO_MS,
        serve: bool = False,
        diagnosis_window: float | None = None,
    ):
        self.clock = Clock()
        self.interval = interval
        self.sim = Simulation(scenario, seed=seed, clock=self.clock, warmup=warmup, queue=queue)
        self.engine = EngineServer(self.sim)
        self.slo_ms = slo_ms
        self.serve = serve
        self.diagnosis_window = diagnosis_window
        self.exporter_url = ""

    def start(self) -> Self:
        self.engine.start()
        settings = load_settings(
            engine_url=self.engine.metrics_url,
            engine="vllm",
            nvml=False,
            port=0,
            interval=self.interval,
            scrape_timeout=5,
            gpu_peak_bandwidth=self.sim.config.gpu.peak_bandwidth,
            slo_ms=self.slo_ms,
            **({"diagnosis_window": self.diagnosis_window} if self.diagnosis_window else {}),
        )
        self.exporter = build_exporter(
            settings, clock=self.clock, extra_collectors=[simulated_gpu.for_engine_url(self.engine.metrics_url, 5)]
        )
        if self.serve:
            self._http = serve_in_thread(create_app(self.exporter), "127.0.0.1", 0)
            self.exporter_url = self._http.url
        return self

    @property
    def now(self) -> float:
        """Simulated seconds since the start."""
        return self.clock.t - T0

    def cycle(self) -> dict[str, Any]:
        """One collection cycle ``interval`` simulated seconds after the last; its diagnosis."""
        assert self.exporter is not None, "start() first"
        self.clock.t += self.interval
        self.exporter.run_cycle()
        return self.diagnosis()

    def run(self, seconds: float) -> list[dict[str, Any]]:
        """Cycles for ``seconds`` simulated seconds; the diagnosis after each."""
        return [self.cycle() for _ in range(max(1, round(seconds / self.interval)))]

    def diagnosis(self) -> dict[str, Any]:
        """The exporter's latest diagnosis (what ``GET /api/v1/diagnosis`` answers)."""
        assert self.exporter is not None, "start() first"
        return self.exporter.diagnosis() or {}

    def http_diagnosis(self) -> dict[str, Any]:
        """``GET /api/v1/diagnosis`` over HTTP (``serve=True``)."""
        resp = httpx.get(f"{self.exporter_url}/api/v1/diagnosis", timeout=10)
        resp.raise_for_status()
        payload: dict[str, Any] = resp.json()
        return payload

    def switch(self, scenario: str, queue: str | None = None) -> dict[str, Any]:
        """``POST /scenario`` on the simulated engine, at the current simulated time; its new state."""
        body: dict[str, str] = {"scenario": scenario}
        if queue is not None:
            body["queue"] = queue
        resp = httpx.post(f"{self.engine.url}/scenario", json=body, timeout=10)
        resp.raise_for_status()
        state: dict[str, Any] = resp.json()
        return state
