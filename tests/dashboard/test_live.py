"""The Live page's callbacks against a fake exporter / fake Prometheus over real HTTP (no browser)."""

from __future__ import annotations

import time

import pytest
from dash import no_update

from kvdoctor.dashboard import charts
from kvdoctor.dashboard.app import create_app
from kvdoctor.dashboard.pages import live
from kvdoctor.rules.collection import SourceError
from kvdoctor.sources.exporter_api import ExporterClient
from tests.support.synthetic import SCENARIOS, FakeExporter, SyntheticEngine, diagnosis_for, fake_fleet

DATA, CURSOR, DIAGNOSIS, HEALTH, OPTIONS, DISABLED = range(6)


@pytest.fixture
def exporter():
    fake = FakeExporter(SyntheticEngine(SCENARIOS["thrashing"], t0=time.time() - 300, gpus=8))
    yield fake
    fake.stop()


def _last_window_seconds(exporter) -> int:
    last = [r for r in exporter.requests if r.startswith("/api/v1/window?seconds=")][-1]
    return int(last.split("=")[1])


def _in_app(app, fn, *args):
    with app.server.test_request_context("/"):
        return fn(*args)


def test_exporter_client_reads_window_diagnosis_and_status(exporter):
    client = ExporterClient(exporter.url, timeout=2.0)
    window, status = client.window_and_sources(60)
    assert 55 <= len(window) <= 61 and set(status["sources"]) == {"engine", "nvml"}  # carried by the window
    assert client.diagnosis()["verdict"] == "kv_thrashing"
    assert set(client.status()["sources"]) == {"engine", "nvml"}
    exporter.fail = True
    with pytest.raises(SourceError, match="HTTP 500"):
        client.window(60)


def test_exporter_client_names_an_unreachable_exporter():
    client = ExporterClient("http://127.0.0.1:9", timeout=0.5)
    with pytest.raises(SourceError, match=r"127\.0\.0\.1:9/api/v1/window: connection refused"):
        client.window(10)


def test_first_fetch_sends_whole_figures_then_only_new_points(exporter):
    app = create_app(exporter_url=exporter.url, environ={})
    first = _in_app(app, live.fetch, 0, "", "live:900", "", None, None)
    data, cursor = first[DATA], first[CURSOR]
    assert data["mode"] == "full" and data["order"] == [c for c, _ in live.GRAPHS]
    kv_fig = data["figures"][charts.KV_LATENCY]
    assert len(kv_fig["data"]) == 3 and 295 <= len(kv_fig["data"][0]["x"]) <= 302
    assert len(data["figures"][charts.BANDWIDTH]["data"]) == 16
    assert first[DIAGNOSIS]["diagnosis"]["verdict"] == "kv_thrashing"
    assert first[HEALTH]["ok"] and not first[HEALTH]["sources_down"]
    assert [o["value"] for o in first[OPTIONS]][:2] == ["", "gpu=0"]
    assert first[DISABLED] is False

    time.sleep(2.1)
    second = _in_app(app, live.fetch, 1, "", "live:900", "", None, cursor)
    ext = second[DATA]
    assert ext["mode"] == "extend"
    payload, indices, cap = ext["extend"][charts.KV_LATENCY]
    assert indices == [0, 1, 2] and cap == app.server.extensions["kvdoctor_dashboard"].settings.live_points_cap
    new_x = payload["x"][0]
    assert 1 <= len(new_x) <= 3 and new_x[0] > kv_fig["data"][0]["x"][-1]  # only points after the last one
    assert second[DIAGNOSIS] is no_update  # unchanged diagnosis is not resent
    assert second[OPTIONS] is no_update
    assert exporter.requests[-2:] == [exporter.requests[-2], "/api/v1/diagnosis"]  # two requests an update
    assert _last_window_seconds(exporter) < 30


def test_a_failed_fetch_keeps_the_charts_and_turns_the_badge_stale(exporter):
    app = create_app(exporter_url=exporter.url, environ={})
    first = _in_app(app, live.fetch, 0, "", "live:900", "", None, None)
    exporter.fail = True
    failed = _in_app(app, live.fetch, 1, "", "live:900", "", None, first[CURSOR])
    assert failed[DATA] == {"mode": "none", "order": [c for c, _ in live.GRAPHS], "tick": 1}  # the gate's tick only
    assert failed[CURSOR] is no_update and failed[DIAGNOSIS] is no_update
    assert failed[HEALTH]["ok"] is False and "HTTP 500" in failed[HEALTH]["error"]
    assert failed[HEALTH]["newest"] == first[CURSOR]["newest"]
    exporter.fail = False
    time.sleep(1.1)  # at least one new sample
    recovered = _in_app(app, live.fetch, 2, "", "live:900", "", None, first[CURSOR])
    assert recovered[HEALTH]["ok"] and recovered[DATA]["mode"] == "extend" and recovered[DATA]["tick"] == 2


def test_a_source_down_shows_in_health(exporter):
    exporter.sources_down = {"nvml": "NVML library not found"}
    app = create_app(exporter_url=exporter.url, environ={})
    out = _in_app(app, live.fetch, 0, "", "live:900", "", None, None)
    assert out[HEALTH]["sources_down"] == [{"name": "nvml", "error": "NVML library not found"}]


def test_a_new_knee_rebuilds_instead_of_appending(exporter):
    app = create_app(exporter_url=exporter.url, environ={})
    first = _in_app(app, live.fetch, 0, "", "live:900", "", None, None)
    exporter.diagnosis = dict(diagnosis_for(SCENARIOS["thrashing"]), knee={"kind": "jump", "kv_level": 0.6})
    out = _in_app(app, live.fetch, 1, "", "live:900", "", None, first[CURSOR])
    assert out[DATA]["mode"] == "full"
    assert out[DATA]["figures"][charts.KV_LATENCY]["layout"]["shapes"][0]["y0"] == pytest.approx(60.0)
    assert out[DIAGNOSIS]["diagnosis"]["knee"]["kv_level"] == 0.6


def test_changing_the_target_refetches_the_whole_window(exporter):
    app = create_app(exporter_url=exporter.url, environ={})
    first = _in_app(app, live.fetch, 0, "", "live:900", "", None, None)
    out = _in_app(app, live.fetch, 0, "gpu=3", "live:900", "", None, first[CURSOR])
    assert out[DATA]["mode"] == "full"
    names = [t["name"] for t in out[DATA]["figures"][charts.BANDWIDTH]["data"]]
    assert names == ["GPU 3 DRAM bandwidth", "GPU 3 SM activity"]


def test_the_exporter_only_gives_what_it_holds_so_the_span_is_capped(exporter):
    app = create_app(exporter_url=exporter.url, environ={})
    _in_app(app, live.fetch, 0, "", "live:99999", "", None, None)  # a forged range value
    assert _last_window_seconds(exporter) == 900


@pytest.mark.parametrize(
    "value, expected",
    [
        ("live:300", (False, 300.0)),
        ("hist:86400", (True, 86400.0)),
        ("hist:-5", (False, 900.0)),
        ("live:1e9", (False, 900.0)),
        ("nonsense", (False, 900.0)),
        (None, (False, 900.0)),
    ],
)
def test_parse_range(value, expected):
    assert live.parse_range(value, 900) == expected


@pytest.fixture
def prometheus():
    targets = {"10.0.0.1:9745": "thrashing", "10.0.0.2:9745": "healthy"}
    fake = fake_fleet(targets, age=7200, gpus=2, pods={"10.0.0.1:9745": "llama-0", "10.0.0.2:9745": "llama-1"})
    yield fake
    fake.stop()


def test_live_from_prometheus_for_one_target(prometheus):
    app = create_app(prometheus_url=prometheus.url, environ={})
    out = _in_app(app, live.fetch, 0, "", "live:300", "10.0.0.1:9745", None, None)
    assert not prometheus.unknown
    data = out[DATA]
    assert data["mode"] == "full"
    kv = data["figures"][charts.KV_LATENCY]["data"][0]["y"]
    assert 290 <= len(kv) <= 302 and min(v for v in kv if v is not None) > 85  # thrashing: KV near full
    assert len(data["figures"][charts.BANDWIDTH]["data"]) == 4
    # rules.diagnosis is there: the dashboard diagnoses the last minute itself, with evidence.
    assert out[DIAGNOSIS]["diagnosis"]["verdict"] == "kv_thrashing"
    assert out[DIAGNOSIS]["diagnosis"]["evidence"]


def test_history_from_prometheus_is_downsampled_and_fetched_once(prometheus):
    app = create_app(prometheus_url=prometheus.url, environ={})
    out = _in_app(app, live.fetch, 0, "", "hist:3600", "10.0.0.2:9745", None, None)
    assert not prometheus.unknown
    assert out[DISABLED] is True and out[HEALTH]["history"]
    step = float(next(p["step"] for path, p in prometheus.queries if path == "/api/v1/query_range"))
    assert step == 2.0  # 3600 s / 2000 points, rounded up to whole seconds
    for fig in out[DATA]["figures"].values():
        assert all(len(t["x"]) <= 2000 for t in fig["data"])
    # Up to 2,000 points a trace, shared by a chart's traces: 4 (2 GPUs x DRAM, SM) share 8,000 and
    # keep every point of the range; the 5 of the transfers chart are cut to 1,600 each.
    kept = len(out[DATA]["figures"][charts.KV_LATENCY]["data"][0]["x"])
    assert kept == 1801
    assert [len(t["x"]) for t in out[DATA]["figures"][charts.BANDWIDTH]["data"]] == [kept] * 4
    assert [len(t["x"]) for t in out[DATA]["figures"][charts.TRANSFERS]["data"]] == [1600] * 5
    again = _in_app(app, live.fetch, 1, "", "hist:3600", "10.0.0.2:9745", None, out[CURSOR])
    assert again[DATA] is no_update


def test_a_fleet_link_range_is_honoured(prometheus):
    app = create_app(prometheus_url=prometheus.url, environ={})
    end = time.time() - 600
    history = {"from": end - 1800, "to": end}
    out = _in_app(app, live.fetch, 0, "", "fixed", "10.0.0.1:9745", history, None)
    xs = out[DATA]["figures"][charts.KV_LATENCY]["data"][0]["x"]
    assert abs(xs[-1] / 1000 - end) <= 2 and abs(xs[0] / 1000 - (end - 1800)) <= 2


def test_page_parameters_only_ever_select_series(prometheus):
    """A hostile ``instance`` from the URL is a quoted label value sent to the configured
    Prometheus, never a URL the dashboard fetches."""
    app = create_app(prometheus_url=prometheus.url, environ={})
    hostile = 'http://169.254.169.254/latest"} or vector(1) or {a="'
    with app.server.test_request_context("/"):
        layout = live.layout(instance=hostile, target="gpu=0&url=http://evil")
        assert layout is not None
        live.fetch(0, "gpu=0&url=http://evil", "live:300", hostile, None, None)
    sent = [p.get("query", "") for _, p in prometheus.queries]
    assert all(path.startswith("/api/v1/") for path, _ in prometheus.queries)
    hostile_queries = [q for q in sent if "169.254" in q]
    assert hostile_queries and all(
        'instance="http://169.254.169.254/latest\\"} or vector(1) or {a=\\""' in q for q in hostile_queries
    )
    assert not any("evil" in q for q in sent)
