"""Evidence that proves the verdict: the path to it plus the context that explains it, no
duplicates, thresholds as configured, each row measured or missing; prefix hits over every tier."""

from __future__ import annotations

import math

import pytest

from kvdoctor.rules import tree
from kvdoctor.rules.diagnosis import diagnose
from kvdoctor.rules.thresholds import Thresholds
from kvdoctor.signals.units import RATIO
from tests.support.scenarios import SCENARIO_BY_NAME, SCENARIOS

KNOBS = set(Thresholds().as_dict().values())


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_every_row_is_once_and_its_threshold_is_a_configured_one(scenario):
    d = diagnose(scenario.window())
    features = [e.feature for e in d.evidence]
    assert len(features) == len(set(features)), features
    for e in d.evidence:
        assert e.measured == (e.value is not None), e.feature
        if e.threshold is not None:
            # a knob as configured or the SLO: never a derived value (sm_active_ratio >= 1.066)
            assert e.threshold in KNOBS or e.threshold == d.context.slo or e.threshold == 0, (e.feature, e.threshold)
            if e.unit == RATIO:
                assert 0 <= e.threshold <= 1, (e.feature, e.threshold)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_evidence_is_the_path_to_the_verdict_plus_its_context(scenario):
    d = diagnose(scenario.window())
    if d.verdict == "unknown":  # too few snapshots: no branch was tried, so no evidence is claimed
        assert d.evidence == [] and d.branch == "unknown"
        return
    branch = tree.BRANCH_BY_ID[d.branch]
    allowed = {f for f in (*tree.CONTEXT_FEATURES, *branch.context)} | {"prefix_hit_ratio"}
    path = {e.feature for e in d.evidence if not e.context}
    for name in path:
        left = name.split(" ")[0]
        assert left in {f for a in tree.BRANCH_ATOMS[branch.id] for f in _names(a)}, (d.branch, name)
    assert {e.feature for e in d.evidence if e.context} <= allowed
    assert {"itl_p95_seconds", "kv_usage", "requests_waiting", "preemptions_per_minute"} <= {
        e.feature for e in d.evidence
    }


def _names(atom) -> tuple[str, ...]:
    return (atom.left, atom.right) if hasattr(atom, "left") else (atom.feature,)


def test_thrashing_evidence_shows_what_proves_it():
    d = diagnose(SCENARIO_BY_NAME["preemptions_just_over"].window())
    rows = {e.feature: e for e in d.evidence}
    assert rows["preemptions_per_minute"].holds and not rows["preemptions_per_minute"].context
    assert rows["requests_waiting"].holds and rows["requests_waiting"].value == 4  # how it is slow
    assert rows["kv_usage"].value == pytest.approx(0.95) and rows["kv_usage"].measured
    itl = rows["itl_p95_seconds"]
    assert itl.comparison == ">=" and itl.threshold == 0.1 and itl.holds is False  # ITL against the SLO
    assert "dram_bandwidth_ratio" not in rows  # a branch not taken says nothing here


def test_the_sm_margin_is_shown_as_configured_not_as_a_derived_threshold():
    d = diagnose(SCENARIO_BY_NAME["sm_not_clearly_above_bandwidth"].window())
    row = next(e for e in d.evidence if e.feature == "sm_active_ratio - dram_bandwidth_ratio")
    assert row.threshold == Thresholds().clearly_above_margin and row.comparison == ">="
    assert row.value == pytest.approx(0.96 - 0.82) and row.holds is False
    assert not any(e.threshold is not None and e.threshold > 1 and e.unit == RATIO for e in d.evidence)


def test_missing_gpu_counters_are_marked_with_how_to_get_them():
    d = diagnose(SCENARIO_BY_NAME["gpu_source_down"].window())
    dram = next(e for e in d.evidence if e.feature == "dram_bandwidth_ratio")
    assert not dram.measured and dram.value is None and dram.holds is None
    assert "not measured: needs NVML" in dram.note


def test_prefix_hits_count_every_tier_once():
    # LMCache's hits (no device tier among them) add to the engine's own: 900 + 300 of 3000
    d = diagnose(SCENARIO_BY_NAME["lmcache_hits_count_with_the_engines_own"].window())
    ratio = next(e for e in d.evidence if e.feature == "prefix_hit_ratio")
    assert ratio.value == pytest.approx(0.4, abs=0.005)
    assert d.features["slow_tier_hit_fraction"] == pytest.approx(0.25, abs=0.005)
    # by-tier counters that include the device tier add up to every hit: not added twice
    tiers = diagnose(SCENARIO_BY_NAME["pcie_tier_traffic_fast_decode"].window())
    hits = next(e for e in tiers.evidence if e.feature == "prefix_hit_ratio")
    assert hits.value == pytest.approx((800 + 1900) / 3000, abs=0.005)
    assert tiers.features["slow_tier_hit_fraction"] == pytest.approx(1900 / 2700, abs=0.005)


def test_context_rows_are_marked_and_json_carries_the_flag():
    d = diagnose(SCENARIO_BY_NAME["baseline"].window())
    payload = d.to_json()["evidence"]
    assert all("context" in row for row in payload)
    assert any(row["context"] for row in payload) and not all(row["context"] for row in payload)
    for row in payload:
        assert row["value"] is None or math.isfinite(row["value"])
