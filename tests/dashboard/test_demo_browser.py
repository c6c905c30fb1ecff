"""The dashboard against the real `kvdoctor demo` (simulated engine and GPU, real exporter), in
headless Chromium: a verdict within 10 s, each scenario's verdict on the banner, charts with data,
the stale badge when the exporter goes away. Screenshots: KVDOCTOR_SCREENSHOT_DIR=docs/img."""

from __future__ import annotations

import time

import pytest

from kvdoctor.dashboard.app import create_app, serve_in_thread
from kvdoctor.simulator.scenarios import SCENARIOS
from tests.support import tools
from tests.support.browser import Page

pytestmark = [pytest.mark.slow, tools.requires_chromium, pytest.mark.timeout(400)]

FIRST_VERDICT_S = 10.0  # the acceptance bar
# The simulation needs some seconds of traffic before the rules' 60 s window says the
# scenario's verdict; on a busy 2-core machine, more.
SCENARIO_VERDICT_S = 90.0


def _verdict(p: Page) -> str | None:
    return p.page.locator(".banner").get_attribute("data-verdict")


def _charts_with_data(p: Page):
    pts = p.chart_points()
    return pts if len(pts) == 4 and all(chart and chart[0] > 0 for chart in pts) else None


def test_demo_shows_a_verdict_within_10_seconds(demo, open_page, tmp_path):
    d = demo("kv_thrashing", dashboard=True)
    p = open_page(d.dashboard_url)
    p.goto("/")
    p.page.wait_for_selector(".banner[data-verdict]:not([data-verdict=''])", timeout=FIRST_VERDICT_S * 1000)
    elapsed = time.monotonic() - d.started_at
    assert elapsed < FIRST_VERDICT_S, f"verdict after {elapsed:.1f} s"
    tools.wait_until(lambda: _verdict(p) == "kv_thrashing", timeout=SCENARIO_VERDICT_S, what="kv_thrashing")
    tools.wait_until(lambda: _charts_with_data(p), timeout=60, what="four charts with data")
    # For the README's picture, a couple of minutes of history on the charts.
    p.page.wait_for_timeout(120_000 if p.keeping_screenshots() else 2_000)
    p.screenshot("live", tmp_path)
    assert p.errors == []


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s != "kv_thrashing"])
def test_each_demo_scenario_shows_its_verdict(demo, open_page, scenario):
    d = demo(scenario, dashboard=True)
    p = open_page(d.dashboard_url)
    p.goto("/")
    expected = SCENARIOS[scenario].expected_verdict
    tools.wait_until(
        lambda: _verdict(p) == expected,
        timeout=SCENARIO_VERDICT_S,
        what=f"verdict {expected} (banner shows {_verdict(p)!r})",
    )
    assert p.page.locator(".banner .verdict-headline").inner_text().strip()
    tools.wait_until(lambda: _charts_with_data(p), timeout=60, what="four charts with data")
    assert p.page.locator("#live-badge .badge").get_attribute("data-state") == "live"
    assert p.errors == []


def test_stale_badge_when_the_real_exporter_stops(demo, open_page):
    d = demo("bandwidth_bound")
    handle = serve_in_thread(create_app(exporter_url=d.exporter_url, environ={}), "127.0.0.1", 0)
    try:
        p = open_page(handle.url)
        p.goto("/")
        p.page.wait_for_selector(".banner[data-verdict]:not([data-verdict=''])", timeout=30_000)
        before = tools.wait_until(lambda: _charts_with_data(p), timeout=60, what="four charts with data")
        d.stop()
        badge = p.page.locator("#live-badge .badge[data-state='stale']")
        badge.wait_for(timeout=30_000)
        assert "unreachable" in badge.inner_text() or "refused" in badge.inner_text()
        after = p.chart_points()
        assert after[0][0] >= before[0][0]  # the charts keep their data
        assert p.errors == []
    finally:
        handle.stop()
