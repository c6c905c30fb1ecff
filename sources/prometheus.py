"""The Prometheus HTTP API: instant and range queries, and canonical windows read through them.

``PrometheusClient(url)`` asks one Prometheus (or anything with its query API: VictoriaMetrics,
Thanos, Mimir): ``query(expr, at)`` (an instant vector), ``query_series(expr, at)`` (an instant
query of a range vector: the raw samples) and ``query_range(expr, start, end, step)``. Queries are
POSTed form-encoded (long expressions stay out of the URL) and asked uncompressed.

``PrometheusSource(url, selector).window(seconds, at)`` returns the samples of every
``kvdoctor_*`` series matching the selector (label matchers such as ``{pod="vllm-0"}``) in the
``seconds`` before ``at`` (default: the newest sample):

- ``step=None`` (the default): the raw samples, as they were scraped, with one instant query of a
  range vector, ``{__name__=~"kvdoctor_.+",pod="vllm-0"}[61s]``. Each series keeps its own
  timestamps, so the window is the one the exporter had, and the one PromQL's own ``rate()`` sees:
  ``diagnose --prometheus`` then agrees with the alert rules and with ``diagnose --replay`` of the
  same samples. The window is cut locally with ``Window.slice`` (both ends included).
- ``step=S``: a range query (``/api/v1/query_range``) evaluated every ``S`` seconds, for long
  windows where the raw samples would be too many; windows over ``MAX_RAW_SECONDS`` use one
  with ``default_step``: the exporter interval when known, or ``seconds / MAX_POINTS``,
  whichever is larger.

Every failure is a ``SourceError`` with one line: unreachable, too slow, an HTTP error, a query
Prometheus rejects, an answer that is not Prometheus', no matching samples, or a selector matching
more than one pod (the decision tree judges one engine at a time).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from kvdoctor.rules.promql import MAX_POINTS_PER_SERIES
from kvdoctor.signals.collection import SourceError
from kvdoctor.signals.vocabulary import SIGNALS
from kvdoctor.signals.window import SeriesKey, Window, labels_of
from kvdoctor.sources.http import DEFAULT_MAX_BYTES, ApiClient, Closing, HttpClient, one_line

__all__ = [
    "MAX_POINTS",
    "MAX_RAW_SECONDS",
    "BadSelector",
    "PrometheusClient",
    "PrometheusSource",
    "QueryRejected",
    "RangeSeries",
    "default_step",
    "parse_matchers",
    "parse_selector",
]

QUERY_PATH = "/api/v1/query"
QUERY_RANGE_PATH = "/api/v1/query_range"
DEFAULT_TIMEOUT_SECONDS = 10.0
MAX_POINTS = 1000  # range queries: at most this many steps per series
MAX_RAW_SECONDS = 3600  # longer windows are read with a range query instead of raw samples
LOOKBACK_SECONDS = 300  # Prometheus' default lookback delta: an instant query sees samples this old
# Uncompressed: a day of history is a few MB of JSON, and Prometheus gzipping it (and us gunzipping
# it) costs more than moving the bytes between a client and a Prometheus in one cluster: a fifth
# to two fifths of a day's history fetch, measured on two cores.
HEADERS = {"Accept": "application/json", "Accept-Encoding": "identity"}

# Names whose newest sample tells where the data ends (histogram buckets add nothing to _count).
_HEARTBEAT_NAMES = tuple(sorted(n for s in SIGNALS.values() for n in s.series_names if not n.endswith("_bucket")))
_NAME_MATCHER = '__name__=~"kvdoctor_.+"'
_MATCHER_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*')

FloatArray = npt.NDArray[np.float64]


class QueryRejected(SourceError):
    """Prometheus refused the query itself (``bad_data``); ``detail`` is its reason."""

    def __init__(self, message: str, detail: str) -> None:
        super().__init__("query_rejected", message)
        self.detail = detail


class BadSelector(QueryRejected):
    """The selector is at fault, not the source: Prometheus rejected it, or it matches several pods."""


@dataclass
class RangeSeries:
    """One series of a matrix answer: its labels (``__name__`` included), timestamps and values."""

    labels: dict[str, str]
    ts: FloatArray
    values: FloatArray


class PrometheusClient(ApiClient):
    """Instant and range queries against one Prometheus HTTP API."""

    def __init__(self, url: str, timeout: float = DEFAULT_TIMEOUT_SECONDS, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        super().__init__(HttpClient(url, name="Prometheus", timeout=timeout, max_bytes=max_bytes, headers=HEADERS))

    def query(self, expr: str, at: float | None = None) -> list[tuple[dict[str, str], float]]:
        """An instant query: ``(labels, value)`` per series of the vector (one unlabelled for a scalar)."""
        data = self._data(QUERY_PATH, _instant_form(expr, at))
        kind = data.get("resultType")
        result: Any = data.get("result")
        try:
            if kind == "scalar":
                return [({}, _value(result[1]))]
            if kind != "vector":
                raise self._unexpected(QUERY_PATH, f"a {kind} where a vector was expected")
            return [(_labels(item), _value(item["value"][1])) for item in result or []]
        except (AttributeError, KeyError, IndexError, TypeError) as exc:
            raise self._malformed(QUERY_PATH, exc) from None

    def query_series(self, expr: str, at: float | None = None) -> list[RangeSeries]:
        """An instant query of a range vector (``x[60s]``): the raw samples of each series."""
        return self._matrix(QUERY_PATH, self._data(QUERY_PATH, _instant_form(expr, at)))

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[RangeSeries]:
        """A range query: each series evaluated every ``step`` seconds from ``start`` to ``end``."""
        form = {"query": expr, "start": _ts(start), "end": _ts(end), "step": f"{step:g}"}
        return self._matrix(QUERY_RANGE_PATH, self._data(QUERY_RANGE_PATH, form))

    def _data(self, path: str, form: Mapping[str, str]) -> dict[str, Any]:
        answer = self._http.post_form(path, form)
        where = self._http.where(path)
        try:
            body = answer.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or body.get("status") not in ("success", "error"):
            if answer.status != 200:
                raise self._http.status_error(answer)
            raise SourceError(
                "not_prometheus", f"{where} does not answer like a Prometheus HTTP API (no Prometheus JSON)"
            )
        if body["status"] == "error":
            error = one_line(body.get("error") or "")
            if body.get("errorType") == "bad_data" or answer.status == 400:
                raise QueryRejected(one_line(f"{where} rejected the query: {error}"), error)
            raise SourceError(
                f"http_{answer.status}",
                one_line(f"{where} answered HTTP {answer.status}: {body.get('errorType') or 'error'}: {error}"),
            )
        data = body.get("data") or {}
        if not isinstance(data, dict):
            raise self._unexpected(path, f"data is a {type(data).__name__}, not an object")
        return data

    def _matrix(self, path: str, data: dict[str, Any]) -> list[RangeSeries]:
        if data.get("resultType") != "matrix":
            raise self._unexpected(path, f"a {data.get('resultType')} where a matrix was expected")
        out = []
        try:
            for item in data.get("result") or []:
                points = item.get("values") or []
                ts = np.fromiter((float(p[0]) for p in points), dtype=np.float64, count=len(points))
                values = np.fromiter((_value(p[1]) for p in points), dtype=np.float64, count=len(points))
                out.append(RangeSeries(_labels(item), ts, values))
        except (AttributeError, KeyError, IndexError, TypeError, ValueError) as exc:
            raise self._malformed(path, exc) from None
        return out

    def _unexpected(self, path: str, what: str) -> SourceError:
        return SourceError("parse_error", one_line(f"{self._http.where(path)} sent an unexpected answer: {what}"))

    def _malformed(self, path: str, exc: Exception) -> SourceError:
        return SourceError(
            "parse_error", one_line(f"{self._http.where(path)} sent a malformed series: {type(exc).__name__}: {exc}")
        )


def parse_selector(selector: str | None) -> str:
    """The label matchers of ``selector`` (``{pod="x"}``, ``pod="x"`` or empty) as ``a="b",...``.

    A metric name is refused: the source picks the ``kvdoctor_*`` series itself.
    """
    return ",".join(f"{label}{op}{literal}" for label, op, literal in parse_matchers(selector))


def parse_matchers(selector: str | None) -> list[tuple[str, str, str]]:
    """``parse_selector``'s matchers one by one: ``(label, operator, the value's string literal as
    written, quotes included)``;
    ValueError for a selector that is not label matchers."""
    text = (selector or "").strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1].strip()
    elif text.startswith("{") or text.endswith("}") or "{" in text:
        raise ValueError(f"bad selector {selector!r}: give label matchers only, e.g. '{{pod=\"vllm-0\"}}'")
    if not text:
        return []
    matchers = []
    pos = 0
    while pos < len(text):
        m = _MATCHER_RE.match(text, pos)
        if m is None:
            raise ValueError(
                f'bad selector {selector!r}: expected label matchers such as pod="vllm-0" '
                f"(operators = != =~ !~, values in double quotes)"
            )
        if m.group(1) == "__name__":
            raise ValueError(f"bad selector {selector!r}: do not match __name__, kvdoctor selects its own series")
        matchers.append((m.group(1), m.group(2), f'"{m.group(3)}"'))
        pos = m.end()
        if pos < len(text):
            if text[pos] != ",":
                raise ValueError(f"bad selector {selector!r}: matchers must be separated by commas")
            pos += 1
    return matchers


def default_step(seconds: float, interval: float | None = None) -> float:
    """A range query's step: the exporter interval, or seconds / MAX_POINTS when that is coarser."""
    return max(float(interval or 0.0), seconds / MAX_POINTS, 0.001)


class PrometheusSource(Closing):
    """Canonical windows from one Prometheus (``url``) for the series matching ``selector``."""

    def __init__(
        self,
        url: str,
        selector: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        client: PrometheusClient | None = None,
    ) -> None:
        self._client = client or PrometheusClient(url, timeout)
        self._owns_client = client is None
        try:
            self.matchers = parse_selector(selector)
        except ValueError as exc:
            self.close()
            raise SourceError("bad_selector", str(exc)) from None
        self.url = self._client.url
        self.selector = "{" + self.matchers + "}"

    @property
    def series_selector(self) -> str:
        """Every ``kvdoctor_*`` series the selector matches, as a PromQL vector selector."""
        return "{" + ",".join(m for m in (_NAME_MATCHER, self.matchers) if m) + "}"

    # ------------------------------------------------------------------------------ queries
    def newest_sample_time(self, at: float | None = None) -> float:
        """The timestamp of the newest matching sample at or before ``at`` (default: now), looking
        back ``LOOKBACK_SECONDS`` as an instant query does."""
        at = time.time() if at is None else at
        with self._naming_the_selector():
            values = [value for _, value in self._client.query(self._newest_expression(), at)]
        if not values or math.isnan(values[0]):
            raise SourceError(
                "no_data",
                f"no kvdoctor_* series match {self.selector} at {self.url} in the {LOOKBACK_SECONDS // 60} minutes "
                f"before {_iso(at)} (for older data give --at)",
            )
        return values[0]

    def _newest_expression(self) -> str:
        """``max(timestamp(a{sel}) or timestamp(b{sel}) or ...)`` over the canonical signals.

        ``timestamp()`` gives a sample's own time only when applied to a plain vector selector
        (otherwise the evaluation time), and drops the metric name, so one selector over all
        ``kvdoctor_*`` names would collide; ``or`` merges the per-name results without colliding.
        """
        inner = "{" + self.matchers + "}" if self.matchers else ""
        parts = [f"timestamp({name}{inner})" for name in _HEARTBEAT_NAMES]
        return "max(" + " or ".join(parts) + ")"

    def window(self, seconds: float, at: float | None = None, step: float | None = None) -> Window:
        """The window of ``seconds`` ending at ``at`` (default: the newest sample).

        ``step=None``: the raw samples (a range query for windows over ``MAX_RAW_SECONDS``);
        ``step=S``: a range query every ``S`` seconds.
        """
        if not seconds > 0:
            raise SourceError("bad_window", f"the window must be positive, got {seconds!r} s")
        end = self.newest_sample_time() if at is None else float(at)
        start = end - seconds
        if step is None and seconds > MAX_RAW_SECONDS:
            step = default_step(seconds)
        with self._naming_the_selector():
            if step is None:
                rng = math.ceil(seconds) + 1  # a little wider than the window, then cut exactly here
                series = self._client.query_series(f"{self.series_selector}[{rng}s]", end)
                window = _series_window(series).slice(start, end)
            else:
                if not step > 0:
                    raise SourceError("bad_window", f"the step must be positive, got {step!r} s")
                if seconds / step > MAX_POINTS_PER_SERIES:
                    raise SourceError(
                        "bad_window",
                        f"a {seconds:g} s window at a {step:g} s step is over Prometheus' "
                        f"{MAX_POINTS_PER_SERIES:,} points per series: raise the step",
                    )
                window = _series_window(self._client.query_range(self.series_selector, start, end, step))
        if not len(window) or not window.series:
            raise SourceError(
                "no_data",
                f"no kvdoctor_* samples match {self.selector} at {self.url} between {_iso(start)} and {_iso(end)}",
            )
        _check_one_target(window, self.selector)
        return window

    @contextmanager
    def _naming_the_selector(self) -> Iterator[None]:
        """A rejected query is the selector's fault (kvdoctor writes the rest): say which one."""
        try:
            yield
        except QueryRejected as exc:  # still a QueryRejected: the caller's input, not an unreadable source
            message = one_line(f"Prometheus rejected the query for selector {self.selector}: {exc.detail}")
            raise BadSelector(message, exc.detail) from None

    def close(self) -> None:
        if self._owns_client:
            self._client.close()


def _series_window(series: list[RangeSeries]) -> Window:
    """A Window from matrix series: one column per series, rows at the union of their timestamps."""
    rows: list[tuple[SeriesKey, FloatArray, FloatArray]] = []
    for s in series:
        labels = dict(s.labels)
        name = labels.pop("__name__", None)
        if name and len(s.ts):
            rows.append(((name, labels_of(labels)), s.ts, s.values))
    if not rows:
        return Window.empty()
    timestamps = np.unique(np.concatenate([ts for _, ts, _ in rows]))
    columns: dict[SeriesKey, FloatArray] = {}
    for key, ts, values in rows:
        column = np.full(len(timestamps), np.nan)
        column[np.searchsorted(timestamps, ts)] = values
        columns[key] = column
    return Window(timestamps, columns)


def _check_one_target(window: Window, selector: str) -> None:
    """The decision tree judges one engine and its GPUs: refuse a selector matching several pods."""
    for label in ("pod", "instance"):
        values = sorted({value for _, labels in window.series for key, value in labels if key == label})
        if len(values) > 1:
            shown = ", ".join(values[:4]) + (", ..." if len(values) > 4 else "")
            message = (
                f"selector {selector} matches {len(values)} {label}s ({shown}): narrow it to one, "
                f"e.g. --selector '{{{label}=\"{values[0]}\"}}'"
            )
            raise BadSelector(message, message)
        if values:
            return


def _instant_form(expr: str, at: float | None) -> dict[str, str]:
    return {"query": expr} if at is None else {"query": expr, "time": _ts(at)}


def _labels(item: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in (item.get("metric") or {}).items()}


def _value(text: Any) -> float:
    """A sample value; NaN for one that is not a number (Prometheus writes NaN and ±Inf as text)."""
    try:
        return float(text)
    except (TypeError, ValueError):
        return math.nan


def _ts(t: float) -> str:
    return f"{t:.3f}"


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
