"""Read a ``Window`` of canonical ``kvdoctor_*`` series from a Prometheus HTTP API.

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

Every failure is a ``PrometheusSourceError`` with one line: unreachable, too slow, an HTTP error,
a selector Prometheus rejects, an answer that is not Prometheus', no matching samples, or a
selector matching more than one pod (the decision tree judges one engine at a time).
"""

from __future__ import annotations

import json
import math
import re
import time
from typing import Any

import httpx
import numpy as np

from kvdoctor.rules.signals import SIGNALS
from kvdoctor.rules.window import SeriesKey, Window, labels_of

__all__ = [
    "MAX_POINTS",
    "MAX_RAW_SECONDS",
    "PrometheusSource",
    "PrometheusSourceError",
    "default_step",
    "parse_selector",
]

DEFAULT_TIMEOUT_SECONDS = 10.0
MAX_POINTS = 1000  # range queries: at most this many steps per series
MAX_RAW_SECONDS = 3600  # longer windows are read with a range query instead of raw samples
MAX_BODY_BYTES = 256 * 1024 * 1024  # a bigger answer is refused, not parsed
LOOKBACK_SECONDS = 300  # Prometheus' default lookback delta: an instant query sees samples this old

# Names whose newest sample tells where the data ends (histogram buckets add nothing to _count).
_HEARTBEAT_NAMES = tuple(sorted(n for s in SIGNALS.values() for n in s.series_names if not n.endswith("_bucket")))
_NAME_MATCHER = '__name__=~"kvdoctor_.+"'
_MATCHER_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*')


class PrometheusSourceError(Exception):
    """Prometheus could not give the window; the message is one line saying why."""


def parse_selector(selector: str | None) -> str:
    """The label matchers of ``selector`` (``{pod="x"}``, ``pod="x"`` or empty) as ``a="b",...``.

    A metric name is refused: the source picks the ``kvdoctor_*`` series itself.
    """
    text = (selector or "").strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1].strip()
    elif text.startswith("{") or text.endswith("}") or "{" in text:
        raise ValueError(f"bad selector {selector!r}: give label matchers only, e.g. '{{pod=\"vllm-0\"}}'")
    if not text:
        return ""
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
        matchers.append(f'{m.group(1)}{m.group(2)}"{m.group(3)}"')
        pos = m.end()
        if pos < len(text):
            if text[pos] != ",":
                raise ValueError(f"bad selector {selector!r}: matchers must be separated by commas")
            pos += 1
    return ",".join(matchers)


def default_step(seconds: float, interval: float | None = None) -> float:
    """A range query's step: the exporter interval, or seconds / MAX_POINTS when that is coarser."""
    return max(float(interval or 0.0), seconds / MAX_POINTS, 0.001)


class PrometheusSource:
    """Canonical windows from one Prometheus (``url``) for the series matching ``selector``."""

    def __init__(
        self,
        url: str,
        selector: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        client: httpx.Client | None = None,
    ):
        if not re.match(r"https?://[^/\s]+", url or ""):
            raise PrometheusSourceError(f"--prometheus needs an http(s) URL, got {url!r}")
        try:
            self.matchers = parse_selector(selector)
        except ValueError as exc:
            raise PrometheusSourceError(str(exc)) from None
        self.url = url.rstrip("/")
        self.selector = "{" + self.matchers + "}"
        self.timeout = float(timeout)
        self._client = client or httpx.Client(timeout=self.timeout, follow_redirects=True)
        self._owns_client = client is None

    @property
    def series_selector(self) -> str:
        """Every ``kvdoctor_*`` series the selector matches, as a PromQL vector selector."""
        return "{" + ",".join(m for m in (_NAME_MATCHER, self.matchers) if m) + "}"

    # ------------------------------------------------------------------------------ queries
    def newest_sample_time(self, at: float | None = None) -> float:
        """The timestamp of the newest matching sample at or before ``at`` (default: now), looking
        back ``LOOKBACK_SECONDS`` as an instant query does."""
        at = time.time() if at is None else at
        result = self._get("query", {"query": self._newest_expression(), "time": _ts(at)})
        try:
            values = [float(r["value"][1]) for r in _vector(result)]
        except (KeyError, IndexError, TypeError, ValueError):
            raise PrometheusSourceError(
                f"unexpected Prometheus answer from {self.url} to the newest-sample query: "
                f"{' '.join(str(result).split())[:80]}"
            ) from None
        if not values or math.isnan(values[0]):
            raise PrometheusSourceError(
                f"no kvdoctor_* series match {self.selector} at {self.url} in the {LOOKBACK_SECONDS // 60} minutes "
                f"before {_iso(at)} (for older data give --at)"
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
            raise PrometheusSourceError(f"the window must be positive, got {seconds!r} s")
        end = self.newest_sample_time() if at is None else float(at)
        start = end - seconds
        if step is None and seconds > MAX_RAW_SECONDS:
            step = default_step(seconds)
        if step is None:
            rng = int(math.ceil(seconds)) + 1  # a little wider than the window, then cut exactly here
            result = self._get("query", {"query": f"{self.series_selector}[{rng}s]", "time": _ts(end)})
            window = _matrix_window(result, raw=True).slice(start, end)
        else:
            if not step > 0:
                raise PrometheusSourceError(f"the step must be positive, got {step!r} s")
            if seconds / step > 11000:  # Prometheus refuses more points per series than this
                raise PrometheusSourceError(
                    f"a {seconds:g} s window at a {step:g} s step is over Prometheus' "
                    "11,000 points per series: raise the step"
                )
            result = self._get(
                "query_range",
                {"query": self.series_selector, "start": _ts(start), "end": _ts(end), "step": f"{step:g}"},
            )
            window = _matrix_window(result, raw=False)
        if not len(window) or not window.series:
            raise PrometheusSourceError(
                f"no kvdoctor_* samples match {self.selector} at {self.url} between {_iso(start)} and {_iso(end)}"
            )
        _check_one_target(window, self.selector)
        return window

    # --------------------------------------------------------------------------------- HTTP
    def _get(self, path: str, params: dict[str, str]) -> Any:
        url = f"{self.url}/api/v1/{path}"
        try:
            # POST (form-encoded), which the query endpoints accept, keeps long expressions out of the URL
            # httpx's timeout bounds each read, not the answer: read the body against one deadline.
            deadline = time.monotonic() + self.timeout
            with self._client.stream("POST", url, data=params, timeout=self.timeout) as response:
                chunks: list[bytes] = []
                size = 0
                for chunk in response.iter_bytes():
                    size += len(chunk)
                    if size > MAX_BODY_BYTES:
                        raise PrometheusSourceError(
                            f"Prometheus at {self.url} sent an answer over "
                            f"{MAX_BODY_BYTES // (1024 * 1024)} MiB: narrow the selector "
                            "or the window"
                        )
                    chunks.append(chunk)
                    if time.monotonic() > deadline:
                        raise PrometheusSourceError(
                            f"Prometheus at {self.url} did not finish answering within {self.timeout:g} s"
                        )
            raw = b"".join(chunks)
        except httpx.TimeoutException:
            raise PrometheusSourceError(f"Prometheus at {self.url} did not answer within {self.timeout:g} s") from None
        except httpx.ConnectError as exc:
            why = "connection refused" if "refused" in str(exc).lower() else (str(exc) or type(exc).__name__)
            raise PrometheusSourceError(f"cannot reach Prometheus at {self.url}: {why}") from None
        except httpx.HTTPError as exc:
            raise PrometheusSourceError(f"Prometheus at {self.url}: {type(exc).__name__}: {exc}") from None
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict) or body.get("status") not in ("success", "error"):
            if response.status_code >= 400:
                raise PrometheusSourceError(
                    f"Prometheus at {self.url} answered HTTP {response.status_code} {response.reason_phrase}".rstrip()
                )
            raise PrometheusSourceError(
                f"{self.url} does not answer like a Prometheus HTTP API (GET /api/v1/{path} gave no Prometheus JSON)"
            )
        if body["status"] == "error":
            error = " ".join(str(body.get("error") or "").split())
            if body.get("errorType") == "bad_data" or response.status_code == 400:
                raise PrometheusSourceError(f"Prometheus rejected the query for selector {self.selector}: {error}")
            raise PrometheusSourceError(
                f"Prometheus at {self.url} answered HTTP {response.status_code}: "
                f"{body.get('errorType') or 'error'}: {error}"
            )
        return body.get("data") or {}

    def close(self) -> None:
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> PrometheusSource:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _vector(data: Any) -> list[dict]:
    if not isinstance(data, dict) or data.get("resultType") not in ("vector", "scalar"):
        raise PrometheusSourceError(f"unexpected Prometheus answer: {str(data)[:80]}")
    result = data.get("result") or []
    if data["resultType"] == "scalar":
        return [{"metric": {}, "value": result}]
    return result


def _matrix_window(data: Any, raw: bool) -> Window:
    """A Window from a matrix result: one column per series, rows at the union of timestamps."""
    if not isinstance(data, dict) or data.get("resultType") != "matrix":
        raise PrometheusSourceError(f"unexpected Prometheus answer: {str(data)[:80]}")
    rows: list[tuple[SeriesKey, np.ndarray, np.ndarray]] = []
    for item in data.get("result") or []:
        metric = dict(item.get("metric") or {})
        name = metric.pop("__name__", None)
        if not name:
            continue
        points = item.get("values") or []
        if not points:
            continue
        ts = np.array([float(p[0]) for p in points])
        values = np.array([_float(p[1]) for p in points])
        rows.append(((name, labels_of(metric)), ts, values))
    if not rows:
        return Window.empty()
    timestamps = np.unique(np.concatenate([ts for _, ts, _ in rows]))
    series: dict[SeriesKey, np.ndarray] = {}
    for key, ts, values in rows:
        column = np.full(len(timestamps), np.nan)
        column[np.searchsorted(timestamps, ts)] = values
        series[key] = column
    return Window(timestamps, series)


def _check_one_target(window: Window, selector: str) -> None:
    """The decision tree judges one engine and its GPUs: refuse a selector matching several pods."""
    for label in ("pod", "instance"):
        values = sorted({dict(labels).get(label) for _, labels in window.series} - {None})
        if len(values) > 1:
            shown = ", ".join(values[:4]) + (", ..." if len(values) > 4 else "")
            raise PrometheusSourceError(
                f"selector {selector} matches {len(values)} {label}s ({shown}): narrow it to one, "
                f"e.g. --selector '{{{label}=\"{values[0]}\"}}'"
            )
        if values:
            return


def _float(text: Any) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return math.nan


def _ts(t: float) -> str:
    return f"{t:.3f}"


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
