"""The Live page's callbacks against a fake exporter / fake Prometheus over real HTTP (no browser)."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
from dash import no_update

from kvdoctor.dashboard import charts
from kvdoctor.dashboard.app import create_app
from kvdoctor.dashboard.pages import live
from kvdoctor.dashboard.sources import backend
from kvdoctor.signals.collection import SourceError
from kvdoctor.sources.exporter_api import ExporterClient
from tests.support.synthetic import SCENARIOS, FakeExporter, SyntheticEngine, diagnosis_for, fake_fleet


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


def _update(app, tick, target, range_value, instance, history, cursor: live.Cursor | None) -> live.Update:
    """``live.update`` with the app's sources, at the current time."""
    controls = live.Controls(target, range_value, instance, history)
    with app.server.test_request_context("/"):
        return live.update(tick, controls, cursor or live.Cursor(), backend(), time.time())


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
    first = _update(app, 0, "", "live:900", "", None, None)
    data, cursor = first.data, first.cursor
    assert data["mode"] == "full" and data["order"] == [c for c, _ in live.GRAPHS]
    kv_fig = data["figures"][charts.KV_LATENCY]
    assert len(kv_fig["data"]) == 3 and 295 <= len(kv_fig["data"][0]["x"]) <= 302
    assert len(data["figures"][charts.BANDWIDTH]["data"]) == 16
    assert first.diagnosis["diagnosis"]["verdict"] == "kv_thrashing"
    assert first.health["ok"] and not first.health["sources_down"]
    assert [o["value"] for o in first.options][:2] == ["", "gpu=0"]
    assert first.interval_disabled is False

    time.sleep(2.1)
    second = _update(app, 1, "", "live:900", "", None, cursor)
    ext = second.data
    assert ext["mode"] == "extend"
    payload, indices, cap = ext["extend"][charts.KV_LATENCY]
    assert indices == [0, 1, 2] and cap == app.server.extensions["kvdoctor_dashboard"].settings.live_points_cap
    new_x = payload["x"][0]
    assert 1 <= len(new_x) <= 3 and new_x[0] > kv_fig["data"][0]["x"][-1]  # only points after the last one
    assert second.diagnosis is None  # unchanged diagnosis is not resent
    assert second.options is None
    assert exporter.requests[-2:] == [exporter.requests[-2], "/api/v1/diagnosis"]  # two requests an update
    assert _last_window_seconds(exporter) < 30


def test_the_callback_keeps_the_cursor_as_json_and_sends_no_update_for_what_is_unchanged(exporter):
    app = create_app(exporter_url=exporter.url, environ={})
    data, store, diagnosis, health, options, disabled = _in_app(app, live.fetch, 0, "", "live:900", "", None, None)
    assert data["mode"] == "full" and diagnosis["diagnosis"] and options and disabled is False
    store = json.loads(json.dumps(store))  # as the browser's store gives it back
    assert set(store) == {f.name for f in dataclasses.fields(live.Cursor)}
    time.sleep(1.1)
    data, store, diagnosis, health, options, _ = _in_app(app, live.fetch, 1, "", "live:900", "", None, store)
    assert data["mode"] == "extend" and health["ok"]
    assert diagnosis is no_update and options is no_update
    assert live.Update(data=data).outputs()[1:] == (no_update,) * 5


def test_a_failed_fetch_keeps_the_charts_and_turns_the_badge_stale(exporter):
    app = create_app(exporter_url=exporter.url, environ={})
    first = _update(app, 0, "", "live:900", "", None, None)
    exporter.fail = True
    failed = _update(app, 1, "", "live:900", "", None, first.cursor)
    assert failed.data == {"mode": "none", "order": [c for c, _ in live.GRAPHS], "tick": 1}  # the gate's tick only
    assert failed.cursor is None and failed.diagnosis is None
    assert failed.health["ok"] is False and "HTTP 500" in failed.health["error"]
    assert failed.health["newest"] == first.cursor.newest
    exporter.fail = False
    time.sleep(1.1)  # at least one new sample
    recovered = _update(app, 2, "", "live:900", "", None, first.cursor)
    assert recovered.health["ok"] and recovered.data["mode"] == "extend" and recovered.data["tick"] == 2


def test_a_source_down_shows_in_health(exporter):
    exporter.sources_down = {"nvml": "NVML library not found"}
    app = create_app(exporter_url=exporter.url, environ={})
    out = _update(app, 0, "", "live:900", "", None, None)
    assert out.health["sources_down"] == [{"name": "nvml", "error": "NVML library not found"}]


def test_a_new_knee_rebuilds_instead_of_appending(exporter):
    app = create_app(exporter_url=exporter.url, environ={})
    first = _update(app, 0, "", "live:900", "", None, None)
    exporter.diagnosis = dict(diagnosis_for(SCENARIOS["thrashing"]), knee={"kind": "jump", "kv_level": 0.6})
    out = _update(app, 1, "", "live:900", "", None, first.cursor)
    assert out.data["mode"] == "full"
    assert out.data["figures"][charts.ITL_KV]["layout"]["shapes"][0]["x0"] == pytest.approx(60_000)  # 0.6 x 100k
    assert out.diagnosis["diagnosis"]["knee"]["kv_level"] == 0.6


def test_changing_the_target_refetches_the_whole_window(exporter):
    app = create_app(exporter_url=exporter.url, environ={})
    first = _update(app, 0, "", "live:900", "", None, None)
    out = _update(app, 0, "gpu=3", "live:900", "", None, first.cursor)
    assert out.data["mode"] == "full"
    names = [t["name"] for t in out.data["figures"][charts.BANDWIDTH]["data"]]
    assert names == ["GPU 3 DRAM bandwidth", "GPU 3 SM activity"]


def test_the_exporter_only_gives_what_it_holds_so_the_span_is_capped(exporter):
    app = create_app(exporter_url=exporter.url, environ={})
    _update(app, 0, "", "live:99999", "", None, None)  # a forged range value
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
    out = _update(app, 0, "", "live:300", "10.0.0.1:9745", None, None)
    assert not prometheus.unknown
    data = out.data
    assert data["mode"] == "full"
    kv = data["figures"][charts.KV_LATENCY]["data"][0]["y"]
    assert 290 <= len(kv) <= 302 and min(v for v in kv if v is not None) > 85  # thrashing: KV near full
    assert len(data["figures"][charts.BANDWIDTH]["data"]) == 4
    # rules.diagnosis is there: the dashboard diagnoses the last minute itself, with evidence.
    assert out.diagnosis["diagnosis"]["verdict"] == "kv_thrashing"
    assert out.diagnosis["diagnosis"]["evidence"]


def test_history_from_prometheus_is_downsampled_and_fetched_once(prometheus):
    app = create_app(prometheus_url=prometheus.url, environ={})
    out = _update(app, 0, "", "hist:3600", "10.0.0.2:9745", None, None)
    assert not prometheus.unknown
    assert out.interval_disabled is True and out.health["history"]
    step = float(next(p["step"] for path, p in prometheus.queries if path == "/api/v1/query_range"))
    assert step == 2.0  # 3600 s / 2000 points, rounded up to whole seconds
    for fig in out.data["figures"].values():
        assert all(len(t["x"]) <= 2000 for t in fig["data"])
    # Up to 2,000 points a trace, shared by a chart's traces: 4 (2 GPUs x DRAM, SM) share 8,000 and
    # keep every point of the range; the 5 of the transfers chart are cut to 1,600 each.
    kept = len(out.data["figures"][charts.KV_LATENCY]["data"][0]["x"])
    assert kept == 1801
    assert [len(t["x"]) for t in out.data["figures"][charts.BANDWIDTH]["data"]] == [kept] * 4
    assert [len(t["x"]) for t in out.data["figures"][charts.TRANSFERS]["data"]] == [1600] * 5
    again = _update(app, 1, "", "hist:3600", "10.0.0.2:9745", None, out.cursor)
    assert again.data is None and again.cursor is None and again.interval_disabled is True


def test_a_fleet_link_range_is_honoured(prometheus):
    app = create_app(prometheus_url=prometheus.url, environ={})
    end = time.time() - 600
    history = {"from": end - 1800, "to": end}
    out = _update(app, 0, "", "fixed", "10.0.0.1:9745", history, None)
    xs = out.data["figures"][charts.KV_LATENCY]["data"][0]["x"]
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
