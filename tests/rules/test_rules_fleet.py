"""kvdoctor.rules.fleet: the fleet's instant queries and the summary made of their answers."""

from __future__ import annotations

import math

import pytest

from kvdoctor.rules import promql
from kvdoctor.rules.fleet import FLEET_FEATURES, FLEET_VERDICTS, FleetRow, fleet_queries, summarize, worst_first_key
from kvdoctor.rules.thresholds import DEFAULT_SLO_SECONDS
from kvdoctor.rules.verdicts import UNKNOWN
from kvdoctor.signals.vocabulary import DIAGNOSIS_VERDICT, ITL_SLO

T = promql.rule_thresholds(None, None)
ITL = promql.record_name("itl_p95_seconds", T)
KV = promql.record_name("kv_usage", T)
WAITING = promql.record_name("requests_waiting", T)
RUNNING = promql.record_name("requests_running", T)


def pod(name: str, ns: str = "prod", **labels: str) -> dict[str, str]:
    return {"namespace": ns, "pod": name, **labels}


def feature(record: str, name: str, value: float, ns: str = "prod", **labels: str):
    return {"__name__": record, **pod(name, ns), "model_name": "m", "engine": "vllm", **labels}, value


def verdict(name: str, v: str, ns: str = "prod"):
    return {**pod(name, ns), "verdict": v}, 1.0


# ------------------------------------------------------------------------------------ queries


def test_without_matchers_every_query_reads_the_whole_fleet_without_a_join():
    q = fleet_queries()
    assert q.pods.startswith("group by (namespace, pod) ({__name__=~")
    assert q.verdicts == f"max by (namespace, pod, verdict) ({DIAGNOSIS_VERDICT}) == 1"
    assert " and on(" not in q.features and " and on(" not in q.verdicts
    for name in FLEET_FEATURES:
        assert promql.record_pattern(name) in q.features
    assert ITL_SLO in q.features and "[" not in q.features.replace("[0-9]", "")  # no range read


def test_namespace_and_pod_matchers_narrow_each_query_directly():
    q = fleet_queries([("namespace", "=", '"prod"'), ("pod", "=~", '"vllm-.*"')])
    for expr in (q.pods, q.verdicts, q.features):
        assert 'namespace="prod"' in expr and 'pod=~"vllm-.*"' in expr
        assert " and on(" not in expr


def test_other_matchers_narrow_through_the_pods_query():
    q = fleet_queries([("namespace", "=", '"prod"'), ("model_name", "=", '"llama"')])
    assert 'model_name="llama"' in q.pods
    for expr in (q.verdicts, q.features):
        assert expr.endswith(f" and on(namespace, pod) {q.pods}")
        assert 'model_name="llama"' not in expr.split(" and on(")[0]  # the records may not carry it
        assert 'namespace="prod"' in expr.split(" and on(")[0]


def test_the_record_patterns_match_every_sizing_of_the_rule_file():
    import re

    for seconds in (1, 15, 30, 60, 120, 0.5):
        name = promql.record_name("kv_usage", promql.rule_thresholds(None, seconds))
        assert re.fullmatch(promql.record_pattern("kv_usage"), name), name
    assert not re.fullmatch(promql.record_pattern("kv_usage"), "kvdoctor:kv_host_usage:60s")
    assert promql.record_range_seconds("kvdoctor:kv_usage:1500ms") == 1.5
    assert promql.record_range_seconds("kvdoctor:itl_slo_seconds") is None


def test_quote_escapes_what_a_promql_string_cannot_hold():
    assert promql.quote('a"b\\c\nd') == '"a\\"b\\\\c\\nd"'


# ------------------------------------------------------------------------------------ summary


def test_rows_are_worst_first_slow_then_by_itl_over_slo():
    pods = [(pod(n), 1.0) for n in ("ok-fast", "ok-near", "slow-a", "slow-b", "idle", "new")]
    verdicts = [
        verdict("ok-fast", "healthy"),
        verdict("ok-near", "healthy"),
        verdict("slow-a", "kv_thrashing"),
        verdict("slow-b", "memory_bandwidth_bound"),
        verdict("idle", "idle"),
    ]
    features = [
        feature(ITL, "ok-fast", 0.01),
        feature(ITL, "ok-near", 0.09),
        feature(ITL, "slow-a", 0.15),
        feature(ITL, "slow-b", 0.05),  # a pod SLO of 20 ms: 2.5x, worse than slow-a's 1.5x
        ({"__name__": ITL_SLO, **pod("slow-b"), "instance": "x:1"}, 0.02),
    ]
    s = summarize(pods, verdicts, features, at=5.0)
    assert [r.pod for r in s.rows] == ["slow-b", "slow-a", "ok-near", "ok-fast", "idle", "new"]
    assert s.rows == tuple(sorted(s.rows, key=worst_first_key))
    assert s.slow == 2 and len(s.rows) == 6 and s.at == 5.0
    assert list(s.counts) == list(FLEET_VERDICTS)
    assert s.counts["healthy"] == 2 and s.counts[UNKNOWN] == 1 and s.counts["compute_bound"] == 0
    assert sum(s.counts.values()) == 6
    assert s.rows[0].slo_seconds == 0.02 and s.rows[0].slo_ratio == pytest.approx(2.5)
    assert math.isnan(s.rows[1].slo_seconds) and s.rows[1].slo_applied == DEFAULT_SLO_SECONDS
    assert any("publish no verdict" in n for n in s.notes)


def test_the_shortest_range_with_a_number_wins_and_engines_of_a_pod_combine():
    coarse = ITL.replace(":60s", ":240s")
    features = [
        feature(coarse, "a", 0.5, engine="e1"),
        feature(ITL, "a", 0.2, engine="e1"),
        feature(ITL, "a", 0.3, engine="e2"),  # two engines: the slower one
        feature(WAITING, "a", 2, engine="e1"),
        feature(WAITING, "a", 3, engine="e2"),  # summed
        feature(RUNNING, "a", math.nan, engine="e2"),
        feature(ITL, "b", math.nan),  # nothing at 60 s: the 240 s record
        feature(coarse, "b", 0.4),
        feature(KV, "c", 0.95),
    ]
    s = summarize([(pod(n), 1.0) for n in "abc"], [], features, at=0)
    rows = {r.pod: r for r in s.rows}
    assert rows["a"].itl_p95_seconds == 0.3 and rows["a"].itl_record == ITL
    assert rows["a"].waiting == 5 and math.isnan(rows["a"].running)
    assert rows["b"].itl_p95_seconds == 0.4 and rows["b"].itl_record == coarse
    assert rows["c"].kv_usage == 0.95 and math.isnan(rows["c"].itl_p95_seconds)
    assert rows["a"].engine == "e1,e2" and rows["a"].model_name == "m"


def test_series_of_pods_the_selector_left_out_are_ignored():
    s = summarize([(pod("a"), 1.0)], [verdict("z", "kv_thrashing")], [feature(ITL, "z", 9.0)], at=0)
    assert [r.pod for r in s.rows] == ["a"] and s.rows[0].verdict == UNKNOWN and s.slow == 0


def test_two_verdicts_at_once_keep_the_slower():
    s = summarize([(pod("a"), 1.0)], [verdict("a", "healthy"), verdict("a", "compute_bound")], [], at=0)
    assert s.rows[0].verdict == "compute_bound"


def test_no_records_at_all_is_said():
    s = summarize([(pod("a"), 1.0)], [verdict("a", "healthy")], [], at=0)
    assert any("recording rules" in n for n in s.notes)
    assert not summarize([], [], [], at=0).notes


def test_the_first_action_and_fix_are_the_verdicts_checked_against_the_row():
    pods = [(pod(n), 1.0) for n in ("q-full", "q-room", "ok")]
    verdicts = [verdict("q-full", "request_queueing"), verdict("q-room", "request_queueing"), verdict("ok", "healthy")]
    features = [feature(KV, "q-full", 0.95), feature(KV, "q-room", 0.5)]
    rows = {r.pod: r for r in summarize(pods, verdicts, features, at=0).rows}
    assert rows["q-room"].first_action == "route_away" and rows["q-room"].first_fix == "raise_sequence_limit"
    assert rows["q-full"].first_fix == "fp8_kv_cache"  # no room to raise the sequence limit
    assert rows["ok"].first_action is None and rows["ok"].first_fix is None


def test_select_filters_by_namespace_verdict_and_pod_substring():
    pods = [(pod("vllm-0", "a"), 1.0), (pod("vllm-1", "b"), 1.0), (pod("sglang-0", "a"), 1.0)]
    verdicts = [verdict("vllm-0", "healthy", "a"), verdict("vllm-1", "kv_thrashing", "b")]
    s = summarize(pods, verdicts, [], at=0)
    assert [r.pod for r in s.select(namespace="a")] == ["sglang-0", "vllm-0"]
    assert [r.pod for r in s.select(verdicts=["kv_thrashing"])] == ["vllm-1"]
    assert [r.pod for r in s.select(search="VLLM")] == ["vllm-1", "vllm-0"]
    assert s.select(namespace="a", search="sglang")[0].verdict == UNKNOWN
    assert s.namespaces == ("a", "b")


def test_json_has_every_row_or_the_first_n_with_missing_numbers_as_null():
    import json

    s = summarize([(pod(n), 1.0) for n in "ab"], [verdict("a", "kv_thrashing")], [feature(ITL, "a", 0.3)], at=7)
    doc = s.to_json()
    json.dumps(doc, allow_nan=False)
    assert doc["pods"] == 2 and doc["slow"] == 1 and len(doc["rows"]) == 2
    assert doc["rows"][0]["itl_p95_seconds"] == 0.3 and doc["rows"][1]["itl_p95_seconds"] is None
    assert doc["rows"][0]["first_action"] == "route_away"
    assert len(s.to_json(limit=1)["rows"]) == 1 and s.to_json(limit=1)["pods"] == 2


def test_a_row_without_itl_is_unmeasured_not_fast():
    row = FleetRow("ns", "p", verdict="healthy")
    assert math.isnan(row.slo_ratio) and not row.slow
    assert worst_first_key(row)[1] == math.inf
