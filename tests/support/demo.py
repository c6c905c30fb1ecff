"""The demo with its URLs: ``kvdoctor demo`` as a real process, or the same pipeline in this process.

Both have ``engine_url`` (the simulated vLLM engine, base URL), ``exporter_url`` (the exporter's
base URL: ``/metrics``, ``/api/v1/...``), ``switch(scenario)`` and ``verdict()``, and stop
cleanly. The ``demo`` fixture (tests/support/fixtures.py) starts either and stops it after the
test:

    d = demo("kv_thrashing")                        # `kvdoctor demo --scenario kv_thrashing`
    d = demo("healthy", dashboard=True)             # ... with its dashboard: d.dashboard_url
    d = demo("kv_thrashing", in_process=True)       # engine + exporter in this process: d.exporter
"""

from __future__ import annotations

import signal
from typing import Any, Self

import httpx

from kvdoctor.exporter.app import create_app
from kvdoctor.exporter.assembly import build_exporter
from kvdoctor.exporter.runtime import Exporter
from kvdoctor.exporter.server import serve_in_thread
from kvdoctor.exporter.settings import ExporterSettings
from kvdoctor.simulator import gpu as simulated_gpu
from kvdoctor.simulator.engine_server import EngineServer
from kvdoctor.simulator.physics import Simulation
from tests.support.processes import Process, kvdoctor
from tests.support.tools import wait_until

START_TIMEOUT = 90.0  # imports and the simulation's warm-up, on a busy 2-core machine


class _Demo:
    """What both demos offer once started (``with`` starts and stops one too)."""

    engine_url: str
    exporter_url: str

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> object:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def metrics_url(self) -> str:
        return f"{self.exporter_url}/metrics"

    def switch(self, scenario: str) -> dict[str, Any]:
        """Switches the simulated engine's workload now; its new state (``expected_verdict``, ...)."""
        resp = httpx.post(f"{self.engine_url}/scenario", json={"scenario": scenario}, timeout=10)
        resp.raise_for_status()
        state: dict[str, Any] = resp.json()
        return state

    def verdict(self) -> str | None:
        """The exporter's current verdict (None before its first diagnosis)."""
        resp = httpx.get(f"{self.exporter_url}/api/v1/diagnosis", timeout=10)
        payload = resp.json() if resp.status_code == 200 else None
        return payload.get("verdict") if isinstance(payload, dict) else None


class DemoProcess(_Demo):
    """``kvdoctor demo`` in its own process, started on free ports; the URLs it printed in ``urls``
    (by name: dashboard, metrics, diagnosis, engine). ``merge_stderr=False`` keeps stderr apart."""

    def __init__(
        self,
        scenario: str = "healthy",
        *,
        dashboard: bool = False,
        port: int = 0,
        dashboard_port: int = 0,
        interval: float | None = None,
        status_every: float = 0,
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        merge_stderr: bool = True,
    ):
        args: list[object] = ["demo", "--scenario", scenario, "--port", port, "--status-every", status_every]
        args += ["--dashboard-port", dashboard_port] if dashboard else ["--no-dashboard"]
        if interval is not None:
            args += ["--interval", interval]
        self.scenario = scenario
        self.process: Process = kvdoctor(*args, *extra_args, env=env, merge_stderr=merge_stderr)
        self.urls: dict[str, str] = {}
        self.started_at = 0.0  # time.monotonic() when the dashboard's URL was printed (else the last URL)

    def start(self, timeout: float = START_TIMEOUT) -> DemoProcess:
        self.process.start()
        self.process.wait_for_line(r"^Ctrl-C to stop", timeout=timeout)
        for at, line in self.process.stamped():
            words = line.split()
            if line.startswith("  ") and len(words) >= 2 and words[1].startswith("http"):
                self.urls[words[0]] = words[1]
                if words[0] == "dashboard" or not self.started_at:
                    self.started_at = at
        self.exporter_url = self.urls["metrics"].removesuffix("/metrics")
        self.engine_url = self.urls["engine"].removesuffix("/metrics")
        return self

    @property
    def dashboard_url(self) -> str | None:
        return self.urls.get("dashboard")

    @property
    def pid(self) -> int:
        return self.process.pid

    def printed(self) -> list[str]:
        """The lines it printed to stdout so far."""
        return list(self.process.lines["stdout"])

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 20.0) -> int | None:
        """Stops it with ``signum`` (it stops its threads on SIGINT and SIGTERM); its exit status."""
        return self.process.stop(signum, timeout)


class InProcess(_Demo):
    """A demo whose engine and exporter run in this process (``InProcessDemo``, and the one on
    simulated time, tests/support/sim_pipeline.py): ``stop()`` stops the exporter's HTTP server,
    the exporter and the engine, whichever have started."""

    engine: EngineServer | None = None
    exporter: Exporter | None = None
    _http: Any = None

    def stop(self) -> None:
        http, self._http = self._http, None
        if http is not None:
            http.stop()
        if self.exporter is not None:
            self.exporter.stop()
        if self.engine is not None:
            self.engine.stop()


class InProcessDemo(InProcess):
    """The demo's pipeline in this process: the simulated vLLM engine on loopback HTTP, the exporter
    scraping it (and the simulated GPU) with the rules' diagnosis, its HTTP API on a free port.
    ``settings`` go to ExporterSettings; ``warm_cycles`` run before the collection thread starts."""

    def __init__(
        self,
        scenario: str = "kv_thrashing",
        *,
        seed: int = 1,
        interval: float = 0.25,
        gpu: bool = True,
        warm_cycles: int = 0,
        **settings: Any,
    ):
        self.scenario = scenario
        self.seed = seed
        self.interval = interval
        self.gpu = gpu
        self.warm_cycles = warm_cycles
        self.settings = settings

    def start(self, cycles: int = 4, timeout: float = 20.0) -> InProcessDemo:
        """Starts it and waits until the exporter has run ``cycles`` collection cycles."""
        self.engine = EngineServer(Simulation(self.scenario, seed=self.seed)).start()
        self.engine_url = self.engine.url
        settings = ExporterSettings(
            engine_url=self.engine.metrics_url, engine="vllm", nvml=False, interval=self.interval, **self.settings
        )
        gpus = [simulated_gpu.for_engine_url(self.engine.metrics_url)] if self.gpu else []
        self.exporter = exporter = build_exporter(settings, extra_collectors=gpus)
        for _ in range(self.warm_cycles):
            exporter.run_cycle()
        exporter.start()
        self._http = serve_in_thread(create_app(exporter), "127.0.0.1", 0)
        self.exporter_url = self._http.url
        wait_until(lambda: exporter.cycles >= cycles, timeout=timeout, interval=0.05, what=f"{cycles} cycles")
        return self


Demo = DemoProcess | InProcessDemo
