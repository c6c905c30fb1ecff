"""The whole alert path, as on-call sees it: two demo exporters without Kubernetes labels (a static
config), a real Prometheus with the exported rules (for a 1 s scrape, so the SLO windows and the
``for``s are 1/15 of the 15 s ones), a real Alertmanager with the shipped config (its receivers
pointed at a webhook here, group timings shortened) and the dashboard serving the runbooks.

Walk: healthy (nothing delivered) -> one engine thrashing (the SLO page is delivered once, naming
the cause, its words rendered, its runbook link answering 200; the cause alert is inhibited) ->
the other engine slow too (two engines, two pages) -> the first engine's exporter killed
mid-incident (an exporter-down page, no resolve) -> the second engine healthy again (resolved).
Prints each alert's onset-to-notification time (docs/alerting.md has the measured ones).
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from kvdoctor.dashboard.app import create_app, serve_in_thread
from kvdoctor.rules import promql
from tests.support import tools
from tests.support.demo import InProcessDemo
from tests.support.processes import OnLoopback, Process, RunsProcess, http_ok, start_on_free_port
from tests.support.prometheus import PrometheusServer
from tests.support.servers import FakeServer, respond

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "deploy" / "alertmanager"
SLO_MS = 15.0  # the demo's simulated H100 decodes in ~8-20 ms per token

pytestmark = [pytest.mark.slow]
needs_the_stack = tools.needs("prometheus", "alertmanager")


def _amtool() -> str:
    return tools.require("amtool")


@tools.needs("amtool")
def test_amtool_accepts_the_shipped_config_and_the_check_is_real(tmp_path):
    ok = subprocess.run([_amtool(), "check-config", str(SHIPPED / "alertmanager.yml")], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "5 inhibit rules" in ok.stdout and "1 templates" in ok.stdout
    broken = tmp_path / "alertmanager.yml"
    broken.write_text((SHIPPED / "alertmanager.yml").read_text().replace("receiver: page", "receiver: pager"))
    (tmp_path / "templates").symlink_to(SHIPPED / "templates")
    bad = subprocess.run([_amtool(), "check-config", str(broken)], capture_output=True, text=True)
    assert bad.returncode != 0 and "pager" in bad.stdout + bad.stderr


class Alertmanager(OnLoopback, RunsProcess):
    """The real alertmanager on 127.0.0.1 with ``config`` (written into ``workdir``)."""

    def __init__(self, binary: str, workdir: Path, config: dict[str, Any]):
        self.binary, self.workdir, self.port = binary, workdir, 0
        self.process: Process | None = None
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "templates").mkdir(exist_ok=True)
        for tmpl in (SHIPPED / "templates").glob("*.tmpl"):
            (workdir / "templates" / tmpl.name).write_text(tmpl.read_text())
        self.config_path = workdir / "alertmanager.yml"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))

    def start(self) -> Alertmanager:
        return start_on_free_port(self._launch)

    def _launch(self, port: int) -> Alertmanager:
        self.port = port
        argv = [
            self.binary,
            f"--config.file={self.config_path}",
            f"--storage.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
            "--log.level=warn",
        ]
        self.process = Process(argv, log=self.workdir / "alertmanager.log", name="alertmanager").start()
        self.process.wait_for(http_ok(f"{self.url}/-/ready"), timeout=30, interval=0.1, what="ready")
        return self


def _test_config(webhook: str) -> dict[str, Any]:
    """The shipped config: its routes, grouping and inhibitions as they are; every receiver a
    webhook here; the group timings shortened (seconds, not minutes)."""
    config = yaml.safe_load((SHIPPED / "alertmanager.yml").read_text())
    config["templates"] = ["templates/*.tmpl"]
    config["route"].update(group_wait="1s", group_interval="2s", repeat_interval="1h")
    for route in config["route"]["routes"]:
        route.pop("repeat_interval", None)
    config["receivers"] = [
        {"name": r["name"], "webhook_configs": [{"url": f"{webhook}/{r['name']}", "send_resolved": True}]}
        for r in config["receivers"]
    ]
    return config


class Inbox:
    """What the webhook received: (monotonic time, receiver, status, alert) per alert per notification."""

    def __init__(self, server: FakeServer):
        self.server = server

    def notifications(self) -> list[tuple[str, dict[str, Any]]]:
        out = []
        for path, body in zip(list(self.server.paths), list(self.server.bodies), strict=False):
            if body:
                out.append((path.strip("/"), json.loads(body)))
        return out

    def alerts(self, name: str | None = None, status: str | None = None) -> list[tuple[str, dict[str, Any]]]:
        return [
            (receiver, a)
            for receiver, n in self.notifications()
            for a in n["alerts"]
            if (name is None or a["labels"]["alertname"] == name) and (status is None or a["status"] == status)
        ]

    def wait(self, name: str, status: str = "firing", timeout: float = 240, **labels: str) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            return next(
                (a for _, a in self.alerts(name, status) if all(a["labels"].get(k) == v for k, v in labels.items())),
                None,
            )

        return tools.wait_until(probe, timeout=timeout, interval=0.5, what=f"{name} {status} {labels} delivered")


class Stack:
    def __init__(self, demos: dict[str, InProcessDemo], prometheus: PrometheusServer, inbox: Inbox, dashboard: str):
        self.demos, self.prometheus, self.inbox, self.dashboard = demos, prometheus, inbox, dashboard

    def instance(self, name: str) -> str:
        return self.demos[name].exporter_url.removeprefix("http://")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    prom, am = tools.prometheus(), tools.alertmanager()
    if prom is None or am is None:
        pytest.skip(tools.missing_reason("prometheus" if prom is None else "alertmanager"))
    work = tmp_path_factory.mktemp("alert-path")
    with contextlib.ExitStack() as stack:
        demos = {n: stack.enter_context(InProcessDemo("healthy", interval=1.0, slo_ms=SLO_MS)) for n in ("a", "b")}
        app = create_app(exporter_url=demos["a"].exporter_url)
        dashboard = serve_in_thread(app, "127.0.0.1", 0)
        stack.callback(dashboard.stop)
        base = dashboard.url.rstrip("/")
        rules = work / "kvdoctor.yaml"
        rules.write_text(promql.render_rules_yaml(scrape_interval_seconds=1, runbook_base_url=f"{base}/runbooks/"))
        webhook = FakeServer(respond(b"{}", content_type="application/json"))
        stack.callback(webhook.stop)
        alertmanager = Alertmanager(am, work / "alertmanager", _test_config(webhook.url()))
        stack.callback(alertmanager.stop)
        alertmanager.start()
        targets = [d.exporter_url.removeprefix("http://") for d in demos.values()]
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{alertmanager.port}"]}]}]},
            "scrape_configs": [{"job_name": "kvdoctor", "static_configs": [{"targets": targets}]}],
        }
        prometheus = PrometheusServer.configured(prom, work / "prometheus", config, rule_files=[rules])
        stack.callback(prometheus.stop)
        prometheus.start().wait_for_targets_up(timeout=60)
        prometheus.wait_for(promql.VERDICT_RECORD, lambda r: len(r) == 2, timeout=120)
        yield Stack(demos, prometheus, Inbox(webhook), base)


@needs_the_stack
def test_the_alert_path_from_onset_to_page_to_resolve(stack):
    inbox, a, b = stack.inbox, stack.instance("a"), stack.instance("b")
    # healthy: the verdict records of two unlabelled exporters stay two, and nothing is delivered
    time.sleep(20)
    assert {r["metric"]["instance"] for r in stack.prometheus.query(promql.VERDICT_RECORD)} == {a, b}
    assert inbox.notifications() == [], inbox.notifications()

    onset = time.monotonic()
    stack.demos["a"].switch("kv_thrashing")
    page = inbox.wait("KvdoctorLatencySLOFastBurn", instance=a)
    paged = time.monotonic() - onset
    notes = page["annotations"]
    for text in notes.values():
        assert text.strip() and "{{" not in text and not re.search(r"\bkvdoctor[_:][a-z_]", text), text
    assert notes["summary"].startswith(f"ITL SLO burning fast on {a}: ITL p90 ")
    # the cause is kvdoctor's verdict when the page fired (thrashing builds up through a slow decode)
    causes = {spec.cause.split(":")[0] for spec in promql.ALERTS if spec.verdict}
    assert "SLO 15ms" in notes["summary"], notes["summary"]
    assert notes["summary"].split("Cause: ")[1] in causes, notes["summary"]
    assert "First action: now: route traffic away" in notes["description"] and "Confidence: " in notes["description"]
    assert httpx.get(notes["runbook_url"], timeout=10).status_code == 200
    assert notes["runbook_url"] == f"{stack.dashboard}/runbooks/KvdoctorLatencySLOFastBurn.md"
    # the cause alert fires in Prometheus, and the page's inhibition keeps it from on-call
    stack.prometheus.wait_for_alert("KVCacheThrashing", timeout=120)
    time.sleep(5)
    assert not inbox.alerts("KVCacheThrashing"), inbox.alerts("KVCacheThrashing")
    assert [r for r, _ in inbox.alerts("KvdoctorLatencySLOFastBurn")] == ["page"]  # delivered once, to page

    # the other engine slow too: two unlabelled engines, two pages
    stack.demos["b"].switch("compute_bound")
    inbox.wait("KvdoctorLatencySLOFastBurn", instance=b)
    assert len({x["labels"]["instance"] for _, x in inbox.alerts("KvdoctorLatencySLOFastBurn")}) == 2

    # the first engine's exporter killed mid-incident: an exporter-down page, never a resolve
    killed, killed_at = time.monotonic(), time.strftime("%H:%M:%S", time.gmtime())
    before = [x for _, x in inbox.alerts(status="resolved") if x["labels"].get("instance") == a]
    stack.demos["a"].stop()
    down = inbox.wait("KvdoctorExporterDown", instance=a, timeout=60)
    exporter_down_after = time.monotonic() - killed
    assert "exporter down on" in down["annotations"]["summary"] and "{{" not in down["annotations"]["description"]
    assert not stack.prometheus.query(f'{promql.VERDICT_RECORD}{{instance="{a}"}}')  # no verdict, not healthy
    time.sleep(30)  # past the page's short window: Prometheus resolves it, Alertmanager holds it back
    resolved_a = [x for _, x in inbox.alerts(status="resolved") if x["labels"].get("instance") == a]
    assert not resolved_a, (killed_at, before, [(x["labels"]["alertname"], x["endsAt"]) for x in resolved_a])

    # the second engine recovers: its page is sent as resolved
    recovered = time.monotonic()
    stack.demos["b"].switch("healthy")
    inbox.wait("KvdoctorLatencySLOFastBurn", status="resolved", instance=b, timeout=120)
    resolved_after = time.monotonic() - recovered
    print(
        f"\nonset -> fast-burn page {paged:.0f} s; exporter killed -> exporter-down page {exporter_down_after:.0f} s; "
        f"recovery -> resolved {resolved_after:.0f} s (rules for a 1 s scrape: x15 for 15 s)"
    )
