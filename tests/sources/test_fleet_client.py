"""kvdoctor.sources.fleet.read_fleet against a fake Prometheus on loopback: three instant queries at
one time, refusals before asking, a rejected query as the selector's fault (the real Prometheus and
VictoriaMetrics: tests/sources/test_fleet_stores.py)."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs

import pytest

from kvdoctor.rules import promql
from kvdoctor.rules.verdicts import UNKNOWN
from kvdoctor.signals.collection import SourceError
from kvdoctor.signals.vocabulary import DIAGNOSIS_VERDICT
from kvdoctor.sources.fleet import fleet_matchers, read_fleet
from kvdoctor.sources.prometheus import BadSelector, PrometheusClient
from tests.support.servers import FakeServer, send_json

T0 = 1_700_000_000.0
ITL = promql.record_name("itl_p95_seconds", promql.rule_thresholds(None, None))


def vector(*items: tuple[dict, float]) -> dict:
    result = [{"metric": m, "value": [T0, repr(v)]} for m, v in items]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


def fake_fleet(pods: dict[str, str], itl: dict[str, float]):
    """A fake Prometheus answering the fleet's three queries from ``pods`` (pod -> verdict)."""

    def answer(h: BaseHTTPRequestHandler) -> None:
        query = parse_qs(h.body.decode())["query"][0]  # type: ignore[attr-defined]
        if query.startswith("group by"):
            send_json(h, vector(*(({"namespace": "ns", "pod": p}, 1.0) for p in pods)))
        elif query.startswith("max by (namespace, pod, verdict)"):
            send_json(h, vector(*(({"namespace": "ns", "pod": p, "verdict": v}, 1.0) for p, v in pods.items() if v)))
        else:
            send_json(h, vector(*(({"__name__": ITL, "namespace": "ns", "pod": p}, v) for p, v in itl.items())))

    return FakeServer(answer)


def test_three_instant_queries_at_one_time_give_the_summary():
    with fake_fleet({"a": "healthy", "b": "kv_thrashing", "c": ""}, {"a": 0.01, "b": 0.4}) as server:
        with PrometheusClient(server.url(), timeout=2) as client:
            summary = read_fleet(client, '{job="vllm"}', namespace="ns", at=T0)
        forms = server.forms()
    assert len(forms) == 3 and {f["time"][0] for f in forms} == {f"{T0:.3f}"}
    assert all('namespace="ns"' in f["query"][0] for f in forms)
    assert forms[1]["query"][0].startswith(f"max by (namespace, pod, verdict) ({DIAGNOSIS_VERDICT}")
    assert [r.pod for r in summary.rows] == ["b", "a", "c"]
    assert summary.rows[0].itl_p95_seconds == 0.4 and summary.rows[2].verdict == UNKNOWN
    assert summary.selector == '{job="vllm",namespace="ns"}' and summary.at == T0


def test_no_pod_matching_is_an_empty_summary_after_one_question():
    with fake_fleet({}, {}) as server:
        with PrometheusClient(server.url(), timeout=2) as client:
            summary = read_fleet(client, None)
        assert len(server.forms()) == 1
    assert summary.rows == () and summary.slow == 0


@pytest.mark.parametrize(
    "selector, namespace, phrase",
    [
        ("kvdoctor_x{pod='a'}", None, "label matchers only"),
        ("{pod=a}", None, "bad selector"),
        ('{__name__="x"}', None, "do not match __name__"),
        (None, "  ", "namespace is empty"),
    ],
)
def test_a_bad_selector_is_refused_before_asking(selector, namespace, phrase):
    with fake_fleet({"a": "healthy"}, {}) as server:
        with PrometheusClient(server.url(), timeout=2) as client, pytest.raises(BadSelector, match=phrase):
            read_fleet(client, selector, namespace)
        assert server.requests == 0


def test_a_query_the_store_rejects_is_the_selectors_fault():
    def reject(h: BaseHTTPRequestHandler) -> None:
        send_json(h, {"status": "error", "errorType": "bad_data", "error": "invalid regexp"}, status=400)

    rejected = r"rejected the query for selector \{pod=~\"\(\"\}: invalid regexp"
    with (
        FakeServer(reject) as server,
        PrometheusClient(server.url(), timeout=2) as client,
        pytest.raises(BadSelector, match=rejected),
    ):
        read_fleet(client, '{pod=~"("}')


def test_an_unreadable_store_is_a_source_error():
    def broken(h: BaseHTTPRequestHandler) -> None:
        send_json(h, {"status": "error", "errorType": "internal", "error": "tsdb broke"}, status=500)

    with (
        FakeServer(broken) as server,
        PrometheusClient(server.url(), timeout=2) as client,
        pytest.raises(SourceError, match="tsdb broke") as caught,
    ):
        read_fleet(client, None)
    assert not isinstance(caught.value, BadSelector)


def test_the_namespace_is_quoted_into_one_matcher():
    assert fleet_matchers('{pod="a"}', 'we"ird') == [("pod", "=", '"a"'), ("namespace", "=", '"we\\"ird"')]
