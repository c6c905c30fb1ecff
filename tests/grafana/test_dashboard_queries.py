"""The dashboard's PromQL, checked by Prometheus itself: every query parses (promtool), and against a
real Prometheus scraping two demo exporters and evaluating the kvdoctor rule file, every panel's
queries return data, the numbers the exporters report."""

from __future__ import annotations

import math
import re
import time
from typing import Any

import httpx
import pytest
import yaml

from kvdoctor.rules import rule_file
from kvdoctor.rules.thresholds import DEFAULT_SLO_SECONDS
from kvdoctor.rules.verdicts import VERDICTS
from kvdoctor.signals import vocabulary as S
from tests.grafana import board as B
from tests.support import tools
from tests.support.processes import run

NAMESPACE = "kvdoctor-test"
# Two demo engines: one thrashing its KV pool (preemptions, a firing alert), one missing its prefix
# cache on the GPU (KV moved in from the CPU tier over PCIe, hits from the host tier).
PODS = {"demo-thrashing": "kv_thrashing", "demo-tier-miss": "tier_miss"}
ALL_PODS = ".*"  # the pod variable's "All"


def _panel_exprs(values: dict[str, str]) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel query and every variable's series, with the variables set."""
    board = B.load()
    out = [(f"{t.panel}/{t.ref}", B.substitute(t.expr, values)) for t in B.targets(board)]
    for name, variable in B.variables(board).items():
        if variable["type"] == "query":
            series, _ = B.label_values_query(variable["query"])
            out.append((f"variable {name}", B.substitute(series, values)))
    return out


def _promtool_check(exprs: list[tuple[str, str]], path) -> tuple[int, str]:
    rules = [{"record": f"kvdoctor_grafana_query_{i}", "expr": expr} for i, (_, expr) in enumerate(exprs)]
    path.write_text(yaml.safe_dump({"groups": [{"name": "grafana-panels", "rules": rules}]}, sort_keys=False))
    result = run([tools.promtool(), "check", "rules", path])
    return result.rc, result.stdout + result.stderr


@tools.requires_promtool
def test_every_query_parses(tmp_path):
    """Each query as the expression of a recording rule: ``promtool check rules`` parses them all."""
    exprs = _panel_exprs({"namespace": NAMESPACE, "pod": ALL_PODS})
    assert len(exprs) >= 15
    rc, output = _promtool_check(exprs, tmp_path / "panels.yaml")
    assert rc == 0 and f"SUCCESS: {len(exprs)} rules found" in output, output
    # the check is real: one query broken, and promtool says which
    where, expr = exprs[4]
    broken = [*exprs[:4], (where, f"max by (pod) ({expr}"), *exprs[5:]]  # a parenthesis left open
    rc, output = _promtool_check(broken, tmp_path / "bad.yaml")
    assert rc != 0 and "parse error" in output, output


# ------------------------------------------------------------------------ a real Prometheus


def _rules_firing_at_once() -> str:
    """The rule file ``kvdoctor rules export`` writes (tests/rules checks the committed copy is the
    same) with every alert's ``for`` at 0s: the same expressions, firing as soon as they hold (a test
    cannot wait the 5-10 minutes the alerts hold for)."""
    doc = yaml.safe_load(rule_file.render_rules_yaml())
    for group in doc["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                rule["for"] = "0s"
    return yaml.safe_dump(doc, sort_keys=False)


def _config(demos: dict[str, Any]) -> dict[str, Any]:
    """One scrape job; each demo's exporter gets the namespace and pod labels Kubernetes discovery gives."""
    static = [
        {"targets": [d.exporter_url.removeprefix("http://")], "labels": {"namespace": NAMESPACE, "pod": pod}}
        for pod, d in demos.items()
    ]
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "kvdoctor", "static_configs": static}],
    }


def _finite(result: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The series with at least one finite value (instant vector or matrix)."""
    out = []
    for series in result:
        values = series["values"] if "values" in series else [series["value"]]
        if any(math.isfinite(float(v)) for _, v in values):
            out.append(series)
    return out


def _last(series: dict[str, Any]) -> float:
    values = series["values"] if "values" in series else [series["value"]]
    return next(float(v) for _, v in reversed(values) if math.isfinite(float(v)))


@pytest.mark.slow
@pytest.mark.timeout(400)
@tools.needs("prometheus")
def test_every_panel_returns_data_from_a_real_prometheus_scraping_the_demo(demo, prometheus_server):
    demos = {pod: demo(scenario, in_process=True, interval=0.5) for pod, scenario in PODS.items()}
    prom = prometheus_server(_config(demos), rule_files={"kvdoctor.yaml": _rules_firing_at_once()})
    prom.wait_for_targets_up()
    # a verdict from each exporter, and the thrashing one's alert firing from the real rules
    tools.wait_until(
        lambda: demos["demo-thrashing"].verdict() == "kv_thrashing" and demos["demo-tier-miss"].verdict(),
        timeout=90,
        what="the demos' own verdicts",
    )
    prom.wait_for('ALERTS{alertname="KVCacheThrashing", alertstate="firing", pod="demo-thrashing"}', timeout=90)
    time.sleep(3)  # a few more evaluations behind every recorded series

    values = {"namespace": NAMESPACE, "pod": ALL_PODS}
    end = time.time()
    board = B.load()
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for t in B.targets(board):
        expr = B.substitute(t.expr, values)
        if t.instant:
            result = prom.api("query", query=expr, time=end)["result"]
        else:
            result = prom.api("query_range", query=expr, start=end - 30, end=end, step=1)["result"]
        results[(t.panel, t.ref)] = result
    empty = [f"{panel}/{ref}" for (panel, ref), result in results.items() if not _finite(result)]
    assert not empty, f"panel queries without data: {empty}"

    # one pod chosen: every query answers for it alone
    one = {"namespace": NAMESPACE, "pod": "demo-thrashing"}
    for t in B.targets(board):
        result = prom.api("query", query=B.substitute(t.expr, one), time=end)["result"]
        assert {r["metric"].get("pod", "demo-thrashing") for r in result} <= {"demo-thrashing"}, t.panel

    # the pickers list the namespace and both pods
    for name, variable in B.variables(board).items():
        if variable["type"] != "query":
            continue
        series, label = B.label_values_query(variable["query"])
        found = {r["metric"][label] for r in prom.query(B.substitute(series, values))}
        assert found == ({NAMESPACE} if name == "namespace" else set(PODS)), name

    # and the numbers are the exporters' own
    verdicts = {p: d.verdict() for p, d in demos.items()}
    now = results[("Verdict now", "A")]
    assert {r["metric"]["pod"]: r["metric"]["verdict"] for r in now} == verdicts
    timeline = {r["metric"]["pod"]: _last(r) for r in results[("Verdict over time", "A")]}
    assert {p: VERDICTS[int(code) - 1] for p, code in timeline.items()} == verdicts
    firing = {(r["metric"]["alertname"], r["metric"]["pod"]) for r in results[("Firing kvdoctor alerts", "A")]}
    assert ("KVCacheThrashing", "demo-thrashing") in firing

    kv_panel = "KV-cache usage and ITL p95 vs the SLO"
    thrashing_kv = next(r for r in results[(kv_panel, "A")] if r["metric"]["pod"] == "demo-thrashing")
    assert _last(thrashing_kv) >= 0.8  # its pool is full
    (slo,) = results[(kv_panel, "C")]
    published = prom.query(f"min({S.ITL_SLO})")
    assert _last(slo) == (float(published[0]["value"][1]) if published else DEFAULT_SLO_SECONDS)

    preempting = {r["metric"]["pod"] for r in results[("Preemptions and PCIe", "A")] if _last(r) > 0}
    assert "demo-thrashing" in preempting
    moved_in = {r["metric"]["pod"] for r in results[("Preemptions and PCIe", "C")] if _last(r) > 0}
    assert "demo-tier-miss" in moved_in
    tiers = {(r["metric"]["pod"], r["metric"]["tier"]) for r in _finite(results[("Prefix-cache hits by tier", "A")])}
    assert ("demo-tier-miss", "host") in tiers, tiers
    dram = {r["metric"]["pod"]: _last(r) for r in results[("DRAM bandwidth vs SM activity", "A")]}
    assert set(dram) == set(PODS) and all(0 <= v <= 1 for v in dram.values())
    # the exporters' own window agrees with what Prometheus recorded for the queue
    window = httpx.get(demos["demo-thrashing"].exporter_url + "/api/v1/window", params={"seconds": 5}, timeout=5)
    running = next(s for s in window.json()["series"] if s["name"] == S.REQUESTS_RUNNING)["values"]
    queue = next(r for r in results[("Queue: running and waiting", "A")] if r["metric"]["pod"] == "demo-thrashing")
    assert _last(queue) == pytest.approx(max(v for v in running if v is not None), rel=0.5)
    assert not re.search(r"\$\w", " ".join(B.substitute(t.expr, values) for t in B.targets(board)))
