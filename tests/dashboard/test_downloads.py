"""The Live page's "download this window": the window on show as a trace file that `kvdoctor
diagnose --replay` replays, from a real in-process exporter and from a real Prometheus."""

from __future__ import annotations

import contextlib
import io
import json
import time

import pytest

from kvdoctor.cli import main as kvdoctor_main
from kvdoctor.dashboard import downloads
from kvdoctor.dashboard.app import create_app
from kvdoctor.dashboard.pages.live import download_href
from kvdoctor.exporter.replay import AdapterNormaliser
from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.textformat import OPENMETRICS_CONTENT_TYPE
from kvdoctor.sources.traces import load_trace
from tests.support import servers
from tests.support.tools import requires_prometheus, wait_until


def replay(path) -> tuple[int, dict]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        rc = kvdoctor_main(["diagnose", "--replay", str(path), "--json"])
    return rc, json.loads(out.getvalue())


@pytest.mark.parametrize(
    "range_value, instance, history, link",
    [
        ("live:900", "", None, "/download/window.om?seconds=900"),
        ("live:300", "10.0.0.2:9745", None, "/download/window.om?seconds=300&instance=10.0.0.2%3A9745"),
        ("hist:3600", "10.0.0.2:9745", None, "/download/window.om?seconds=3600&instance=10.0.0.2%3A9745"),
        ("fixed", "p:1", {"from": 1000.0, "to": 1600.0}, "/download/window.om?seconds=600&instance=p%3A1&end=1600.000"),
        ("bogus", "", None, "/download/window.om?seconds=900"),  # falls back to the live window
    ],
)  # fmt: skip
def test_the_link_asks_for_the_window_on_show(range_value, instance, history, link):
    assert download_href(range_value, instance, history, 900) == link


@pytest.mark.parametrize(
    "query, status, says",
    [
        ("seconds=0", 400, "seconds must be more than 0"),
        ("seconds=lots", 400, "seconds must be more than 0"),
        ("seconds=100000", 400, "seconds must be more than 0 up to 86400"),
        ("seconds=60&end=never", 400, "end must be a time"),
        ("seconds=60&instance=p:1", 400, "this dashboard has none"),
    ],
)
def test_a_bad_request_is_one_line_and_no_fetch(query, status, says):
    app = create_app(exporter_url=servers.refusing_url(), environ={})
    answer = app.server.test_client().get(f"{downloads.ROUTE}?{query}")
    assert answer.status_code == status and says in answer.text and answer.text.count("\n") == 1


def test_an_unreachable_exporter_is_a_502_naming_it():
    url = servers.refusing_url()
    answer = create_app(exporter_url=url, environ={}).server.test_client().get(f"{downloads.ROUTE}?seconds=60")
    assert answer.status_code == 502 and f"cannot reach the exporter at {url}" in answer.text


@pytest.mark.slow
def test_the_exporters_window_downloads_as_a_trace_that_replays(demo, tmp_path):
    live = demo("kv_thrashing", in_process=True, interval=0.25)
    wait_until(lambda: live.exporter.cycles >= 16, timeout=30, interval=0.1, what="16 cycles")
    client = create_app(exporter_url=live.exporter_url, environ={}).server.test_client()
    answer = client.get(download_href("live:900", "", None, 900))
    assert answer.status_code == 200, answer.text
    assert answer.headers["Content-Type"] == OPENMETRICS_CONTENT_TYPE
    assert answer.headers["Content-Disposition"].startswith('attachment; filename="kvdoctor-exporter-')
    path = tmp_path / "window.om"
    path.write_bytes(answer.data)
    window = load_trace(path, AdapterNormaliser()).window
    assert len(window) >= 16 and window.select(S.PREEMPTIONS)
    rc, diagnosis = replay(path)
    assert rc == 1 and diagnosis["verdict"] == "kv_thrashing"


@pytest.mark.slow
@pytest.mark.timeout(180)
@requires_prometheus
def test_an_exporter_picked_through_prometheus_downloads_its_series(demo, prometheus_server, tmp_path):
    live = demo("kv_thrashing", in_process=True, interval=0.5)
    target = live.exporter_url.removeprefix("http://")
    prom = prometheus_server(targets=[target], scrape_interval="1s")
    prom.wait_for_targets_up()
    prom.wait_for_value(S.PREEMPTIONS, lambda v: v > 0, timeout=30)
    time.sleep(12)
    client = create_app(prometheus_url=prom.url, environ={}).server.test_client()
    answer = client.get(download_href("live:300", target, None, 900))
    assert answer.status_code == 200, answer.text
    path = tmp_path / "window.om"
    path.write_bytes(answer.data)
    window = load_trace(path, AdapterNormaliser()).window
    assert {dict(labels).get("instance") for _, labels in window.series} == {target}
    rc, diagnosis = replay(path)
    assert rc == 1 and diagnosis["verdict"] == "kv_thrashing"
    missing = client.get(download_href("live:300", "nowhere:1", None, 900))
    assert missing.status_code == 502 and 'instance="nowhere:1"' in missing.text
