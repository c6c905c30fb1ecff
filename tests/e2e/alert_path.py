"""The Alertmanager side of the alert-path tests (test_alert_path.py on Prometheus,
test_alert_path_vmalert.py on vmalert): the dashboard serving the runbooks, the rules exported for a
1 s scrape with its runbook links, a real Alertmanager with the shipped config (every receiver a
webhook, group timings shortened) and the webhook's ``Inbox``.

    with AlertingSide(work, exporter_url) as side:      # side.rules, side.alertmanager, side.inbox
        ...start Prometheus or vmalert with side.rules, sending to side.alertmanager.url...
        page = side.inbox.wait("KvdoctorLatencySLOFastBurn", instance=target)
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, NamedTuple, Protocol
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

from kvdoctor.dashboard.app import create_app, serve_in_thread
from kvdoctor.rules import alert_specs, promql, rule_file
from kvdoctor.simulator.scenarios import SCENARIOS
from tests.support import tools
from tests.support.demo import InProcessDemo
from tests.support.processes import OnLoopback, Process, RunsProcess, http_ok, start_on_free_port
from tests.support.servers import FakeServer, send

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "deploy" / "alertmanager"
SLO_MS = 15.0  # the demo's simulated H100 decodes in ~8-20 ms per token
PAGE = "KvdoctorLatencySLOFastBurn"


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


def test_config(webhook: str, page_group_wait: str | None = None) -> dict[str, Any]:
    """The shipped config: its routes, grouping and inhibitions as they are; every receiver a
    webhook here; the group timings shortened (seconds, not minutes); ``page_group_wait`` for the
    page route alone where given."""
    config = yaml.safe_load((SHIPPED / "alertmanager.yml").read_text())
    config["templates"] = ["templates/*.tmpl"]
    config["route"].update(group_wait="1s", group_interval="2s", repeat_interval="1h")
    for route in config["route"]["routes"]:
        route.pop("repeat_interval", None)
        if page_group_wait and route["receiver"] == "page":
            route["group_wait"] = page_group_wait
    config["receivers"] = [
        {"name": r["name"], "webhook_configs": [{"url": f"{webhook}/{r['name']}", "send_resolved": True}]}
        for r in config["receivers"]
    ]
    return config


test_config.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test


class Delivery(NamedTuple):
    at: float  # time.monotonic() when the webhook received it
    receiver: str
    alert: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.alert["labels"]["alertname"])

    @property
    def status(self) -> str:
        return str(self.alert["status"])

    @property
    def instance(self) -> str | None:
        return self.alert["labels"].get("instance")


class Inbox:
    """The webhook every receiver posts to: each alert of each notification, as a ``Delivery``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._deliveries: list[Delivery] = []
        self.server = FakeServer(self._receive)

    def _receive(self, handler: BaseHTTPRequestHandler) -> None:
        at = time.monotonic()
        body = getattr(handler, "body", b"")
        if body:
            receiver = urlsplit(handler.path).path.strip("/")
            with self._lock:
                self._deliveries += [Delivery(at, receiver, a) for a in json.loads(body)["alerts"]]
        send(handler, b"{}", 200, "application/json")

    def url(self) -> str:
        return self.server.url()

    def stop(self) -> None:
        self.server.stop()

    def alerts(
        self, name: str | None = None, status: str | None = None, instance: str | None = None, since: float = 0.0
    ) -> list[Delivery]:
        """What was delivered (from monotonic time ``since`` on), in order of arrival."""
        with self._lock:
            delivered = list(self._deliveries)
        return [
            d
            for d in delivered
            if d.at >= since
            and (name is None or d.name == name)
            and (status is None or d.status == status)
            and (instance is None or d.instance == instance)
        ]

    def timeline(self, since: float) -> list[str]:
        """Every delivery in words, timed from ``since``: what an assertion shows when it fails."""
        return [
            f"{d.at - since:+.1f}s {d.receiver} {d.status} {d.name} {d.instance}: "
            + str(d.alert["annotations"].get("summary"))
            for d in self.alerts()
        ]

    def wait(
        self, name: str, status: str = "firing", instance: str | None = None, timeout: float = 240, since: float = 0.0
    ) -> Delivery:
        return tools.wait_until(
            lambda: next(iter(self.alerts(name, status, instance, since)), None),
            timeout=timeout,
            interval=0.5,
            what=f"{name} {status} for {instance or 'any engine'} delivered",
        )


def rendered(text: str) -> bool:
    """An annotation as on-call reads it: not empty, no template left, no metric name."""
    return (
        bool(text.strip())
        and "{{" not in text
        and "<no value>" not in text
        and not re.search(r"\bkvdoctor[_:][a-z_]", text)
    )


class AlertingSide(contextlib.ExitStack):
    """The dashboard (serving the runbooks; ``dashboard`` its base URL), the rules exported for a
    1 s scrape linking to it (``rules``), the webhook (``inbox``) and the started ``alertmanager``."""

    def __init__(self, work: Path, exporter_url: str, page_group_wait: str | None = None):
        super().__init__()
        self.work, self.exporter_url, self.page_group_wait = work, exporter_url, page_group_wait

    def __enter__(self) -> AlertingSide:
        super().__enter__()
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        binary = tools.require("alertmanager")
        dashboard = serve_in_thread(create_app(exporter_url=self.exporter_url), "127.0.0.1", 0)
        self.callback(dashboard.stop)
        self.dashboard = dashboard.url.rstrip("/")
        self.rules = self.work / "kvdoctor.yaml"
        self.rules.write_text(
            rule_file.render_rules_yaml(scrape_interval_seconds=1, runbook_base_url=f"{self.dashboard}/runbooks/")
        )
        self.inbox = Inbox()
        self.callback(self.inbox.stop)
        config = test_config(self.inbox.url(), self.page_group_wait)
        self.alertmanager = Alertmanager(binary, self.work / "alertmanager", config)
        self.callback(self.alertmanager.stop)
        self.alertmanager.start()


# A page is sent with the annotations of its first firing evaluation: the verdict then. In the demo
# thrashing builds up through a bandwidth-bound decode (the pool fills before preemptions start),
# so its page may name that; the KVCacheThrashing cause alert follows (measured: ~15 s at 1 s).
EARLIER_VERDICTS = {"kv_thrashing": ("memory_bandwidth_bound",)}
SLOW_SCENARIOS = tuple(name for name in SCENARIOS if name != "healthy")
KILLED = "kv_thrashing"  # whose exporter the walk kills mid-incident


def cause_words(verdict: str) -> str:
    """The cause of ``verdict`` as the page's summary names it."""
    return alert_specs.ALERT_BY_NAME[alert_specs.VERDICT_ALERT[verdict]].cause.split(":")[0]


class Backend(Protocol):
    """Prometheus or vmalert: an instant query, and the alerts as its /api/v1/alerts lists them."""

    def query(self, expr: str) -> list[dict[str, Any]]: ...

    def alerts(self) -> list[dict[str, Any]]: ...


class StartBackend(Protocol):
    """Starts the rule evaluator (its program at ``binary``) over ``targets`` (``host:port``) and
    the ``side``'s rules, stopped with ``stack``; returns once it has a verdict from every target."""

    def __call__(
        self, binary: str, stack: contextlib.ExitStack, work: Path, targets: list[str], side: AlertingSide
    ) -> Backend: ...


@contextlib.contextmanager
def running_alert_path(
    work: Path, binary: str, start_backend: StartBackend, **side_options: Any
) -> Iterator[AlertPath]:
    """One demo exporter per slow scenario (each started healthy: the walk turns it), the alerting
    side, and the backend ``start_backend`` starts over them; all stopped on leaving."""
    with contextlib.ExitStack() as stack:
        engines = {
            s: stack.enter_context(InProcessDemo("healthy", interval=1.0, slo_ms=SLO_MS)) for s in SLOW_SCENARIOS
        }
        side = stack.enter_context(AlertingSide(work, next(iter(engines.values())).exporter_url, **side_options))
        targets = [e.exporter_url.removeprefix("http://") for e in engines.values()]
        yield AlertPath(engines, start_backend(binary, stack, work, targets, side), side)


def alert_path_fixture(tool: str, start_backend: StartBackend, **side_options: Any) -> Any:
    """The module fixture ``alert_path``: ``running_alert_path`` on the backend ``start_backend``
    starts with ``tool``'s program."""

    @pytest.fixture(scope="module", name="alert_path")
    def fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AlertPath]:
        binary = tools.require(tool)
        with running_alert_path(
            tmp_path_factory.mktemp(f"alert-path-{tool}"), binary, start_backend, **side_options
        ) as path:
            yield path

    return fixture


@dataclass
class AlertPath:
    """What the walk runs on: the exporters, the backend evaluating the rules over them, the alerting side."""

    engines: dict[str, InProcessDemo]
    backend: Backend
    side: AlertingSide

    def walk(self) -> Timings:
        return walk_every_slow_scenario(self.engines, self.backend, self.side)


@dataclass
class Timings:
    """Seconds from each scenario's onset (or the kill, or recovery) to what on-call receives."""

    page: dict[str, float] = field(default_factory=dict)
    cause_alert: dict[str, float] = field(default_factory=dict)  # firing in the backend, inhibited
    resolved: dict[str, float] = field(default_factory=dict)
    exporter_down: float = 0.0
    resolved_words: str = ""  # one resolved page's summary, as delivered

    def report(self, backend: str) -> str:
        lines = [f"{backend} (rules for a 1 s scrape: x15 for 15 s):"]
        for scenario, paged in self.page.items():
            resolved = self.resolved.get(scenario)
            lines.append(
                f"  {scenario:18} onset -> page {paged:4.0f} s, cause alert firing {self.cause_alert[scenario]:4.0f} s"
                + (f", recovery -> resolved {resolved:4.0f} s" if resolved is not None else ", exporter killed")
            )
        lines.append(f"  exporter killed mid-incident -> exporter-down page {self.exporter_down:.0f} s")
        lines.append(f"  a resolved page: {self.resolved_words}")
        return "\n".join(lines)


def walk_every_slow_scenario(engines: dict[str, InProcessDemo], backend: Backend, side: AlertingSide) -> Timings:
    """One demo engine per slow scenario, none with Kubernetes labels, walked at once: healthy
    (nothing delivered) -> its scenario (the SLO page delivered once, to ``page``, naming the cause,
    every annotation rendered, the runbook answering 200; the scenario's cause alert firing and
    inhibited) -> healthy again (the page resolved), but ``KILLED``'s exporter is killed instead (an
    exporter-down page, never a resolve)."""
    inbox, timings = side.inbox, Timings()
    instance = {s: e.exporter_url.removeprefix("http://") for s, e in engines.items()}
    time.sleep(20)
    verdicts = [r["metric"].get("instance") for r in backend.query(promql.VERDICT_RECORD)]
    assert sorted(verdicts) == sorted(instance.values()), verdicts  # unlabelled engines stay apart
    assert inbox.alerts() == [], inbox.alerts()

    onset = time.monotonic()
    expected = {s: engines[s].switch(s)["expected_verdict"] for s in engines}
    cause_alert = {s: alert_specs.VERDICT_ALERT[v] for s, v in expected.items()}

    def seen_all() -> bool:  # each page delivered, each cause alert firing in the backend: when each came
        for scenario, inst in instance.items():
            page = next(iter(inbox.alerts(PAGE, "firing", inst)), None)
            if page is not None and scenario not in timings.page:
                timings.page[scenario] = page.at - onset
                _check_page(page, inst, expected[scenario], EARLIER_VERDICTS.get(scenario, ()), side.dashboard)
            if scenario not in timings.cause_alert and _firing(backend, cause_alert[scenario], inst):
                timings.cause_alert[scenario] = time.monotonic() - onset
        return len(timings.page) == len(timings.cause_alert) == len(instance)

    tools.wait_until(seen_all, timeout=300, interval=0.5, what=f"every page and cause alert, {timings}")
    time.sleep(5)
    pages = {scenario: inbox.alerts(PAGE, instance=inst) for scenario, inst in instance.items()}
    for scenario, inst in instance.items():
        assert [d.receiver for d in pages[scenario]] == ["page"], inbox.timeline(onset)  # once, to page
        # a cause alert reaches chat only where its ``for`` ends before the page: the page inhibits it
        for cause in inbox.alerts(status="firing", instance=inst):
            if cause.name in alert_specs.VERDICT_ALERT.values():
                assert cause.receiver == "chat" and cause.at < pages[scenario][0].at, inbox.timeline(onset)
                assert cause.name == alert_specs.VERDICT_ALERT[expected[scenario]], inbox.timeline(onset)

    killed = time.monotonic()
    engines[KILLED].stop()
    recovered = time.monotonic()
    for scenario in engines:
        if scenario != KILLED:
            engines[scenario].switch("healthy")
    down = inbox.wait(alert_specs.EXPORTER_DOWN_ALERT, instance=instance[KILLED], timeout=120, since=killed)
    timings.exporter_down = down.at - killed
    assert down.receiver == "page" and all(rendered(t) for t in down.alert["annotations"].values()), down
    assert not backend.query(f'{promql.VERDICT_RECORD}{{instance="{instance[KILLED]}"}}')  # absent, not healthy
    for scenario, inst in instance.items():
        if scenario != KILLED:
            resolved = inbox.wait(PAGE, status="resolved", instance=inst, timeout=120, since=recovered)
            timings.resolved[scenario] = resolved.at - recovered
            _check_resolved(resolved, inst)
            timings.resolved_words = resolved.alert["annotations"]["summary"]
    time.sleep(max(0.0, killed + 30 - time.monotonic()))  # past the page's short window
    assert inbox.alerts(status="resolved", instance=instance[KILLED]) == []  # held back, never resolved
    late = [d for d in inbox.alerts(status="firing", since=recovered) if d.name not in _MAY_FOLLOW_RECOVERY]
    assert [d for d in late if d.instance != instance[KILLED]] == [], late
    return timings


# Still true once an engine recovers: the slow burn's budget was spent (its long window is 6 h, 24 min
# at 1 s); the page no longer inhibits it.
_MAY_FOLLOW_RECOVERY = ("KvdoctorLatencySLOSlowBurn",)


def _check_page(page: Delivery, instance: str, verdict: str, earlier: tuple[str, ...], dashboard: str) -> None:
    notes = page.alert["annotations"]
    assert page.receiver == "page", page
    assert all(rendered(text) for text in notes.values()), notes
    summary = notes["summary"]
    burning = re.match(rf"ITL SLO burning fast on {re.escape(instance)}: ([\d.e+-]+)% of tokens over the SLO ", summary)
    assert burning and float(burning[1]) > 10, summary
    assert summary.split("Cause: ")[1] in {cause_words(v) for v in (verdict, *earlier)}, (verdict, summary)
    assert "ITL SLO of 15ms" in notes["description"], notes["description"]
    assert "First action: now: " in notes["description"], notes["description"]
    assert re.search(r"Confidence: (high|lower), ", notes["description"]), notes["description"]
    assert notes["runbook_url"] == f"{dashboard}/runbooks/{PAGE}.md"
    assert httpx.get(notes["runbook_url"], timeout=10).status_code == 200


def _check_resolved(resolved: Delivery, instance: str) -> None:
    """The page's resolved notification shows the recovered value, under the SLO."""
    notes = resolved.alert["annotations"]
    assert resolved.receiver == "page" and all(rendered(text) for text in notes.values()), resolved
    recovered = re.fullmatch(
        rf"ITL SLO recovered on {re.escape(instance)}: ([\d.e+-]+)% of tokens over the SLO in the last .*",
        notes["summary"],
    )
    assert recovered and float(recovered[1]) <= 10, notes["summary"]
    assert notes["description"].startswith(f"The tokens of {instance} "), notes["description"]


def _firing(backend: Backend, name: str, instance: str) -> bool:
    return any(
        a["labels"].get("alertname") == name and a["labels"].get("instance") == instance and a["state"] == "firing"
        for a in backend.alerts()
    )
