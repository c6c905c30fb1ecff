"""Engine adapters: one mapping table per engine, from its /metrics families to canonical signals.

The tables are data (``MetricMap`` rows); ``EngineAdapter.normalise`` is the only code that
applies them. A family no row asks for is skipped, never an error. Renamed families are listed
newest first in ``sources``; the first one present in a scrape wins, so an engine exposing both
the old and the new name during a deprecation window is not counted twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

from kvdoctor.rules.signals import SIGNALS, Kind
from kvdoctor.rules.window import Labels, SeriesKey

# (sample name, labels as a dict, value) -- what the exposition parser yields for one sample
RawSample = tuple[str, Mapping[str, str], float]

HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


@dataclass(frozen=True)
class MetricMap:
    """One row: engine family (or its older names) -> one canonical signal.

    sources        engine family names, newest first (for counters, the ``_total`` sample name;
                   for histograms, the family name without suffix)
    target         canonical signal name (rules/signals.py)
    match          only samples whose labels include these
    rename_labels  engine label -> canonical label (e.g. ``{"source": "tier"}``)
    const_labels   labels added to every output sample (e.g. ``{"direction": "to_gpu"}``)
    scale          multiply the value (e.g. MiB -> bytes, percent -> ratio)
    value          optional function (labels, value) -> value or None (None drops the sample),
                   for info-style metrics whose value lives in labels
    """

    sources: tuple[str, ...]
    target: str
    match: Mapping[str, str] = field(default_factory=dict)
    rename_labels: Mapping[str, str] = field(default_factory=dict)
    const_labels: Mapping[str, str] = field(default_factory=dict)
    scale: float = 1.0
    value: Callable[[Mapping[str, str], float], float | None] | None = None

    def __post_init__(self):
        if self.target not in SIGNALS:
            raise ValueError(f"unknown canonical signal {self.target!r}")


@dataclass(frozen=True)
class EngineAdapter:
    """An engine's mapping table plus how to recognise it.

    name            the ``engine`` label value and the ``--engine`` choice
    detect          family names whose presence identifies the engine (any one suffices)
    maps            the table
    keep_labels     engine labels carried into canonical samples (after ``rename_labels``)
    engine_labels   engine label -> canonical label applied to every sample (e.g. vLLM's
                    data-parallel ``engine="0"`` label becomes ``dp_rank``)
    cannot_provide  canonical signals this engine does not expose (README / --help)
    """

    name: str
    detect: tuple[str, ...]
    maps: tuple[MetricMap, ...]
    keep_labels: tuple[str, ...] = ("model_name",)
    engine_labels: Mapping[str, str] = field(default_factory=dict)
    cannot_provide: tuple[str, ...] = ()

    def wanted_names(self) -> frozenset[str]:
        """Every sample name the table can use (the parser skips all others cheaply)."""
        names: set[str] = set()
        for m in self.maps:
            kind = SIGNALS[m.target].kind
            for src in m.sources:
                if kind is Kind.HISTOGRAM:
                    names.update(src + s for s in HISTOGRAM_SUFFIXES)
                else:
                    names.add(src)
        return frozenset(names)

    def normalise(self, samples: Iterable[RawSample], extra_labels: Mapping[str, str] | None = None) -> dict[SeriesKey, float]:
        """Apply the table to parsed samples; returns canonical series -> value."""
        by_name: dict[str, list[tuple[Mapping[str, str], float]]] = {}
        for name, labels, value in samples:
            by_name.setdefault(name, []).append((labels, value))

        out: dict[SeriesKey, float] = {}
        base = {"engine": self.name, **(extra_labels or {})}
        for m in self.maps:
            kind = SIGNALS[m.target].kind
            suffixes = HISTOGRAM_SUFFIXES if kind is Kind.HISTOGRAM else ("",)
            for src in m.sources:
                if not any(src + s in by_name for s in suffixes):
                    continue
                for suffix in suffixes:
                    for labels, value in by_name.get(src + suffix, ()):
                        if any(labels.get(k) != v for k, v in m.match.items()):
                            continue
                        if m.value is not None:
                            v = m.value(labels, value)
                            if v is None:
                                continue
                        else:
                            v = value * m.scale
                        out_labels = dict(base)
                        for k in self.keep_labels:
                            if k in labels:
                                out_labels[k] = labels[k]
                        for src_label, dst_label in {**self.engine_labels, **m.rename_labels}.items():
                            if src_label in labels:
                                out_labels[dst_label] = labels[src_label]
                        if suffix == "_bucket" and "le" in labels:
                            out_labels["le"] = labels["le"]
                        out_labels.update(m.const_labels)
                        key = (m.target + suffix, tuple(sorted(out_labels.items())))
                        # Several engine series folded onto one canonical series: counters and
                        # histograms add up, gauges keep the last one.
                        out[key] = out.get(key, 0.0) + v if kind is not Kind.GAUGE else v
                break  # newest present name wins
        return out


def labels_tuple(d: Mapping[str, str]) -> Labels:
    return tuple(sorted(d.items()))
