"""Recordings (``kvdoctor record``): what was polled, kept in memory and written as a trace file.

- ``SnapshotRecording``: canonical snapshots merged by timestamp, so the overlapping windows asked
  of an exporter add each of its cycles once; written with ``traces.write_window``.
- ``RawRecording``: an engine's raw /metrics pages with the time each was taken; written with
  ``traces.write_raw_captures`` (replay normalises them through the engine adapters).
- ``ExporterRecorder``: polls one exporter into a ``SnapshotRecording``, through its window API,
  or its /metrics when it has none; ``backfill`` first adds what the exporter already holds
  (``kvdoctor record --since``).

While recording, ``checkpoint()`` rewrites the file every ``CHECKPOINT_SECONDS``, so a crash loses
at most that much.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from pathlib import Path

from kvdoctor.signals.collection import SourceError
from kvdoctor.signals.window import Snapshot, Window
from kvdoctor.sources.exporter_api import WINDOW_PATH, ExporterClient, NoWindowApi, WindowRefused
from kvdoctor.sources.paths import METRICS_PATH
from kvdoctor.sources.traces import write_raw_captures, write_window

__all__ = [
    "CHECKPOINT_SECONDS",
    "ExporterRecorder",
    "RawRecording",
    "Recording",
    "SnapshotRecording",
    "exporter_history",
]

CHECKPOINT_SECONDS = 60.0
MAX_WINDOW_REQUEST = 900  # seconds: the exporter's default --max-window
MAX_BACKFILL_SECONDS = 7 * 86400  # a backfill asks for at most a week (an exporter keeps far less)


class Recording(ABC):
    """What was recorded so far, and the trace file it goes to."""

    def __init__(self, output: Path) -> None:
        self.output = output
        self.last_checkpoint = time.monotonic()

    @abstractmethod
    def __len__(self) -> int:
        """Snapshots (or pages) recorded so far."""

    @abstractmethod
    def timestamps(self) -> list[float]:
        """When each snapshot (or page) was taken, oldest first."""

    @abstractmethod
    def _write(self) -> int: ...

    def write(self) -> int:
        """Writes the trace (atomically); returns how many snapshots (or pages) it holds."""
        self.last_checkpoint = time.monotonic()
        return self._write()

    def checkpoint(self) -> None:
        """Rewrites the trace when the last write is ``CHECKPOINT_SECONDS`` old."""
        if len(self) and time.monotonic() - self.last_checkpoint >= CHECKPOINT_SECONDS:
            self.write()


class SnapshotRecording(Recording):
    """Canonical snapshots, merged by timestamp."""

    def __init__(self, output: Path) -> None:
        super().__init__(output)
        self.since: float | None = None  # on the exporter's clock, which may differ from ours
        self.snapshots: dict[float, Snapshot] = {}

    def __len__(self) -> int:
        return len(self.snapshots)

    def add_window(self, window: Window) -> int:
        """Adds the window's snapshots not already here; returns how many were new.

        The first window only sets where the recording starts: at the exporter's newest snapshot."""
        if not len(window):
            return 0
        if self.since is None:
            self.since = window.end
        added = 0
        for snap in window.snapshots():
            if snap.ts >= self.since and snap.ts not in self.snapshots:
                self.snapshots[snap.ts] = snap
                added += 1
        return added

    def add_history(self, window: Window) -> int:
        """Adds every snapshot of ``window`` (what a source already held), and starts the recording
        at its oldest; returns how many were new."""
        if not len(window):
            return 0
        self.since = window.start if self.since is None else min(self.since, window.start)
        added = 0
        for snap in window.snapshots():
            if snap.ts not in self.snapshots:
                self.snapshots[snap.ts] = snap
                added += 1
        return added

    def add_snapshot(self, snap: Snapshot) -> None:
        self.snapshots[snap.ts] = snap

    def newest(self) -> float | None:
        return max(self.snapshots) if self.snapshots else None

    def timestamps(self) -> list[float]:
        return sorted(self.snapshots)

    def _write(self) -> int:
        return write_window(Window.from_snapshots(self.snapshots.values()), self.output)


class RawRecording(Recording):
    """Raw exposition pages of an engine's /metrics with the time each was taken."""

    def __init__(self, output: Path) -> None:
        super().__init__(output)
        self.captures: list[tuple[float, str]] = []

    def __len__(self) -> int:
        return len(self.captures)

    def add(self, taken: float, page: str) -> None:
        self.captures.append((taken, page))

    def timestamps(self) -> list[float]:
        return [ts for ts, _ in self.captures]

    def _write(self) -> int:
        write_raw_captures(self.captures, self.output)
        return len(self.captures)


def exporter_history(client: ExporterClient, seconds: float) -> tuple[Window, float]:
    """What the exporter already holds of the last ``seconds`` (its ring store, through its window
    API), and the seconds asked for: an exporter serving shorter windows (its --max-window) gives
    its longest. ``NoWindowApi`` without the window API, ``SourceError`` when it cannot be read."""
    asked = min(float(seconds), float(MAX_BACKFILL_SECONDS))
    try:
        return client.window(asked), asked
    except WindowRefused as refused:
        if refused.longest is None or refused.longest >= asked:
            raise
        return client.window(refused.longest), float(refused.longest)


class ExporterRecorder:
    """Polls one exporter into a ``SnapshotRecording`` every ``interval`` seconds.

    Through its window API, each poll asks for the seconds since the newest snapshot recorded (plus
    two intervals), so every collection cycle is recorded, not one per poll; an exporter without
    the API (the first poll finds out) is read through its /metrics, one snapshot per poll.
    """

    def __init__(self, client: ExporterClient, recording: SnapshotRecording, interval: float) -> None:
        self.client = client
        self.recording = recording
        self.interval = interval
        self.uses_window_api = True

    @property
    def mode(self) -> str:
        """The path polled: the window API or /metrics."""
        return WINDOW_PATH if self.uses_window_api else METRICS_PATH

    def backfill(self, seconds: float) -> float:
        """What the exporter already holds of the last ``seconds`` (its ring store, through its
        window API), added to the recording; an exporter serving shorter windows (its
        --max-window) gives its longest. Returns the seconds asked for. ``NoWindowApi`` when it has
        no window API (its past cannot be read), ``SourceError`` when it cannot be read."""
        window, asked = exporter_history(self.client, seconds)
        self.recording.add_history(window)
        return asked

    def first_poll(self) -> None:
        """The first poll, which finds out whether the exporter has the window API."""
        try:
            self._poll_window()
        except NoWindowApi:
            self.uses_window_api = False
            self.recording.add_snapshot(self.client.metrics_snapshot())

    def poll(self) -> None:
        """One poll; ``SourceError`` (one line) when the exporter cannot be read."""
        if not self.uses_window_api:
            self.recording.add_snapshot(self.client.metrics_snapshot())
            return
        try:
            self._poll_window()
        except NoWindowApi:
            raise SourceError("no_window_api", f"{self.client.url}{WINDOW_PATH} disappeared") from None

    def _poll_window(self) -> None:
        newest = self.recording.newest()
        behind = (time.time() - newest) if newest is not None else self.interval
        seconds = min(MAX_WINDOW_REQUEST, max(2 * self.interval, behind + 2 * self.interval))
        self.recording.add_window(self.client.window(seconds))
