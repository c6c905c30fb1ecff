"""kvdoctor dashboard: serve the web dashboard for an exporter and/or a Prometheus."""

from __future__ import annotations

import argparse
import sys
import threading
from types import ModuleType

from kvdoctor import arguments, flags
from kvdoctor.errors import UsageError

NAME = "dashboard"
HELP = "serve the web dashboard (Live, Ledger, Fleet)"
DESCRIPTION = """\
Serve the dashboard on-call opens during a latency incident.

  --exporter URL     a kvdoctor exporter (live window, verdict, evidence); Live page
  --prometheus URL   a Prometheus scraping kvdoctor exporters; Fleet page and history

At least one is needed. The dashboard only ever talks to these two URLs.
Binds 127.0.0.1 unless --host says otherwise. Basic auth: set KVDOCTOR_DASHBOARD_USERS
("user:password,...") or KVDOCTOR_DASHBOARD_AUTH_FILE (a file of user:password lines).
Settings with no flag, from the environment: KVDOCTOR_DASHBOARD_LIVE_SECONDS (seconds the live
charts keep), KVDOCTOR_DASHBOARD_REQUEST_TIMEOUT (seconds an exporter answer may take).

Needs the [dashboard] extra: pip install 'kvdoctor[dashboard]'.

examples:
  kvdoctor dashboard --exporter http://127.0.0.1:9745
  kvdoctor dashboard --prometheus http://prometheus:9090 --host 0.0.0.0 --port 8050"""
EXIT_STATUS = """\
exit status: 0 stopped (SIGTERM or Ctrl-C), 2 a usage error (a flag, a URL, the auth settings, a port
in use, the [dashboard] extra missing), 3 an internal error. A source that cannot be read (or is not
what its flag says) is not an exit: it is said at start, one line on stderr naming its URL and the
error, and on every page, until it reads."""

# Top-level modules of the [dashboard] extra and what they pull in: one missing means the extra is.
DASHBOARD_EXTRA_MODULES = frozenset({"dash", "plotly", "matplotlib", "tsdownsample", "flask", "werkzeug"})
MISSING_EXTRA = "the dashboard is not installed; install it with: pip install 'kvdoctor[dashboard]'"


def load_dashboard_app(hint: str = "") -> ModuleType:
    """``kvdoctor.dashboard.app``; a UsageError naming the extra when its dependencies are missing."""
    try:
        import kvdoctor.dashboard.app as app  # noqa: PLC0415  (the optional [dashboard] extra: dash, plotly, ...)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in DASHBOARD_EXTRA_MODULES:
            raise
        raise UsageError(MISSING_EXTRA + hint) from None
    return app


def add_arguments(parser: argparse.ArgumentParser) -> None:
    flags.add(parser, "--exporter", type=arguments.url, help="kvdoctor exporter base URL, e.g. http://127.0.0.1:9745")
    flags.add(parser, "--prometheus", type=arguments.url, help="Prometheus base URL, e.g. http://prometheus:9090")
    # the server's own settings: unset (None) leaves the dashboard's default
    for flag, kind, metavar, meaning in (
        ("--host", str, "HOST", "address to bind (default 127.0.0.1)"),
        ("--port", arguments.port, "PORT", "port to bind (default 8050; 0: any free port)"),
        ("--refresh", arguments.positive_float, "S", "seconds between live updates (default 1)"),
    ):
        parser.add_argument(flag, type=kind, default=None, metavar=metavar, help=meaning)


def run(args: argparse.Namespace) -> int:
    dashboard = load_dashboard_app()
    exporter, prometheus = args.exporter, args.prometheus
    if not exporter and not prometheus:
        raise UsageError("give --exporter URL and/or --prometheus URL")
    port = dashboard.DEFAULT_PORT if args.port is None else args.port
    host = args.host or dashboard.DEFAULT_HOST
    try:
        app = dashboard.create_app(exporter_url=exporter, prometheus_url=prometheus, refresh_seconds=args.refresh)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        handle = dashboard.serve_in_thread(app, host, port)
    except OSError as exc:
        raise UsageError(exc.strerror or str(exc)) from None
    print(f"kvdoctor dashboard: {handle.url}", flush=True)
    for problem in dashboard.source_problems(app):  # said at start; the pages say it too
        print(f"kvdoctor dashboard: warning: {problem}", file=sys.stderr, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        handle.stop()
    return 0
