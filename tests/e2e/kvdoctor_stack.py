"""The kvdoctor side of the end-to-end tests: the exporter as a real subprocess, and restarts.

exporter = ExporterProcess(engine_metrics_url=server.metrics_url, workdir=tmp_path, pod="e2e").start()
exporter.diagnosis()["verdict"]
exporter.restart()            # same port: Prometheus keeps scraping the same target
restart_engine(server)        # the vLLM server again on its port, counters back at zero
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.support.processes import OnLoopback, Process, http_ok, kvdoctor, start_on_free_port
from tests.support.tools import ROOT

ALERT_RULES = ROOT / "rules" / "alerts.yaml"


@dataclass
class ExporterProcess(OnLoopback):
    """``kvdoctor exporter`` in its own process, scraping an engine every ``interval`` seconds."""

    engine_metrics_url: str
    workdir: Path
    pod: str = "e2e"
    engine: str = "vllm"  # --engine: an adapter name, or auto
    interval: float = 1.0
    port: int = 0
    extra_args: tuple[str, ...] = ()
    process: Process | None = None
    starts: list[float] = field(default_factory=list)  # seconds each start took to /readyz

    @property
    def log_path(self) -> Path:
        return Path(self.workdir) / f"exporter-{self.pod}.log"

    def arguments(self) -> list[object]:
        return [
            "exporter",
            "--engine-url",
            self.engine_metrics_url,
            "--engine",
            self.engine,
            "--interval",
            self.interval,
            "--port",
            self.port,
            "--pod",
            self.pod,
            "--no-collector.nvml",
            "--log-level",
            "warning",
            *self.extra_args,
        ]

    def start(self, timeout: float = 60, attempts: int = 3) -> ExporterProcess:
        """Starts on ``port`` (a free one if 0) and waits for /readyz (one collection cycle done)."""
        started = time.monotonic()
        start_on_free_port(lambda port: self._launch(port, timeout), attempts, port=self.port or None)
        self.starts.append(time.monotonic() - started)
        return self

    def _launch(self, port: int, timeout: float) -> ExporterProcess:
        self.port = port
        self.process = kvdoctor(*self.arguments(), log=self.log_path, name="exporter").start()
        self.process.wait_for(http_ok(f"{self.url}/readyz"), timeout=timeout, what="ready (/readyz)")
        return self

    def stop(self, timeout: float = 10) -> None:
        process, self.process = self.process, None
        if process is not None:
            process.stop(timeout=timeout)

    def restart(self, down_seconds: float = 0.0) -> None:
        """Stops and starts again on the same port, after ``down_seconds`` without an exporter."""
        self.stop()
        time.sleep(down_seconds)
        self.start()

    def get(self, path: str, **params) -> dict:
        resp = httpx.get(f"{self.url}{path}", params=params or None, timeout=10)
        resp.raise_for_status()
        return resp.json()

    def diagnosis(self) -> dict:
        return self.get("/api/v1/diagnosis")


def restart_engine(server, ready_timeout: float = 300) -> float:
    """Stops the vLLM ``server`` and starts it again on the same port (so the exporter's
    --engine-url stays right, as for a restarted engine container); returns the seconds it took."""
    started = time.monotonic()
    server.stop()
    server.start(ready_timeout=ready_timeout, attempts=3, port=server.port)
    return time.monotonic() - started


def prometheus_config(exporter_target: str) -> dict:
    """Scrape the exporter every second and evaluate the rules every second."""
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [{"job_name": "kvdoctor", "static_configs": [{"targets": [exporter_target]}]}],
    }


@dataclass
class Observation:
    at: float  # Unix seconds
    verdict: str | None  # None: the exporter did not answer (e.g. while it restarts)
    features: dict = field(default_factory=dict)
    error: str = ""


class Watcher:
    """Polls the exporter's diagnosis (and Prometheus' alerts, if given) every ``period`` seconds
    on a thread, for as long as a test runs: what was said *while* something restarted."""

    def __init__(self, exporter: ExporterProcess, prometheus=None, period: float = 1.0):
        self.exporter = exporter
        self.prometheus = prometheus
        self.period = period
        self.observations: list[Observation] = []
        self.alerts_seen: dict[str, set[str]] = {}  # alertname -> states seen
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="e2e-watcher", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.time()
            try:
                d = self.exporter.diagnosis()
                self.observations.append(Observation(now, d.get("verdict"), d.get("features") or {}))
            except (httpx.HTTPError, ValueError) as exc:
                self.observations.append(Observation(now, None, error=type(exc).__name__))
            if self.prometheus is not None:
                try:
                    for alert in self.prometheus.alerts():
                        self.alerts_seen.setdefault(alert["labels"].get("alertname", ""), set()).add(alert["state"])
                except Exception:
                    pass
            self._stop.wait(self.period)

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)

    def verdicts(self, since: float = 0.0) -> list[str]:
        return [o.verdict for o in self.observations if o.verdict is not None and o.at >= since]

    def negative_features(self) -> list[tuple[str, float]]:
        """Every (feature, value) the exporter served below zero: rates, counts and ratios cannot be."""
        return [
            (name, value)
            for o in self.observations
            for name, value in o.features.items()
            if isinstance(value, (int, float)) and value < 0
        ]
