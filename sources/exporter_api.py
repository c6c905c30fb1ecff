"""The kvdoctor exporter's HTTP API: its stored window, its diagnosis, its sources' status, its /metrics.

``ExporterClient(url)`` takes the exporter as its base URL, its /metrics or one of its API paths.
Every failure is a ``SourceError`` with one line; an exporter without the window API (an engine's
own /metrics server, an older exporter) is a ``NoWindowApi``, which ``kvdoctor record`` answers by
reading /metrics instead.
"""

from __future__ import annotations

import math
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from kvdoctor.rules.context import Context, context_from_json
from kvdoctor.signals.collection import SourceError
from kvdoctor.signals.textparse import ExpositionError, iter_samples
from kvdoctor.signals.trace import CANONICAL_PREFIX
from kvdoctor.signals.window import Snapshot, Window, series_key
from kvdoctor.sources.http import DEFAULT_MAX_BYTES, ApiClient, HttpClient, one_line
from kvdoctor.sources.paths import METRICS_PATH

__all__ = [
    "DEFAULT_TIMEOUT_SECONDS",
    "DIAGNOSIS_PATH",
    "STATUS_PATH",
    "WINDOW_PATH",
    "ExporterClient",
    "NoWindowApi",
    "WindowRefused",
    "exporter_base_url",
]

WINDOW_PATH = "/api/v1/window"
DIAGNOSIS_PATH = "/api/v1/diagnosis"
STATUS_PATH = "/api/v1/status"
DEFAULT_TIMEOUT_SECONDS = 5.0


class NoWindowApi(SourceError):
    """The server answers 404 to the window API: not a kvdoctor exporter, or one without the API."""

    def __init__(self, message: str) -> None:
        super().__init__("no_window_api", message)


class WindowRefused(SourceError):
    """The exporter refused the window asked for (422): it keeps less than that. ``longest``: the
    longest window it serves (its --max-window), where its answer says (else None)."""

    def __init__(self, message: str, longest: int | None = None) -> None:
        super().__init__("window_refused", message)
        self.longest = longest


def _longest_window(answer_json: Any) -> int | None:
    """The bound a 422 answer names for ``seconds`` (FastAPI's ``detail[].ctx.le``), else None."""
    details = answer_json.get("detail") if isinstance(answer_json, dict) else None
    for detail in details if isinstance(details, list) else ():
        bound = (detail.get("ctx") or {}).get("le") if isinstance(detail, dict) else None
        if "seconds" in (detail.get("loc") or ()) and isinstance(bound, int | float) and bound >= 1:
            return int(bound)
    return None


def exporter_base_url(url: str) -> str:
    """The exporter's base URL, whether given as the base, its /metrics or one of its API paths."""
    parts = urlsplit((url or "").strip())
    path = parts.path.rstrip("/")
    for tail in (METRICS_PATH, WINDOW_PATH, DIAGNOSIS_PATH, STATUS_PATH):
        if path.endswith(tail):
            path = path[: -len(tail)]
            break
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


class ExporterClient(ApiClient):
    """The parts of a kvdoctor exporter's API that the CLI, the dashboard and the stress test read."""

    def __init__(self, url: str, timeout: float = DEFAULT_TIMEOUT_SECONDS, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        super().__init__(HttpClient(exporter_base_url(url), name="the exporter", timeout=timeout, max_bytes=max_bytes))

    def window(self, seconds: float) -> Window:
        """The exporter's last ``seconds`` of samples (``GET /api/v1/window?seconds=N``)."""
        return self.window_and_sources(seconds)[0]

    def window_and_sources(self, seconds: float) -> tuple[Window, dict[str, Any] | None]:
        """The window, and ``{"sources": ...}`` (the sources' status) when the payload carries it."""
        n = max(1, math.ceil(seconds))
        answer = self._http.get(WINDOW_PATH, {"seconds": n})
        where = self._http.where(WINDOW_PATH)
        if answer.status == 404:
            raise NoWindowApi(f"{self.url} has no {WINDOW_PATH}: is it a kvdoctor exporter?")
        if answer.status == 422:
            try:
                longest = _longest_window(answer.json())
            except ValueError:
                longest = None
            keeps = f"it serves at most {longest} s" if longest else "it keeps less"
            raise WindowRefused(f"{where} refused a {n} s window ({keeps}: see its --max-window)", longest)
        if answer.status != 200:
            raise self._http.status_error(answer)
        try:
            payload = answer.json()
            window = Window.from_json(payload)
        except ValueError as exc:  # also JSONDecodeError and UnicodeDecodeError
            detail = str(exc).splitlines()[0][:120]
            raise SourceError("parse_error", one_line(f"{where} did not return a kvdoctor window: {detail}")) from None
        sources = payload.get("sources")
        return window, ({"sources": sources} if isinstance(sources, dict) else None)

    def diagnosis(self) -> dict[str, Any] | None:
        """The exporter's last diagnosis; None when it has none (yet)."""
        payload = self._http.get_json(DIAGNOSIS_PATH, missing=(204, 404, 503))
        return payload if isinstance(payload, dict) and payload.get("verdict") else None

    def status(self) -> dict[str, Any]:
        """``/api/v1/status``; empty when the exporter does not answer one (the endpoint is optional)."""
        answer = self._http.get(STATUS_PATH)
        if answer.status != 200:
            return {}
        try:
            payload = answer.json()
        except ValueError:
            return {}
        return payload if isinstance(payload, dict) else {}

    def context(self) -> Context | None:
        """The context the exporter diagnoses with (its SLO, model, GPU, peak bandwidth), from
        ``/api/v1/status``; None when it does not publish one (an older exporter)."""
        payload = self.status().get("context")
        if not isinstance(payload, dict):
            return None
        try:
            return context_from_json(payload)
        except ValueError as exc:
            raise SourceError(
                "parse_error", one_line(f"{self._http.where(STATUS_PATH)} has a malformed context: {exc}")
            ) from None

    def interval(self) -> float | None:
        """The exporter's collection interval from its status (None if it does not say)."""
        raw = self.status().get("interval_seconds")
        try:
            value = float(raw) if isinstance(raw, int | float | str) else math.nan
        except ValueError:
            return None
        return value if value > 0 and math.isfinite(value) else None

    def metrics_snapshot(self) -> Snapshot:
        """One Snapshot of the canonical ``kvdoctor_*`` samples on /metrics, stamped now."""
        taken = time.time()
        answer = self._http.get(METRICS_PATH)
        if answer.status != 200:
            raise self._http.status_error(answer)
        where = self._http.where(METRICS_PATH)
        snap = Snapshot(taken)
        try:
            for name, labels, value, _ts in iter_samples(answer.text):
                if name.startswith(CANONICAL_PREFIX):
                    snap.samples[series_key(name, labels)] = value
        except ExpositionError as exc:
            raise SourceError("parse_error", one_line(f"{where} is not a Prometheus exposition: {exc}")) from None
        if not snap.samples:
            raise SourceError("no_data", f"{where} has no {CANONICAL_PREFIX}* samples: is it a kvdoctor exporter?")
        return snap
