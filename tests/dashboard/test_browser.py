"""The dashboard in real headless Chromium: verdicts, charts, the stale badge, the ledger.

These run against the fake exporter / fake Prometheus of synthetic.py (real HTTP, synthetic
data); tests/dashboard/test_demo_browser.py runs the same checks against the real `kvdoctor demo`.
Screenshots: set KVDOCTOR_SCREENSHOT_DIR=docs/img to refresh the README's images.
"""

from __future__ import annotations

import time

import pytest

from kvdoctor.dashboard.app import create_app, serve_in_thread
from kvdoctor.ledger.gpus import gpu_spec
from kvdoctor.ledger.model import COMMON_MODELS
from tests.support import servers, tools
from tests.support.browser import Page
from tests.support.synthetic import SCENARIOS, SYNTHETIC_SLO_SECONDS, FakeExporter, SyntheticEngine

pytestmark = [pytest.mark.slow, tools.requires_chromium, pytest.mark.timeout(240)]

# Room for a busy machine (Chromium rendering shares the CPUs with everything else); the
# acceptance bar, a verdict within 10 s, is checked against the real demo (test_demo_browser.py).
SLOW_MS = 30_000


@pytest.fixture
def served():
    """Factory: serve a dashboard for the given sources; stops everything afterwards."""
    stops = []

    def serve(environ: dict | None = None, **sources):
        app = create_app(environ=environ or {}, **sources)
        handle = serve_in_thread(app, "127.0.0.1", 0)
        stops.append(handle.stop)
        return handle

    yield serve
    for stop in stops:
        stop()


@pytest.fixture
def fake_exporter():
    made = []

    def make(scenario: str, gpus: int = 8, age: float = 300.0) -> FakeExporter:
        fake = FakeExporter(SyntheticEngine(SCENARIOS[scenario], t0=time.time() - age, gpus=gpus))
        made.append(fake)
        return fake

    yield make
    for fake in made:
        fake.stop()


def _wait_for_verdict(p: Page, verdict: str, timeout_ms: int = SLOW_MS):
    p.page.wait_for_selector(f".banner[data-verdict='{verdict}']", timeout=timeout_ms)


def _wait_for_charts(p: Page, timeout_s: float = SLOW_MS / 1000) -> list[list[int]]:
    try:
        return tools.wait_until(
            lambda: (
                (pts := p.chart_points())
                and len(pts) == 4
                and all(pts)
                and all(n > 0 for chart in pts for n in chart[:1])
                and pts
            ),
            timeout=timeout_s,
            what="four charts with data",
        )
    except TimeoutError as exc:  # say what the page said: the badge carries the fetch's error
        badge = p.page.locator("#live-badge").inner_text(timeout=2000)
        raise TimeoutError(f"{exc}; badge: {badge!r}; points: {p.chart_points()}") from None


@pytest.mark.parametrize("scenario", ["thrashing", "bandwidth", "healthy"])
def test_live_page_shows_the_verdict_and_live_charts(scenario, served, fake_exporter, open_page):
    exporter = fake_exporter(scenario)
    handle = served(exporter_url=exporter.url)
    p = open_page(handle.url)
    p.goto("/")
    _wait_for_verdict(p, SCENARIOS[scenario].verdict)  # the 10 s bar is checked on the real demo

    banner = p.page.locator(".banner")
    assert SCENARIOS[scenario].headline in banner.inner_text()
    assert banner.locator("table.evidence tbody tr").count() == 3
    assert "--kv-cache-dtype fp8" in banner.locator(".actions").inner_text()

    points = _wait_for_charts(p)
    assert len(points[1]) == 16  # DRAM and SM for 8 GPUs
    assert min(points[0]) >= 295  # 5 minutes of 1 Hz data on the KV/latency chart
    grown = tools.wait_until(
        lambda: (now := p.chart_points()) and now[0][0] > points[0][0] and now,
        timeout=SLOW_MS / 1000,
        what="live points appended",
    )
    assert len(grown[1]) == 16  # appended, not rebuilt into something else
    assert p.page.locator("#live-badge .badge").get_attribute("data-state") == "live"
    drawn = _axes_as_drawn(p)
    for chart in (0, 2):  # KV/latency and preemptions/PCIe: two axes, one set of gridlines
        assert drawn[chart]["y"] == drawn[chart]["y2"] and len(drawn[chart]["y"]) >= 5, drawn[chart]
    assert f"ITL SLO {SYNTHETIC_SLO_SECONDS * 1000:g} ms" in drawn[0]["notes"]  # the published SLO, drawn
    assert f"ITL SLO {SYNTHETIC_SLO_SECONDS * 1000:g} ms" in drawn[3]["notes"]
    assert p.errors == []


def _axes_as_drawn(p: Page) -> list[dict]:
    """Each chart's y-axis ticks as Plotly drew them (pixels from the top) and its annotations."""
    return p.page.evaluate(
        """() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(g => {
            const L = g._fullLayout;
            const px = ax => ax ? ax._vals.filter(v => !v.minor).map(v => Math.round(ax.l2p(v.x))) : [];
            return {y: px(L.yaxis), y2: px(L.yaxis2),
                    notes: Array.from(g.querySelectorAll('.annotation-text')).map(e => e.textContent)};
        })"""
    )


def test_stale_badge_when_the_exporter_goes_away(served, fake_exporter, open_page):
    exporter = fake_exporter("thrashing", gpus=2)
    handle = served(exporter_url=exporter.url)
    p = open_page(handle.url)
    p.goto("/")
    _wait_for_verdict(p, "kv_thrashing")
    before = _wait_for_charts(p)
    exporter.stop()
    badge = p.page.locator("#live-badge .badge[data-state='stale']")
    badge.wait_for(timeout=SLOW_MS)
    # The kept-alive connection is hung up first, then the port refuses.
    tools.wait_until(
        lambda: "connection refused" in badge.inner_text(),
        timeout=SLOW_MS / 1000,
        what="the badge naming the refused connection",
    )
    after = p.chart_points()
    assert after[0][0] >= before[0][0]  # the charts keep what they had
    assert p.page.locator(".banner").get_attribute("data-verdict") == "kv_thrashing"
    assert p.errors == []


def test_an_exporter_slower_than_the_refresh_still_updates(served, fake_exporter, open_page):
    """Each window request takes 1.5 s against a 1 s refresh: the browser must wait for each answer
    instead of firing a new request every second (Dash would drop every answer but the last), and
    wait until the charts have taken it: a tick landing between the first answer and the charts'
    routing once left them empty for good (about one page load in four; three loads here)."""
    exporter = fake_exporter("healthy", gpus=1)
    exporter.delay = 1.5
    # Slower than the refresh, not than the request timeout (2 s by default: a loaded machine can
    # spend the 0.5 s left over building and sending the window, and then nothing ever arrives).
    url = served(exporter_url=exporter.url, environ={"KVDOCTOR_DASHBOARD_REQUEST_TIMEOUT": "10"}).url
    p = None
    for _ in range(3):
        if p is not None:
            p.close()  # its polling would add to the requests counted below
        p = open_page(url)
        asked_before = len(exporter.requests)
        p.goto("/")
        first = _wait_for_charts(p)
        assert p.errors == []
    tools.wait_until(
        lambda: (now := p.chart_points()) and now[0][0] >= first[0][0] + 2,
        timeout=SLOW_MS / 1000,
        what="points appended despite the slow exporter",
    )
    windows = [r for r in exporter.requests[asked_before:] if r.startswith("/api/v1/window")]
    assert len(windows) <= 2 + (time.monotonic() - p.opened) / 1.5  # never more than one in flight
    assert p.errors == []


def test_source_down_badge(served, fake_exporter, open_page):
    exporter = fake_exporter("healthy", gpus=1)
    exporter.sources_down = {"nvml": "NVML library not found"}
    p = open_page(served(exporter_url=exporter.url).url)
    p.goto("/")
    badge = p.page.locator("#live-badge .badge[data-state='source-down']")
    badge.wait_for(timeout=SLOW_MS)
    assert "source nvml down: NVML library not found" in badge.inner_text()


@pytest.mark.parametrize("source", ["prometheus_url", "exporter_url"])
def test_every_page_names_a_source_that_cannot_be_read(source, served, open_page):
    """`kvdoctor dashboard --prometheus URL` (the chart's only mode) or `--exporter URL` with
    nothing answering there: each page says so at the top, naming the URL and the error, and the
    Live page's banner says why no diagnosis comes instead of waiting for one forever."""
    url = servers.refusing_url()
    what, path = ("Prometheus", "/api/v1/query") if source == "prometheus_url" else ("the exporter", "/api/v1/window")
    line = f"cannot reach {what} at {url}{path}: connection refused"
    p = open_page(served(**{source: url}).url)
    for page in ("/", "/ledger", "/fleet"):
        p.goto(page)
        banner = p.page.locator("#source-problems .source-problems")
        banner.wait_for(timeout=SLOW_MS)
        assert line in banner.inner_text(), page
    p.goto("/")
    live = p.page.locator("#live-banner .banner[data-error='true']")
    live.wait_for(timeout=SLOW_MS)
    said = live.inner_text()
    assert "No diagnosis: the source cannot be read" in said and "Waiting" not in said
    assert (url in said) if source == "exporter_url" else ("lists no kvdoctor exporter" in said)
    assert p.errors == []


def test_the_source_banner_goes_once_the_source_reads(served, fake_exporter, open_page):
    exporter = fake_exporter("healthy", gpus=1)
    exporter.fail = True
    p = open_page(served(exporter_url=exporter.url).url)
    p.goto("/")
    banner = p.page.locator("#source-problems .source-problems")
    banner.wait_for(timeout=SLOW_MS)
    assert exporter.url in banner.inner_text() and "500" in banner.inner_text()
    exporter.fail = False
    banner.wait_for(state="detached", timeout=SLOW_MS)
    _wait_for_verdict(p, "healthy")


PHONE = {"width": 390, "height": 844}


def test_the_live_page_fits_a_phone(served, fake_exporter, open_page):
    """On-call opens the page link on a phone: at 390 px the Live page scrolls down only, and the
    nav (its Fleet link), the verdict and its chip, the first action and the two key charts are
    all within the screen; the confidence is a word, the evidence facts with their direction."""
    exporter = fake_exporter("thrashing", gpus=2)
    p = open_page(served(exporter_url=exporter.url).url)
    p.page.set_viewport_size(PHONE)
    p.goto("/")
    _wait_for_verdict(p, "kv_thrashing")
    _wait_for_charts(p)
    assert p.page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    boxes = p.page.evaluate(
        """() => Object.fromEntries([
            ...Array.from(document.querySelectorAll('#nav a')).map(a => ['nav ' + a.textContent, a]),
            ['verdict', document.querySelector('.verdict-title')],
            ['verdict chip', document.querySelector('.verdict-code')],
            ['badge', document.querySelector('#live-badge .badge')],
            ['first action', document.querySelector('.actions li')],
            ['first chart', document.querySelectorAll('.chart')[0]],
            ['second chart', document.querySelectorAll('.chart')[1]],
        ].map(([name, e]) => [name, e ? [e.getBoundingClientRect().left, e.getBoundingClientRect().right] : null]))"""
    )
    assert "nav Fleet" in boxes
    for name, box in boxes.items():
        assert box is not None, name
        assert box[0] >= 0 and box[1] <= PHONE["width"], (name, box)
    assert p.page.locator(".verdict-confidence").inner_text() in (
        "high confidence",
        "medium confidence",
        "low confidence",
    )
    rows = p.page.locator("table.evidence td.evidence-signal").all_inner_texts()
    assert any(", above the " in row for row in rows) and any(", below the " in row for row in rows), rows
    assert p.errors == []


def test_the_live_page_downloads_the_window_it_shows(served, fake_exporter, open_page, tmp_path):
    import httpx

    from kvdoctor.sources.traces import load_trace

    exporter = fake_exporter("thrashing", gpus=1)
    handle = served(exporter_url=exporter.url)
    p = open_page(handle.url)
    p.goto("/")
    _wait_for_verdict(p, "kv_thrashing")
    link = p.page.locator("#live-download")
    assert link.inner_text() == "download this window"
    href = link.get_attribute("href")
    assert href == "/download/window.om?seconds=900"
    answer = httpx.get(handle.url.rstrip("/") + href, timeout=30)
    assert answer.status_code == 200 and answer.text.endswith("# EOF\n")
    (tmp_path / "window.om").write_text(answer.text)
    assert len(load_trace(tmp_path / "window.om").window) > 10
    assert p.errors == []


def _set_number(p: Page, element_id: str, value) -> None:
    box = p.page.locator(f"#{element_id}")
    box.fill(str(value))
    box.press("Enter")


def _ledger_value(p: Page, row: str) -> str:
    return p.page.locator(f"table.ledger-table tr:has(th:text-is('{row}')) td").inner_text()


def test_ledger_computes_the_known_model(served, open_page, tmp_path):
    p = open_page(served(exporter_url="http://127.0.0.1:9").url)
    p.goto("/ledger")
    p.page.wait_for_selector("table.ledger-table")
    _set_number(p, "ledger-context", 8192)
    _set_number(p, "ledger-batch", 16)
    # Llama-3.1-8B (the default pick) on an H100 (the default GPU), bf16 KV:
    per_token = 2 * 32 * 8 * 128 * 2  # K and V x layers x KV heads x head dim x bytes
    total = per_token * 8192 * 16
    floor = (COMMON_MODELS["Llama-3.1-8B"].weight_bytes + total) / gpu_spec("H100").peak_bandwidth
    tools.wait_until(
        lambda: f"{total / 1e9:,.2f} GB" in _ledger_value(p, "total KV (context x batch)"),
        timeout=SLOW_MS / 1000,
        what="the ledger for batch 16",
    )
    assert _ledger_value(p, "KV bytes per token").startswith(f"{per_token:,} B")
    assert _ledger_value(p, "decode step floor") == f"{floor * 1000:,.2f} ms"
    assert _ledger_value(p, "tokens/s ceiling per sequence") == f"{1 / floor:,.1f} tokens/s"
    what_if = p.page.locator("table.what-if").inner_text()
    assert "FP8 KV cache" in what_if and f"{per_token // 2:,} B" in what_if
    p.screenshot("ledger", tmp_path)
    assert p.errors == []
