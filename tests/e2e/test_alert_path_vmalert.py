"""The alert walk of test_alert_path.py on VictoriaMetrics: vmagent scraping a demo exporter (no
Kubernetes labels) into a single-node VictoriaMetrics, vmalert evaluating the same exported rules
(for a 1 s scrape) and writing its records back, and the same real Alertmanager with the shipped
config (receivers pointed at a webhook, group timings shortened, the page route's group_wait long
enough for vmalert's records: ``GROUP_WAIT``).

Walk: healthy (nothing delivered) -> the engine thrashing (the SLO page is delivered once, to
``page``, naming the cause, every annotation rendered by vmalert's template engine: no template
left, none empty, the pod's SLO and the first action in words, the runbook link answering 200; the
cause alert is inhibited) -> healthy again (the page is sent as resolved). Prints the
onset-to-notification times (docs/alerting.md).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator

import httpx
import pytest

from kvdoctor.dashboard.app import create_app, serve_in_thread
from kvdoctor.rules import promql
from tests.e2e.test_alert_path import SLO_MS, Alertmanager, Inbox, _test_config
from tests.support import tools
from tests.support.demo import InProcessDemo
from tests.support.servers import FakeServer, respond
from tests.support.victoria import VictoriaStack

pytestmark = [pytest.mark.slow, tools.needs("victoria-metrics", "alertmanager")]

PAGE = "KvdoctorLatencySLOFastBurn"
# vmalert writes each record back through VictoriaMetrics and reads it on its next evaluation, one
# -search.latencyOffset behind: kvdoctor:verdict, records of records, follows the raw series by
# several evaluations (13 s behind the page's first firing, measured at 1 s; Prometheus has none).
# The page reads the verdict each time it is evaluated, and Alertmanager sends the annotations it
# holds when group_wait ends: the page route's group_wait must cover that lag (the shipped 30 s,
# scaled here as 1 s is to 15 s, would not; 30 s leaves room on a busy machine), or the page reads
# "Cause: none found" (docs/alerting.md, "On VictoriaMetrics").
GROUP_WAIT = "30s"


class Walk:
    def __init__(self, demo: InProcessDemo, victoria: VictoriaStack, inbox: Inbox, dashboard: str):
        self.demo, self.victoria, self.inbox, self.dashboard = demo, victoria, inbox, dashboard
        self.instance = demo.exporter_url.removeprefix("http://")


@pytest.fixture(scope="module")
def walk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Walk]:
    vm, am = tools.victoria_metrics(), tools.alertmanager()
    if vm is None or am is None:
        pytest.skip(tools.missing_reason("victoria-metrics" if vm is None else "alertmanager"))
    work = tmp_path_factory.mktemp("alert-path-vmalert")
    with contextlib.ExitStack() as stack:
        demo = stack.enter_context(InProcessDemo("healthy", interval=1.0, slo_ms=SLO_MS))
        dashboard = serve_in_thread(create_app(exporter_url=demo.exporter_url), "127.0.0.1", 0)
        stack.callback(dashboard.stop)
        base = dashboard.url.rstrip("/")
        rules = work / "kvdoctor.yaml"
        rules.write_text(promql.render_rules_yaml(scrape_interval_seconds=1, runbook_base_url=f"{base}/runbooks/"))
        webhook = FakeServer(respond(b"{}", content_type="application/json"))
        stack.callback(webhook.stop)
        config = _test_config(webhook.url())
        page_route = next(r for r in config["route"]["routes"] if r["receiver"] == "page")
        page_route["group_wait"] = GROUP_WAIT  # the others keep 1 s: the inhibition check below is real
        alertmanager = Alertmanager(am, work / "alertmanager", config)
        stack.callback(alertmanager.stop)
        alertmanager.start()
        target = demo.exporter_url.removeprefix("http://")
        victoria = VictoriaStack(vm, work / "victoria", targets=[target], rule_files=[rules])
        victoria.alerter.notifier = alertmanager.url  # the real Alertmanager, not the stack's stand-in
        stack.callback(victoria.stop)
        victoria.start()
        victoria.wait_for(promql.VERDICT_RECORD, timeout=120)
        yield Walk(demo, victoria, Inbox(webhook), base)


def _rendered(text: str) -> bool:
    return (
        bool(text.strip())
        and "{{" not in text
        and "<no value>" not in text
        and not re.search(r"\bkvdoctor[_:][a-z_]", text)
    )


def test_the_alert_path_on_vmalert_from_onset_to_page_to_resolve(walk):
    inbox, a = walk.inbox, walk.instance
    # healthy: the rules' verdict is there, and nothing is delivered
    time.sleep(20)
    assert [r["metric"].get("instance") for r in walk.victoria.query(promql.VERDICT_RECORD)] == [a]
    assert inbox.notifications() == [], inbox.notifications()

    onset = time.monotonic()
    walk.demo.switch("kv_thrashing")
    page = inbox.wait(PAGE, instance=a)
    paged = time.monotonic() - onset
    notes = page["annotations"]
    assert all(_rendered(text) for text in notes.values()), notes
    assert notes["summary"].startswith(f"ITL SLO burning fast on {a}: ITL p90 "), notes["summary"]
    assert "SLO 15ms" in notes["summary"], notes["summary"]
    causes = {spec.cause.split(":")[0] for spec in promql.ALERTS if spec.verdict}
    assert notes["summary"].split("Cause: ")[1] in causes, notes["summary"]
    assert "ITL SLO of 15ms" in notes["description"], notes["description"]
    assert "First action: now: route traffic away" in notes["description"], notes["description"]
    assert re.search(r"Confidence: (high|lower), ", notes["description"]), notes["description"]
    assert notes["runbook_url"] == f"{walk.dashboard}/runbooks/{PAGE}.md"
    assert httpx.get(notes["runbook_url"], timeout=10).status_code == 200
    # the cause alert fires in vmalert, and the page's inhibition keeps it from on-call
    tools.wait_until(
        lambda: any(
            x["labels"]["alertname"] == "KVCacheThrashing" and x["state"] == "firing"
            for x in walk.victoria.alerter.alerts()
        ),
        timeout=120,
        what="KVCacheThrashing firing in vmalert",
    )
    time.sleep(5)
    assert not inbox.alerts("KVCacheThrashing"), inbox.alerts("KVCacheThrashing")
    assert [r for r, _ in inbox.alerts(PAGE)] == ["page"]  # delivered once, to page

    recovered = time.monotonic()
    walk.demo.switch("healthy")
    resolved = inbox.wait(PAGE, status="resolved", instance=a, timeout=180)
    resolved_after = time.monotonic() - recovered
    assert resolved["labels"]["severity"] == "critical" and _rendered(resolved["annotations"]["summary"])
    print(f"\nvmalert: onset -> fast-burn page {paged:.0f} s; recovery -> resolved {resolved_after:.0f} s")
