"""Writing the Prometheus text format and OpenMetrics: escaping, values, series text.

One place for what the exporter's ``/metrics`` renderer and the trace writer both write.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

# The media types of the two formats, as a server sends them.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"

# Where a histogram's samples go within one label set: buckets (by ``le``), then the rest.
HISTOGRAM_PROMETHEUS_ORDER = {"_bucket": 0, "_sum": 1, "_count": 2}
HISTOGRAM_OPENMETRICS_ORDER = {"_bucket": 0, "_count": 1, "_sum": 2}


def escape_label_value(value: str) -> str:
    """A label value as both formats write it: backslash, newline and double quote escaped."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def escape_help(text: str, openmetrics: bool = False) -> str:
    """HELP text: backslash and newline escaped; OpenMetrics escapes double quotes too."""
    escaped = text.replace("\\", "\\\\").replace("\n", "\\n")
    return escaped.replace('"', '\\"') if openmetrics else escaped


def format_value(value: float) -> str:
    """A sample value as Prometheus writes it (``+Inf``, ``-Inf``, ``NaN``, else ``repr``)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def series_text(name: str, labels: Iterable[tuple[str, str]]) -> str:
    """``name{k="v",...}``, or the bare name without labels."""
    inner = ",".join(f'{k}="{escape_label_value(str(v))}"' for k, v in labels)
    return f"{name}{{{inner}}}" if inner else name


def le_order(le: str) -> float:
    """A bucket's ``le`` as a number for sorting; anything unreadable sorts last, with ``+Inf``."""
    try:
        return float(le)
    except ValueError:
        return math.inf
