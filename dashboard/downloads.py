"""The Live page's "download this window": ``/download/window.om?seconds=N[&instance=I]`` answers
the window on show as a trace file (the format of ``kvdoctor record``), which ``kvdoctor diagnose
--replay`` replays.

From the configured exporter (no ``instance``): what its ring store holds of the last N seconds
(its longest window where it serves less). From Prometheus (``instance``, one scrape target):
that exporter's ``kvdoctor_*`` series over the last N seconds. Only the app's own sources are read:
the request gives a number of seconds and a label value, never a URL.
"""

from __future__ import annotations

import math
import re
import time
from urllib.parse import urlencode

from flask import Flask, Response, current_app, request

from kvdoctor.dashboard.promql import TARGET_LABEL
from kvdoctor.dashboard.sources import EXTENSION_KEY, Backend
from kvdoctor.rules.promql import quote
from kvdoctor.signals.collection import SourceError
from kvdoctor.signals.textformat import OPENMETRICS_CONTENT_TYPE
from kvdoctor.signals.trace import format_window
from kvdoctor.sources.prometheus import PrometheusSource
from kvdoctor.sources.recording import exporter_history

ROUTE = "/download/window.om"  # ?seconds=N[&instance=I][&end=T]
MAX_SECONDS = 24 * 3600.0  # the longest range the Live page shows
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def href(seconds: float, instance: str = "", end: float | None = None) -> str:
    """The link to the window of the last ``seconds`` (of ``instance`` through Prometheus; ending
    at ``end``, Unix seconds, for a fixed range)."""
    query = {"seconds": f"{seconds:g}"}
    if instance:
        query["instance"] = instance
    if end is not None:
        query["end"] = f"{end:.3f}"
    return f"{ROUTE}?{urlencode(query)}"


def serve() -> Response:
    b: Backend = current_app.extensions[EXTENSION_KEY]
    try:
        seconds = float(request.args.get("seconds", "900"))
    except ValueError:
        seconds = math.nan
    if not 0 < seconds <= MAX_SECONDS:
        return _refused(400, f"seconds must be more than 0 up to {MAX_SECONDS:g}, got {request.args.get('seconds')!r}")
    instance = request.args.get("instance", "")
    try:
        end = float(request.args["end"]) if "end" in request.args else None
    except ValueError:
        end = math.nan
    if end is not None and not (math.isfinite(end) and end > 0):
        return _refused(400, f"end must be a time in Unix seconds, got {request.args.get('end')!r}")
    try:
        if instance:
            if b.prometheus is None:
                return _refused(400, "an instance is read through Prometheus, and this dashboard has none")
            selector = f"{{{TARGET_LABEL}={quote(instance)}}}"
            with PrometheusSource(b.prometheus.url, selector, client=b.prometheus) as source:
                window = source.window(seconds, at=end)
        elif end is not None:
            return _refused(400, "a fixed range is read through Prometheus: give its instance")
        elif b.exporter is not None:
            window, _ = exporter_history(b.exporter, seconds)
        else:
            return _refused(400, "pick an exporter: this dashboard reads Prometheus only")
    except SourceError as exc:
        return _refused(502, str(exc))
    if not len(window):
        return _refused(502, "the source holds no samples for that window yet")
    name = _UNSAFE.sub("-", instance or "exporter").strip("-")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(window.end))
    return Response(
        format_window(window),
        mimetype=None,
        headers={
            "Content-Type": OPENMETRICS_CONTENT_TYPE,
            "Content-Disposition": f'attachment; filename="kvdoctor-{name}-{stamp}.om"',
        },
    )


def _refused(status: int, line: str) -> Response:
    return Response(line + "\n", status=status, mimetype="text/plain")


def install(server: Flask) -> None:
    """Serve the window downloads on ``server`` (behind the dashboard's auth, like every route)."""
    server.add_url_rule(ROUTE, "download_window", serve)
