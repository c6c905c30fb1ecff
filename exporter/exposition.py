"""Prometheus text exposition (format 0.0.4) of canonical samples, rendered fast.

``ExpositionRenderer.render(keys, values)`` turns one cycle's series into the bytes ``/metrics``
serves. HELP and TYPE come from ``signals/vocabulary.py``; histograms are grouped per label set with
their buckets in ``le`` order followed by ``_sum`` and ``_count``, exactly as the engine exposed
them; counters keep their ``_total`` names.

The layout of the page (headers, sample names, escaped labels) depends only on the set of series,
which rarely changes between cycles, so it is compiled once into a ``%``-format template with one
slot per value and cached per schema; a cycle then costs one ``str %`` and one ``encode``.

A scraper whose ``Accept`` asks for ``application/openmetrics-text`` (Prometheus does) gets
OpenMetrics 1.0.0 instead (``MetricsPages``): the same samples, counter families named without
``_total``, ``unknown`` for untyped, quotes escaped in HELP, and ``# EOF``. It is converted from the
rendered page at most once per cycle, and only when someone asks for it.
"""

from __future__ import annotations

import math
import re
from collections import OrderedDict
from collections.abc import Callable, Sequence

from kvdoctor.signals.textformat import (
    CONTENT_TYPE,
    HISTOGRAM_PROMETHEUS_ORDER,
    OPENMETRICS_CONTENT_TYPE,
    escape_help,
    format_value,
    le_order,
    series_text,
)
from kvdoctor.signals.vocabulary import Kind, signal_for_series
from kvdoctor.signals.window import SeriesKey

_OPENMETRICS_VERSIONS = ("", "1.0.0", "0.0.1")  # 0.0.1 is the draft of 1.0.0: served 1.0.0, as prometheus_client does

_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


class _Plan:
    __slots__ = ("order", "skipped", "template")

    def __init__(self, template: str, order: list[int], skipped: int):
        self.template = template  # the whole page with one %s per value
        self.order = order  # value index for each %s, in page order
        self.skipped = skipped  # series left out (invalid names)


def compile_plan(keys: Sequence[SeriesKey]) -> _Plan:
    """Lay out the page for ``keys``: families sorted by name, histogram series grouped."""
    families: dict[str, list[tuple[tuple, int, str, tuple]]] = {}
    kinds: dict[str, str] = {}
    helps: dict[str, str] = {}
    skipped = 0
    for index, (name, labels) in enumerate(keys):
        if not _METRIC_NAME.match(name) or any(not _LABEL_NAME.match(k) for k, _ in labels):
            skipped += 1
            continue
        signal = signal_for_series(name)
        if signal is None:
            family, kind, help_text, sort_key = name, "untyped", None, labels
        elif signal.kind is Kind.HISTOGRAM:
            family, kind, help_text = signal.name, "histogram", signal.help
            suffix = name[len(signal.name) :]
            base = tuple(kv for kv in labels if kv[0] != "le")
            le = next((v for k, v in labels if k == "le"), "")
            sort_key = (base, HISTOGRAM_PROMETHEUS_ORDER.get(suffix, 3), le_order(le) if suffix == "_bucket" else 0.0)
        else:
            family, kind, help_text, sort_key = signal.name, signal.kind.value, signal.help, labels
        families.setdefault(family, []).append((sort_key, index, name, labels))
        kinds[family] = kind
        if help_text is not None:
            helps[family] = help_text

    pieces: list[str] = []
    order: list[int] = []
    for family in sorted(families):
        if family in helps:
            pieces.append(f"# HELP {family} {escape_help(helps[family])}\n")
        pieces.append(f"# TYPE {family} {kinds[family]}\n")
        for _, index, name, labels in sorted(families[family], key=lambda row: row[0]):
            pieces.append(series_text(name, labels).replace("%", "%%") + " %s\n")
            order.append(index)
    return _Plan("".join(pieces), order, skipped)


class ExpositionRenderer:
    """Renders series to exposition bytes, caching the page layout per set of series."""

    def __init__(self, cache_size: int = 8):
        self._plans: OrderedDict[tuple, _Plan] = OrderedDict()
        self._cache_size = cache_size
        self._last_keys: tuple | None = None
        self._last_plan: _Plan | None = None
        self.last_skipped = 0

    def render(self, keys: tuple[SeriesKey, ...], values: Sequence[float]) -> bytes:
        # Same series as last time (the usual case): tuple == short-cuts on identical elements.
        if keys == self._last_keys:
            plan = self._last_plan
        else:
            plan = self._plans.get(keys)
            if plan is None:
                plan = compile_plan(keys)
                self._plans[keys] = plan
                if len(self._plans) > self._cache_size:
                    self._plans.popitem(last=False)
            else:
                self._plans.move_to_end(keys)
            self._last_keys, self._last_plan = keys, plan
        self.last_skipped = plan.skipped
        if hasattr(values, "tolist"):  # numpy: repr(np.float64) is not a plain number
            values = values.tolist()
        ordered = [float(values[i]) for i in plan.order]
        fmt = repr if all(map(math.isfinite, ordered)) else format_value
        text = plan.template % tuple(map(fmt, ordered))
        return text.encode()


def render_samples(samples: dict[SeriesKey, float]) -> bytes:
    """One-off rendering of a samples dict (tests, tools)."""
    return ExpositionRenderer().render(tuple(samples), list(samples.values()))


def wants_openmetrics(accept: str) -> bool:
    """Whether an ``Accept`` value prefers OpenMetrics: ``application/openmetrics-text`` (version
    1.0.0, 0.0.1 or none) with a q-value above 0 and at least the one of the classic text format."""
    openmetrics = classic = 0.0
    for item in accept.split(","):
        media, *params = item.split(";")
        media = media.strip().lower()
        q, version = 1.0, ""
        for param in params:
            name, _, value = param.partition("=")
            name, value = name.strip().lower(), value.strip().strip('"')
            if name == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
            elif name == "version":
                version = value
        if media == "application/openmetrics-text" and version in _OPENMETRICS_VERSIONS:
            openmetrics = max(openmetrics, q)
        elif media in ("text/plain", "text/*", "*/*"):
            classic = max(classic, q)
    return openmetrics > 0 and openmetrics >= classic


def to_openmetrics(page: bytes) -> bytes:
    """A classic text page (as ``ExpositionRenderer`` writes it) as OpenMetrics 1.0.0 text."""
    out: list[bytes] = []
    position, size = 0, len(page)
    while position < size:  # at a line start; label values never hold a newline, so "\n#" starts a comment
        if page[position] != 0x23:  # "#"
            found = page.find(b"\n#", position)
            end = size if found < 0 else found + 1
            out.append(page[position:end])
            position = end
            continue
        end = page.find(b"\n", position)
        end = size if end < 0 else end + 1
        following = page[end : page.find(b"\n", end)] if end < size else b""
        out.append(_openmetrics_comment(page[position:end].rstrip(b"\n"), following))
        position = end
    if out and out[-1] and not out[-1].endswith(b"\n"):
        out.append(b"\n")
    out.append(b"# EOF\n")
    return b"".join(out)


def _openmetrics_comment(line: bytes, following: bytes) -> bytes:
    """One ``# HELP`` or ``# TYPE`` line in OpenMetrics (a HELP line reads the kind from the TYPE
    line after it); any other comment is dropped, OpenMetrics allows none."""
    parts = line.split(b" ", 3)
    if len(parts) < 4 or parts[1] not in (b"HELP", b"TYPE"):
        return b""
    name, rest = parts[2], parts[3]
    if parts[1] == b"TYPE":
        kind = rest.strip()
    else:
        next_parts = following.split(b" ")
        kind = next_parts[3].strip() if next_parts[:3] == [b"#", b"TYPE", name] and len(next_parts) == 4 else b""
    if kind == b"counter" and name.endswith(b"_total"):
        name = name[: -len(b"_total")]
    elif kind in (b"counter", b"untyped", b""):  # a counter without _total cannot be an OpenMetrics counter
        kind = b"unknown"
    if parts[1] == b"TYPE":
        return b"# TYPE %s %s\n" % (name, kind)
    return b"# HELP %s %s\n" % (name, rest.replace(b'"', b'\\"'))


class MetricsPages:
    """``/metrics`` in the format the scraper asks for, from the runtime's classic page: the
    OpenMetrics conversion is made once per page and kept with it."""

    def __init__(self, classic: Callable[[], bytes]):
        self._classic = classic
        self._converted: tuple[bytes, bytes] | None = None  # (classic page, its OpenMetrics)
        self._accepts: dict[bytes, bool] = {}
        self._classic_type = CONTENT_TYPE.encode()
        self._openmetrics_type = OPENMETRICS_CONTENT_TYPE.encode()

    def openmetrics(self) -> bytes:
        page, converted = self._classic(), self._converted
        if converted is not None and converted[0] is page:
            return converted[1]
        text = to_openmetrics(page)
        self._converted = (page, text)
        return text

    def negotiate(self, accept: bytes) -> tuple[bytes, bytes]:
        """(content type, body) for a request's ``Accept`` value (empty: classic text)."""
        if not accept:
            return self._classic_type, self._classic()
        wanted = self._accepts.get(accept)
        if wanted is None:
            if len(self._accepts) > 64:  # scrapers send one Accept value each; bound odd clients
                self._accepts.clear()
            wanted = self._accepts[accept] = wants_openmetrics(accept.decode("latin-1"))
        if wanted:
            return self._openmetrics_type, self.openmetrics()
        return self._classic_type, self._classic()


__all__ = [
    "ExpositionRenderer",
    "MetricsPages",
    "compile_plan",
    "render_samples",
    "to_openmetrics",
    "wants_openmetrics",
]
