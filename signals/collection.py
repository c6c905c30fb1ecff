"""The contract between a source of samples and the loop that collects it.

A collector reads one source (NVML, an engine's /metrics, dcgm-exporter, the simulator) and
returns canonical samples. Collectors may raise: the exporter's runtime wraps every call, so a
failing source never fails the scrape. "Not applicable here" (no GPU, no URL
configured) is reported with ``NotApplicable`` and is not an error. The contract lives in
``rules`` so that every package that implements a source (the exporter's collectors, the
simulated GPU) can implement it without importing the exporter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from kvdoctor.signals.window import Labels, SeriesKey


class NotApplicable(Exception):
    """The source does not exist here (no driver, no GPU, no URL): not an error."""


class SourceError(Exception):
    """A source could not be read, for a known reason: ``reason`` is a short snake_case label
    value (``timeout``, ``connection_refused``, ``http_503``...), the message one line saying
    why. The one error type of every reader of a source: the exporter's collectors, the API
    clients (``kvdoctor.sources``), the simulator."""

    def __init__(self, reason: str, message: str = ""):
        super().__init__(message or reason)
        self.reason = reason


@dataclass
class Collected:
    """What one collection produced: canonical samples plus per-part failures it isolated.

    ``partial_errors`` lists reasons for parts that failed while the rest succeeded (one GPU of
    eight lost): they are counted in ``kvdoctor_source_errors_total`` but the source stays up.
    """

    samples: dict[SeriesKey, float] = field(default_factory=dict)
    partial_errors: list[str] = field(default_factory=list)

    def add(self, name: str, value: float, labels: Labels = ()) -> None:
        self.samples[(name, labels)] = float(value)


class Collector(Protocol):
    """One source. ``collect`` returns samples or raises NotApplicable / SourceError / anything."""

    name: str

    def collect(self) -> Collected: ...

    def close(self) -> None: ...
