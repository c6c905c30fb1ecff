"""Prometheus down, slow or answering garbage: the dashboard's data sources and ``kvdoctor
diagnose --prometheus`` end in a clear state, never a traceback, and never wait much longer than
their timeout.

Already covered elsewhere (tests/test_cli_diagnose.py): the CLI against a closed port, a server
that answers after the timeout, HTTP errors and non-Prometheus JSON, run in-process. Here the CLI
runs through its real entry point (a subprocess) against faults that are not covered: a reset
mid-answer, Prometheus dying between two queries, an answer that trickles past the timeout, and
well-formed JSON of the wrong shape. The dashboard's sources layer (dashboard/sources.py), which
no test drove into a failing Prometheus, gets every fault, through each function the pages call,
and the Fleet and Live pages show the failure as a state.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from kvdoctor.dashboard.app import create_app
from kvdoctor.dashboard.pages import fleet, live
from kvdoctor.dashboard.sources import fetch_live_from_prometheus, fleet_summary, prometheus_diagnosis
from kvdoctor.signals.collection import SourceError
from kvdoctor.sources.prometheus import PrometheusClient
from tests.support import servers

TIMEOUT = 0.5
EMPTY = json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}).encode()
# The newest-sample query of `diagnose --prometheus` answered, so the next query is reached.
NOW = time.time()
NEWEST = json.dumps(
    {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [NOW, str(NOW)]}]}}
).encode()
JSON = "application/json"


@dataclass
class Fault:
    id: str
    behaviour: Callable[[], servers.Behaviour] | None  # None: nothing listens on the port
    dashboard_xfail: str = ""
    cli_xfail: str = ""
    # Down or slow: every call must fail (a quiet empty answer would hide the outage). Garbage of
    # the right type may also be skipped; either way nothing but SourceError may come out.
    must_fail: bool = True
    # Calls that make one request are answered by a server that dies only after it.
    single_request_ok: bool = False


FAULTS = [
    Fault("refused", None),
    Fault("hangs_past_the_timeout", lambda: servers.respond(EMPTY, content_type=JSON, delay=TIMEOUT * 6)),
    Fault("reset_mid_answer", lambda: servers.reset_mid_body(EMPTY + b" " * 200, content_type=JSON)),
    Fault("http_503_html", lambda: servers.respond(b"<html>upstream down</html>", 503, "text/html")),
    Fault(
        "dies_after_the_first_query",
        lambda: servers.first_then(
            servers.respond(NEWEST, content_type=JSON), servers.reset_mid_body(EMPTY, content_type=JSON)
        ),
        single_request_ok=True,
    ),
    # ~13 s to send 266 bytes, each read well inside the timeout.
    Fault(
        "trickles_past_the_timeout", lambda: servers.trickle(EMPTY + b" " * 200, chunk=4, pause=0.2, content_type=JSON)
    ),
    Fault(
        "data_is_not_an_object",
        lambda: servers.respond(b'{"status":"success","data":[1,2]}', content_type=JSON),
        must_fail=False,
    ),
    Fault(
        "sample_without_a_value",
        lambda: servers.respond(
            b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{}}]}}', content_type=JSON
        ),
        must_fail=False,
    ),
    Fault(
        "matrix_with_bad_points",
        lambda: servers.respond(
            b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"__name__":"kvdoctor_x"},'
            b'"values":[["x"]]}]}}',
            content_type=JSON,
        ),
        must_fail=False,
    ),
]


def params(consumer: str) -> list:
    out = []
    for f in FAULTS:
        why = f.dashboard_xfail if consumer == "dashboard" else f.cli_xfail
        marks = [pytest.mark.xfail(reason=why, strict=True)] if why else []
        if consumer == "cli" or f.id.startswith("trickles"):
            marks.append(pytest.mark.slow)
        out.append(pytest.param(f, id=f.id, marks=marks))
    return out


class FaultyPrometheus:
    """The fault's server (none for ``refused``: a closed port); ``rearm()`` starts its script over."""

    def __init__(self, fault: Fault):
        self.fault = fault
        self.server = servers.FakeServer(fault.behaviour()) if fault.behaviour else None
        self.url = self.server.url() if self.server else servers.refusing_url()

    def rearm(self) -> None:
        if self.server is not None:
            self.server.behaviour = self.fault.behaviour()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


@pytest.fixture
def prometheus(request):
    fault: Fault = request.param if hasattr(request, "param") else request.node.callspec.params["fault"]
    faulty = FaultyPrometheus(fault)
    yield faulty
    faulty.stop()


def assert_one_line_naming(message: str, url: str) -> None:
    assert "\n" not in message.strip() and "Traceback" not in message
    assert url.removeprefix("http://") in message, message


# ----------------------------------------------------------------------------- dashboard sources


@pytest.mark.parametrize("fault", params("dashboard"))
def test_dashboard_sources_raise_one_clear_error_in_time(fault: Fault, prometheus: FaultyPrometheus):
    client = PrometheusClient(prometheus.url, TIMEOUT)
    end = time.time()
    calls = {}
    if not fault.single_request_ok:  # first: a slow answer costs one request's time here, not ten
        calls.update(
            {
                "query": lambda: client.query("up"),
                "query_range": lambda: client.query_range("up", end - 60, end, 1.0),
                "prometheus_diagnosis": lambda: prometheus_diagnosis(client, "10.0.0.1:9745", end),
            }
        )
    calls.update(
        {
            "fleet_summary": lambda: fleet_summary(client, end),
            "fetch_live_from_prometheus": lambda: fetch_live_from_prometheus(
                client, "10.0.0.1:9745", {}, end - 60, end, 1.0, 10.0
            ),
        }
    )
    for name, call in calls.items():
        prometheus.rearm()
        started = time.monotonic()
        try:
            call()
            error = None
        except SourceError as exc:
            error = exc
        elapsed = time.monotonic() - started
        if fault.must_fail:
            assert error is not None, f"{name} returned normally from a failing Prometheus"
        if error is not None:
            assert_one_line_naming(str(error), prometheus.url)
        # A page fetch makes several requests, but gives up at the first failure.
        assert elapsed < 3 * TIMEOUT + 1.0, f"{name} took {elapsed:.1f} s with a {TIMEOUT} s timeout"
    client.close()


@pytest.mark.parametrize("prometheus", [FAULTS[0]], indirect=True, ids=["refused"])
def test_fleet_and_live_pages_show_prometheus_down_as_a_state(prometheus: FaultyPrometheus):
    app = create_app(prometheus_url=prometheus.url, environ={})
    with app.server.test_request_context("/fleet"):
        page = str(fleet.layout())  # renders, with the badge saying why there is no row
    assert "badge-stale" in page and "connection refused" in page
    with app.server.test_request_context("/"):
        page = str(live.layout())  # renders, with the instance picker saying why it is empty
    assert "connection refused" in page


# ------------------------------------------------------------------------- kvdoctor diagnose (CLI)


@pytest.mark.parametrize("fault", params("cli"))
def test_diagnose_prometheus_exits_3_with_one_line_in_time(fault: Fault, prometheus: FaultyPrometheus, run_cli):
    started = time.monotonic()
    result = run_cli(
        "diagnose",
        "--prometheus",
        prometheus.url,
        "--selector",
        '{pod="vllm-0"}',
        "--timeout",
        str(TIMEOUT * 2),
        timeout=60,
    )
    elapsed = time.monotonic() - started
    assert result.rc == 3, (result.rc, result.stdout, result.stderr)  # 3: a source could not be read
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "Prometheus" in lines[0] or prometheus.url.removeprefix("http://") in lines[0], lines[0]
    # Python start-up is a few seconds on a busy machine; the fetch itself must stay near the timeout.
    assert elapsed < 10.0, f"diagnose took {elapsed:.1f} s with --timeout {TIMEOUT * 2}"
