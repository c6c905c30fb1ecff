"""Samples and windows: the data that flows from collectors to the store, the rules and the API.

A *series* is a sample name plus its labels (``SeriesKey``), exactly as in an exposition:
histograms are flat ``_bucket{le=..}``/``_sum``/``_count`` series. A ``Snapshot`` is everything
one collection cycle produced at one instant. A ``Window`` is a run of snapshots laid out as
columns (one float array per series, NaN where a series was absent), which is what the rules
evaluate and what ``GET /api/v1/window`` serves.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Labels = tuple[tuple[str, str], ...]  # sorted by label name
SeriesKey = tuple[str, Labels]


def labels_of(mapping: Mapping[str, str] | None = None, **kw: str) -> Labels:
    """Canonical (sorted, hashable) labels from a mapping and/or keywords."""
    merged = dict(mapping or {})
    merged.update(kw)
    return tuple(sorted((str(k), str(v)) for k, v in merged.items()))


def series_key(name: str, labels: Mapping[str, str] | Labels | None = None) -> SeriesKey:
    if labels is None:
        return (name, ())
    if isinstance(labels, tuple):
        return (name, labels)
    return (name, labels_of(labels))


def format_series(key: SeriesKey) -> str:
    """``name{a="1",b="2"}`` (Prometheus text form), for messages and tests."""
    name, labels = key
    if not labels:
        return name
    inner = ",".join(f'{k}="{v}"' for k, v in labels)
    return f"{name}{{{inner}}}"


@dataclass
class Snapshot:
    """All samples of one collection cycle, taken at ``ts`` (Unix seconds)."""

    ts: float
    samples: dict[SeriesKey, float] = field(default_factory=dict)

    def add(self, name: str, value: float, labels: Mapping[str, str] | Labels | None = None) -> None:
        self.samples[series_key(name, labels)] = float(value)


class Window:
    """Columnar run of snapshots: ``timestamps`` (n,) and one (n,) float array per series."""

    __slots__ = ("series", "timestamps")

    def __init__(self, timestamps: np.ndarray, series: dict[SeriesKey, np.ndarray]):
        self.timestamps = np.asarray(timestamps, dtype=float)
        self.series = series
        for key, values in series.items():
            if len(values) != len(self.timestamps):
                raise ValueError(
                    f"series {format_series(key)} has {len(values)} values for {len(self.timestamps)} timestamps"
                )

    @classmethod
    def empty(cls) -> Window:
        return cls(np.empty(0), {})

    @classmethod
    def from_snapshots(cls, snapshots: Iterable[Snapshot]) -> Window:
        snaps = sorted(snapshots, key=lambda s: s.ts)
        n = len(snaps)
        ts = np.fromiter((s.ts for s in snaps), dtype=float, count=n)
        columns: dict[SeriesKey, np.ndarray] = {}
        for i, snap in enumerate(snaps):
            for key, value in snap.samples.items():
                col = columns.get(key)
                if col is None:
                    col = np.full(n, np.nan)
                    columns[key] = col
                col[i] = value
        return cls(ts, columns)

    def __len__(self) -> int:
        return len(self.timestamps)

    @property
    def start(self) -> float:
        return float(self.timestamps[0]) if len(self) else math.nan

    @property
    def end(self) -> float:
        return float(self.timestamps[-1]) if len(self) else math.nan

    def select(self, name: str, **label_filter: str) -> dict[Labels, np.ndarray]:
        """All series named ``name`` whose labels include ``label_filter``, keyed by labels."""
        out: dict[Labels, np.ndarray] = {}
        for (n, labels), values in self.series.items():
            if n != name:
                continue
            if label_filter:
                d = dict(labels)
                if any(d.get(k) != v for k, v in label_filter.items()):
                    continue
            out[labels] = values
        return out

    def slice(self, start: float, end: float) -> Window:
        """The snapshots with ``start <= ts <= end``."""
        mask = (self.timestamps >= start) & (self.timestamps <= end)
        return Window(self.timestamps[mask], {k: v[mask] for k, v in self.series.items() if np.any(~np.isnan(v[mask]))})

    def snapshots(self) -> Iterator[Snapshot]:
        for i, ts in enumerate(self.timestamps):
            snap = Snapshot(float(ts))
            for key, values in self.series.items():
                v = values[i]
                if not math.isnan(v):
                    snap.samples[key] = float(v)
            yield snap

    def to_json(self) -> dict[str, Any]:
        """The ``/api/v1/window`` payload: columns, ``null`` where a series was absent."""
        return {
            "timestamps": [float(t) for t in self.timestamps],
            "series": [
                {
                    "name": name,
                    "labels": dict(labels),
                    "values": [None if math.isnan(v) else float(v) for v in values],
                }
                for (name, labels), values in sorted(self.series.items())
            ],
        }

    @classmethod
    def from_json(cls, payload: Mapping[str, Any]) -> Window:
        """Inverse of ``to_json``; raises ``ValueError`` on a malformed payload."""
        try:
            ts = np.asarray(payload["timestamps"], dtype=float)
            series = {}
            for item in payload["series"]:
                values = np.asarray(item["values"], dtype=float)  # None -> NaN
                series[series_key(item["name"], dict(item.get("labels") or {}))] = values
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a kvdoctor window payload: {exc}") from None
        return cls(ts, series)
