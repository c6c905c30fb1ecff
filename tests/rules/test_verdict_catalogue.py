"""The verdict catalogue (rules/verdicts.py) is the one definition every surface reads."""

from __future__ import annotations

import dataclasses
import math

import pytest

from kvdoctor.dashboard import components, derive
from kvdoctor.grafana import builder
from kvdoctor.rules import alert_specs, confidence, fleet, tree, verdicts
from kvdoctor.rules.diagnosis import diagnose
from tests.support.scenarios import SCENARIO_BY_NAME


def test_every_verdict_has_every_part():
    assert {v.id for v in verdicts.CATALOGUE} == set(verdicts.VERDICTS)
    assert sorted(v.rank for v in verdicts.CATALOGUE) == list(range(len(verdicts.CATALOGUE)))
    for v in verdicts.CATALOGUE:
        assert v.title and v.severity in verdicts.SEVERITY_COLOURS and v.colour
        assert 0 < v.base_confidence <= 1 and callable(v.headline)
        assert (v.alert is not None) == v.slow, v.id  # every slow verdict pages, nothing else does
    # every branch of the tree gives a catalogued verdict; every catalogued verdict but unknown has a branch
    assert {b.verdict for b in tree.BRANCHES} == set(verdicts.VERDICTS) - {verdicts.UNKNOWN}


def test_one_ranking_everywhere():
    worst_first = list(verdicts.WORST_FIRST)
    assert sorted(verdicts.VERDICTS, key=derive.severity, reverse=True) == worst_first
    assert sorted(verdicts.VERDICTS, key=verdicts.rank) == worst_first
    # the fleet's pod order and its "slower one" pick read the same rank
    assert list(verdicts.SLOW_VERDICTS) == [v for v in worst_first if verdicts.verdict(v).slow]
    assert fleet.FLEET_VERDICTS == verdicts.VERDICTS


def test_alerts_and_runbooks_come_from_the_catalogue():
    for spec in alert_specs.ALERTS:
        if spec.verdict:
            assert spec.name == verdicts.verdict(spec.verdict).alert
    assert alert_specs.VERDICT_ALERT == verdicts.ALERT_OF


def test_base_confidence_is_the_verdicts_unless_a_branch_says_otherwise():
    for b in tree.BRANCHES:
        expected = verdicts.verdict(b.verdict).base_confidence if b.base_confidence is None else b.base_confidence
        assert confidence.BASE[b.id] == expected


def _swap(monkeypatch: pytest.MonkeyPatch, verdict_id: str, **changes: object) -> None:
    """Edit one catalogue entry as a person would edit its definition."""
    entry = dataclasses.replace(verdicts.VERDICT_BY_ID[verdict_id], **changes)
    monkeypatch.setitem(verdicts.VERDICT_BY_ID, verdict_id, entry)


def test_a_renamed_title_reaches_the_dashboard_and_grafana(monkeypatch):
    _swap(monkeypatch, "kv_tier_miss", title="Prefix hits from a slow tier")
    assert components.verdict_title("kv_tier_miss") == "Prefix hits from a slow tier"
    banner = components.banner({"verdict": "kv_tier_miss", "headline": "x"})
    assert "Prefix hits from a slow tier" in str(banner)
    assert "Prefix hits from a slow tier" in builder.render_dashboard()


def test_a_reranked_verdict_reorders_the_dashboard_and_the_fleet(monkeypatch):
    # host overhead becomes the worst verdict: every ordering follows
    ranks = {v.id: v.rank + 1 for v in verdicts.CATALOGUE}
    ranks["host_overhead_bound"] = 0
    for vid, r in ranks.items():
        _swap(monkeypatch, vid, rank=r)
    assert max(verdicts.VERDICTS, key=derive.severity) == "host_overhead_bound"
    rows = [({"namespace": "n", "pod": "p"}, 1.0)]
    picked = fleet.summarize(
        rows,
        [
            ({"namespace": "n", "pod": "p", "verdict": "kv_thrashing"}, 1.0),
            ({"namespace": "n", "pod": "p", "verdict": "host_overhead_bound"}, 1.0),
        ],
        [],
        at=0.0,
    )
    assert picked.rows[0].verdict == "host_overhead_bound"  # two verdicts at once: the worse one


def test_a_recoloured_verdict_reaches_the_banner_and_grafana(monkeypatch):
    _swap(monkeypatch, "request_queueing", severity=verdicts.CRITICAL)
    assert components.verdict_class("request_queueing") == "verdict-bad"
    assert builder.verdict_colour("request_queueing") == "red"


def test_the_headline_is_the_catalogues(monkeypatch):
    _swap(monkeypatch, "kv_thrashing", headline=lambda branch, facts: f"custom {branch}")
    d = diagnose(SCENARIO_BY_NAME["thrashing_kv_oscillates_under_preemption"].window())
    assert d.verdict == "kv_thrashing" and d.headline.startswith("custom thrashing_preemptions")
    assert not math.isnan(d.confidence)
