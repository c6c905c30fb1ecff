"""The verdict banner and the freshness badge, from data (no browser)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from kvdoctor.dashboard import components, derive
from kvdoctor.dashboard.pages import live
from tests.support.synthetic import SCENARIOS, SyntheticEngine, diagnosis_for


def _text(component) -> str:
    """All the text a component tree shows."""
    if component is None:
        return ""
    if isinstance(component, (str, int, float)):
        return str(component)
    children = getattr(component, "children", None)
    if isinstance(children, list):
        return " ".join(_text(c) for c in children)
    return _text(children)


def test_banner_shows_headline_evidence_and_ordered_actions():
    diagnosis = diagnosis_for(SCENARIOS["thrashing"])
    diagnosis["evidence"][0].update(unit="ratio", feature="kv_usage_max", holds=True)
    banner = components.banner(diagnosis, ["a note"])
    text = _text(banner)
    assert banner.className == "banner verdict-bad" and getattr(banner, "data-verdict") == "kv_thrashing"
    assert "KV thrashing" in text and "high confidence" in text and SCENARIOS["thrashing"].headline in text
    assert "kv_usage_max: 95%, above the 90% threshold" in text  # ratio shown as percent, with its direction
    assert "not measured" in text and "Not measured here: kvdoctor_prefix_cache_hits_total." in text
    assert text.index("Quantise the KV cache") < text.index("Cap concurrent sequences")
    assert "--kv-cache-dtype fp8" in text and "--max-running-requests 64" in text
    assert "a note" in text


def test_banner_without_a_diagnosis_waits():
    banner = components.banner(None)
    assert "Waiting for the first diagnosis" in _text(banner) and getattr(banner, "data-verdict") == ""


@pytest.mark.parametrize(
    "value, unit, text",
    [
        (0.873, "ratio", "87.3%"),
        (0.0123, "seconds", "12.3 ms"),
        (12.5, "seconds", "12.5 s"),
        (2.0, "seconds", "2 s"),  # a TTFT threshold, not "2e+03 ms"
        (2.1e10, "bytes/s", "21 GB/s"),
        (157.4, "per minute", "157 per minute"),
        (None, "ratio", "–"),
    ],
)
def test_evidence_values_in_their_units(value, unit, text):
    assert components.format_with_unit(value, unit) == text


@pytest.mark.parametrize(
    "health, state, words",
    [
        (None, "connecting", "connecting"),
        ({"ok": True, "newest": 0.0, "sources_down": []}, "live", "live · data at 00:00:00 UTC"),
        (
            {"ok": False, "error": "http://x/api/v1/window: timed out", "newest": 60.0},
            "stale",
            "stale: showing data up to 00:01:00 UTC; http://x/api/v1/window: timed out",
        ),
        (
            {"ok": True, "newest": 0.0, "sources_down": [{"name": "nvml", "error": "no driver"}]},
            "source-down",
            "source nvml down: no driver",
        ),
        ({"ok": True, "history": True}, "history", "history (not live)"),
    ],
)
def test_badge_states(health, state, words):
    badge = components.badge(health)
    assert getattr(badge, "data-state") == state and words in _text(badge)


def test_a_history_range_gets_its_own_knee():
    engine = SyntheticEngine(SCENARIOS["bandwidth"], t0=0.0, gpus=1)
    frame = derive.live_frame(engine.window(0.0, 300.0))
    knee = live.history_knee(frame)
    assert knee["kind"] == "rises_with_kv" and 0.2 <= knee["kv_level"] <= 0.9
    flat = derive.live_frame(SyntheticEngine(SCENARIOS["healthy"], t0=0.0, gpus=1).window(0.0, 30.0))
    flat.itl_mean = np.full(len(flat), 0.01)
    assert live.history_knee(flat)["kind"] is None


def test_parse_history_accepts_only_a_sane_range():
    now = time.time()
    assert live.parse_history({"from": str(now - 60), "to": str(now)}) == {
        "from": pytest.approx(now - 60),
        "to": pytest.approx(now),
    }
    for bad in ({"from": "x", "to": "1"}, {"from": "10", "to": "5"}, {"from": "0", "to": str(40 * 86400)}, {}):
        assert live.parse_history(bad) is None


def test_evidence_rows_are_the_rules_words_without_internal_names():
    from kvdoctor.rules.features import FEATURES
    from kvdoctor.rules.render import FEATURE_LABELS, feature_label

    assert set(FEATURES) <= set(FEATURE_LABELS)  # every quantity the tree compares has words
    evidence = [
        {
            "signal": "kvdoctor_inter_token_latency_seconds",
            "feature": "itl_p95_seconds",
            "value": 0.0459,
            "unit": "seconds",
            "holds": True,
            "text": "ITL p95 over the last 15 s: 45.9 ms (SLO 15 ms)",
        },
        # an older exporter's row, without the words: label and value in its unit
        {"signal": "kvdoctor_kv_cache_usage_ratio", "feature": "kv_usage", "value": 0.97, "unit": "ratio"},
        {"signal": "kvdoctor_gpu_sm_active_ratio", "feature": "sm_active_ratio", "measured": False},
    ]
    rows = components.evidence_table(evidence).children[1].children
    texts = [row.children[0].children for row in rows]
    assert texts == [
        "ITL p95 over the last 15 s: 45.9 ms (SLO 15 ms)",
        "KV cache usage: 97%",
        f"{feature_label('sm_active_ratio')}: not measured",
    ]
    assert [row.children[1].children for row in rows] == ["decides", "", "not measured"]
    assert not any("itl_p95_seconds" in _text(row) or "kv_usage" in _text(row) for row in rows)
    assert feature_label("itl_p95_seconds / itl_early_median_seconds").count(" / ") == 1


def test_the_banner_says_what_else_is_present_in_one_short_line():
    diagnosis = {
        "verdict": "memory_bandwidth_bound",
        "headline": "Decode is HBM-bandwidth bound",
        "differential": [
            {"verdict": "kv_capacity_pressure", "confidence": 0.8, "consequence": False},
            {"verdict": "request_queueing", "confidence": 0.85, "consequence": True},
        ],
    }
    text = _text(components.banner(diagnosis))
    assert (
        "Also present: KV capacity pressure (high confidence); requests waiting, a consequence of the slowness" in text
    )
    assert "Also present" not in _text(components.banner({**diagnosis, "differential": []}))
    assert components.also_present([]) == ""


@pytest.mark.parametrize(
    "value, word",
    [(0.9, "high confidence"), (0.8, "high confidence"), (0.7, "medium confidence"), (0.45, "low confidence"),
     (85, "high confidence"), (None, ""), ("x", ""), (float("nan"), "")],
)  # fmt: skip
def test_a_confidence_is_a_word_never_a_bare_percentage(value, word):
    assert components.format_confidence(value) == word


def _row(**fields):
    return {"measured": True, "comparison": ">=", **fields}


@pytest.mark.parametrize(
    "item, fact",
    [
        (  # the row: "SM activity minus DRAM bandwidth: -52% (threshold >= 15%)" read as a failed check
            _row(feature="sm_active_ratio - dram_bandwidth_ratio", unit="ratio", value=-0.52, threshold=0.15,
                 holds=False, text="SM activity minus DRAM bandwidth: -52% (threshold ≥ 15%)"),
            "SM activity 52 points below DRAM bandwidth: not compute",
        ),
        (
            _row(feature="sm_active_ratio - dram_bandwidth_ratio", unit="ratio", value=0.05, threshold=0.15,
                 holds=False, text=""),
            "SM activity 5 points above DRAM bandwidth: not compute (under the 15-point margin)",
        ),
        (
            _row(feature="sm_active_ratio - dram_bandwidth_ratio", unit="ratio", value=0.3, threshold=0.15,
                 holds=True, text=""),
            "SM activity 30 points above DRAM bandwidth: compute (over the 15-point margin)",
        ),
        (
            _row(feature="preemptions_per_minute", unit="per minute", value=72.4, threshold=1.0, holds=True,
                 text="preemptions over the last 15 s: 72.4/min (threshold ≥ 1.0/min)"),
            "preemptions over the last 15 s: 72.4/min, above the 1.0/min threshold",
        ),
        (
            _row(feature="itl_p95_seconds", unit="seconds", value=0.0247, threshold=0.1, holds=False, context=True,
                 text="ITL p95 over the last 15 s: 24.7 ms (SLO 100 ms)"),
            "ITL p95 over the last 15 s: 24.7 ms, below the 100 ms SLO",
        ),
        (  # nothing compared: the rules' words
            _row(feature="prefix_hit_ratio", unit="ratio", value=0.0, threshold=0.5, text="prefix-cache hit ratio: 0% "
                 "(a hit says where the KV came from, not how fast it is read)"),
            "prefix-cache hit ratio: 0% (a hit says where the KV came from, not how fast it is read)",
        ),
        (
            _row(feature="ttft_p95_seconds", measured=False, value=None, threshold=2.0, text="TTFT p95: not measured"),
            "TTFT p95: not measured",
        ),
    ],
)  # fmt: skip
def test_an_evidence_row_reads_as_a_fact_with_its_direction(item, fact):
    assert components.evidence_fact(item) == fact
