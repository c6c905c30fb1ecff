"""The whole alert path on Prometheus, as on-call sees it: one demo engine per slow scenario, none
with Kubernetes labels (a static config), a real Prometheus with the exported rules (for a 1 s
scrape, so the SLO windows and the ``for``s are 1/15 of the 15 s ones), a real Alertmanager with
the shipped config and the dashboard serving the runbooks (alert_path.py).

The walk (``walk_every_slow_scenario``): healthy -> each slow scenario at once -> healthy, one
exporter killed mid-incident instead. Prints each alert's onset-to-notification time
(docs/alerting.md has the measured ones).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from pathlib import Path

import pytest
import yaml

from kvdoctor.rules import promql, rule_file
from tests.e2e.alert_path import PAGE, SHIPPED, SLO_MS, AlertingSide, alert_path_fixture
from tests.support import go_templates, tools
from tests.support.prometheus import PrometheusServer

pytestmark = [pytest.mark.slow]


@tools.needs("amtool")
def test_amtool_accepts_the_shipped_config_and_the_check_is_real(tmp_path):
    amtool = tools.require("amtool")
    ok = subprocess.run([amtool, "check-config", str(SHIPPED / "alertmanager.yml")], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "5 inhibit rules" in ok.stdout and "1 templates" in ok.stdout
    broken = tmp_path / "alertmanager.yml"
    broken.write_text((SHIPPED / "alertmanager.yml").read_text().replace("receiver: page", "receiver: pager"))
    (tmp_path / "templates").symlink_to(SHIPPED / "templates")
    bad = subprocess.run([amtool, "check-config", str(broken)], capture_output=True, text=True)
    assert bad.returncode != 0 and "pager" in bad.stdout + bad.stderr


def start_prometheus(
    binary: str, stack: contextlib.ExitStack, work: Path, targets: list[str], side: AlertingSide
) -> PrometheusServer:
    """Prometheus scraping ``targets`` every second, evaluating the rules, sending to the side's Alertmanager."""
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{side.alertmanager.port}"]}]}]},
        "scrape_configs": [{"job_name": "kvdoctor", "static_configs": [{"targets": targets}]}],
    }
    prometheus = PrometheusServer.configured(binary, work / "prometheus", config, rule_files=[side.rules])
    stack.callback(prometheus.stop)
    prometheus.start().wait_for_targets_up(timeout=60)
    prometheus.wait_for(promql.VERDICT_RECORD, lambda r: len(r) == len(targets), timeout=120)
    return prometheus


alert_path = alert_path_fixture("prometheus", start_prometheus)


@tools.needs("prometheus", "alertmanager")
def test_every_slow_scenario_pages_once_naming_its_cause_and_resolves(alert_path):
    timings = alert_path.walk()
    print("\n" + timings.report("Prometheus 2.42 + Alertmanager 0.25"))


def _resolved(name: str, labels: dict[str, str], summary: str) -> dict:
    return {
        "status": "resolved",
        "labels": {"alertname": name, **labels},
        "annotations": {"summary": summary, "description": "d"},
        "startsAt": "2026-12-05T02:00:00Z",
        "endsAt": "2026-12-05T02:10:00Z",
        "generatorURL": "http://prometheus",
        "fingerprint": name,
    }


@tools.needs("amtool")
def test_the_chat_template_says_resolved_with_the_recovered_value_or_what_it_was(tmp_path):
    """A resolved SLO alert's words are its recovered ones (slo_alerts.burn_expr): the message quotes
    them; a cause alert's are its firing ones: the message says "was"."""
    rules = yaml.safe_load(rule_file.render_rules_yaml())
    page = next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == PAGE)
    labels = {"pod": "vllm-7f9c", "severity": "critical", **page["labels"]}

    def slo(expr: str) -> list:
        return [({}, SLO_MS / 1000)] if expr.startswith(promql.SLO_RECORD) else []

    recovered = go_templates.render(page["annotations"]["summary"], labels, 0.024, slo)
    thrashing = "KV cache thrashing on gpu-box:9745: 382.9 preempted requests per minute"
    data = {
        "receiver": "page",
        "status": "resolved",
        "alerts": [
            _resolved(PAGE, labels, recovered),
            _resolved("KVCacheThrashing", {"instance": "gpu-box:9745", "severity": "info"}, thrashing),
        ],
        "groupLabels": {},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager",
    }
    (tmp_path / "data.json").write_text(json.dumps(data))
    out = subprocess.run(
        [
            tools.require("amtool"),
            "template",
            "render",
            f"--template.glob={SHIPPED / 'templates' / '*.tmpl'}",
            '--template.text={{ template "kvdoctor.text" . }}',
            f"--template.data={tmp_path / 'data.json'}",
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        f"RESOLVED {PAGE} on vllm-7f9c at 02:10:00 UTC: ITL SLO recovered on vllm-7f9c: 2.4% of tokens over the SLO in "
        "the last 5 minutes",
        f"RESOLVED KVCacheThrashing on gpu-box:9745 at 02:10:00 UTC (was: {thrashing})",
    ]
