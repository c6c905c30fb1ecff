"""Agreement, promtool half: the generated rules pass ``promtool check rules`` and, on every
scenario's series, fire exactly the alert the Python evaluator's verdict names -- at the exporter's
1 s (rules compiled for 1 s: the exporter's own window), and, for the scenarios whose verdict does
not hang on seconds (``timeless``), scraped every 15 s and 30 s (the committed default file) and
every minute (``--scrape-interval 1m``)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from kvdoctor.rules import promql, rule_file
from kvdoctor.rules.alert_rules import contributing_annotation
from kvdoctor.rules.thresholds import Thresholds
from kvdoctor.rules.verdicts import verdict_code
from tests.rules.promtool_suite import python_diagnosis, write_test_file
from tests.support.scenarios import SCENARIO_BY_NAME, SCENARIOS
from tests.support.tools import promtool, requires_promtool

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "rules" / "alerts.yaml"

pytestmark = requires_promtool


def _promtool(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=timeout)


def test_promtool_check_rules_passes_on_the_committed_file():
    result = _promtool("check", "rules", str(COMMITTED))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def _assert_promtool_passes(rules: Path, interval: str, series: list[dict], check: dict, file: Path) -> None:
    """One promtool unit test of ``rules`` on ``series`` (scraped and evaluated every ``interval``)
    with ``check`` (a ``promql_expr_test`` or ``alert_rule_test`` entry), written to ``file``."""
    test = {"interval": interval, "input_series": series, **check}
    file.write_text(json.dumps({"rule_files": [str(rules)], "evaluation_interval": interval, "tests": [test]}))
    result = _promtool("test", "rules", str(file))
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]


def _rules_for(tmp_path: Path, interval: float) -> tuple[Path, Thresholds]:
    path = tmp_path / f"rules-{interval:g}s.yaml"
    path.write_text(rule_file.render_rules_yaml(scrape_interval_seconds=interval))
    return path, promql.rule_thresholds(None, interval)


@pytest.mark.slow
def test_every_scenario_fires_the_matching_alert_and_no_other(tmp_path):
    rules, thresholds = _rules_for(tmp_path, 1)
    assert thresholds == Thresholds()  # at 1 s, the exporter's own window
    test_file = write_test_file(
        tmp_path / "scenarios.test.yaml", rules, list(SCENARIOS), thresholds, scrape_interval_seconds=1
    )
    result = _promtool("test", "rules", str(test_file))
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]


def _at_interval(step: float, thresholds: Thresholds) -> list:
    return [
        s.at_interval(step, Thresholds()).but(window_seconds=thresholds.window_seconds) for s in SCENARIOS if s.timeless
    ]


@pytest.mark.slow
@pytest.mark.parametrize("scrape, rules_for", [(15, 15), (30, 15), (60, 60)], ids=["15s", "30s-default-file", "1m"])
def test_the_scenarios_fire_their_alert_at_common_scrape_intervals(tmp_path, scrape, rules_for):
    """The default file (sized for 15 s) at 15 s and 30 s scrapes, the 1 m export at 1 m scrapes."""
    if rules_for == 15:
        rules, thresholds = COMMITTED, promql.rule_thresholds(None, None)
    else:
        rules, thresholds = _rules_for(tmp_path, rules_for)
    scenarios = _at_interval(scrape, thresholds)
    wrong = [s.name for s in scenarios if python_diagnosis(s, thresholds).verdict != s.expected]
    assert not wrong, f"the Python verdict moved at a {scrape} s scrape interval: {wrong}"
    test_file = write_test_file(
        tmp_path / f"scenarios-{scrape}.test.yaml", rules, scenarios, thresholds, scrape_interval_seconds=rules_for
    )
    result = _promtool("test", "rules", str(test_file))
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]


def test_the_agreement_test_catches_drift(tmp_path):
    """Rules compiled with a different ceiling disagree with the Python verdicts: promtool must fail."""
    drifted = tmp_path / "drifted.yaml"
    drifted.write_text(rule_file.render_rules_yaml(Thresholds(kv_ceiling_ratio=0.97), scrape_interval_seconds=1))
    scenarios = [SCENARIO_BY_NAME["kv_ceiling_just_over"]]
    test_file = write_test_file(
        tmp_path / "drift.test.yaml", drifted, scenarios, Thresholds(), scrape_interval_seconds=1
    )
    result = _promtool("test", "rules", str(test_file))
    assert result.returncode != 0
    assert "KVCacheCapacityPressure" in result.stdout + result.stderr


def test_an_engine_scraped_by_two_jobs_keeps_one_itl_p95_with_the_same_value(tmp_path):
    """The p95 is taken per scraped histogram, then the largest per engine: the same histogram under
    two jobs must still be one series per engine (the verdict's joins are one-to-one) with the value
    of one histogram. Per second, 1 token <= 50 ms, 5 <= 100 ms, 10 <= 200 ms, 10 in all: the 9.5th
    of 10 lies 4.5/5 into (0.1, 0.2], so p95 = 0.19 s."""
    rules, thresholds = _rules_for(tmp_path, 1)
    record = promql.record_name("itl_p95_seconds", thresholds)
    per_second = {"0.05": 1, "0.1": 5, "0.2": 10, "+Inf": 10}

    def buckets(pod: str, job: str) -> list[dict]:
        labels = f'namespace="ns", pod="{pod}", model_name="m", engine="vllm", job="{job}"'
        return [
            {"series": f'kvdoctor_inter_token_latency_seconds_bucket{{{labels}, le="{le}"}}', "values": f"0+{n}x120"}
            for le, n in per_second.items()
        ]

    engine = 'namespace="ns", model_name="m", engine="vllm"'
    series = buckets("twice", "a") + buckets("twice", "b") + buckets("once", "a")
    samples = [{"labels": f'{record}{{{engine}, pod="{pod}"}}', "value": 0.19} for pod in ("once", "twice")]
    check = {"promql_expr_test": [{"expr": record, "eval_time": "90s", "exp_samples": samples}]}
    _assert_promtool_passes(rules, "1s", series, check, tmp_path / "two-jobs.test.yaml")


def test_the_slo_page_lists_the_other_causes_present_as_prometheus_renders_it(tmp_path):
    """The ``contributing`` annotation's query, run by Prometheus' own template engine: the causes
    whose branch record holds, less the verdict, the queue in words, sorted."""
    engine = {"namespace": "ns", "pod": "p", "instance": "i", "model_name": "m", "engine": "vllm"}
    inner = ",".join(f'{k}="{v}"' for k, v in engine.items())
    keys = ", ".join(engine)
    rules = tmp_path / "page.yaml"
    page = {
        "alert": "Page",
        "expr": f"max by ({keys}) (page)",
        "annotations": {"contributing": contributing_annotation()},
    }
    rules.write_text(json.dumps({"groups": [{"name": "page", "rules": [page]}]}))
    branches = {"sm_high": "compute_bound", "gpu_idle": "host_overhead_bound", "queue_consequence": "request_queueing"}
    series = [
        {"series": f"page{{{inner}}}", "values": "1x4"},
        {
            "series": f'{promql.VERDICT_RECORD}{{{inner},verdict="compute_bound"}}',
            "values": f"{verdict_code('compute_bound')}x4",
        },
        *(
            {"series": f'{promql.BRANCH_RECORD}{{{inner},branch="{b}",verdict="{v}"}}', "values": "1x4"}
            for b, v in branches.items()
        ),
    ]
    listed = "Also present on p: host_overhead_bound, requests waiting (a consequence of the slowness)"
    expected = [{"exp_labels": engine, "exp_annotations": {"contributing": listed}}]
    check = {"alert_rule_test": [{"eval_time": "30s", "alertname": "Page", "exp_alerts": expected}]}
    _assert_promtool_passes(rules, "15s", series, check, tmp_path / "page.test.yaml")


def test_a_stalled_itl_histogram_falls_back_to_the_mean_time_per_token(tmp_path):
    """The latency measure is the ITL p95, else the mean time per token (``tree.ITL_SLOW``). A
    histogram with no new tokens in the state sub-window gives a NaN p95: not a measure, so the mean
    decides, as in Python; a p95 that is a number decides even where the mean disagrees."""
    rules, _ = _rules_for(tmp_path, 1)
    series = []
    for pod, per_second in (("stalled", 0), ("fast", 10)):
        labels = f'namespace="ns", pod="{pod}", model_name="m", engine="vllm", job="a"'
        bucket = "kvdoctor_inter_token_latency_seconds_bucket"
        series += [
            {"series": f'{bucket}{{{labels}, le="{le}"}}', "values": f"0+{per_second}x120"} for le in ("0.05", "+Inf")
        ]
        series += [
            {"series": f"kvdoctor_generation_tokens_total{{{labels}}}", "values": "0+10x120"},
            {"series": f"kvdoctor_generation_seconds_total{{{labels}}}", "values": "0+5x120"},  # 0.5 s a token
            {"series": f"kvdoctor_inter_token_latency_slo_seconds{{{labels}}}", "values": "0.1x120"},
        ]
    slow = "kvdoctor:itl_slow"
    stalled = 'namespace="ns", pod="stalled", model_name="m", engine="vllm"'
    samples = [{"labels": f"{slow}{{{stalled}}}", "value": 1}]
    check = {"promql_expr_test": [{"expr": slow, "eval_time": "90s", "exp_samples": samples}]}
    _assert_promtool_passes(rules, "1s", series, check, tmp_path / "stalled.test.yaml")
