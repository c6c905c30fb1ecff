"""Where a stress run's signals come from: an exporter's window, recorded while the load runs.

``SignalRecorder`` is what the run needs of one. ``ExporterSignals`` reads a running kvdoctor
exporter over its API (``kvdoctor.sources``); the CLI plugs in an exporter run in its own process
(``kvdoctor.exporter.inprocess.LocalSignals``) when none is given: the stress package does not
import the exporter.
"""

from __future__ import annotations

from typing import Protocol

from kvdoctor.signals.collection import SourceError
from kvdoctor.signals.window import Snapshot, Window
from kvdoctor.sources.exporter_api import ExporterClient

__all__ = ["ExporterSignals", "SignalRecorder", "SignalsError"]


class SignalsError(Exception):
    """The signals cannot be recorded; the message is one line saying why."""


class SignalRecorder(Protocol):
    """The signals of one run: started before the load, polled while it runs, read after."""

    description: str  # where the signals come from, for the report

    def start(self) -> None:
        """Ready to record (``SignalsError``, one line, when it cannot be)."""

    def try_poll(self) -> str | None:
        """One poll; the error line instead of raising (the run goes on without that poll)."""

    def window(self, since: float | None = None) -> Window:
        """The snapshots recorded (since ``since``)."""

    def close(self) -> None: ...


class ExporterSignals:
    """A running kvdoctor exporter: its window polled and merged by timestamp."""

    POLL_SECONDS = 5  # each poll asks for this much (overlap covers a late poll)

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        try:
            self.client = ExporterClient(url, timeout=timeout)
        except SourceError as exc:
            raise SignalsError(str(exc)) from None
        self.url = self.client.url
        self.description = f"exporter {self.url}"
        self.interval: float | None = None
        self._snapshots: dict[float, Snapshot] = {}

    def start(self) -> None:
        """Checks it is a kvdoctor exporter with samples; ``SignalsError`` (one line) otherwise."""
        try:
            self.interval = self.client.interval()
            self.poll()
        except SourceError as exc:
            raise SignalsError(str(exc)) from None

    def poll(self) -> None:
        for snap in self.client.window(self.POLL_SECONDS).snapshots():
            self._snapshots[snap.ts] = snap

    def try_poll(self) -> str | None:
        try:
            self.poll()
            return None
        except SourceError as exc:
            return str(exc)

    def window(self, since: float | None = None) -> Window:
        return Window.from_snapshots(s for t, s in self._snapshots.items() if since is None or t >= since)

    def close(self) -> None:
        self.client.close()
