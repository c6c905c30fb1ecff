"""kvdoctor.sources.exporter_api against a fake exporter on loopback (the real one is in
tests/test_cli_diagnose.py and tests/dashboard/test_live.py): what each endpoint gives, and how
each way an exporter can fail reads."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.collection import SourceError
from kvdoctor.signals.window import Window, labels_of
from kvdoctor.sources.exporter_api import ExporterClient, NoWindowApi, exporter_base_url
from tests.support.servers import JSON, FakeServer, computed, respond

T0 = 1_700_000_000.0
LABELS = labels_of(engine="vllm", model_name="m")


def window_payload(n: int = 3, sources: dict | None = None) -> bytes:
    window = Window(
        T0 + np.arange(n, dtype=float),
        {(S.KV_CACHE_USAGE, LABELS): np.linspace(0.1, 0.3, n), (S.REQUESTS_RUNNING, LABELS): np.full(n, 4.0)},
    )
    payload = window.to_json()
    if sources is not None:
        payload["sources"] = sources
    return json.dumps(payload).encode()


@pytest.fixture
def exporter():
    with FakeServer() as fake:
        yield fake


@pytest.mark.parametrize(
    "given",
    [
        "http://127.0.0.1:9745",
        "http://127.0.0.1:9745/",
        "http://127.0.0.1:9745/metrics",
        "http://127.0.0.1:9745/api/v1/window",
        "http://127.0.0.1:9745/api/v1/status/",
    ],
)
def test_the_base_url_is_found_from_any_of_its_paths(given):
    assert exporter_base_url(given) == "http://127.0.0.1:9745"
    assert exporter_base_url("https://x/kvd/metrics") == "https://x/kvd"


def test_a_bad_url_is_refused_before_asking():
    with pytest.raises(SourceError, match="the exporter needs an http"):
        ExporterClient("ftp://x")


def test_the_window_and_the_sources_it_carries(exporter):
    sources = {"engine": {"up": True, "last_error": ""}}
    exporter.routes["/api/v1/window"] = respond(window_payload(3, sources), content_type=JSON)
    with ExporterClient(exporter.url("/metrics"), timeout=2) as client:
        window = client.window(2.5)
        again, carried = client.window_and_sources(10)
    assert exporter.paths == ["/api/v1/window?seconds=3", "/api/v1/window?seconds=10"]
    assert list(window.timestamps) == [T0, T0 + 1, T0 + 2]
    assert np.allclose(window.series[(S.KV_CACHE_USAGE, LABELS)], [0.1, 0.2, 0.3])
    assert carried == {"sources": sources} and len(again) == 3


@pytest.mark.parametrize(
    "status, ctype, body, error, phrase",
    [
        (404, "application/json", b'{"detail":"Not Found"}', NoWindowApi, "has no /api/v1/window: is it a kvdoctor"),
        (422, "application/json", b'{"detail":"too long"}', SourceError, "refused a 900 s window"),
        (500, "text/plain", b"boom", SourceError, "/api/v1/window answered HTTP 500"),
        (200, "text/html", b"<html></html>", SourceError, "did not return a kvdoctor window"),
        (200, "application/json", b'{"series": []}', SourceError, "did not return a kvdoctor window"),
    ],
)
def test_window_failures_are_one_line(exporter, status, ctype, body, error, phrase):
    exporter.routes["/api/v1/window"] = respond(body, status, ctype)
    with ExporterClient(exporter.url(), timeout=2) as client, pytest.raises(error) as raised:
        client.window(900)
    assert phrase in str(raised.value) and "\n" not in str(raised.value)
    assert exporter.url() in str(raised.value)


def test_diagnosis_is_none_until_there_is_one(exporter):
    answers = {"status": 503}

    def diagnosis(path: str) -> tuple[int, str, bytes]:
        return answers["status"], JSON, json.dumps({"verdict": "healthy"}).encode()

    exporter.routes["/api/v1/diagnosis"] = computed(diagnosis)
    with ExporterClient(exporter.url(), timeout=2) as client:
        assert client.diagnosis() is None
        answers["status"] = 200
        assert client.diagnosis() == {"verdict": "healthy"}
        answers["status"] = 500
        with pytest.raises(SourceError, match="answered HTTP 500"):
            client.diagnosis()


def test_status_and_interval_are_optional(exporter):
    with ExporterClient(exporter.url(), timeout=2) as client:
        assert client.status() == {} and client.interval() is None  # 404: an exporter without it
        exporter.routes["/api/v1/status"] = respond(b"<html>", content_type="text/html")
        assert client.interval() is None
        exporter.routes["/api/v1/status"] = respond(b'{"interval_seconds": 0.5}', content_type=JSON)
        assert client.status() == {"interval_seconds": 0.5} and client.interval() == 0.5
        exporter.routes["/api/v1/status"] = respond(b'{"interval_seconds": "soon"}', content_type=JSON)
        assert client.interval() is None


def test_metrics_snapshot_keeps_the_canonical_samples(exporter):
    page = (
        f"# TYPE {S.KV_CACHE_USAGE} gauge\n"
        f'{S.KV_CACHE_USAGE}{{engine="vllm",model_name="m"}} 0.5\n'
        "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 3\n"
    )
    exporter.routes["/metrics"] = respond(page.encode())
    with ExporterClient(exporter.url(), timeout=2) as client:
        snap = client.metrics_snapshot()
        assert snap.samples == {(S.KV_CACHE_USAGE, LABELS): 0.5}
        exporter.routes["/metrics"] = respond(b"# TYPE foo gauge\nfoo 1\n")
        with pytest.raises(SourceError, match=r"/metrics has no kvdoctor_\* samples"):
            client.metrics_snapshot()
        exporter.routes["/metrics"] = respond(b"\x00\x01binary", content_type="application/octet-stream")
        with pytest.raises(SourceError, match="is not a Prometheus exposition"):
            client.metrics_snapshot()
