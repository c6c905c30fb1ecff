"""The HTTP app (in process, through FastAPI's TestClient) and the server (real sockets)."""

from __future__ import annotations

import socket

import httpx
import hypothesis
import pytest
import schemathesis
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from kvdoctor.exporter import live_diagnosis
from kvdoctor.exporter.app import create_app
from kvdoctor.exporter.runtime import Exporter
from kvdoctor.exporter.server import PortInUseError, serve_in_thread
from kvdoctor.exporter.settings import ExporterSettings
from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.textformat import CONTENT_TYPE
from kvdoctor.signals.window import Window
from tests.exporter.exporter_fakes import (
    FakeClock,
    StaticCollector,
    engine_samples,
    failing,
    gpu_samples,
    not_applicable,
)


class FakeDiagnosis:
    verdict = "healthy"

    def to_json(self) -> dict:
        return {"verdict": self.verdict, "confidence": 0.9, "headline": "fine"}


def serving():
    """A fixture's body: an exporter (``make_exporter``, one cycle run) served on a free port, as
    (exporter, server handle); both stopped after."""
    exporter = make_exporter()
    exporter.run_cycle()
    handle = serve_in_thread(create_app(exporter), "127.0.0.1", 0)
    yield exporter, handle
    handle.stop()
    exporter.stop()


def make_exporter(clock=None, diagnose_hook=None, **kw) -> Exporter:
    settings = ExporterSettings(**{"interval": 0.1, "max_window_seconds": 120, **kw})
    collectors = [
        StaticCollector("engine", engine_samples),
        StaticCollector("gpu", lambda s: gpu_samples(2, s)),
        failing("dcgm", "connection_refused"),
        not_applicable("nvml"),
    ]
    return Exporter(settings, collectors, diagnose_hook=diagnose_hook, clock=clock or FakeClock())


@pytest.fixture
def exporter():
    exp = make_exporter()
    yield exp
    exp.stop()


def test_metrics_serves_the_last_rendered_page(exporter):
    exporter.run_cycle()
    client = TestClient(create_app(exporter))
    resp = client.get("/metrics")
    assert resp.status_code == 200
    assert resp.headers["content-type"] == CONTENT_TYPE
    assert resp.content == exporter.metrics_bytes()
    names = {f.name for f in text_string_to_metric_families(resp.text)}
    assert S.KV_CACHE_USAGE in names


def test_readyz_turns_ready_after_the_first_cycle_and_healthz_is_always_ok(exporter):
    client = TestClient(create_app(exporter))
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").status_code == 503
    exporter.run_cycle()
    assert client.get("/readyz").status_code == 200


def test_window_round_trips_and_carries_the_sources_status():
    clock = FakeClock(1000.0)
    exp = make_exporter(clock=clock)
    for _ in range(5):
        exp.run_cycle()
        clock.advance(1.0)
    client = TestClient(create_app(exp))
    payload = client.get("/api/v1/window", params={"seconds": 3}).json()
    window = Window.from_json(payload)
    assert window.timestamps.tolist() == [1002.0, 1003.0, 1004.0]
    assert payload["seconds"] == 3
    assert payload["sources"]["engine"]["up"] is True
    assert payload["sources"]["dcgm"]["up"] is False
    assert payload["sources"]["dcgm"]["last_error_reason"] == "connection_refused"
    assert payload["sources"]["nvml"]["applicable"] is False
    usage = window.select(S.KV_CACHE_USAGE)
    assert [v.tolist() for v in usage.values()] == [[0.5, 0.5, 0.5]]


@pytest.mark.parametrize("seconds", ["0", "-5", "121", "abc", "1.5"])
def test_window_rejects_out_of_range_seconds_with_422(exporter, seconds):
    client = TestClient(create_app(exporter))
    assert client.get("/api/v1/window", params={"seconds": seconds}).status_code == 422


def test_window_defaults_to_60_seconds(exporter):
    exporter.run_cycle()
    assert TestClient(create_app(exporter)).get("/api/v1/window").json()["seconds"] == 60


def test_window_json_has_null_for_non_finite_values():
    exp = make_exporter()
    exp.collectors.append(StaticCollector("odd", lambda s: _odd_values()))
    exp.run_cycle()
    payload = TestClient(create_app(exp)).get("/api/v1/window", params={"seconds": 60})
    assert payload.status_code == 200
    series = {s["name"]: s["values"] for s in payload.json()["series"]}
    assert series[S.REQUESTS_WAITING] == [None]


def _odd_values():
    from kvdoctor.signals.collection import Collected

    return Collected({(S.REQUESTS_WAITING, (("engine", "odd"),)): float("inf")})


def test_diagnosis_is_503_until_the_first_diagnosis_then_the_json(monkeypatch):
    monkeypatch.setattr(live_diagnosis, "known_verdicts", lambda: ("idle", "healthy"))
    exp = make_exporter(diagnose_hook=lambda window: FakeDiagnosis())
    client = TestClient(create_app(exp))
    resp = client.get("/api/v1/diagnosis")
    assert resp.status_code == 503
    assert "no diagnosis yet" in resp.json()["detail"]
    for _ in range(live_diagnosis.MIN_DIAGNOSIS_SNAPSHOTS):
        exp.run_cycle()
    body = client.get("/api/v1/diagnosis").json()
    assert body["verdict"] == "healthy" and body["headline"] == "fine"


def test_diagnosis_without_a_hook_says_it_is_not_enabled(exporter):
    exporter.run_cycle()
    resp = TestClient(create_app(exporter)).get("/api/v1/diagnosis")
    assert resp.status_code == 503
    assert "not enabled" in resp.json()["detail"]


def test_status_lists_every_source(exporter):
    exporter.run_cycle()
    body = TestClient(create_app(exporter)).get("/api/v1/status").json()
    assert body["ready"] is True and body["cycles"] == 1
    assert set(body["sources"]) == {"engine", "gpu", "dcgm", "nvml"}
    assert body["sources"]["dcgm"]["errors"] == {"connection_refused": 1}
    assert body["sources"]["engine"]["series"] > 0


def test_openapi_schema_documents_every_endpoint(exporter):
    schema = TestClient(create_app(exporter)).get("/openapi.json").json()
    assert set(schema["paths"]) == {
        "/metrics",
        "/api/v1/window",
        "/api/v1/diagnosis",
        "/api/v1/status",
        "/healthz",
        "/readyz",
    }
    params = schema["paths"]["/api/v1/window"]["get"]["parameters"]
    [seconds] = [p for p in params if p["name"] == "seconds"]
    assert seconds["schema"]["minimum"] == 1 and seconds["schema"]["maximum"] == 120
    assert CONTENT_TYPE in schema["paths"]["/metrics"]["get"]["responses"]["200"]["content"]


@pytest.mark.slow
def test_responses_conform_to_the_openapi_schema(monkeypatch):
    """schemathesis generates requests from the schema and checks every response against it.

    (Driven through hypothesis directly: schemathesis' pytest fixture loader does not run
    under pytest 9.)"""
    monkeypatch.setattr(live_diagnosis, "known_verdicts", lambda: ("idle", "healthy"))
    exp = make_exporter(diagnose_hook=lambda window: FakeDiagnosis())
    for _ in range(live_diagnosis.MIN_DIAGNOSIS_SNAPSHOTS):
        exp.run_cycle()
    schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(exp))
    checked = []
    for result in schema.get_all_operations():
        operation = result.ok()

        @hypothesis.settings(
            max_examples=5, deadline=None, database=None, suppress_health_check=list(hypothesis.HealthCheck)
        )
        @hypothesis.given(case=operation.as_strategy())
        def check(case):
            case.call_and_validate()

        check()
        checked.append(operation.label)
    assert len(checked) == 6


# ------------------------------------------------------------------------------- real sockets


def test_serve_in_thread_serves_and_stops_and_frees_the_port(exporter):
    exporter.run_cycle()
    handle = serve_in_thread(create_app(exporter), "127.0.0.1", 0)
    try:
        resp = httpx.get(f"{handle.url}/metrics", timeout=5)
        assert resp.status_code == 200 and resp.content == exporter.metrics_bytes()
    finally:
        handle.stop()
    with socket.socket() as sock:  # the port is free again
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", handle.port))


def test_a_port_in_use_raises_a_clear_error(exporter):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(PortInUseError, match=f"port {port} .* already in use"):
            serve_in_thread(create_app(exporter), "127.0.0.1", port)
