"""The Dash app: ``create_app(exporter_url=..., prometheus_url=...)`` and ``serve_in_thread``.

Pages live in ``kvdoctor.dashboard.pages`` (Live, Ledger, Fleet): each has a ``PATH``, a ``NAME``, a
``layout`` and ``register(app)``. ``create_app`` registers them with Dash Pages, in the nav's order,
and each page its callbacks on the app it is given: ``dash.callback``'s global list
is emptied by the first app that serves a request, so a second app in the same process (tests,
a demo that restarts its dashboard) would get none.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import dash
from dash import Input, Output, dcc, html
from flask import Flask
from werkzeug.serving import make_server

from kvdoctor.dashboard import auth, components, downloads, ids, runbooks
from kvdoctor.dashboard.pages import fleet, ledger, live
from kvdoctor.dashboard.settings import DashboardSettings
from kvdoctor.dashboard.sources import EXTENSION_KEY, SOURCE_CHECK_SECONDS, Backend, backend
from kvdoctor.sources.paths import HEALTHZ_PATH, READYZ_PATH

ASSETS = Path(__file__).with_name("assets")
PAGES = (live, ledger, fleet)
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8050


def create_app(
    exporter_url: str | None = None,
    prometheus_url: str | None = None,
    *,
    refresh_seconds: float | None = None,
    live_seconds: int | None = None,
    users: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> dash.Dash:
    """A dashboard reading ``exporter_url`` (live) and/or ``prometheus_url`` (fleet, history).

    Arguments win over ``KVDOCTOR_DASHBOARD_*`` (see ``settings``). Raises ``ValueError`` with one
    line on bad configuration (no source, a malformed URL, a malformed users list).
    """
    settings = DashboardSettings.from_env(
        environ,
        exporter_url=exporter_url,
        prometheus_url=prometheus_url,
        refresh_seconds=refresh_seconds,
        live_seconds=live_seconds,
        users=users,
    )
    if not settings.exporter_url and not settings.prometheus_url:
        raise ValueError("the dashboard needs an exporter URL or a Prometheus URL")

    server = Flask("kvdoctor.dashboard")
    server.extensions[EXTENSION_KEY] = Backend.from_settings(settings)
    auth.install(server, settings.users)
    # Liveness and readiness for the chart's probes: the process serves, the pages are registered.
    server.add_url_rule(HEALTHZ_PATH, "healthz", lambda: {"status": "ok"})
    server.add_url_rule(READYZ_PATH, "readyz", lambda: {"status": "ready"})
    runbooks.install(server)  # /runbooks/<Alert>: the alerts' runbook_url
    downloads.install(server)  # /download/window.om: the Live page's "download this window"
    app = dash.Dash(
        "kvdoctor.dashboard",
        server=server,
        use_pages=True,
        pages_folder="",
        assets_folder=str(ASSETS),
        title="kvdoctor",
        update_title=None,
        suppress_callback_exceptions=True,  # page components are not in the shell layout
        serve_locally=True,
        enable_mcp=False,
    )
    for order, page in enumerate(PAGES):
        title = f"kvdoctor · {page.NAME}"
        dash.register_page(page.__name__, path=page.PATH, name=page.NAME, order=order, title=title, layout=page.layout)
        page.register(app)
    app.layout = _shell
    # Every page: a source that cannot be read is said at the top, checked again every few seconds
    # (fired on load too, so the page's first paint never waits for a source that does not answer).
    app.callback(Output(ids.SOURCE_PROBLEMS, "children"), Input(ids.SOURCE_CHECK, "n_intervals"))(_source_problems)
    return app


def source_problems(app: dash.Dash) -> list[str]:
    """What is wrong with ``app``'s sources now, one line each naming the URL and the error (for
    ``kvdoctor dashboard`` to say at start)."""
    backend: Backend = app.server.extensions[EXTENSION_KEY]
    return backend.source_problems()


def _source_problems(_: int) -> html.Div | None:
    return components.source_problems(backend().source_problems())


def _shell() -> html.Div:
    b = backend()
    sources = []
    if b.settings.exporter_url:
        sources.append(f"exporter {b.settings.exporter_url}")
    if b.settings.prometheus_url:
        sources.append(f"Prometheus {b.settings.prometheus_url}")
    links = [
        dcc.Link(page["name"], href=page["relative_path"], className="nav-link") for page in dash.page_registry.values()
    ]
    return html.Div(
        [
            html.Header(
                [
                    html.Span("kvdoctor", className="brand"),
                    html.Span("why is decode slow?", className="tagline"),
                    html.Nav(links, id=ids.NAV),
                    html.Span(" · ".join(sources), id=ids.SOURCE_LINE, className="source-line"),
                ],
                className="topbar",
            ),
            html.Main(
                [
                    html.Div(id=ids.SOURCE_PROBLEMS),
                    dcc.Interval(id=ids.SOURCE_CHECK, interval=int(SOURCE_CHECK_SECONDS * 1000)),
                    dash.page_container,
                ],
                className="content",
            ),
        ]
    )


@dataclass
class ServerHandle:
    """A dashboard served from a background thread."""

    host: str
    port: int
    _server: object
    _thread: threading.Thread

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def stop(self, timeout: float = 5.0) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout)


def serve_in_thread(dash_app: dash.Dash, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> ServerHandle:
    """Serve ``dash_app`` on ``host:port`` (0: any free port) from a daemon thread.

    Raises ``OSError`` with a one-line message when the port cannot be bound.
    """
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no access log line per callback
    # Bind here: werkzeug prints a paragraph and exits on a port in use; we want one clear error.
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.create_server((host, port), family=family)
    except (OSError, OverflowError) as exc:
        errno = getattr(exc, "errno", None)
        reason = os.strerror(errno) if errno else str(exc)
        raise OSError(errno, f"cannot serve the dashboard on {host}:{port}: {reason}") from None
    try:
        server = make_server(host, sock.getsockname()[1], dash_app.server, threaded=True, fd=sock.fileno())
    finally:
        sock.close()  # the server holds its own duplicate of the socket
    bound_port = server.socket.getsockname()[1]
    thread = threading.Thread(target=server.serve_forever, name=f"kvdoctor-dashboard-{bound_port}", daemon=True)
    thread.start()
    return ServerHandle(host, bound_port, server, thread)
