"""The fleet and pod diagnosis and the Grafana dashboard's queries on two Prometheus-compatible stores:
a real Prometheus, and VictoriaMetrics (single node, vmagent scraping, vmalert evaluating the exported
rule file and writing its records back by remote write), both fed by the same three demo exporters.

Both stores must give the same verdicts (the exporters' own, and the rules' ``kvdoctor:verdict``),
the same fleet summary, the same single-pod diagnosis, and data for every Grafana panel. The
numbers are close, not equal: the two scrape at their own instants, and MetricsQL's ``rate`` and
``increase`` do not extrapolate to the range's edges as PromQL's do (README, "Past one Prometheus").
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvdoctor.cli import main as kvdoctor_main
from kvdoctor.rules import promql, rule_file
from kvdoctor.rules.verdicts import VERDICTS
from kvdoctor.sources.fleet import read_fleet
from kvdoctor.sources.prometheus import PrometheusClient
from tests.grafana import board as B
from tests.support import tools
from tests.support.demo import InProcessDemo
from tests.support.prometheus import PrometheusServer
from tests.support.victoria import VictoriaStack

ROOT = Path(__file__).resolve().parents[2]
RULE_FILES = [ROOT / "rules/alerts.yaml", *sorted((ROOT / "helm/kvdoctor/files").glob("alerts-*.yaml"))]
# pod -> (namespace, scenario, the verdict its exporter gives)
PODS = {
    "vllm-a": ("serving", "kv_thrashing", "kv_thrashing"),
    "vllm-b": ("serving", "healthy", "healthy"),
    "vllm-c": ("batch", "compute_bound", "compute_bound"),
}
SLO_MS = 15.0  # the demo's: its simulated H100 decodes in ~8-20 ms per token

pytestmark = [pytest.mark.slow, tools.needs("prometheus", "victoria-metrics")]


def _vmalert(*args: str) -> subprocess.CompletedProcess[str]:
    binary = tools.vmalert(tools.require("victoria-metrics"))
    assert binary is not None
    return subprocess.run([binary, "-dryRun", *args], capture_output=True, text=True, timeout=60)


def test_vmalert_accepts_every_exported_rule_file(tmp_path):
    """``vmalert -dryRun`` parses each file and validates every expression with MetricsQL."""
    for path in RULE_FILES:
        result = _vmalert(f"-rule={path}", "-rule.validateExpressions", "-rule.validateTemplates")
        assert result.returncode == 0, (path, result.stderr[-2000:])
    broken = tmp_path / "broken.yaml"
    doc = yaml.safe_load(RULE_FILES[0].read_text())
    doc["groups"][0]["rules"][0]["expr"] += ")"  # the check is real
    broken.write_text(yaml.safe_dump(doc))
    result = _vmalert(f"-rule={broken}")
    assert result.returncode != 0 and "invalid expression" in result.stderr


def _rules_firing_at_once() -> str:
    """The exported rule file with every alert's ``for`` at 0s (a test cannot wait 5-10 minutes)."""
    doc = yaml.safe_load(rule_file.render_rules_yaml())
    for rule in doc["groups"][0]["rules"]:
        if "alert" in rule:
            rule["for"] = "0s"
    return yaml.safe_dump(doc, sort_keys=False)


class Fleet:
    def __init__(self, demos: dict[str, InProcessDemo], prometheus: PrometheusServer, victoria: VictoriaStack):
        self.demos, self.prometheus, self.victoria = demos, prometheus, victoria
        self.stores = {"prometheus": prometheus.url, "victoria": victoria.url}

    def verdicts(self) -> dict[str, str | None]:
        return {pod: demo.verdict() for pod, demo in self.demos.items()}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    prom_binary, vm_binary = tools.require("prometheus"), tools.require("victoria-metrics")
    work = tmp_path_factory.mktemp("stores")
    rules = work / "kvdoctor.yaml"
    rules.write_text(_rules_firing_at_once())
    with contextlib.ExitStack() as stack:
        demos = {}
        for pod, (_, scenario, _) in PODS.items():
            demo = InProcessDemo(scenario, interval=1.0, pod=pod, slo_ms=SLO_MS)
            demos[pod] = stack.enter_context(demo)
        labels = {d.exporter_url.removeprefix("http://"): {"namespace": PODS[p][0]} for p, d in demos.items()}
        static = [{"targets": [t], "labels": extra} for t, extra in labels.items()]
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "kvdoctor", "static_configs": static}],
        }
        prometheus = PrometheusServer.configured(prom_binary, work / "prometheus", config, rule_files=[rules])
        stack.callback(prometheus.stop)
        victoria = VictoriaStack(vm_binary, work / "victoria", targets=list(labels), labels=labels, rule_files=[rules])
        stack.callback(victoria.stop)
        prometheus.start()
        victoria.start()
        fleet = Fleet(demos, prometheus, victoria)
        expected = {pod: verdict for pod, (_, _, verdict) in PODS.items()}
        tools.wait_until(lambda: fleet.verdicts() == expected, timeout=120, what="the exporters' own verdicts")
        for store in (prometheus, victoria):  # the rules' verdict of every engine, written back
            store.wait_for(promql.VERDICT_RECORD, lambda result: len(result) == len(PODS), timeout=120)
            store.wait_for('ALERTS{alertname="KVCacheThrashing", alertstate="firing"}', timeout=120)
        time.sleep(3)
        yield fleet


def _at() -> float:
    return time.time() - 2  # a little in the past: every store has ingested it


def test_the_fleet_summary_is_the_same_from_both_stores(fleet):
    at = _at()
    summaries = {}
    for name, url in fleet.stores.items():
        with PrometheusClient(url, timeout=10) as client:
            summaries[name] = read_fleet(client, None, at=at)
    verdicts = fleet.verdicts()
    for name, summary in summaries.items():
        rows = {r.pod: r for r in summary.rows}
        assert {pod: r.verdict for pod, r in rows.items()} == verdicts, name
        assert {r.pod for r in summary.rows[:2]} == {"vllm-a", "vllm-c"} and summary.rows[2].pod == "vllm-b", name
        assert summary.slow == 2 and summary.counts["healthy"] == 1, name
        assert rows["vllm-a"].namespace == "serving" and rows["vllm-c"].namespace == "batch"
        assert all(r.slo_seconds == SLO_MS / 1000 for r in summary.rows), name
        assert rows["vllm-a"].kv_usage >= 0.9 and rows["vllm-a"].first_action == "route_away", name
        assert all(math.isfinite(r.itl_p95_seconds) for r in summary.rows), name
        assert not summary.notes, summary.notes
    prom, vm = ({r.pod: r for r in s.rows} for s in summaries.values())
    for pod in PODS:
        assert vm[pod].itl_p95_seconds == pytest.approx(prom[pod].itl_p95_seconds, rel=0.35), pod
        assert vm[pod].kv_usage == pytest.approx(prom[pod].kv_usage, abs=0.1), pod
    one = {}
    for name, url in fleet.stores.items():
        with PrometheusClient(url, timeout=10) as client:
            one[name] = read_fleet(client, '{model_name=~".+"}', namespace="batch", at=at)
    assert [(r.pod, r.verdict) for s in one.values() for r in s.rows] == [("vllm-c", "compute_bound")] * 2


def test_the_rules_give_each_engine_the_same_verdict_in_both_stores(fleet):
    verdicts = {}
    for name, url in fleet.stores.items():
        with PrometheusClient(url, timeout=10) as client:
            found = client.query(promql.VERDICT_RECORD, _at())
        verdicts[name] = {labels["pod"]: VERDICTS[int(code) - 1] for labels, code in found}
    assert verdicts["prometheus"] == verdicts["victoria"] == {p: v for p, (_, _, v) in PODS.items()}


def _diagnose(*args: str) -> tuple[int, Any, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = kvdoctor_main(["diagnose", *args])
    text = out.getvalue()
    return rc, (json.loads(text) if "--json" in args else text), err.getvalue()


def test_diagnose_reads_the_fleet_and_one_pod_from_either_store(fleet):
    for name, url in fleet.stores.items():
        started = time.monotonic()
        rc, doc, err = _diagnose("--prometheus", url, "--namespace", "serving", "--json")
        assert time.monotonic() - started < 5, name
        assert rc == 1 and not err and doc["pods"] == 2, (name, err)
        assert [r["pod"] for r in doc["rows"]] == ["vllm-a", "vllm-b"], name
        rc, text, err = _diagnose("--prometheus", url)
        assert rc == 1 and text.startswith("3 pods, 2 slow"), (name, text, err)
        rc, doc, err = _diagnose("--prometheus", url, "--selector", '{pod="vllm-a"}', "--json")
        assert rc == 1 and doc["verdict"] == "kv_thrashing", (name, err)
        assert not any(m.startswith("kvdoctor_gpu") for m in doc.get("missing", [])), (name, doc.get("missing"))
        rc, _, err = _diagnose("--prometheus", url, "--selector", '{pod="nowhere"}')
        assert rc == 3 and "no kvdoctor pods match" in err, (name, err)


def _finite(result: list[dict[str, Any]]) -> bool:
    for series in result:
        values = series["values"] if "values" in series else [series["value"]]
        if any(math.isfinite(float(v)) for _, v in values):
            return True
    return False


def test_every_grafana_panel_returns_data_from_both_stores(fleet):
    values = {"namespace": "serving|batch", "pod": ".*"}
    end = _at()
    for name, url in fleet.stores.items():
        empty = []
        with PrometheusClient(url, timeout=10) as client:
            for t in B.targets(B.load()):
                expr = B.substitute(t.expr, values)
                if t.instant:
                    result = [{"value": [end, v]} for _, v in client.query(expr, end)]
                else:
                    result = [
                        {"values": list(zip(s.ts, s.values, strict=True))}
                        for s in client.query_range(expr, end - 30, end, 1)
                    ]
                if not _finite(result):
                    empty.append(f"{t.panel}/{t.ref}")
        assert not empty, f"{name}: panel queries without data: {empty}"
