"""The Prometheus-backed views against a real Prometheus scraping two real `kvdoctor demo` exporters:
the dashboard's PromQL is accepted and gives the exporters' own numbers; the Fleet page ranks the
targets and opens Live for one (in Chromium, when it is installed). And history from a real
Prometheus backfilled with synthetic samples (what bench/bench_dashboard.py measures)."""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass

import httpx
import numpy as np
import pytest

from kvdoctor.dashboard import charts, promql
from kvdoctor.dashboard.app import create_app, serve_in_thread
from kvdoctor.dashboard.settings import DashboardSettings
from kvdoctor.dashboard.sources import fetch_live_from_prometheus, fleet_summary
from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.window import Window
from kvdoctor.sources.prometheus import PrometheusClient
from tests.support import tools
from tests.support.browser import Page, chromium_browser
from tests.support.demo import DemoProcess
from tests.support.synthetic import SCENARIOS, SyntheticEngine, backfill

pytestmark = [pytest.mark.slow, tools.requires_prometheus, pytest.mark.timeout(400)]


@pytest.fixture
def demos(demo):
    """Two demos, each with its pod label (KVDOCTOR_POD, as the chart sets it): the Fleet page's rows are pods."""
    return [
        demo("kv_thrashing", env={"KVDOCTOR_POD": "demo-thrashing"}),
        demo("healthy", env={"KVDOCTOR_POD": "demo-healthy"}),
    ]


def _instance(demo: DemoProcess) -> str:
    return demo.exporter_url.removeprefix("http://").rstrip("/")


def _exporter_verdict(demo: DemoProcess) -> str | None:
    r = httpx.get(demo.exporter_url + "/api/v1/diagnosis", timeout=5)
    return r.json().get("verdict") if r.status_code == 200 else None


def test_dashboard_queries_on_a_real_prometheus(demos, prometheus_server, tmp_path):
    thrashing, healthy = demos
    tools.wait_until(
        lambda: _exporter_verdict(thrashing) == "kv_thrashing" and _exporter_verdict(healthy) == "healthy",
        timeout=90,
        what="the demos' own verdicts",
    )
    prom = prometheus_server(targets=[_instance(thrashing), _instance(healthy)], scrape_interval="1s")
    prom.wait_for_targets_up()
    prom.wait_for(f"{S.DIAGNOSIS_VERDICT} == 1", lambda r: len(r) == 2, timeout=30)
    time.sleep(5)  # a few more scrapes, for the rates
    client = PrometheusClient(prom.url, timeout=10)

    fleet = fleet_summary(client, time.time())  # no recording rules here: verdicts only, and a note
    assert [(r.pod, r.verdict) for r in fleet.rows] == [("demo-thrashing", "kv_thrashing"), ("demo-healthy", "healthy")]
    assert fleet.notes and "recording rules" in fleet.notes[0]

    now = time.time()
    got = fetch_live_from_prometheus(client, _instance(thrashing), {}, math.floor(now - 60), now, 1.0, 10.0)
    frame = got.frame
    tail = slice(-5, None)
    for name in ("kv_usage", "itl_p50", "itl_p95", "itl_mean", "resident_tokens", "preemption_rate", "decode_floor"):
        assert np.isfinite(getattr(frame, name)[tail]).any(), f"{name} has no value from Prometheus"
    assert frame.kv_capacity_tokens > 0  # the capacity joined to the usage without model_name
    np.testing.assert_allclose(
        np.nanmax(frame.resident_tokens[tail]), np.nanmax(frame.kv_usage[tail]) * frame.kv_capacity_tokens, rtol=0.05
    )
    assert [g.gpu for g in frame.gpus] == ["0"] and np.isfinite(frame.gpus[0].dram[tail]).any()
    # The dashboard diagnoses the last minute from Prometheus with the same rules as the exporter.
    assert got.diagnosis["verdict"] == "kv_thrashing"
    assert {o.value for o in got.targets} >= {"", "gpu=0"}
    # The same numbers the exporter serves: KV usage now, within a scrape of each other.
    window = httpx.get(thrashing.exporter_url + "/api/v1/window", params={"seconds": 5}, timeout=5).json()
    usage = next(s for s in window["series"] if s["name"] == S.KV_CACHE_USAGE)["values"]
    assert np.nanmax(frame.kv_usage[tail]) == pytest.approx(max(v for v in usage if v is not None), abs=0.1)

    chromium = tools.find("chromium")
    if chromium is None:
        return  # the rest needs a browser; the queries above are the point of this test
    handle = serve_in_thread(create_app(prometheus_url=prom.url, environ={}), "127.0.0.1", 0)
    try:
        with chromium_browser(chromium) as browser:
            p = Page(browser, handle.url)
            p.goto("/fleet")
            p.page.wait_for_selector("table.fleet tbody tr >> nth=1", timeout=30_000)
            p.page.locator("table.fleet tbody tr").nth(0).locator("a").first.click()
            p.page.wait_for_url(re.compile(r".*/\?instance="), timeout=30_000)
            p.page.wait_for_selector(".banner[data-verdict='kv_thrashing']", timeout=30_000)
            tools.wait_until(
                lambda: (pts := p.chart_points()) and len(pts) == 4 and all(c and c[0] for c in pts),
                timeout=30,
                what="live charts from Prometheus",
            )
            assert p.errors == []
            p.close()
    finally:
        handle.stop()


@dataclass
class PreemptionBurst:
    """A SyntheticEngine that also preempts ``count`` requests in the ``seconds`` from ``at``."""

    engine: SyntheticEngine
    at: float
    seconds: float
    count: float

    def window(self, start: float, end: float) -> Window:
        window = self.engine.window(start, end)
        series = dict(window.series)
        for key in [k for k in series if k[0] == S.PREEMPTIONS]:
            series[key] = series[key] + np.clip((window.timestamps - self.at) / self.seconds, 0.0, 1.0) * self.count
        return Window(window.timestamps, series)


@tools.requires_promtool
def test_history_from_a_backfilled_prometheus_keeps_a_burst(prometheus_server, tmp_path):
    """A day of history is fetched at the step a day gets (44 s): a 10 s burst of 60 preemptions must
    show at its height over one step, not spread over four, and survive the downsampling; the gauges
    are the samples backfilled (the benchmark's Prometheus holds what the fake would serve)."""
    settings = DashboardSettings()
    step = promql.range_step(86_400, settings.oversampling * settings.max_points)
    assert step == 44.0
    end = float(int(time.time()))
    engine = SyntheticEngine(SCENARIOS["healthy"], t0=end - 3 * 3600, gpus=2)
    start = math.ceil((engine.t0 + 600) / step) * step
    burst = PreemptionBurst(engine, at=start + 60 * step + 15, seconds=10.0, count=60.0)  # inside one step
    instance = "10.0.0.1:9745"
    blocks = tmp_path / "blocks"
    assert (
        backfill(burst, engine.t0, end, blocks, tools.require("promtool"), {"instance": instance, "job": "kvdoctor"})
        > 0
    )
    prom = prometheus_server(config={"global": {"scrape_interval": "15s"}}, tsdb_blocks=blocks)
    client = PrometheusClient(prom.url, timeout=30)

    frame = fetch_live_from_prometheus(
        client, instance, {}, start, end, step, settings.rate_window_seconds, with_diagnosis=False
    ).frame
    peak = np.nanmax(frame.preemption_rate)
    assert peak >= 0.8 * 60 / step  # a window of four steps would show a quarter of it
    assert frame.ts[np.nanargmax(frame.preemption_rate)] == start + 61 * step
    transfers = charts.downsample(charts.live_charts(frame)[charts.TRANSFERS], 100)
    preemptions = next(t for t in transfers["traces"] if t["kind"] == "preemptions")
    assert len(preemptions["x"]) <= 100 and max(v for v in preemptions["y"] if v is not None) == pytest.approx(
        peak, rel=1e-3
    )

    raw = engine.window(start, end)
    at = np.searchsorted(raw.timestamps, frame.ts)
    np.testing.assert_allclose(frame.kv_usage, next(iter(raw.select(S.KV_CACHE_USAGE).values()))[at])
    assert [g.gpu for g in frame.gpus] == ["0", "1"]
    dram = raw.select(S.GPU_DRAM_BANDWIDTH_UTILIZATION, gpu="1")
    np.testing.assert_allclose(frame.gpus[1].dram, next(iter(dram.values()))[at])
