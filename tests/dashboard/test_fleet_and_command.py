"""The Fleet page's data (fake Prometheus over HTTP), the PromQL it sends, and `kvdoctor dashboard`."""

from __future__ import annotations

import socket
import time

import pytest

from kvdoctor.dashboard import components, ids, promql
from kvdoctor.dashboard.app import create_app
from kvdoctor.dashboard.derive import FleetRow
from kvdoctor.dashboard.pages import fleet
from kvdoctor.dashboard.sources import fetch_fleet
from kvdoctor.rules import signals as S
from kvdoctor.sources.prometheus import PrometheusClient
from tests.support.processes import kvdoctor
from tests.support.synthetic import fake_fleet


@pytest.fixture
def prometheus():
    targets = {"10.0.0.1:9745": "healthy", "10.0.0.2:9745": "thrashing", "10.0.0.3:9745": "bandwidth"}
    fake = fake_fleet(targets, age=4000, gpus=1, pods={"10.0.0.2:9745": "llama-2"})
    yield fake
    fake.stop()


def test_fleet_lists_every_target_worst_first(prometheus):
    got = fetch_fleet(PrometheusClient(prometheus.url, 2.0), time.time(), 3600, 2000, 10.0)
    assert not prometheus.unknown
    assert [r.instance for r in got.rows] == ["10.0.0.2:9745", "10.0.0.3:9745", "10.0.0.1:9745"]
    worst = got.rows[0]
    assert (worst.verdict, worst.pod, worst.engine, worst.model_name) == ("kv_thrashing", "llama-2", "vllm", "tiny")
    assert worst.kv_usage > 0.9 and worst.preemption_rate == pytest.approx(0.8, rel=0.05)
    assert set(got.history) == {"itl_p95", "kv_usage"}
    assert len(got.history["kv_usage"]) == 3 and all(len(t["x"]) <= 2000 for t in got.history["kv_usage"])


def test_fleet_page_callbacks_render_links_to_live(prometheus):
    app = create_app(prometheus_url=prometheus.url, environ={})
    with app.server.test_request_context("/fleet"):
        data, badge = fleet.fetch(0, 3600, "", None)
        table, itl_fig, _kv_fig = fleet.render(data)
    text = str(table)
    assert text.index("10.0.0.2:9745") < text.index("10.0.0.1:9745")
    assert "/?instance=10.0.0.2%3A9745" in text and "from=" in text  # live link and review link
    assert len(itl_fig["data"]) == 3 and badge.className.endswith("badge-ok")


def test_fleet_end_time_and_its_errors(prometheus):
    assert fleet.parse_end("2026-01-02 03:04") == 1767323040.0
    assert fleet.parse_end("  ") is None
    with pytest.raises(ValueError, match="end time must look like"):
        fleet.parse_end("yesterday")
    app = create_app(prometheus_url=prometheus.url, environ={})
    with app.server.test_request_context("/fleet"):
        data, badge = fleet.fetch(0, 3600, "yesterday", None)
    assert data is fleet.no_update and badge.className.endswith("badge-stale")


def _find(component, component_id):
    """The component with ``component_id`` in a layout tree, or None."""
    if getattr(component, "id", None) == component_id:
        return component
    children = getattr(component, "children", None)
    for child in children if isinstance(children, list) else [children]:
        if child is not None and not isinstance(child, (str, int, float)):
            found = _find(child, component_id)
            if found is not None:
                return found
    return None


def test_fleet_link_parameters_preselect_the_window(prometheus):
    app = create_app(prometheus_url=prometheus.url, environ={})
    with app.server.test_request_context("/fleet"):
        page = fleet.layout(range="900", end="2026-01-02 03:04")
        assert _find(page, ids.FLEET_RANGE).value == 900
        assert _find(page, fleet.FLEET_END).value == "2026-01-02 03:04"
        junk = fleet.layout(range="12345", end="<script>")
        assert _find(junk, ids.FLEET_RANGE).value == 3600 and _find(junk, fleet.FLEET_END).value == ""


def test_fleet_without_prometheus_says_what_it_needs():
    app = create_app(exporter_url="http://127.0.0.1:9", environ={})
    with app.server.test_request_context("/fleet"):
        assert "Fleet needs Prometheus" in str(fleet.layout())


def test_live_href_never_carries_more_than_the_target_and_range():
    row = FleetRow("10.0.0.1:9745")
    assert fleet.live_href(row) == "/?instance=10.0.0.1%3A9745"
    assert fleet.live_href(row, 100.0, 200.0) == "/?instance=10.0.0.1%3A9745&from=100&to=200"


@pytest.mark.parametrize(
    "value, literal",
    [
        ("plain", '"plain"'),
        ('a"b', '"a\\"b"'),
        ("back\\slash", '"back\\\\slash"'),
        ("new\nline", '"new\\nline"'),
    ],
)
def test_promql_quoting(value, literal):
    assert promql.quote(value) == literal


def test_promql_matchers_refuse_odd_label_names():
    assert promql.matchers({"instance": "x", "gpu": "0"}) == '{gpu="0",instance="x"}'
    with pytest.raises(ValueError):
        promql.matchers({'a"}': "x"})


def test_range_step_is_sized_to_the_range():
    assert promql.range_step(900, 8000) == 1.0
    assert promql.range_step(86400, 8000) == 11.0
    assert promql.range_step(7 * 86400, 8000) == 76.0
    assert promql.rate_window(1.0, 10.0) == "10s"  # live: the trailing window the exporter's charts use
    assert promql.rate_window(44.0, 10.0) == "47s"  # a day in 2,000 points: each window one step and a sample


def test_live_queries_use_the_canonical_names():
    queries = promql.live_queries({"instance": "i"}, 1.0, 10.0)
    assert S.INTER_TOKEN_LATENCY + "_bucket" in queries["itl_p95"]
    assert all("kvdoctor_" in q for q in queries.values())


def test_verdict_classes_cover_every_verdict():
    from kvdoctor.rules.diagnosis import VERDICTS

    for verdict in VERDICTS:
        assert components.verdict_class(verdict) in ("verdict-ok", "verdict-warn", "verdict-bad", "verdict-idle")
        assert components.verdict_title(verdict) != verdict


# ------------------------------------------------------------------------------------- command


def _kvdoctor(capsys, *args):
    """`kvdoctor dashboard ARGS` in this process (a new interpreter costs seconds): (rc, stderr)."""
    from kvdoctor.cli import main

    rc = main(["dashboard", *args])
    return rc, capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message",
    [
        ((), "give --exporter URL and/or --prometheus URL"),
        (("--exporter", "ftp://x"), "exporter URL must be http(s)://host[:port]"),
        (("--exporter", "http://127.0.0.1:1", "--port", "70000"), "--port must be 0..65535"),
    ],
)
def test_command_usage_errors_are_one_line(capsys, monkeypatch, args, message):
    monkeypatch.delenv("KVDOCTOR_DASHBOARD_EXPORTER_URL", raising=False)
    monkeypatch.delenv("KVDOCTOR_DASHBOARD_PROMETHEUS_URL", raising=False)
    rc, err = _kvdoctor(capsys, *args)
    assert rc == 2
    assert err.strip().count("\n") == 0 and message in err and "Traceback" not in err


def test_command_refuses_a_port_in_use(capsys):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        rc, err = _kvdoctor(capsys, "--exporter", "http://127.0.0.1:1", "--port", str(port))
    assert rc == 2
    assert (
        err.strip()
        == f"kvdoctor dashboard: error: cannot serve the dashboard on 127.0.0.1:{port}: Address already in use"
    )


@pytest.mark.slow
def test_command_serves_on_loopback_and_prints_its_url(spawn):
    import httpx

    dashboard = spawn(kvdoctor("dashboard", "--exporter", "http://127.0.0.1:1", "--port", "0", merge_stderr=False))
    url = dashboard.wait_for_line(r"^kvdoctor dashboard: (http://127\.0\.0\.1:\S+)").group(1)
    assert httpx.get(url, timeout=10).status_code == 200
