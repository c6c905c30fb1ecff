"""kvdoctor.sources.prometheus.PrometheusClient against a fake Prometheus on loopback: queries are
POSTed forms, answers are parsed into samples and series, and every way the API can fail reads as
one line (the real Prometheus is in tests/dashboard/test_prometheus_real.py)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from kvdoctor.signals.collection import SourceError
from kvdoctor.sources.prometheus import PrometheusClient, PrometheusSource, QueryRejected
from tests.support.servers import JSON, FakeServer, respond

T0 = 1_700_000_000.0


def success(data: dict) -> bytes:
    return json.dumps({"status": "success", "data": data}).encode()


@pytest.fixture
def prometheus():
    with FakeServer() as fake:
        yield fake


def test_an_instant_query_is_a_posted_form_and_gives_labelled_values(prometheus):
    vector = {
        "resultType": "vector",
        "result": [
            {"metric": {"instance": "a:1"}, "value": [T0, "1.5"]},
            {"metric": {"instance": "b:1"}, "value": [T0, "NaN"]},
        ],
    }
    prometheus.routes["/api/v1/query"] = respond(success(vector), content_type=JSON)
    with PrometheusClient(prometheus.url(), timeout=2) as client:
        got = client.query("up", at=T0)
    assert got[0] == ({"instance": "a:1"}, 1.5) and got[1][0] == {"instance": "b:1"} and math.isnan(got[1][1])
    assert prometheus.forms() == [{"query": ["up"], "time": [f"{T0:.3f}"]}]


def test_a_scalar_is_one_unlabelled_value(prometheus):
    prometheus.routes["/api/v1/query"] = respond(
        success({"resultType": "scalar", "result": [T0, "42"]}), content_type=JSON
    )
    with PrometheusClient(prometheus.url(), timeout=2) as client:
        assert client.query("42") == [({}, 42.0)]
    assert prometheus.forms() == [{"query": ["42"]}]


def test_range_queries_and_range_vectors_give_series(prometheus):
    matrix = {
        "resultType": "matrix",
        "result": [{"metric": {"__name__": "x", "pod": "a"}, "values": [[T0, "1"], [T0 + 5, "+Inf"], [T0 + 10, "3"]]}],
    }
    prometheus.routes["/api/v1/query_range"] = respond(success(matrix), content_type=JSON)
    prometheus.routes["/api/v1/query"] = respond(success(matrix), content_type=JSON)
    with PrometheusClient(prometheus.url(), timeout=2) as client:
        (series,) = client.query_range("x", T0, T0 + 10, 5)
        (raw,) = client.query_series("x[10s]", at=T0 + 10)
    assert series.labels == {"__name__": "x", "pod": "a"}
    assert list(series.ts) == [T0, T0 + 5, T0 + 10] and np.array_equal(series.values, [1, np.inf, 3])
    assert list(raw.ts) == list(series.ts)
    assert prometheus.forms()[0] == {
        "query": ["x"],
        "start": [f"{T0:.3f}"],
        "end": [f"{T0 + 10:.3f}"],
        "step": ["5"],
    }


@pytest.mark.parametrize(
    "status, ctype, body, phrase",
    [
        (
            500,
            JSON,
            b'{"status":"error","errorType":"internal","error":"tsdb broke"}',
            "/api/v1/query answered HTTP 500: internal: tsdb broke",
        ),
        (503, "text/html", b"<html>down</html>", "/api/v1/query answered HTTP 503"),
        (200, "text/html", b"<html>a login page</html>", "does not answer like a Prometheus HTTP API"),
        (200, JSON, b'{"status":"success","data":[1,2]}', "unexpected answer: data is a list"),
        (200, JSON, success({"resultType": "matrix", "result": []}), "a matrix where a vector was expected"),
        (200, JSON, success({"resultType": "vector", "result": [{"metric": {}}]}), "malformed series"),
    ],
)
def test_failures_of_an_instant_query_are_one_line(prometheus, status, ctype, body, phrase):
    prometheus.routes["/api/v1/query"] = respond(body, status, ctype)
    with PrometheusClient(prometheus.url(), timeout=2) as client, pytest.raises(SourceError) as error:
        client.query("up")
    message = str(error.value)
    assert phrase in message and "\n" not in message
    assert message.startswith(f"Prometheus at {prometheus.url()}")


def test_a_malformed_matrix_is_one_line(prometheus):
    bad = success({"resultType": "matrix", "result": [{"metric": {"__name__": "x"}, "values": [["x"]]}]})
    prometheus.routes["/api/v1/query_range"] = respond(bad, content_type=JSON)
    with PrometheusClient(prometheus.url(), timeout=2) as client, pytest.raises(SourceError, match="malformed"):
        client.query_range("x", T0, T0 + 10, 5)


def test_a_rejected_query_says_why_and_the_window_names_the_selector(prometheus):
    body = b'{"status":"error","errorType":"bad_data","error":"parse error: bad matcher"}'
    prometheus.routes["/api/v1/query"] = respond(body, 400, JSON)
    with PrometheusClient(prometheus.url(), timeout=2) as client, pytest.raises(QueryRejected) as error:
        client.query("up{")
    assert error.value.detail == "parse error: bad matcher"
    with (
        PrometheusSource(prometheus.url(), '{pod="a"}', timeout=2) as source,
        pytest.raises(SourceError, match=r'rejected the query for selector \{pod="a"\}: parse error'),
    ):
        source.window(60, at=T0)


def test_a_redirect_is_not_followed(prometheus):
    prometheus.routes["/api/v1/query"] = respond(b"", 301, headers={"Location": "http://elsewhere:9090/api/v1/query"})
    with PrometheusClient(prometheus.url(), timeout=2) as client, pytest.raises(SourceError) as error:
        client.query("up")
    assert "answered HTTP 301, a redirect to http://elsewhere:9090/api/v1/query (not followed" in str(error.value)


def test_queries_ask_for_an_uncompressed_answer(prometheus):
    seen = {}

    def answer(h) -> None:
        seen.update(h.headers)
        respond(success({"resultType": "vector", "result": []}), content_type=JSON)(h)

    prometheus.routes["/api/v1/query"] = answer
    with PrometheusClient(prometheus.url(), timeout=2) as client:
        assert client.query("up") == []
    assert seen["Accept-Encoding"] == "identity" and seen["Content-Type"] == "application/x-www-form-urlencoded"
