"""The bounded in-memory ring of snapshots behind ``/api/v1/window`` and the diagnosis.

Snapshots are kept column-friendly: each entry is ``(ts, schema, values)`` where ``schema`` is the
tuple of series keys and ``values`` a float64 array in the same order. Consecutive cycles almost
always produce the same series, so entries share one schema object and a window of them is a
single ``numpy.stack``; memory is ~8 bytes per sample instead of a dict entry and a float object.

Bounds: by age (``retention_seconds`` behind the newest snapshot), by count (``max_snapshots``,
a ``deque`` maxlen) and by width (``max_series`` per snapshot; the excess is dropped and counted
in ``dropped_series``, which the runtime exports as ``reason="series_cap"``).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from kvdoctor.signals.window import SeriesKey, Snapshot, Window

Schema = tuple[SeriesKey, ...]


class _Entry(NamedTuple):
    ts: float
    schema: Schema
    values: np.ndarray


class RingStore:
    """Thread-safe ring of snapshots, bounded by time, count and series per snapshot."""

    _SCHEMA_CACHE = 16  # distinct schemas remembered for sharing

    def __init__(
        self,
        retention_seconds: float = 900.0,
        max_snapshots: int = 3600,
        max_series: int = 5000,
        clock: Callable[[], float] = time.time,
    ):
        if retention_seconds <= 0 or max_snapshots < 1 or max_series < 1:
            raise ValueError("retention_seconds, max_snapshots and max_series must be positive")
        self.retention_seconds = float(retention_seconds)
        self.max_snapshots = int(max_snapshots)
        self.max_series = int(max_series)
        self._clock = clock
        self._entries: deque[_Entry] = deque(maxlen=self.max_snapshots)
        self._schemas: OrderedDict[Schema, Schema] = OrderedDict()
        self._lock = threading.Lock()
        self.dropped_series = 0  # total series dropped by the max_series cap
        self.appended = 0

    def __len__(self) -> int:
        return len(self._entries)

    def append(self, snapshot: Snapshot) -> int:
        """Store ``snapshot``; returns how many of its series the ``max_series`` cap dropped."""
        samples = snapshot.samples
        dropped = max(0, len(samples) - self.max_series)
        if dropped:
            keys = tuple(samples)[: self.max_series]
            values = np.fromiter((samples[k] for k in keys), dtype=float, count=len(keys))
        else:
            keys = tuple(samples)
            values = np.fromiter(samples.values(), dtype=float, count=len(keys))
        with self._lock:
            schema = self._intern(keys)
            entries = self._entries
            if entries and snapshot.ts < entries[-1].ts:
                raise ValueError(f"snapshot at {snapshot.ts} is older than the newest stored ({entries[-1].ts})")
            entries.append(_Entry(float(snapshot.ts), schema, values))
            horizon = snapshot.ts - self.retention_seconds
            while entries and entries[0].ts < horizon:
                entries.popleft()
            self.dropped_series += dropped
            self.appended += 1
        return dropped

    def _intern(self, keys: Schema) -> Schema:
        schema = self._schemas.get(keys)
        if schema is None:
            schema = keys
            self._schemas[keys] = keys
            if len(self._schemas) > self._SCHEMA_CACHE:
                self._schemas.popitem(last=False)
        else:
            self._schemas.move_to_end(keys)
        return schema

    def latest(self) -> Snapshot | None:
        with self._lock:
            if not self._entries:
                return None
            entry = self._entries[-1]
        return Snapshot(entry.ts, dict(zip(entry.schema, entry.values.tolist(), strict=True)))

    def window(self, seconds: float, now: float | None = None) -> Window:
        """The snapshots of the last ``seconds`` before ``now``, as columns.

        ``now`` defaults to the clock, or to the newest snapshot if that is later (a clock that
        stepped back must not hide the snapshots taken before the step).
        """
        selected = []
        with self._lock:
            end = now
            if end is None:
                end = self._clock()
                if self._entries and self._entries[-1].ts > end:
                    end = self._entries[-1].ts
            start = end - seconds
            for entry in reversed(self._entries):  # newest first: stop at the window's start
                if entry.ts < start:
                    break
                if entry.ts <= end:
                    selected.append(entry)
        selected.reverse()
        return _columns(selected)

    def snapshots(self) -> list[Snapshot]:
        with self._lock:
            entries = list(self._entries)
        return [Snapshot(e.ts, dict(zip(e.schema, e.values.tolist(), strict=True))) for e in entries]


def _columns(entries: list[_Entry]) -> Window:
    if not entries:
        return Window.empty()
    timestamps = np.fromiter((e.ts for e in entries), dtype=float, count=len(entries))
    schemas: dict[int, Schema] = {}
    for e in entries:
        schemas.setdefault(id(e.schema), e.schema)
    if len(schemas) == 1:
        (schema,) = schemas.values()
        matrix = np.stack([e.values for e in entries], axis=1) if schema else np.empty((0, len(entries)))
        return Window(timestamps, dict(zip(schema, matrix, strict=True)))

    # Several schemas (a series appeared or vanished): scatter each entry into the union.
    index: dict[SeriesKey, int] = {}
    positions: dict[int, np.ndarray] = {}
    for sid, schema in schemas.items():
        positions[sid] = np.fromiter(
            (index.setdefault(k, len(index)) for k in schema), dtype=np.intp, count=len(schema)
        )
    matrix = np.full((len(index), len(entries)), np.nan)
    for col, e in enumerate(entries):
        matrix[positions[id(e.schema)], col] = e.values
    return Window(timestamps, dict(zip(index, matrix, strict=True)))
