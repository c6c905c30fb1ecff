"""Engine adapters: one mapping table per engine, from its /metrics families to canonical signals.

The tables are data (``MetricMap`` rows); ``EngineAdapter.normalise`` is the only code that
applies them. A family no row asks for is skipped, never an error. Renamed families are listed
newest first in ``sources``; the first one with a matching sample in a scrape wins, so an engine
exposing both the old and the new name during a deprecation window is not counted twice.

Ratios are checked at run time: a row whose canonical signal is a ratio (unit ``ratio``) yields
values in 0..1 only. Its ``unit`` says how the engine publishes it (``ratio``, ``percent``, or
``percent_or_ratio`` for a family that some generations publish as a percent); a value outside
0..1 after conversion (vLLM V0 writes -1 for "no data", a percent read as a ratio) is dropped,
never clipped into a wrong number.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.units import RATIO  # 0..1 as published
from kvdoctor.signals.vocabulary import SIGNALS, Kind
from kvdoctor.signals.window import SeriesKey

# (sample name, labels as a dict, value) -- what the exposition parser yields for one sample
RawSample = tuple[str, Mapping[str, str], float]

# A source family that needs its own label match: ("vllm:kv_offload_total_bytes_total",
# {"transfer_type": "CPU_to_GPU"}). Plain strings in ``MetricMap.sources`` match on ``match`` only.
Source = tuple[str, Mapping[str, str]]
_ByName = Mapping[str, list[tuple[Mapping[str, str], float]]]  # samples by name: (labels, value)
_Found = tuple[str, Mapping[str, str], float]  # (suffix, labels, canonical value) of one sample

HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
MAX_CACHED_KEYS = 1024  # canonical keys an adapter remembers (~1 KB each; a vLLM page needs ~60)

# How a row's engine family states a ratio (``MetricMap.unit``).
PERCENT = "percent"  # 0..100 in every generation
PERCENT_OR_RATIO = "percent_or_ratio"  # a percent in some generations, a ratio in others
_UNITS = ("", RATIO, PERCENT, PERCENT_OR_RATIO)
# The tier label for prefix hits an engine cannot place in a tier (vLLM's own spelling): tokens a
# KV connector such as LMCache supplied. A KV-tier adapter on the same page names them.
UNATTRIBUTED_TIER = "external_unspecified"
_RATIO_SLACK = 1e-9  # float noise above 1.0 that still reads as a full pool


@dataclass(frozen=True)
class Ratio:
    """A source computed from two published parts: ``part / whole`` of the samples that share the
    adapter's identifying labels (model, DP rank), for engines that publish used and total but
    not their ratio (Triton's 2023 TensorRT-LLM backend: used and max KV blocks). A sample
    without a partner, or with a whole of 0 or less, yields nothing."""

    part: Source
    whole: Source


@dataclass(frozen=True)
class MetricMap:
    """One row: engine family (or its older names) -> one canonical signal.

    sources        engine family names, newest first (for counters, the ``_total`` sample name;
                   for histograms, the family name without suffix); an entry may be a
                   ``(name, {label: value})`` pair when only that name needs a label match
                   (a renamed family that moved a label into its name), or a ``Ratio`` of two
                   parts; the first entry with a matching sample on the page wins
    target         canonical signal name (signals/vocabulary.py)
    match          only samples whose labels include these
    rename_labels  engine label -> canonical label (e.g. ``{"source": "tier"}``)
    const_labels   labels added to every output sample (e.g. ``{"direction": "to_gpu"}``)
    scale          multiply the value (e.g. MiB -> bytes)
    value          optional function (labels, value) -> value or None (None drops the sample),
                   for info-style metrics whose value lives in labels
    times          optional ``(sample name, match)``: multiply by the value of that sample (e.g.
                   KV blocks x tokens per block); it must carry the same kept and engine labels
                   as the sample being mapped, and a sample without such a partner is dropped
    requires       sample names of which at least one must be in the scrape for the row to apply
                   (e.g. prefix queries = processed + cached only where the cached counter exists)
    unless         sample names any of which in the scrape turns the row off (e.g. a tier split
                   derived from totals, only where the engine publishes no split of its own)
    unit           how the engine publishes a ratio target: ``ratio`` (0..1, the default for a
                   ratio target), ``percent`` (divided by 100), or ``percent_or_ratio`` (a
                   family some generations publish as a percent: read as a percent when the
                   sample carries one of ``percent_labels`` -- the label spelling of the
                   generation that published percents -- or when its value is above 1)
    percent_labels label names that mark the percent generation of a ``percent_or_ratio`` family
    """

    sources: tuple[str | Source | Ratio, ...]
    target: str
    match: Mapping[str, str] = field(default_factory=dict)
    rename_labels: Mapping[str, str] = field(default_factory=dict)
    const_labels: Mapping[str, str] = field(default_factory=dict)
    scale: float = 1.0
    value: Callable[[Mapping[str, str], float], float | None] | None = None
    times: Source | None = None
    requires: tuple[str, ...] = ()
    unless: tuple[str, ...] = ()
    unit: str = ""
    percent_labels: tuple[str, ...] = ()

    def __post_init__(self):
        if self.target not in SIGNALS:
            raise ValueError(f"unknown canonical signal {self.target!r}")
        if not self.sources or isinstance(self.sources, str):
            raise ValueError(f"{self.target}: sources must be a non-empty tuple of names")
        if self.unit not in _UNITS:
            raise ValueError(f"{self.target}: unit must be one of {_UNITS[1:]}, got {self.unit!r}")
        if self.unit and SIGNALS[self.target].unit != RATIO:
            raise ValueError(f"{self.target}: unit applies to ratio signals only")
        if self.percent_labels and self.unit != PERCENT_OR_RATIO:
            raise ValueError(f"{self.target}: percent_labels needs unit={PERCENT_OR_RATIO!r}")

    def source_list(self) -> tuple[Source | Ratio, ...]:
        """``sources`` as (name, labels to match) pairs or ``Ratio``s, newest first; ``match``
        applies to all."""
        out: list[Source | Ratio] = []
        for src in self.sources:
            if isinstance(src, Ratio):
                out.append(
                    Ratio((src.part[0], {**self.match, **src.part[1]}), (src.whole[0], {**self.match, **src.whole[1]}))
                )
            elif isinstance(src, str):
                out.append((src, self.match))
            else:
                out.append((src[0], {**self.match, **src[1]}))
        return tuple(out)

    def to_canonical(self, labels: Mapping[str, str], value: float) -> float | None:
        """The engine value in the canonical unit, or None where it cannot be one (a ratio
        outside 0..1 after conversion, NaN)."""
        if self.unit == PERCENT or (
            self.unit == PERCENT_OR_RATIO
            and (value > 1.0 + _RATIO_SLACK or any(k in labels for k in self.percent_labels))
        ):
            value = value / 100.0
        if SIGNALS[self.target].unit != RATIO:
            return value
        if math.isnan(value) or value < 0.0 or value > 1.0 + _RATIO_SLACK:
            return None
        return min(value, 1.0)


@dataclass(frozen=True)
class JsonEndpoint:
    """A JSON endpoint next to the engine's /metrics that its adapter reads too (llama.cpp's
    ``/slots`` and ``/props``).

    ``read`` turns the parsed document into raw samples under names of the adapter's own (rows
    of its table map them like any /metrics family). Only the object keys in ``keys`` survive
    parsing: every other value (prompt text, generated text, settings) is dropped as soon as its
    object is parsed, so it is never stored, logged or exported.

    name            short, in partial-error reasons (``slots`` -> ``slots_http_501``)
    path            where it is, next to /metrics (``/slots``)
    keys            the object keys ``read`` needs
    provides        canonical signals only this endpoint gives (missing while it is unavailable)
    only_without    endpoints that make this one unnecessary: it is asked only when they gave nothing
    max_body_bytes  its size cap
    """

    name: str
    path: str
    read: Callable[[Any], list[RawSample]]
    keys: frozenset[str]
    provides: tuple[str, ...] = ()
    only_without: tuple[str, ...] = ()
    max_body_bytes: int = 4 * 1024 * 1024

    def samples(self, text: str) -> list[RawSample]:
        """The raw samples of one answer; ``ValueError`` when it is not the JSON ``read`` expects."""
        keep = self.keys
        doc = json.loads(text, object_pairs_hook=lambda pairs: {k: v for k, v in pairs if k in keep})
        return self.read(doc)


def kv_transfers(to_gpu: str, from_gpu: str, tier: str) -> tuple[MetricMap, MetricMap]:
    """The two counters of KV bytes moved between the GPU and ``tier``: into the GPU, out of it."""
    return (
        MetricMap((to_gpu,), S.KV_TRANSFER_BYTES, const_labels={"direction": "to_gpu", "tier": tier}),
        MetricMap((from_gpu,), S.KV_TRANSFER_BYTES, const_labels={"direction": "from_gpu", "tier": tier}),
    )


# The signals an engine adapter may provide: every engine signal but the collector's engine_info and
# the SLO counters the exporter derives from the engine's histograms.
ENGINE_SIGNALS = tuple(
    name
    for name, signal in SIGNALS.items()
    if signal.labels[: len(S.ENGINE_LABELS)] == S.ENGINE_LABELS and name != S.ENGINE_INFO and name not in S.SLO_COUNTERS
)
# What a KV tier beside the engine (LMCache, Dynamo KVBM) may provide.
TIER_SIGNALS = (S.PREFIX_CACHE_HITS_BY_TIER, S.KV_TRANSFER_BYTES)


def _matches(labels: Mapping[str, str], match: Mapping[str, str]) -> bool:
    return not match or all(labels.get(k) == v for k, v in match.items())


@dataclass(frozen=True)
class EngineAdapter:
    """An engine's mapping table plus how to recognise it.

    name            the ``engine`` label value and the ``--engine`` choice
    detect          family names that identify the engine on their own (any one suffices)
    maps            the table
    keep_labels     engine labels carried into canonical samples (after ``rename_labels``)
    engine_labels   engine label -> canonical label applied to every sample (e.g. vLLM's
                    data-parallel ``engine="0"`` label becomes ``dp_rank``; SGLang's 2024
                    ``name`` label becomes ``model_name``)
    covers          the signals this kind of adapter answers for: every engine signal, or a KV
                    tier's (``TIER_SIGNALS``); ``cannot_provide`` is those its table and
                    endpoints do not provide (README / --help)
    prefixes        family-name prefixes only this engine uses (``vllm:``): with the families
                    the table reads, they recognise a page that carries only some of the
                    engine's families (``recognises``)
    legacy_only     mapped signals that only older generations of the engine publish (vLLM V0's
                    swapped requests): absent from a current engine's page by design
    endpoints       JSON endpoints next to /metrics the engine collector reads too (``JsonEndpoint``)
    """

    name: str
    detect: tuple[str, ...]
    maps: tuple[MetricMap, ...]
    keep_labels: tuple[str, ...] = ("model_name",)
    engine_labels: Mapping[str, str] = field(default_factory=dict)
    prefixes: tuple[str, ...] = ()
    legacy_only: tuple[str, ...] = ()
    endpoints: tuple[JsonEndpoint, ...] = ()
    covers: tuple[str, ...] = ENGINE_SIGNALS

    def __post_init__(self):
        # Worked out once: each row's kind, suffixes and sources; and the canonical key of every
        # (row, suffix, extra labels, engine labels) seen, so a scrape repeating the last one's
        # series builds no label dicts and sorts nothing.
        plan = []
        for m in self.maps:
            kind = SIGNALS[m.target].kind
            suffixes = HISTOGRAM_SUFFIXES if kind is Kind.HISTOGRAM else ("",)
            converts = bool(m.unit) or SIGNALS[m.target].unit == RATIO
            plan.append((m, kind is Kind.GAUGE, converts, suffixes, m.source_list()))
        object.__setattr__(self, "_plan", tuple(plan))
        object.__setattr__(self, "_keys", {})
        object.__setattr__(self, "_families", frozenset(self.source_names()) | self.wanted_names())

    @property
    def cannot_provide(self) -> tuple[str, ...]:
        """The signals it answers for (``covers``) that its table and endpoints do not provide."""
        provided = {m.target for m in self.maps} | {s for ep in self.endpoints for s in ep.provides}
        return tuple(name for name in self.covers if name not in provided)

    def source_names(self) -> frozenset[str]:
        """The family names the table reads (histograms without their suffixes)."""
        names: set[str] = set()
        for m in self.maps:
            for src in m.source_list():
                names.update((src.part[0], src.whole[0]) if isinstance(src, Ratio) else (src[0],))
        return frozenset(names)

    def wanted_names(self) -> frozenset[str]:
        """Every sample name the table can use (the parser skips all others cheaply)."""
        names: set[str] = set()
        for m in self.maps:
            kind = SIGNALS[m.target].kind
            if m.times is not None:
                names.add(m.times[0])
            names.update(m.requires)
            names.update(m.unless)
            for src in m.source_list():
                if isinstance(src, Ratio):
                    names.update((src.part[0], src.whole[0]))
                elif kind is Kind.HISTOGRAM:
                    names.update(src[0] + s for s in HISTOGRAM_SUFFIXES)
                else:
                    names.add(src[0])
        return frozenset(names)

    def recognises(self, names: Iterable[str]) -> int:
        """How surely a page with these family and sample names is this engine's: 2 when one of
        its identifying families is there, 1 when only some other family it reads (or one with
        its prefix) is, 0 when nothing of it is."""
        present = names if isinstance(names, (set, frozenset)) else set(names)
        if any(n in present for n in self.detect):
            return 2
        families = self._families  # type: ignore[attr-defined]
        prefixes = self.prefixes
        if any(n in families or (prefixes and n.startswith(prefixes)) for n in present):
            return 1
        return 0

    def normalise(
        self, samples: Iterable[RawSample], extra_labels: Mapping[str, str] | None = None
    ) -> dict[SeriesKey, float]:
        """Apply the table to parsed samples; returns canonical series -> value."""
        by_name: dict[str, list[tuple[Mapping[str, str], float]]] = {}
        for name, labels, value in samples:
            by_name.setdefault(name, []).append((labels, value))

        out: dict[SeriesKey, float] = {}
        extra = tuple((extra_labels or {}).items())
        keys = self._keys  # type: ignore[attr-defined]
        if len(keys) >= MAX_CACHED_KEYS:  # label churn (new models, an exploding label): start over
            keys.clear()

        def emit(row: int, m: MetricMap, is_gauge: bool, suffix: str, labels: Mapping[str, str], v: float) -> None:
            cache_key = (row, suffix, extra, tuple(labels.items()))
            key = keys.get(cache_key)
            if key is None:
                key = self._output_key(m, suffix, labels, extra_labels)
                if len(keys) < MAX_CACHED_KEYS:
                    keys[cache_key] = key
            # Several engine series folded onto one canonical series: counters and histograms
            # add up, gauges keep the last one.
            out[key] = v if is_gauge else out.get(key, 0.0) + v

        for row, (m, is_gauge, converts, suffixes, sources) in enumerate(self._plan):  # type: ignore[attr-defined]
            if (m.requires and not any(r in by_name for r in m.requires)) or (
                m.unless and any(u in by_name for u in m.unless)
            ):
                continue
            for src in sources:
                if isinstance(src, Ratio):
                    found = self._ratio_values(m, src, by_name)
                else:
                    found = self._mapped_values(m, src, suffixes, converts, by_name)
                if found is None:
                    continue  # no sample of this name: the next (older) name
                for suffix, labels, v in found:
                    emit(row, m, is_gauge, suffix, labels, v)
                break  # newest present name wins
        return out

    def _ratio_values(self, m: MetricMap, src: Ratio, by_name: _ByName) -> list[_Found] | None:
        """``m``'s values from a ``Ratio`` source: part / whole of each matching part sample; None
        when no part sample matches (the next source is tried)."""
        parts = [(labels, part) for labels, part in by_name.get(src.part[0], ()) if _matches(labels, src.part[1])]
        if not parts:
            return None
        found: list[_Found] = []
        for labels, part in parts:
            whole = self._partner(by_name, src.whole, labels)
            v = m.to_canonical(labels, part / whole) if whole is not None and whole > 0 else None
            if v is not None:
                found.append(("", labels, v))
        return found

    def _mapped_values(
        self, m: MetricMap, src: Source, suffixes: tuple[str, ...], converts: bool, by_name: _ByName
    ) -> list[_Found] | None:
        """``m``'s values from one named source, each suffix of it (a histogram's _bucket, _sum,
        _count); None when no sample matches (the next source is tried)."""
        name, match = src
        matched = False
        found: list[_Found] = []
        for suffix in suffixes:
            for labels, value in by_name.get(name + suffix, ()):
                if not _matches(labels, match):
                    continue
                matched = True
                v = self._mapped(m, labels, value, converts, by_name)
                if v is not None:
                    found.append((suffix, labels, v))
        return found if matched else None

    def _mapped(
        self, m: MetricMap, labels: Mapping[str, str], value: float, converts: bool, by_name: _ByName
    ) -> float | None:
        """One sample's canonical value: ``m.value`` or ``m.scale``, times its ``times`` partner,
        then ``m.to_canonical`` where the unit converts; None drops the sample."""
        v = m.value(labels, value) if m.value is not None else value * m.scale
        if v is not None and m.times is not None:
            factor = self._partner(by_name, m.times, labels)
            v = None if factor is None else v * factor
        if v is not None and converts:
            v = m.to_canonical(labels, v)
        return v

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

    def _partner(self, by_name, other: Source, labels: Mapping[str, str]) -> float | None:
        """The value of the ``other`` sample sharing the identifying labels of ``labels``."""
        name, match = other
        ident = [k for k in (*self.keep_labels, *self.engine_labels) if k in labels]
        for candidate, value in by_name.get(name, ()):
            if _matches(candidate, match) and all(candidate.get(k) == labels[k] for k in ident):
                return value
        return None
