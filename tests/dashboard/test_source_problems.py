"""Nothing silent: a source the dashboard cannot read (unreachable, or not what its flag says) is
one line naming its URL and the error, at start (on stderr) and on every page (the banner)."""

from __future__ import annotations

import time

import pytest

from kvdoctor.dashboard import components
from kvdoctor.dashboard.settings import DashboardSettings
from kvdoctor.dashboard.sources import SOURCE_CHECK_SECONDS, SourceWatch, check_sources
from tests.support import servers
from tests.support.processes import kvdoctor
from tests.support.synthetic import SCENARIOS, FakeExporter, FakePrometheus, SyntheticEngine


@pytest.fixture
def exporter():
    fake = FakeExporter(SyntheticEngine(SCENARIOS["healthy"], t0=time.time() - 60, gpus=1))
    yield fake
    fake.stop()


@pytest.fixture
def answering():
    """answering(status, type, body): a server giving that answer to every request."""
    made = []

    def make(status: int, content_type: str, body: bytes) -> servers.FakeServer:
        made.append(servers.FakeServer(servers.computed(lambda path: (status, content_type, body))))
        return made[-1]

    yield make
    for server in made:
        server.stop()


def test_sources_that_read_have_no_problem(exporter):
    engine = exporter.engine
    prometheus = FakePrometheus({"10.0.0.1:9745": engine})
    try:
        assert check_sources(DashboardSettings(exporter_url=exporter.url, prometheus_url=prometheus.url)) == []
    finally:
        prometheus.stop()


def test_an_unreachable_source_is_named_with_its_url_and_error():
    exporter_url, prometheus_url = servers.refusing_url(), servers.refusing_url()
    problems = check_sources(DashboardSettings(exporter_url=exporter_url, prometheus_url=prometheus_url))
    assert problems == [
        f"cannot reach the exporter at {exporter_url}/api/v1/window: connection refused",
        f"cannot reach Prometheus at {prometheus_url}/api/v1/query: connection refused",
    ]


def test_a_source_that_is_not_what_its_flag_says_is_named(answering):
    web_page = answering(200, "text/html", b"<html>grafana</html>")
    not_found = answering(404, "text/plain", b"404 page not found\n")
    (as_exporter,) = check_sources(DashboardSettings(exporter_url=not_found.url()))
    assert as_exporter == f"{not_found.url()} has no /api/v1/window: is it a kvdoctor exporter?"
    (as_prometheus,) = check_sources(DashboardSettings(prometheus_url=web_page.url()))
    assert web_page.url() in as_prometheus and "Prometheus" in as_prometheus


def test_a_prometheus_without_kvdoctor_series_is_said_to_be_misconfigured():
    empty = FakePrometheus({})
    try:
        (problem,) = check_sources(DashboardSettings(prometheus_url=empty.url))
    finally:
        empty.stop()
    assert problem == (
        f"Prometheus {empty.url} holds no kvdoctor exporter's series (kvdoctor_source_up): "
        "is it scraping the exporters?"
    )


def test_the_watch_checks_again_once_its_answer_is_old(exporter, monkeypatch):
    watch = SourceWatch(DashboardSettings(exporter_url=exporter.url))
    assert watch.problems() == []
    exporter.fail = True
    assert watch.problems() == []  # the answer stands a few seconds: every open page asks
    clock = time.monotonic() + SOURCE_CHECK_SECONDS + 1
    monkeypatch.setattr("kvdoctor.dashboard.sources.time.monotonic", lambda: clock)
    (problem,) = watch.problems()
    assert exporter.url in problem and "500" in problem


def test_the_banner_says_each_problem_and_nothing_when_none():
    assert components.source_problems([]) is None
    banner = components.source_problems(["cannot reach Prometheus at http://p:9090/api/v1/query: timed out"])
    assert "verdict-bad" in banner.className
    assert banner.children[1].children == "cannot reach Prometheus at http://p:9090/api/v1/query: timed out"


def test_before_any_diagnosis_the_live_banner_says_why_none_comes():
    waiting = components.banner(None)
    failed = components.banner(None, [], "cannot reach the exporter at http://e:9745/api/v1/window: timed out")
    assert waiting.children[0].children == "Waiting for the first diagnosis…"
    assert failed.children[0].children == "No diagnosis: the source cannot be read"
    assert failed.children[1].children.endswith("timed out") and "verdict-bad" in failed.className


@pytest.mark.slow
def test_the_command_says_at_start_which_source_cannot_be_read(spawn):
    exporter_url, prometheus_url = servers.refusing_url(), servers.refusing_url()
    args = ("dashboard", "--exporter", exporter_url, "--prometheus", prometheus_url, "--port", "0")
    dashboard = spawn(kvdoctor(*args, merge_stderr=False))
    dashboard.wait_for_line(r"^kvdoctor dashboard: http://")
    for url, what in ((exporter_url, "the exporter"), (prometheus_url, "Prometheus")):
        line = dashboard.wait_for_line(rf"^kvdoctor dashboard: warning: cannot reach {what} at ", stream="stderr")
        assert line.string == f"kvdoctor dashboard: warning: cannot reach {what} at {url}{line.string.split(url)[1]}"
        assert line.string.endswith(": connection refused")
