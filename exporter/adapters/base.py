"""Engine adapters: one mapping table per engine, from its /metrics families to canonical signals.

The tables are data (``MetricMap`` rows); ``EngineAdapter.normalise`` is the only code that
applies them. A family no row asks for is skipped, never an error. Renamed families are listed
newest first in ``sources``; the first one present in a scrape wins, so an engine exposing both
the old and the new name during a deprecation window is not counted twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from kvdoctor.rules.signals import SIGNALS, Kind
from kvdoctor.rules.window import SeriesKey

# (sample name, labels as a dict, value) -- what the exposition parser yields for one sample
RawSample = tuple[str, Mapping[str, str], float]

# A source family that needs its own label match: ("vllm:kv_offload_total_bytes_total",
# {"transfer_type": "CPU_to_GPU"}). Plain strings in ``MetricMap.sources`` match on ``match`` only.
Source = tuple[str, Mapping[str, str]]

HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
MAX_CACHED_KEYS = 1024  # canonical keys an adapter remembers (~1 KB each; a vLLM page needs ~60)


@dataclass(frozen=True)
class MetricMap:
    """One row: engine family (or its older names) -> one canonical signal.

    sources        engine family names, newest first (for counters, the ``_total`` sample name;
                   for histograms, the family name without suffix); an entry may be a
                   ``(name, {label: value})`` pair when only that name needs a label match
                   (a renamed family that moved a label into its name)
    target         canonical signal name (rules/signals.py)
    match          only samples whose labels include these
    rename_labels  engine label -> canonical label (e.g. ``{"source": "tier"}``)
    const_labels   labels added to every output sample (e.g. ``{"direction": "to_gpu"}``)
    scale          multiply the value (e.g. MiB -> bytes, percent -> ratio)
    value          optional function (labels, value) -> value or None (None drops the sample),
                   for info-style metrics whose value lives in labels
    times          optional ``(sample name, match)``: multiply by the value of that sample (e.g.
                   KV blocks x tokens per block); it must carry the same kept and engine labels
                   as the sample being mapped, and a sample without such a partner is dropped
    requires       sample names of which at least one must be in the scrape for the row to apply
                   (e.g. prefix queries = processed + cached only where the cached counter exists)
    """

    sources: tuple[str | Source, ...]
    target: str
    match: Mapping[str, str] = field(default_factory=dict)
    rename_labels: Mapping[str, str] = field(default_factory=dict)
    const_labels: Mapping[str, str] = field(default_factory=dict)
    scale: float = 1.0
    value: Callable[[Mapping[str, str], float], float | None] | None = None
    times: Source | None = None
    requires: tuple[str, ...] = ()

    def __post_init__(self):
        if self.target not in SIGNALS:
            raise ValueError(f"unknown canonical signal {self.target!r}")
        if not self.sources or isinstance(self.sources, str):
            raise ValueError(f"{self.target}: sources must be a non-empty tuple of names")

    def source_list(self) -> tuple[Source, ...]:
        """``sources`` as (name, labels to match) pairs, newest first; ``match`` applies to all."""
        return tuple(
            (src, self.match) if isinstance(src, str) else (src[0], {**self.match, **src[1]}) for src in self.sources
        )


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

    def __post_init__(self):
        # Worked out once: each row's kind, suffixes and sources; and the canonical key of every
        # (row, suffix, extra labels, engine labels) seen, so a scrape repeating the last one's
        # series builds no label dicts and sorts nothing.
        plan = []
        for m in self.maps:
            kind = SIGNALS[m.target].kind
            plan.append(
                (m, kind is Kind.GAUGE, HISTOGRAM_SUFFIXES if kind is Kind.HISTOGRAM else ("",), m.source_list())
            )
        object.__setattr__(self, "_plan", tuple(plan))
        object.__setattr__(self, "_keys", {})

    def wanted_names(self) -> frozenset[str]:
        """Every sample name the table can use (the parser skips all others cheaply)."""
        names: set[str] = set()
        for m in self.maps:
            kind = SIGNALS[m.target].kind
            if m.times is not None:
                names.add(m.times[0])
            names.update(m.requires)
            for src, _ in m.source_list():
                if kind is Kind.HISTOGRAM:
                    names.update(src + s for s in HISTOGRAM_SUFFIXES)
                else:
                    names.add(src)
        return frozenset(names)

    def normalise(
        self, samples: Iterable[RawSample], extra_labels: Mapping[str, str] | None = None
    ) -> dict[SeriesKey, float]:
        """Apply the table to parsed samples; returns canonical series -> value."""
        by_name: dict[str, list[tuple[Mapping[str, str], float]]] = {}
        for name, labels, value in samples:
            by_name.setdefault(name, []).append((labels, value))

        out: dict[SeriesKey, float] = {}
        extra = tuple((extra_labels or {}).items())
        keys = self._keys
        if len(keys) >= MAX_CACHED_KEYS:  # label churn (new models, an exploding label): start over
            keys.clear()
        for row, (m, is_gauge, suffixes, sources) in enumerate(self._plan):
            if m.requires and not any(r in by_name for r in m.requires):
                continue
            for src, match in sources:
                if not any(src + s in by_name for s in suffixes):
                    continue
                for suffix in suffixes:
                    for labels, value in by_name.get(src + suffix, ()):
                        if match and any(labels.get(k) != v for k, v in match.items()):
                            continue
                        if m.value is not None:
                            v = m.value(labels, value)
                            if v is None:
                                continue
                        else:
                            v = value * m.scale
                        if m.times is not None:
                            factor = self._partner(by_name, m.times, labels)
                            if factor is None:
                                continue
                            v *= factor
                        cache_key = (row, suffix, extra, tuple(labels.items()))
                        key = keys.get(cache_key)
                        if key is None:
                            key = self._output_key(m, suffix, labels, extra_labels)
                            if len(keys) < MAX_CACHED_KEYS:
                                keys[cache_key] = key
                        # Several engine series folded onto one canonical series: counters and
                        # histograms add up, gauges keep the last one.
                        out[key] = v if is_gauge else out.get(key, 0.0) + v
                break  # newest present name wins
        return out

    def _output_key(
        self, m: MetricMap, suffix: str, labels: Mapping[str, str], extra_labels: Mapping[str, str] | None
    ) -> SeriesKey:
        out_labels = {"engine": self.name, **(extra_labels or {})}
        for k in self.keep_labels:
            if k in labels:
                out_labels[k] = labels[k]
        for src_label, dst_label in {**self.engine_labels, **m.rename_labels}.items():
            if src_label in labels:
                out_labels[dst_label] = labels[src_label]
        if suffix == "_bucket" and "le" in labels:
            out_labels["le"] = labels["le"]
        out_labels.update(m.const_labels)
        return (m.target + suffix, tuple(sorted(out_labels.items())))

    def _partner(self, by_name, times: Source, labels: Mapping[str, str]) -> float | None:
        """The value of the ``times`` sample sharing the identifying labels of ``labels``."""
        name, match = times
        ident = [k for k in (*self.keep_labels, *self.engine_labels) if k in labels]
        for other, value in by_name.get(name, ()):
            if all(other.get(k) == v for k, v in match.items()) and all(other.get(k) == labels[k] for k in ident):
                return value
        return None
