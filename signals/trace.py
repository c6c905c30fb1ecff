"""Traces: recorded samples as OpenMetrics text, replayable through the same code as live scraping.

A trace is an OpenMetrics text document with a timestamp (Unix **seconds**) on every sample and a
final ``# EOF`` line: the format ``promtool tsdb create-blocks-from openmetrics`` backfills into
Prometheus, so the same file can be replayed by ``kvdoctor diagnose --replay`` and loaded into a
Prometheus for the dashboard or ``diagnose --prometheus``. It may hold

- canonical ``kvdoctor_*`` families (what ``kvdoctor record`` writes from an exporter), which pass
  through unchanged, and/or
- raw engine families (``vllm:*``, ``sglang:*``, ...; also dcgm-exporter's ``DCGM_FI_*``), which are
  normalised snapshot by snapshot through the engine adapters, exactly as the engine collector
  normalises a live scrape. The engine is recognised from the family names (``engine=`` forces one).

Reading groups samples by timestamp into snapshots (all samples of one scrape share its
timestamp) and returns a ``Window``. Writing lays families out one after the other (OpenMetrics
does not allow a family to be interleaved with another), each series' points in time order, a
histogram's buckets, ``_count`` and ``_sum`` together per timestamp; timestamps are written to the
millisecond, which is what Prometheus stores.

Pure text in, text out: reading and writing files is ``kvdoctor.sources.traces``, and the raw
families are normalised by a ``RawNormaliser`` the caller passes (the exporter's engine adapters,
``kvdoctor.exporter.replay``), so the format knows no engine.

Anything that is not a usable trace raises ``TraceError`` with one line saying what is wrong:
empty, not OpenMetrics, truncated (no final ``# EOF``), a sample without a timestamp, timestamps
in milliseconds, timestamps going backwards within a series, nothing kvdoctor can read.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from kvdoctor.signals.textformat import HISTOGRAM_OPENMETRICS_ORDER, escape_help, format_value, le_order, series_text
from kvdoctor.signals.textparse import ExpositionError, is_openmetrics, iter_samples
from kvdoctor.signals.vocabulary import Kind, signal_for_series
from kvdoctor.signals.window import Labels, SeriesKey, Window, format_series

__all__ = [
    "CANONICAL_PREFIX",
    "RawNormaliser",
    "RawSample",
    "Trace",
    "TraceError",
    "format_raw_captures",
    "format_window",
    "parse_trace",
]

CANONICAL_PREFIX = "kvdoctor_"
# Unix seconds beyond this (year 5138) are taken for milliseconds written by mistake.
_MAX_SECONDS = 1e11
_SAMPLE_SUFFIXES = ("_total", "_created", "_bucket", "_count", "_sum", "_info", "_gcount", "_gsum")
_TYPE_RE = re.compile(r"# (TYPE|HELP) (\S+)(?: (.*))?\Z")


class TraceError(ValueError):
    """The file is not a usable trace; the message is one line saying why."""


RawSample = tuple[str, dict[str, str], float]  # (sample name, labels, value) of one raw scrape


class RawNormaliser(Protocol):
    """Turns raw engine / dcgm-exporter families into canonical samples, one scrape at a time."""

    def select(self, names: set[str]) -> frozenset[str]:
        """The raw family and sample names it reads from a trace that holds ``names`` (empty:
        nothing it knows); it also settles which engine adapter the trace needs."""
        ...

    def normalise(self, raw: list[RawSample]) -> dict[SeriesKey, float]:
        """One scrape's raw samples as canonical samples."""
        ...

    @property
    def engine(self) -> str | None:
        """The engine adapter ``select`` settled on (None: dcgm-exporter families only, or none)."""
        ...

    @property
    def known(self) -> str:
        """What it can read, for an error message (``vllm, sglang, ...``)."""
        ...


@dataclass(frozen=True)
class Trace:
    """A trace read back: the window of canonical series and how it was obtained."""

    window: Window
    engine: str | None  # the adapter that normalised raw engine families (None: canonical only)
    raw_families: bool  # raw engine / dcgm families were normalised
    canonical_families: bool  # kvdoctor_* families were present


# ------------------------------------------------------------------------------------- reading


def parse_trace(text: str, normaliser: RawNormaliser | None = None, source: str = "trace") -> Trace:
    """The window a trace's text holds, its raw engine families normalised by ``normaliser``.

    Without a normaliser only the canonical ``kvdoctor_*`` families are read.
    """
    if not text.strip():
        raise TraceError(f"{source} is empty")
    _check_openmetrics(text, source)
    names = _names(text)

    canonical_names = {n for n in names if n.startswith(CANONICAL_PREFIX)}
    raw_wanted = normaliser.select(names) if normaliser is not None else frozenset()
    if not canonical_names and not raw_wanted:
        found = sorted(names)
        shown = ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")
        known = (
            f"no family of a known engine ({normaliser.known})" if normaliser is not None else "no raw family read here"
        )
        raise TraceError(f"{source} holds no kvdoctor_* family and {known}{': only ' + shown if shown else ''}")
    wanted = canonical_names | raw_wanted

    canonical: dict[SeriesKey, tuple[list[float], list[float]]] = {}  # key -> (timestamps, values)
    raw_by_ts: dict[float, list[RawSample]] = {}
    raw_times: dict[SeriesKey, list[float]] = {}
    try:
        for key, labels, value, ts in _trace_samples(text, frozenset(wanted)):
            if ts is None:
                raise TraceError(
                    f"{source}: sample {format_series(key)} has no timestamp (a trace needs one on every sample)"
                )
            if key[0].startswith(CANONICAL_PREFIX):
                points = canonical.get(key)
                if points is None:
                    points = canonical[key] = ([], [])
                points[0].append(ts)
                points[1].append(value)
            else:
                raw_by_ts.setdefault(ts, []).append((key[0], labels, value))
                raw_times.setdefault(key, []).append(ts)
    except ExpositionError as exc:
        raise TraceError(f"{source} is not an OpenMetrics trace: {exc}") from None
    if not canonical and not raw_by_ts:
        raise TraceError(f"{source} holds no samples kvdoctor can use")
    for key, times in list(raw_times.items()) + [(k, p[0]) for k, p in canonical.items()]:
        _check_timestamps(source, key, times)

    # Raw families: one scrape per timestamp, normalised as the engine collector does live.
    columns: dict[SeriesKey, tuple[list[float], list[float]]] = {}
    for ts in sorted(raw_by_ts):
        samples = normaliser.normalise(raw_by_ts[ts]) if normaliser is not None else {}
        for key, value in samples.items():
            points = columns.get(key)
            if points is None:
                points = columns[key] = ([], [])
            points[0].append(ts)
            points[1].append(value)
    for key, (times, values) in canonical.items():
        if key in columns:  # the same canonical series from raw families too: the canonical samples win
            merged = dict(zip(*columns[key], strict=True))
            merged.update(zip(times, values, strict=True))
            times, values = sorted(merged), [merged[t] for t in sorted(merged)]
        columns[key] = (times, values)
    if not columns:
        raise TraceError(f"{source} holds no sample of a signal kvdoctor uses")
    engine = normaliser.engine if normaliser is not None and raw_by_ts else None
    return Trace(_window_of(columns), engine, bool(raw_by_ts), bool(canonical))


def _window_of(columns: Mapping[SeriesKey, tuple[list[float], list[float]]]) -> Window:
    """A Window from per-series (timestamps, values): rows at the union of all timestamps."""
    stamps = {key: np.asarray(times, dtype=float) for key, (times, _) in columns.items()}
    timestamps = np.unique(np.concatenate(list(stamps.values())))
    series = {}
    for key, (_, values) in columns.items():
        column = np.full(len(timestamps), np.nan)
        column[np.searchsorted(timestamps, stamps[key])] = values
        series[key] = column
    return Window(timestamps, series)


# known.get()'s answer for a series text not seen yet (compared by identity)
_UNSEEN: tuple[SeriesKey, dict[str, str]] = (("", ()), {})
_SAMPLE_NAME_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)", re.MULTILINE)
_DECLARED_NAME_RE = re.compile(r"^# (?:TYPE|HELP) ([a-zA-Z_:][a-zA-Z0-9_:]*)", re.MULTILINE)


def _names(text: str) -> set[str]:
    """Declared family names and sample names, for recognising the engine (``family_names`` of
    textparse finds the same names but also parses; here every line is parsed later anyway)."""
    return set(_SAMPLE_NAME_RE.findall(text)) | set(_DECLARED_NAME_RE.findall(text))


def _trace_samples(
    text: str, wanted: frozenset[str]
) -> Iterator[tuple[SeriesKey, dict[str, str], float, float | None]]:
    """``(series key, labels, value, timestamp)`` for the wanted samples of an OpenMetrics trace.

    A trace repeats the same series text (``name{labels}``) once per snapshot, so each distinct
    text is parsed once, by ``textparse.iter_samples`` (the exposition parser), and every later
    line with that text costs a split and two ``float()``s. A line the shortcut cannot vouch for
    (a new series, an exemplar, blanks where they are not expected) goes through the parser.
    """
    known: dict[str, tuple[SeriesKey, dict[str, str]] | None] = {}  # series text -> key and labels, None: unwanted
    for number, line in enumerate(text.splitlines(), 1):
        if not line or line[0] == "#":
            if line == "# EOF":
                return
            continue
        parts = line.rsplit(" ", 2)
        if len(parts) == 3:
            series = known.get(parts[0], _UNSEEN)
            if series is None:
                continue
            if series is not _UNSEEN and "_" not in parts[1] and "_" not in parts[2]:
                try:
                    yield series[0], series[1], float(parts[1]), float(parts[2])
                    continue
                except ValueError:
                    pass  # let the parser say what is wrong with it
        try:
            samples = list(iter_samples(line + "\n", openmetrics=True))
        except ExpositionError as exc:
            raise ExpositionError(re.sub(r"^line \d+:", f"line {number}:", str(exc))) from None
        for name, labels, value, ts in samples:
            key = (name, tuple(sorted(labels.items())))
            entry = (key, labels) if name in wanted else None
            # the shortcut is safe for this text once the parser read the same three fields from it
            # (not with a '#' on the line: an exemplar's value and time could pass for the sample's)
            if (
                len(parts) == 3
                and "#" not in line
                and ts is not None
                and _same(parts[1], value)
                and _same(parts[2], ts)
            ):
                known[parts[0]] = entry
            if entry is not None:
                yield key, labels, value, ts


def _same(token: str, number: float) -> bool:
    try:
        parsed = float(token)
    except ValueError:
        return False
    return parsed == number or (math.isnan(parsed) and math.isnan(number))


def _check_openmetrics(text: str, source: str) -> None:
    """``TraceError`` unless the text ends with ``# EOF``: truncated, or not OpenMetrics at all."""
    if is_openmetrics(text):
        return
    lines = text.rstrip("\r\n").split("\n")
    try:
        for _ in iter_samples(text, openmetrics=True):
            pass
    except ExpositionError as exc:
        where = re.match(r"line (\d+):", str(exc))
        if where and len(lines) > 1 and int(where.group(1)) >= len(lines):
            raise TraceError(f"{source} is truncated: its last line is cut off and there is no '# EOF' line") from None
        raise TraceError(f"{source} is not an OpenMetrics trace: {exc}") from None
    if "# EOF" in (line.strip() for line in lines):
        raise TraceError(f"{source} has text after its '# EOF' line")
    raise TraceError(f"{source} is truncated or not OpenMetrics: it does not end with a '# EOF' line")


def _check_timestamps(source: str, key: SeriesKey, times: list[float]) -> None:
    """Timestamps of one series: finite Unix seconds, strictly increasing in file order."""
    ts = np.asarray(times, dtype=float)
    bad = ~np.isfinite(ts)
    if bad.any():
        raise TraceError(f"{source}: sample {format_series(key)} has timestamp {ts[bad][0]}")
    if np.abs(ts).max() >= _MAX_SECONDS:
        raise TraceError(
            f"{source}: sample {format_series(key)} has timestamp {np.abs(ts).max():.0f}, which looks "
            "like milliseconds; OpenMetrics traces use seconds"
        )
    steps = np.diff(ts)
    if len(steps) and steps.min() <= 0:
        i = int(np.argmax(steps <= 0))
        how = "repeats" if steps[i] == 0 else "goes back from"
        raise TraceError(
            f"{source}: series {format_series(key)} {how} timestamp {ts[i]:.3f} to {ts[i + 1]:.3f} "
            "(timestamps must increase within each series)"
        )


# ------------------------------------------------------------------------------------- writing


def format_window(window: Window) -> str:
    """A window of canonical series as a trace (OpenMetrics text, ``# EOF`` terminated)."""
    families: dict[str, tuple[str, str | None, list[SeriesKey]]] = {}
    for name, labels in window.series:
        signal = signal_for_series(name)
        if signal is None:
            family, kind, help_text = name, "unknown", None
        elif signal.kind is Kind.COUNTER and name.endswith("_total"):
            family, kind, help_text = name[: -len("_total")], "counter", signal.help
        else:
            family, kind, help_text = signal.name, signal.kind.value, signal.help
        families.setdefault(family, (kind, help_text, []))[2].append((name, labels))

    timestamps = [_format_ts(t) for t in window.timestamps]
    out: list[str] = []
    for family in sorted(families):
        kind, help_text, keys = families[family]
        if help_text:
            out.append(f"# HELP {family} {escape_help(help_text, openmetrics=True)}\n")
        out.append(f"# TYPE {family} {kind}\n")
        if kind == "histogram":
            _write_histogram(out, family, keys, window, timestamps)
        else:
            for key in sorted(keys):
                text = series_text(*key)
                for value, ts in zip(window.series[key], timestamps, strict=True):
                    if not math.isnan(value):
                        out.append(f"{text} {format_value(float(value))} {ts}\n")
    out.append("# EOF\n")
    return "".join(out)


def _write_histogram(out: list[str], family: str, keys: list[SeriesKey], window: Window, timestamps: list[str]) -> None:
    """One histogram family: per label set (without ``le``), per timestamp, buckets then count, sum."""
    groups: dict[Labels, list[tuple[tuple[int, float], str, Labels]]] = {}
    for name, labels in keys:
        suffix = name[len(family) :]
        base = tuple(kv for kv in labels if kv[0] != "le")
        le = next((v for k, v in labels if k == "le"), "")
        order = (HISTOGRAM_OPENMETRICS_ORDER.get(suffix, 3), le_order(le) if suffix == "_bucket" else 0.0)
        groups.setdefault(base, []).append((order, name, labels))
    for base in sorted(groups):
        members = sorted(groups[base])
        texts = [series_text(name, labels) for _, name, labels in members]
        columns = [window.series[(name, labels)] for _, name, labels in members]
        for i, ts in enumerate(timestamps):
            for text, column in zip(texts, columns, strict=True):
                value = column[i]
                if not math.isnan(value):
                    out.append(f"{text} {format_value(float(value))} {ts}\n")


def format_raw_captures(captures: Iterable[tuple[float, str]]) -> str:
    """Raw exposition pages (e.g. a real engine's /metrics), each with the time it was taken, as
    one trace. Family metadata (HELP, TYPE) comes from the pages; Prometheus-text counters declared
    with their ``_total`` name become OpenMetrics counter families without it."""
    meta: dict[str, dict[str, str]] = {}  # family as declared -> {"type": ..., "help": ...}
    points: dict[SeriesKey, list[tuple[float, float]]] = {}
    first_seen: dict[str, int] = {}
    last_ts: float | None = None
    for ts, text in captures:
        ts = float(ts)
        if not math.isfinite(ts) or abs(ts) >= _MAX_SECONDS:
            raise TraceError(f"capture timestamp {ts!r} is not Unix seconds")
        if last_ts is not None and ts <= last_ts:
            raise TraceError(f"capture timestamps must increase: {ts:.3f} after {last_ts:.3f}")
        last_ts = ts
        _read_metadata(text, meta)
        try:
            for name, labels, value, _own_ts in iter_samples(text):
                key = (name, tuple(sorted(labels.items())))
                points.setdefault(key, []).append((ts, value))
                first_seen.setdefault(name, len(first_seen))
        except ExpositionError as exc:
            raise TraceError(f"capture at {ts:.3f} is not an exposition: {exc}") from None

    # sample name -> the declared family it belongs to
    def family_of(name: str) -> str:
        if name in meta:
            return name
        for suffix in _SAMPLE_SUFFIXES:
            if name.endswith(suffix) and name[: -len(suffix)] in meta:
                return name[: -len(suffix)]
        return name

    families: dict[str, list[SeriesKey]] = {}
    for key in sorted(points, key=lambda k: (first_seen[k[0]], k)):
        families.setdefault(family_of(key[0]), []).append(key)

    out: list[str] = []
    for declared, keys in families.items():
        info = meta.get(declared, {})
        kind = info.get("type", "unknown")
        if kind == "untyped":
            kind = "unknown"
        family = declared[: -len("_total")] if kind == "counter" and declared.endswith("_total") else declared
        if info.get("help"):
            out.append(f"# HELP {family} {info['help']}\n")
        out.append(f"# TYPE {family} {kind}\n")
        if kind == "histogram":
            by_base: dict[Labels, list[tuple[tuple[int, float], SeriesKey]]] = {}
            for name, label_set in keys:
                suffix = name[len(declared) :]
                le = next((v for k, v in label_set if k == "le"), "")
                order = (HISTOGRAM_OPENMETRICS_ORDER.get(suffix, 3), le_order(le) if suffix == "_bucket" else 0.0)
                base_labels = tuple(kv for kv in label_set if kv[0] != "le")
                by_base.setdefault(base_labels, []).append((order, (name, label_set)))
            for base in by_base:
                members = [key for _, key in sorted(by_base[base])]
                merged: dict[float, list[str]] = {}
                for key in members:
                    text = series_text(*key)
                    for ts, value in points[key]:
                        merged.setdefault(ts, []).append(f"{text} {format_value(value)} {_format_ts(ts)}\n")
                for ts in sorted(merged):
                    out.extend(merged[ts])
        else:
            for key in keys:
                text = series_text(*key)
                out.extend(f"{text} {format_value(value)} {_format_ts(ts)}\n" for ts, value in points[key])
    out.append("# EOF\n")
    return "".join(out)


def _read_metadata(text: str, meta: dict[str, dict[str, str]]) -> None:
    for line in text.splitlines():
        if not line.startswith("# "):
            continue
        m = _TYPE_RE.match(line.rstrip())
        if m is None or m.group(2).startswith('"'):
            continue
        kind, name, rest = m.group(1), m.group(2), (m.group(3) or "").strip()
        entry = meta.setdefault(name, {})
        key = "type" if kind == "TYPE" else "help"
        entry.setdefault(key, rest)


# ------------------------------------------------------------------------------------- helpers


def _format_ts(ts: float) -> str:
    return f"{float(ts):.3f}"
