"""The chart's optional AlertmanagerConfig (Prometheus Operator, monitoring.coreos.com/v1alpha1).

Its routes, grouping, timings and inhibitions are read from deploy/alertmanager/alertmanager.yml
(files/alertmanager.yml is a symlink to it): the tests convert that file here, independently of the
template, and check the rendering against it; they check the routing and inhibition facts the
issue asks for on both (which alert, firing for which engine, silences which); and they show that a
change to the file changes the chart."""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvdoctor.rules.slo_alerts import FAST, SLO_ALERT_NAMES, SLOW, TTFT_FAST, TTFT_SLOW, Burn
from tests.helm.chart import CHART_DIR, ChartUnderTest, Helm, chart_under_test
from tests.support import tools
from tests.support.tools import ROOT, requires_helm

pytestmark = requires_helm

SHIPPED = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
SCENARIO = "alertmanager-config"
PAGE_URL = ("--set", "monitoring.alertmanagerConfig.receivers.page.webhookUrl=https://oncall.example.com/hook")
ON = ("--set", "monitoring.alertmanagerConfig.enabled=true", *PAGE_URL)
_MATCHER = re.compile(r'^([a-zA-Z_][a-zA-Z0-9_]*)(=~|!~|!=|=)"(.*)"$')


def _matchers(texts: list[str]) -> list[dict[str, str]]:
    out = []
    for text in texts:
        name, op, value = _MATCHER.fullmatch(text).groups()  # type: ignore[union-attr]
        out.append({"name": name, "value": value, "matchType": op})
    return out


def _route(route: Mapping[str, Any]) -> dict[str, Any]:
    keys = {"group_by": "groupBy", "group_wait": "groupWait", "group_interval": "groupInterval"}
    keys |= {"repeat_interval": "repeatInterval", "continue": "continue"}
    out: dict[str, Any] = {"receiver": route["receiver"]}
    if route.get("matchers"):
        out["matchers"] = _matchers(route["matchers"])
    out |= {to: route[k] for k, to in keys.items() if k in route}
    return out


def expected_spec_from(config: Mapping[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """An alertmanager.yml's route and inhibit rules as an AlertmanagerConfig's (written here
    independently of the template)."""
    route = _route(config["route"])
    if config["route"].get("routes"):
        route["routes"] = [_route(r) for r in config["route"]["routes"]]
    inhibit = [
        {
            "sourceMatch": _matchers(r["source_matchers"]),
            "targetMatch": _matchers(r["target_matchers"]),
            "equal": r["equal"],
        }
        for r in config["inhibit_rules"]
    ]
    return route, inhibit


# ------------------------------------------------------------------ what an Alertmanager would do


def _matches(matchers: list[dict[str, str]], labels: Mapping[str, str]) -> bool:
    for m in matchers:
        value = labels.get(m["name"], "")
        hit = re.fullmatch(m["value"], value) is not None if "~" in m["matchType"] else value == m["value"]
        if hit == m["matchType"].startswith("!"):
            return False
    return True


def inhibits(rules: list[dict[str, Any]], source: Mapping[str, str], target: Mapping[str, str]) -> bool:
    """Whether a firing ``source`` alert silences ``target`` under ``rules`` (AlertmanagerConfig form)."""
    return any(
        _matches(r["sourceMatch"], source)
        and _matches(r["targetMatch"], target)
        and all(source.get(k, "") == target.get(k, "") for k in r["equal"])
        for r in rules
    )


def receiver_of(route: Mapping[str, Any], labels: Mapping[str, str]) -> str:
    for child in route.get("routes") or []:
        if _matches(child.get("matchers") or [], labels):
            return str(child["receiver"])
    return str(route["receiver"])


def _severities() -> dict[str, str]:
    """Every kvdoctor alert and its severity, from the rules the chart ships."""
    doc = yaml.safe_load(chart_under_test().alerts_file.read_text())
    return {r["alert"]: r["labels"]["severity"] for g in doc["groups"] for r in g["rules"] if "alert" in r}


ENGINE = {"namespace": "serving", "pod": "vllm-a", "instance": "10.0.0.1:9745"}
OTHER = {"namespace": "serving", "pod": "vllm-b", "instance": "10.0.0.2:9745"}


def check_on_call_facts(route: Mapping[str, Any], rules: list[dict[str, Any]]) -> None:
    """The routing and inhibition the issue and docs/alerting.md promise, for every kvdoctor alert."""
    severity = _severities()
    causes = {a for a, s in severity.items() if s == "info"}
    assert {"KVCacheThrashing", "KVCacheCapacityPressure", "DecodeComputeBound"} <= causes

    def alert(name: str, engine: Mapping[str, str] = ENGINE) -> dict[str, str]:
        return {"alertname": name, "severity": severity[name], **engine}

    def burn_alert(burn: Burn) -> dict[str, str]:
        """A burn alert as it fires: its SLO's label too (the fast burn holds back its own slow burn)."""
        return {**alert(burn.spec.name), "slo": burn.objective.key}

    assert route["groupBy"] == ["namespace", "pod", "instance"]
    for name, sev in severity.items():
        assert receiver_of(route, alert(name)) == {"critical": "page", "warning": "ticket", "info": "chat"}[sev], name
    # exporter down: every other alert of that engine, none of another engine
    for name in set(severity) - {"KvdoctorExporterDown"}:
        assert inhibits(rules, alert("KvdoctorExporterDown"), alert(name)), name
        assert not inhibits(rules, alert("KvdoctorExporterDown", OTHER), alert(name)), name
    # source down: the cause alerts, not the SLO page
    for name in causes:
        assert inhibits(rules, alert("KvdoctorSourceDown"), alert(name)), name
    for page in SLO_ALERT_NAMES:
        assert not inhibits(rules, alert("KvdoctorSourceDown"), alert(page)), page
    # the SLO pages (either burn, either SLO): the per-cause alerts of the same pod, not of another
    for page in SLO_ALERT_NAMES:
        for name in causes:
            assert inhibits(rules, alert(page), alert(name)), (page, name)
            assert not inhibits(rules, alert(page, OTHER), alert(name)), (page, name)
    # fast burn -> slow burn of the same SLO, never the reverse, never the other SLO's; only a dead
    # exporter holds a fast burn back
    for fast, slow in ((FAST, SLOW), (TTFT_FAST, TTFT_SLOW)):
        assert inhibits(rules, burn_alert(fast), burn_alert(slow)), fast.spec.name
        assert not inhibits(rules, burn_alert(slow), burn_alert(fast)), slow.spec.name
    assert not inhibits(rules, burn_alert(FAST), burn_alert(TTFT_SLOW))
    assert not inhibits(rules, burn_alert(TTFT_FAST), burn_alert(SLOW))
    for page in (FAST, TTFT_FAST):
        for name in set(severity) - {"KvdoctorExporterDown"}:
            assert not inhibits(rules, alert(name), burn_alert(page)), (name, page.spec.name)
    # thrashing -> capacity pressure, never the reverse
    assert inhibits(rules, alert("KVCacheThrashing"), alert("KVCacheCapacityPressure"))
    assert not inhibits(rules, alert("KVCacheCapacityPressure"), alert("KVCacheThrashing"))


def _spec(helm: Helm, *values: str, scenario: str | None = None) -> dict[str, Any]:
    doc = helm.render(scenario, *values).one("AlertmanagerConfig")
    assert doc["apiVersion"] == "monitoring.coreos.com/v1alpha1"
    spec: dict[str, Any] = doc["spec"]
    return spec


# ---------------------------------------------------------------------------------------- tests


def test_off_by_default_and_when_asked_off(helm):
    assert "AlertmanagerConfig" not in helm.render("default").kinds()
    assert "AlertmanagerConfig" not in helm.render(SCENARIO, "--set", "monitoring.alertmanagerConfig.enabled=false")


def test_the_chart_reads_the_shipped_example_through_a_symlink():
    link = CHART_DIR / "files" / "alertmanager.yml"
    assert link.is_symlink() and link.resolve() == SHIPPED.resolve()


def test_its_routes_grouping_and_inhibitions_are_the_shipped_examples(helm):
    spec = _spec(helm, *ON, scenario=None)
    route, inhibit = expected_spec_from(yaml.safe_load(SHIPPED.read_text()))
    assert spec["route"] == route
    assert spec["inhibitRules"] == inhibit
    assert len(inhibit) == 5


def test_both_keep_on_call_to_one_message_per_incident(helm):
    """The same facts hold for the shipped alertmanager.yml and for the chart's rendering."""
    route, inhibit = expected_spec_from(yaml.safe_load(SHIPPED.read_text()))
    check_on_call_facts(route, inhibit)
    spec = _spec(helm, *ON, scenario=None)
    check_on_call_facts(spec["route"], spec["inhibitRules"])


def test_the_fact_check_catches_a_missing_inhibition():
    route, inhibit = expected_spec_from(yaml.safe_load(SHIPPED.read_text()))
    without = [r for r in inhibit if r["targetMatch"][0]["value"] != "KVCacheCapacityPressure"]
    with pytest.raises(AssertionError):
        check_on_call_facts(route, without)
    narrowed = [
        {**r, "targetMatch": [{**r["targetMatch"][0], "value": "KVCache.*|Decode.*"}]} if i == 0 else r
        for i, r in enumerate(inhibit)
    ]  # exporter down no longer covering RequestsQueueing and the SLO pages
    with pytest.raises(AssertionError):
        check_on_call_facts(route, narrowed)


def test_receivers_come_from_the_values(helm):
    rendered = helm.render(SCENARIO)
    doc = rendered.one("AlertmanagerConfig")
    assert doc["metadata"]["labels"]["alertmanagerConfig"] == "kvdoctor"
    receivers = {r["name"]: r for r in doc["spec"]["receivers"]}
    assert set(receivers) == {"page", "ticket", "chat"}
    assert receivers["page"]["webhookConfigs"] == [
        {"urlSecret": {"name": "oncall-webhook", "key": "webhook-url"}, "sendResolved": True}
    ]
    assert receivers["ticket"]["webhookConfigs"] == [
        {"url": "https://tickets.example.com/hooks/kvdoctor", "sendResolved": True}
    ]
    assert receivers["chat"] == {
        "name": "chat",
        "slackConfigs": [
            {"apiURL": {"name": "slack-webhook", "key": "url"}, "channel": "#inference-alerts", "sendResolved": True}
        ],
    }
    # a severity whose receiver is left empty is delivered nowhere (a receiver without integrations)
    plain = {r["name"]: r for r in _spec(helm, *ON, scenario=None)["receivers"]}
    assert plain["ticket"] == {"name": "ticket"} and plain["chat"] == {"name": "chat"}


def test_without_a_page_receiver_it_refuses_naming_the_value(helm):
    message = helm.render_error("--set", "monitoring.alertmanagerConfig.enabled=true")
    assert "monitoring.alertmanagerConfig.receivers.page" in message and "webhookUrl" in message, message
    assert "\n\t" not in message.strip()


@pytest.mark.parametrize(
    "values, where",
    [
        (("--set", "monitoring.alertmanagerConfig.receivers.pager.webhookUrl=https://x"), "receivers"),
        (("--set", "monitoring.alertmanagerConfig.receivers.page.webhookUrl=oncall"), "webhookUrl"),
        (("--set", "monitoring.alertmanagerConfig.receivers.page.webhookUrlSecret=Oncall Hook"), "webhookUrlSecret"),
        (("--set-json", 'monitoring.alertmanagerConfig.receivers.page.configs={"pagerduty":[]}'), "Configs"),
    ],
)
def test_the_schema_refuses_bad_receivers(helm, values, where):
    message = helm.render_error(*ON, *values)
    assert "values don't meet the specifications of the schema" in message and where in message, message


def _chart_copy(tmp_path: Path, shipped_text: str) -> Helm:
    chart = tmp_path / "kvdoctor"
    shutil.copytree(CHART_DIR, chart, symlinks=False)
    (chart / "files" / "alertmanager.yml").write_text(shipped_text)
    return Helm(tools.require("helm"), ChartUnderTest(chart, chart / "files" / "alerts.yaml"))


def test_a_change_to_the_shipped_example_is_a_change_to_the_chart(tmp_path):
    config = yaml.safe_load(SHIPPED.read_text())
    config["route"]["group_by"] = ["namespace", "pod", "instance", "slo"]
    config["inhibit_rules"].append(
        {
            "source_matchers": ['alertname="DecodeComputeBound"'],
            "target_matchers": ['alertname!~"Kvdoctor.*"'],
            "equal": ["pod"],
        }
    )
    spec = _spec(_chart_copy(tmp_path, yaml.safe_dump(config)), *ON)
    assert spec["route"]["groupBy"] == ["namespace", "pod", "instance", "slo"]
    assert spec["inhibitRules"][-1] == {
        "sourceMatch": [{"name": "alertname", "value": "DecodeComputeBound", "matchType": "="}],
        "targetMatch": [{"name": "alertname", "value": "Kvdoctor.*", "matchType": "!~"}],
        "equal": ["pod"],
    }


def test_a_matcher_the_chart_cannot_read_fails_the_rendering(tmp_path):
    text = SHIPPED.read_text().replace("""['severity="info"']""", "['severity=info']", 1)
    assert text != SHIPPED.read_text()
    helm = _chart_copy(tmp_path, text)
    message = helm.render_error(*ON)
    assert "severity=info" in message and "name=" in message, message
