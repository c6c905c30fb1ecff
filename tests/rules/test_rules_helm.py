"""The chart's PrometheusRule for a scrape interval and a runbook base, rendered by the real helm."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from kvdoctor.rules import promql, rule_file
from tests.support.tools import require, requires_helm

CHART = Path(__file__).resolve().parents[2] / "helm" / "kvdoctor"

pytestmark = requires_helm


def render(*values: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [require("helm"), "template", "t", str(CHART), *(a for v in values for a in ("--set", v))],
        capture_output=True,
        text=True,
        timeout=120,
    )


def rule_groups(*values: str) -> list[dict]:
    result = render(*values)
    assert result.returncode == 0, result.stderr
    rule = next(d for d in yaml.safe_load_all(result.stdout) if d and d.get("kind") == "PrometheusRule")
    return rule["spec"]["groups"]


@pytest.mark.parametrize("interval, seconds", [("15s", 15), ("30s", 30), ("1m", 60), ("2m", 120)])
def test_the_scrape_interval_value_picks_rules_whose_ranges_hold_four_scrapes(interval, seconds):
    groups = rule_groups(f"monitoring.prometheusRule.scrapeInterval={interval}")
    text = yaml.safe_dump(groups)
    ranges = [promql.parse_duration(r) for r in re.findall(r"\[(\d+m?s)\]", text)]
    assert ranges and min(ranges) >= 4 * seconds
    assert {r["alert"] for g in groups for r in g["rules"] if "alert" in r} >= {"RequestsQueueing", "KVCacheThrashing"}


def test_the_runbook_base_url_value_sets_every_runbook_url():
    default = rule_groups()  # no base known: no link, never a relative path
    assert all("runbook_url" not in r["annotations"] for g in default for r in g["rules"] if "alert" in r)
    ingress = rule_groups(
        "dashboard.ingress.enabled=true",
        "dashboard.ingress.allowAnonymous=true",
        "dashboard.ingress.tls[0].secretName=t",
        "dashboard.ingress.tls[0].hosts[0]=kvdoctor.example.com",
    )
    for rule in (r for g in ingress for r in g["rules"] if "alert" in r):
        notes = rule["annotations"]
        assert notes["runbook_url"] == f"https://kvdoctor.example.com/runbooks/{rule['alert']}.md"
        assert notes["dashboard"] == "https://kvdoctor.example.com/?pod={{ or $labels.pod $labels.instance }}"
    based = rule_groups("monitoring.prometheusRule.runbookBaseUrl=https://git.example.org/kvdoctor/runbooks")
    for group in based:
        for rule in (r for r in group["rules"] if "alert" in r):
            assert rule["annotations"]["runbook_url"] == f"https://git.example.org/kvdoctor/runbooks/{rule['alert']}.md"


def test_an_interval_the_chart_does_not_ship_is_refused_naming_the_export_command():
    result = render("monitoring.prometheusRule.scrapeInterval=5m")
    assert result.returncode != 0 and "scrapeInterval" in result.stderr


def test_the_dashboard_url_value_links_every_alert_as_rules_export_does():
    groups = rule_groups("monitoring.prometheusRule.dashboardUrl=https://dash.example.org/")
    exported = yaml.safe_load(rule_file.render_rules_yaml(dashboard_base_url="https://dash.example.org/"))
    links = {r["alert"]: r["annotations"]["dashboard"] for g in exported["groups"] for r in g["rules"] if "alert" in r}
    for rule in (r for g in groups for r in g["rules"] if "alert" in r):
        assert rule["annotations"]["dashboard"] == links[rule["alert"]]
        assert rule["annotations"]["runbook_url"] == f"https://dash.example.org/runbooks/{rule['alert']}.md"
