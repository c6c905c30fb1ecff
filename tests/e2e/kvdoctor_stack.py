"""The kvdoctor side of the end-to-end tests: the exporter as a real subprocess, and restarts.

exporter = ExporterProcess(engine_metrics_url=server.metrics_url, workdir=tmp_path, pod="e2e").start()
exporter.diagnosis()["verdict"]
exporter.restart()            # same port: Prometheus keeps scraping the same target
restart_engine(server)        # the vLLM server again on its port, counters back at zero
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

import httpx

from tests import tools

ROOT = Path(__file__).resolve().parents[2]
ALERT_RULES = ROOT / "rules" / "alerts.yaml"


class ExporterProcessError(RuntimeError):
    """The exporter subprocess did not start or answer."""


@dataclass
class ExporterProcess:
    """``kvdoctor exporter`` in its own process, scraping an engine every ``interval`` seconds."""

    engine_metrics_url: str
    workdir: Path
    pod: str = "e2e"
    interval: float = 1.0
    port: int = 0
    extra_args: tuple[str, ...] = ()
    process: subprocess.Popen | None = None
    starts: list[float] = field(default_factory=list)  # seconds each start took to /readyz

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return Path(self.workdir) / f"exporter-{self.pod}.log"

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "kvdoctor",
            "exporter",
            "--engine-url",
            self.engine_metrics_url,
            "--engine",
            "vllm",
            "--interval",
            str(self.interval),
            "--port",
            str(self.port),
            "--pod",
            self.pod,
            "--no-nvml",
            "--log-level",
            "warning",
            *self.extra_args,
        ]

    def start(self, timeout: float = 60, attempts: int = 3) -> ExporterProcess:
        """Starts on ``port`` (a free one if 0) and waits for /readyz (one collection cycle done)."""
        Path(self.workdir).mkdir(parents=True, exist_ok=True)
        keep_port = self.port != 0
        for _ in range(attempts):
            if not keep_port:
                self.port = tools.free_port()
            started = time.monotonic()
            with open(self.log_path, "ab") as log:
                log.write(f"\n$ {' '.join(self.command())}\n".encode())
                log.flush()
                self.process = subprocess.Popen(
                    self.command(),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    env={**os.environ, "PYTHONUNBUFFERED": "1"},
                )
            try:
                tools.wait_until(self._ready, timeout=timeout, interval=0.2, what="exporter /readyz")
                self.starts.append(time.monotonic() - started)
                return self
            except (TimeoutError, ExporterProcessError):
                in_use = "already in use" in self.log_tail()
                self.stop()
                if not in_use:
                    raise ExporterProcessError(f"the exporter did not become ready:\n{self.log_tail()}") from None
                if keep_port:  # the port we must keep is still held (TIME_WAIT is fine: SO_REUSEADDR)
                    time.sleep(1.0)
        raise ExporterProcessError(f"the exporter could not bind a port in {attempts} attempts:\n{self.log_tail()}")

    def _ready(self) -> bool:
        if self.process is None or self.process.poll() is not None:
            raise ExporterProcessError(f"exporter exited with {self.process.returncode if self.process else None}")
        try:
            return httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self, timeout: float = 10) -> None:
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

    def restart(self, down_seconds: float = 0.0) -> None:
        """Stops and starts again on the same port, after ``down_seconds`` without an exporter."""
        self.stop()
        time.sleep(down_seconds)
        self.start()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def get(self, path: str, **params) -> dict:
        resp = httpx.get(f"{self.url}{path}", params=params or None, timeout=10)
        resp.raise_for_status()
        return resp.json()

    def diagnosis(self) -> dict:
        return self.get("/api/v1/diagnosis")


def restart_engine(server, ready_timeout: float = 300) -> float:
    """Stops the vLLM ``server`` and starts it again on the same port (so the exporter's
    --engine-url stays right, as for a restarted engine container); returns the seconds it took.

    ``VLLMServer.start`` always picks a fresh port, so its port finder is pinned for this start.
    """
    port = server.port
    started = time.monotonic()
    server.stop()
    with mock.patch.object(tools, "free_port", lambda: port):
        server.start(ready_timeout=ready_timeout, attempts=3)
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
        import threading

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
