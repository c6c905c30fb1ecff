"""The scenario suite as one ``promtool test rules`` file, with the expectations the Python half gives.

For each scenario, at the end of its series:

- ``alert_rule_test`` for every verdict alert (and ``KvdoctorSourceDown``): the one matching the
  expected verdict is firing, with the labels of the engine and the annotations Prometheus would
  render (``$value`` is the Python evaluator's value of the alert's feature); all others are not;
- ``promql_expr_test`` on ``ALERTS`` for the verdict alerts: exactly the expected one is pending or
  firing -- *pending* for scenarios that do not settle (a latency trend holds only at the end, so
  the alert's ``for`` cannot elapse; the tree's answer must still be the same);
- ``promql_expr_test`` on the branch records where a verdict alert fires: the other causes they hold
  (what the SLO page's ``contributing`` lists) are the Python differential.

``thresholds`` are those the rule file was compiled with (``promql.rule_thresholds``): the Python
half judges each scenario's window with them, so the rules for a 1 m scrape interval are checked
on scenarios sampled every minute and judged on the 12-minute window those rules read.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from kvdoctor.rules import alert_rules, alert_specs, promql
from kvdoctor.rules.alert_specs import EXPORTER_DOWN_ALERT, SOURCE_DOWN_ALERT
from kvdoctor.rules.context import Context
from kvdoctor.rules.diagnosis import Diagnosis, diagnose
from kvdoctor.rules.feature_promql import ENGINE_KEYS
from kvdoctor.rules.thresholds import DEFAULT_SLO_SECONDS, Thresholds
from tests.support import go_templates
from tests.support.scenarios import Scenario

EVALUATION_INTERVAL = "30s"


def _engine_alert_labels(scenario: Scenario, spec: alert_specs.AlertSpec) -> dict[str, str]:
    labels = {k: v for k, v in scenario.engine_labels().items() if k in ENGINE_KEYS}
    labels["severity"] = spec.severity
    return labels


def _annotations(
    rules: dict[str, dict], spec: alert_specs.AlertSpec, labels: dict[str, str], value: float
) -> dict[str, str]:
    """What Prometheus renders (the cause alerts' words make no query)."""
    return {k: go_templates.render(v, labels, value) for k, v in rules[spec.name]["annotations"].items()}


def expected_alerts(scenario: Scenario, diagnosis: Diagnosis, rules: dict[str, dict]) -> dict[str, list[dict]]:
    """Alert name -> the promtool ``exp_alerts`` list at the scenario's end, from the Python verdict
    (the exporter-down alert needs ``up``, which the scenarios do not have: tests/e2e covers it)."""
    out: dict[str, list[dict]] = {}
    for spec in alert_specs.ALERTS:
        if spec.name == EXPORTER_DOWN_ALERT:
            continue
        out[spec.name] = []
        if spec.verdict is not None and spec.verdict == diagnosis.verdict and scenario.settles:
            labels = _engine_alert_labels(scenario, spec)
            value = diagnosis.features.get(spec.value_feature, math.nan)
            annotations = _annotations(rules, spec, labels, value)
            out[spec.name] = [{"exp_labels": labels, "exp_annotations": annotations}]
        if spec.name == SOURCE_DOWN_ALERT:
            for source in scenario.sources_down:
                labels = {"source": source, "pod": scenario.pod, "severity": spec.severity}
                annotations = _annotations(rules, spec, labels, 0.0)
                out[spec.name].append({"exp_labels": labels, "exp_annotations": annotations})
    return out


def _alerts_series(scenario: Scenario, verdict: str) -> list[dict]:
    name = alert_specs.VERDICT_ALERT.get(verdict)
    if name is None:
        return []
    spec = alert_specs.ALERT_BY_NAME[name]
    labels = {
        "alertname": name,
        "alertstate": "firing" if scenario.settles else "pending",
        **_engine_alert_labels(scenario, spec),
    }
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return [{"labels": f"ALERTS{{{inner}}}", "value": 1}]


def _differential_test(scenario: Scenario, diagnosis: Diagnosis, at: str) -> list[dict]:
    """Where the verdict's alert fires: the causes the branch records hold beside it, as the SLO page's
    ``contributing`` asks for them, are the Python differential."""
    if diagnosis.verdict not in alert_specs.VERDICT_ALERT or not scenario.settles:
        return []
    expr = f'group by (verdict) ({promql.BRANCH_RECORD}{{verdict!="{diagnosis.verdict}"}})'
    listed = sorted({c.verdict for c in diagnosis.differential})
    return [
        {"expr": expr, "eval_time": at, "exp_samples": [{"labels": f'{{verdict="{v}"}}', "value": 1} for v in listed]}
    ]


def python_diagnosis(scenario: Scenario, thresholds: Thresholds, slo_seconds: float | None = None) -> Diagnosis:
    """The Python half's diagnosis of the scenario: the SLO given, else the one it publishes, else the default."""
    return diagnose(scenario.window(), Context(slo_seconds=slo_seconds), thresholds)


def scenario_group(
    scenario: Scenario, rules: dict[str, dict], thresholds: Thresholds, slo_seconds: float | None = None
) -> dict:
    """One promtool test group for ``scenario`` (its verdict from the Python evaluator)."""
    diagnosis = python_diagnosis(scenario, thresholds, slo_seconds)
    verdict = diagnosis.verdict
    at = f"{scenario.eval_seconds}s"
    verdict_alerts = "|".join(alert_specs.VERDICT_ALERT_NAMES)
    return {
        "name": scenario.name,
        "interval": f"{scenario.step:g}s",
        "input_series": scenario.input_series(),
        "alert_rule_test": [
            {"eval_time": at, "alertname": name, "exp_alerts": exp}
            for name, exp in expected_alerts(scenario, diagnosis, rules).items()
        ],
        "promql_expr_test": [
            {
                "expr": f'ALERTS{{alertname=~"{verdict_alerts}"}}',
                "eval_time": at,
                "exp_samples": _alerts_series(scenario, verdict),
            },
            *_differential_test(scenario, diagnosis, at),
        ],
    }


def write_test_file(
    path: Path,
    rule_file: Path,
    scenarios: list[Scenario],
    thresholds: Thresholds | None = None,
    slo_seconds: float = DEFAULT_SLO_SECONDS,
    runbook_base_url: str | None = None,
    scrape_interval_seconds: float = 15.0,
) -> Path:
    """The test file for ``rule_file``, compiled with ``thresholds`` (default: the default export's)
    and ``slo_seconds`` as the fallback SLO of pods that publish none."""
    t = thresholds or promql.rule_thresholds(None, None)
    rules = {r["alert"]: r for r in alert_rules.alert_rules(t, slo_seconds, runbook_base_url, scrape_interval_seconds)}
    doc = {
        "rule_files": [str(rule_file)],
        "evaluation_interval": EVALUATION_INTERVAL,
        "tests": [scenario_group(s, rules, t, None if s.published_slo else slo_seconds) for s in scenarios],
    }
    path.write_text(json.dumps(doc, indent=1))  # JSON is YAML, and much faster to write
    return path
