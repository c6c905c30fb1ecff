"""An exporter run inside another command's process, read directly from its store.

``LocalSignals`` is what ``kvdoctor stress`` records from when no exporter is given: an exporter
built from the usual settings on the engine's own /metrics, its window read from the store. It has
the shape of ``kvdoctor.stress.signals.SignalRecorder`` without importing the stress package (the
exporter and the stress test are independent; the CLI plugs this one in).
"""

from __future__ import annotations

import math

from kvdoctor.exporter.assembly import build_exporter
from kvdoctor.exporter.runtime import Exporter
from kvdoctor.exporter.settings import load_settings
from kvdoctor.signals.window import Window

__all__ = ["LocalSignals"]

FIRST_CYCLE_WAIT_SECONDS = 5.0


class LocalSignals:
    """An exporter running in this process on ``metrics_url`` (an engine's /metrics)."""

    def __init__(self, metrics_url: str, interval: float = 1.0, retention_seconds: float = 3600.0) -> None:
        self.metrics_url = metrics_url
        self.interval = interval
        self.retention_seconds = retention_seconds
        self.description = f"in-process exporter on {metrics_url}"
        self.exporter: Exporter | None = None

    def start(self) -> None:
        """Starts the exporter and waits (a few seconds at most) for its first collection cycle."""
        settings = load_settings(
            engine_url=self.metrics_url,
            interval=self.interval,
            retention_seconds=self.retention_seconds,
            max_snapshots=int(self.retention_seconds / self.interval) + 10,
        )
        self.exporter = build_exporter(settings)
        self.exporter.start()
        self.exporter.ready.wait(FIRST_CYCLE_WAIT_SECONDS)

    def engine_up(self) -> tuple[bool | None, str]:
        """(whether the engine source answered its last collection, its last error)."""
        status = self.exporter.status().get("engine", {}) if self.exporter else {}
        return status.get("up"), status.get("last_error") or ""

    def try_poll(self) -> str | None:
        return None  # the exporter's own thread collects

    def window(self, since: float | None = None) -> Window:
        if self.exporter is None:
            return Window.empty()
        w = self.exporter.store.window(self.retention_seconds)
        return w if since is None else w.slice(since, math.inf)

    def close(self) -> None:
        if self.exporter is not None:
            self.exporter.stop()
