"""Prometheus text exposition (format 0.0.4) of canonical samples, rendered fast.

``ExpositionRenderer.render(keys, values)`` turns one cycle's series into the bytes ``/metrics``
serves. HELP and TYPE come from ``rules/signals.py``; histograms are grouped per label set with
their buckets in ``le`` order followed by ``_sum`` and ``_count``, exactly as the engine exposed
them; counters keep their ``_total`` names.

The layout of the page (headers, sample names, escaped labels) depends only on the set of series,
which rarely changes between cycles, so it is compiled once into a ``%``-format template with one
slot per value and cached per schema; a cycle then costs one ``str %`` and one ``encode``.
"""

from __future__ import annotations

import math
import re
from collections import OrderedDict
from collections.abc import Sequence

from kvdoctor.rules.signals import Kind, signal_for_series
from kvdoctor.rules.textformat import HISTOGRAM_PROMETHEUS_ORDER, escape_help, format_value, le_order, series_text
from kvdoctor.rules.window import SeriesKey

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

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


__all__ = ["CONTENT_TYPE", "ExpositionRenderer", "compile_plan", "render_samples"]
