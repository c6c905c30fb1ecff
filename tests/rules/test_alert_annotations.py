"""Every alert's words, rendered as Prometheus renders them, with and without Kubernetes labels: none
is empty, none leaves a template or a metric name behind, the engine is named by pod, else instance,
else job, and runbook links are absolute or absent."""

from __future__ import annotations

import math
import re

import pytest
import yaml

from kvdoctor.rules import alert_specs, alert_templates, promql, rule_file, verdicts
from kvdoctor.rules.slo_alerts import BURNS, OBJECTIVES, SLO_ALERT_NAMES
from tests.support import go_templates

KUBERNETES = {"namespace": "serving", "pod": "vllm-7f9c", "instance": "10.1.2.3:9745", "job": "kvdoctor"}
STATIC = {"instance": "gpu-box-2:9745", "job": "kvdoctor"}  # a static config / docker-compose
ENGINE = {"model_name": "meta-llama/Llama-2-7b-chat-hf", "engine": "vllm"}
SLO_SECONDS = 0.015


def _alerts(**kwargs) -> dict[str, dict]:
    doc = yaml.safe_load(rule_file.render_rules_yaml(**kwargs))
    return {r["alert"]: r for g in doc["groups"] for r in g["rules"] if "alert" in r}


def _query(verdict_code: float | None):
    def query(expr: str) -> list:
        if any(expr.startswith(o.slo_record + "{") for o in OBJECTIVES):  # the ITL SLO, the TTFT SLO
            return [({}, SLO_SECONDS)]
        if expr.startswith(promql.VERDICT_RECORD + "{") and verdict_code is not None:
            return [({}, verdict_code)]
        return []

    return query


def _labels(name: str, target: dict[str, str]) -> dict[str, str]:
    labels = {**target, **ENGINE, "alertname": name}
    if name == "KvdoctorSourceDown":
        labels["source"] = "dcgm"
    return labels


@pytest.mark.parametrize("target", [KUBERNETES, STATIC], ids=["kubernetes", "static"])
@pytest.mark.parametrize("verdict", [None, "kv_thrashing", "healthy"])
def test_every_annotation_renders_to_words_people_read(target, verdict):
    code = float(verdicts.verdict_code(verdict)) if verdict else None
    for name, rule in _alerts().items():
        for key, text in rule["annotations"].items():
            out = go_templates.render(text, _labels(name, target), 0.1842, _query(code))
            where = f"{name}.{key} ({'pod' if 'pod' in target else 'no pod'}, verdict {verdict})"
            assert out.strip(), where
            assert "{{" not in out and "}}" not in out and "$labels" not in out, (where, out)
            assert not re.search(r"\bkvdoctor[_:][a-z_]+", out), (where, out)  # no metric names in prose
            assert " on :" not in out and " on  " not in out and "  " not in out, (where, out)
            name_shown = target.get("pod") or target["instance"]
            assert name_shown in out or (key == "description" and name == "KvdoctorSourceDown"), (where, out)


def test_values_are_in_units_people_read_and_cause_alerts_make_no_query():
    alerts = _alerts()
    bw = alerts["DecodeMemoryBandwidthBound"]["annotations"]["summary"]
    out = go_templates.render(bw, _labels("x", STATIC), 0.1842, _query(None))
    assert out == "Decode is HBM-bandwidth bound on gpu-box-2:9745: ITL p95 184.2ms, over its SLO"
    # expanded at every evaluation for every engine with the cause: a query each would cost the fleet
    for name in alert_specs.VERDICT_ALERT_NAMES:
        assert all("query" not in text for text in alerts[name]["annotations"].values()), name
    kv = alerts["KVCacheCapacityPressure"]["annotations"]["summary"]
    assert go_templates.render(kv, _labels("x", KUBERNETES), 0.973).endswith(": 97.3% used")


def test_the_slo_page_names_the_cause_its_first_action_and_confidence():
    page = _alerts()["KvdoctorLatencySLOFastBurn"]
    code = float(verdicts.verdict_code("kv_thrashing"))
    text = go_templates.render(page["annotations"]["description"], _labels("p", KUBERNETES), 0.4, _query(code))
    assert "KV cache thrashing" in text and "First action: now: route traffic away" in text
    assert text.startswith(
        "40% of the tokens of vllm-7f9c (meta-llama/Llama-2-7b-chat-hf) took longer than its ITL SLO"
    )
    assert "its ITL SLO of 15ms in the last 5 minutes, and more than 10% in the last 1 hour" in text
    assert "Confidence: lower" in text  # the exporter's own verdict is not in this fake store
    summary = go_templates.render(page["annotations"]["summary"], _labels("p", KUBERNETES), 0.4, _query(None))
    assert summary.endswith("Cause: unknown")  # no verdict: said, not left empty
    assert page["labels"] == {"severity": "critical", "slo": "itl"}
    asked: list[str] = []

    def differential(expr: str) -> list:
        asked.append(expr)
        return [({"verdict": "request_queueing"}, 1.0), ({"verdict": "compute_bound"}, 1.0)]

    also = go_templates.render(page["annotations"]["contributing"], _labels("p", KUBERNETES), 0.04, differential)
    assert also == "Also present on vllm-7f9c: compute_bound, requests waiting (a consequence of the slowness)"
    assert 'kvdoctor:branch{namespace="serving",pod="vllm-7f9c",' in asked[0]
    assert 'kvdoctor:verdict{namespace="serving",pod="vllm-7f9c",' in asked[0] and "unless on(verdict)" in asked[0]
    ticket = _alerts()["KvdoctorLatencySLOSlowBurn"]
    assert ticket["labels"]["severity"] == "warning"
    # a ticket asks one query for its cause and none for a confidence or a differential: each query is
    # made for every active alert at every evaluation
    assert "contributing" not in ticket["annotations"] and "Confidence" not in ticket["annotations"]["description"]
    assert page["annotations"]["summary"].count("| query") == 1  # the cause; the SLO is in the description


def test_the_engine_is_named_by_pod_else_instance_else_job():
    t = alert_templates.engine()
    assert go_templates.render(t, KUBERNETES, math.nan) == "vllm-7f9c"
    assert go_templates.render(t, STATIC, math.nan) == "gpu-box-2:9745"
    assert go_templates.render(t, {"job": "kvdoctor"}, math.nan) == "kvdoctor"


def test_runbook_links_are_absolute_or_absent_and_the_dashboard_link_is_the_pods():
    assert all("runbook_url" not in r["annotations"] for r in _alerts().values())
    base = "https://kvdoctor.example.com/runbooks"
    linked = _alerts(runbook_base_url=base, dashboard_base_url="https://kvdoctor.example.com")
    for name, rule in linked.items():
        assert rule["annotations"]["runbook_url"] == f"{base}/{name}.md"
        link = go_templates.render(rule["annotations"]["dashboard"], KUBERNETES, 0.0)
        assert link == "https://kvdoctor.example.com/?pod=vllm-7f9c"
    assert set(SLO_ALERT_NAMES) <= set(linked)


def test_cause_alerts_are_info_with_a_stated_for_that_scales_with_the_scrape_interval():
    at15, at1 = _alerts(), _alerts(scrape_interval_seconds=1)
    for name in alert_specs.VERDICT_ALERT_NAMES:
        assert at15[name]["labels"]["severity"] == "info" and at15[name]["for"] == "180s"
        assert at1[name]["for"] == "12s"
    assert at15["KvdoctorExporterDown"]["for"] == "60s" and at1["KvdoctorExporterDown"]["for"] == "4s"
    fast = at15["KvdoctorLatencySLOFastBurn"]["expr"]
    assert "kvdoctor:itl_slo_error_ratio:3600s > 0.1" in fast and "[300s]" in fast and "> 0.1" in fast
    assert "kvdoctor:itl_slo_error_ratio:240s" in at1["KvdoctorLatencySLOFastBurn"]["expr"]
    assert "[20s]" in at1["KvdoctorLatencySLOFastBurn"]["expr"]
    slow = at15["KvdoctorLatencySLOSlowBurn"]["expr"]
    assert "kvdoctor:itl_slo_error_ratio:21600s > 0.05" in slow and "kvdoctor:itl_slo_error_ratio:1800s" in slow
    assert "histogram_quantile" not in fast + slow and "_bucket" not in fast + slow  # no bucket read


@pytest.mark.parametrize("burn", BURNS, ids=lambda b: b.spec.name)
def test_a_burn_alert_at_its_recovering_evaluation_says_it_recovered_with_the_value(burn):
    """Its last firing evaluation is the one whose ``$value`` (the short window's share over the SLO) is
    back under the burn's fraction (slo_alerts.burn_expr): the resolved notification carries these
    words, not the burning ones; the words turn at the fraction itself."""
    name, slo, counts = burn.spec.name, burn.objective.title, burn.objective.counts
    rule = _alerts()[name]
    code = float(verdicts.verdict_code("kv_thrashing"))
    above, at = burn.fraction * 1.5, burn.fraction
    burning, recovered = (
        go_templates.render(rule["annotations"]["summary"], _labels(name, KUBERNETES), v, _query(code))
        for v in (above, at)
    )
    assert "burning" in burning and "Cause: KV cache thrashing" in burning, burning
    assert burning.startswith(f"{slo} SLO burning") and f": {above:.1%}".replace(".0%", "%") in burning, burning
    assert recovered.startswith(f"{slo} SLO recovered on vllm-7f9c: {at:.0%} of {counts} over the SLO"), recovered
    description = go_templates.render(rule["annotations"]["description"], _labels(name, KUBERNETES), at, _query(code))
    engine = "vllm-7f9c (meta-llama/Llama-2-7b-chat-hf)"
    assert description.startswith(f"The {counts} of {engine} are back within its {slo} SLO of 15ms")
    assert "ALERTS" not in rule["expr"]  # the recovering evaluation reads the data, not what the rule engine wrote
