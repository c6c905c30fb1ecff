"""Invariants of the diagnosis, checked by hypothesis on windows it builds from the scenario model:

- a window with ITL under the SLO, no preemption, no swapping and no request delayed (nothing
  waiting, TTFT under its SLO) is never a slow verdict;
- raising the preemption rate never moves a window from kv_thrashing to healthy;
- sample order, label order and counter resets never change the verdict, nor yield a negative rate;
- dropping any one signal never raises an exception, and never raises the confidence;
- the confidence (memoised across calls) is the same whatever was assessed before.

The same cases go through the PromQL rules and replay in the scenario suite
(tests/rules/test_rules_promtool.py, tests/rules/test_replay_agreement.py): ``CASES`` below are
scenarios of that suite.
"""

from __future__ import annotations

import math
import random

import numpy as np
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from kvdoctor.rules import confidence, tree
from kvdoctor.rules.conditions import Cmp, CmpFeatures, features_of
from kvdoctor.rules.diagnosis import diagnose
from kvdoctor.rules.knee import JUMP, RISES_WITH_KV
from kvdoctor.rules.thresholds import DEFAULT_SLO_SECONDS, Thresholds
from kvdoctor.rules.verdicts import SLOW_VERDICTS
from kvdoctor.signals.vocabulary import SIGNALS, signal_for_series
from kvdoctor.signals.window import Window
from tests.support.scenarios import BASE, Gpu, Latency, Scenario

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
T = Thresholds()

ratios = st.floats(0.0, 1.0, allow_nan=False)
latencies = st.floats(0.002, 0.4, allow_nan=False)


@st.composite
def gpus(draw) -> tuple[Gpu, ...]:
    if not draw(st.booleans()):
        return ()
    return (Gpu(dram=draw(ratios), sm=draw(ratios), pcie_rx=draw(st.sampled_from([1e6, 5e8, 3e9, 2e10]))),)


@st.composite
def scenarios(draw, **fixed: object) -> Scenario:
    """A window of one engine as the scenario model writes it: every family present or absent,
    its level drawn. ``fixed`` pins fields."""
    fields: dict[str, object] = dict(
        name="drawn",
        expected="",
        why="drawn by hypothesis",
        generation_tokens_per_second=draw(st.sampled_from([0, 5, 300, 2000])),
        prompt_tokens_per_second=draw(st.sampled_from([0, 500, 5000, 40000])),
        running=draw(st.integers(0, 64)),
        waiting=draw(st.sampled_from([0, 0, 2, 30])),
        kv_usage=draw(ratios),
        preemptions_per_minute=draw(st.sampled_from([0.0, 0.0, 2.0, 20.0])),
        kv_to_gpu_bytes_per_second=draw(st.sampled_from([None, 1e8, 3e9])),
        hits_by_tier=draw(st.sampled_from([None, (("device", 800), ("host", 600)), (("lmcache", 400),)])),
        latency=Latency(base=draw(latencies), mix=((0.9, 1.0), (0.1, draw(st.floats(1.0, 2.5))))),
        ttft=draw(st.sampled_from([None, Latency(base=0.2), Latency(base=3.0)])),
        itl_histogram=draw(st.booleans()),
        mean_time_per_token=draw(st.booleans()),
        swapped=draw(st.sampled_from([None, 0, 3])),
        kv_usage_reported=draw(st.booleans()),
        waiting_reported=draw(st.booleans()),
        gpus=draw(gpus()),
        duration=90.0,
    )
    fields.update(fixed)
    note(f"scenario fields: {fields}")
    return BASE.but(**fields)


def _families(window: Window) -> set[str]:
    return {s.name for name, _ in window.series if (s := signal_for_series(name)) is not None}


def _without(window: Window, family: str) -> Window:
    names = set(SIGNALS[family].series_names)
    return Window(window.timestamps, {k: v for k, v in window.series.items() if k[0] not in names})


# ------------------------------------------------------------------------------ properties


@FAST
@given(
    scenarios(
        waiting=0,
        preemptions_per_minute=0.0,
        swapped=None,
        ttft=Latency(base=0.2),
        itl_histogram=True,
    )
)
def test_on_time_and_nothing_waiting_is_never_a_slow_verdict(scenario):
    window = scenario.window()
    d = diagnose(window)
    p95 = d.features["itl_p95_seconds"]
    if math.isnan(p95) or p95 >= DEFAULT_SLO_SECONDS:
        return  # the drawn latency is over the SLO: not this property's window
    assert d.verdict not in SLOW_VERDICTS, d.headline


@FAST
@given(scenarios(preemptions_per_minute=2.0), st.sampled_from([4.0, 10.0, 60.0]))
def test_more_preemptions_never_turn_thrashing_into_healthy(scenario, more):
    before = diagnose(scenario.window())
    if before.verdict != "kv_thrashing":
        return
    after = diagnose(scenario.but(preemptions_per_minute=more).window())
    assert after.verdict != "healthy", after.headline
    assert after.verdict == "kv_thrashing", after.headline


@FAST
@given(scenarios(), st.randoms(use_true_random=False))
def test_sample_and_label_order_change_nothing(scenario, rnd: random.Random):
    window = scenario.window()
    keys = list(window.series)
    rnd.shuffle(keys)
    order = np.arange(len(window))
    rnd.shuffle(order)  # a Window is columns: sorting happens where it is built from snapshots
    shuffled = Window.from_snapshots(list(window.snapshots())[i] for i in order)
    relabelled = Window(window.timestamps, {(n, tuple(reversed(lb))): window.series[(n, lb)] for n, lb in keys})
    want = diagnose(window)
    for other in (shuffled, relabelled):
        got = diagnose(other)
        assert got.verdict == want.verdict
        assert got.features.keys() == want.features.keys()
        for name, value in want.features.items():
            assert (math.isnan(value) and math.isnan(got.features[name])) or got.features[name] == value, name


@FAST
@given(scenarios(), st.floats(5.0, 50.0))
def test_a_counter_reset_changes_no_verdict_and_no_rate_goes_negative(scenario, before_end):
    steady = diagnose(scenario.window())
    reset = diagnose(scenario.but(counter_reset_before_end=before_end).window())
    for name in ("generation_tokens_per_second", "prompt_tokens_per_second", "preemptions_per_minute"):
        value = reset.features[name]
        assert math.isnan(value) or value >= 0, (name, value)
    assert reset.verdict == steady.verdict, (reset.headline, steady.headline)


@FAST
@given(scenarios())
def test_dropping_any_one_signal_never_raises_and_never_adds_confidence(scenario):
    window = scenario.window()
    full = diagnose(window)
    for family in sorted(_families(window)):
        fewer = diagnose(_without(window, family))  # never raises
        assert fewer.confidence <= full.confidence + 1e-9, (
            f"without {family}: {fewer.verdict} {fewer.confidence:.3f} > {full.verdict} {full.confidence:.3f}\n"
            f"{full.headline}\n{fewer.headline}"
        )


def test_a_verdict_that_holds_for_want_of_gpu_counters_caps_the_guess_made_without_its_token_counter():
    # prefill-heavy without GPU counters (compute_bound) holds only while the counters stay missing
    # and only at prompt rates past prefill_heavy_ratio x the generation rate; without the prompt
    # counter, the bandwidth guess must not be surer than that verdict was
    params = tree.parameters(T, DEFAULT_SLO_SECONDS)
    values = {
        "itl_p95_seconds": 3 * DEFAULT_SLO_SECONDS,
        "generation_tokens_per_second": 5.0,
        "prompt_tokens_per_second": 5.0 * T.prefill_heavy_ratio * 2,
        "requests_running": 1.0,
    }
    values = {name: values.get(name, math.nan) for name in _FEATURES}
    assert tree.choose_branch(values, params).id == "prefill_heavy_no_gpu"
    full, _ = confidence.assess(values, params, None)
    without_prompt = {**values, "prompt_tokens_per_second": math.nan}
    assert tree.choose_branch(without_prompt, params).verdict == "memory_bandwidth_bound"
    fewer, unresolved = confidence.assess(without_prompt, params, None)
    assert fewer <= full and "compute_bound" in unresolved


# --------------------------------------------------------------- the memoised search

_CMPS = list(dict.fromkeys(a for b in tree.BRANCHES for a in tree.BRANCH_ATOMS[b.id] if isinstance(a, Cmp)))
_PAIRS = list(dict.fromkeys(a for b in tree.BRANCHES for a in tree.BRANCH_ATOMS[b.id] if isinstance(a, CmpFeatures)))
_FEATURES = sorted({n for b in tree.BRANCHES for n in features_of(b.condition)})


def _partner(name: str) -> str | None:
    return next((p.right if name == p.left else p.left for p in _PAIRS if name in (p.left, p.right)), None)


@st.composite
def feature_values(draw) -> tuple[dict[str, float], dict[str, float], str | None]:
    """Feature values on either side of, near and at the tree's thresholds and of the feature each is
    compared with, some missing; the SLO and the knee."""
    params = tree.parameters(T, draw(st.sampled_from([0.02, DEFAULT_SLO_SECONDS])))
    values: dict[str, float] = {}
    for name in _FEATURES:
        thresholds = [a.threshold.value(params) for a in _CMPS if a.feature == name] or [1.0]
        choices = [
            st.just(math.nan),
            st.sampled_from(thresholds).flatmap(
                lambda thr: st.sampled_from([0.0, 0.5, 0.97, 1.0, 1.03, 1.5, 12.0]).map(lambda k: thr * k)
            ),
            st.floats(0.0, 1e4, allow_nan=False),
        ]
        other = values.get(_partner(name) or "", math.nan)
        if not math.isnan(other):  # around the feature it is compared with (scaled, offset)
            scaled = st.sampled_from([0.95, 1.0, 1.05, 9.5, 10.0, 10.5]).map(lambda k, o=other: o * k)
            choices.append(
                scaled.flatmap(lambda v: st.sampled_from([0.0, 0.15, 0.2, -0.15]).map(lambda d: max(0.0, v + d)))
            )
        values[name] = draw(st.one_of(choices))
    return values, params, draw(st.sampled_from([None, RISES_WITH_KV, JUMP]))


@FAST
@given(feature_values(), st.lists(feature_values(), max_size=3))
def test_the_confidence_is_the_same_whatever_was_assessed_before(case, before):
    values, params, knee = case
    confidence._assess_frozen.cache_clear()
    alone = confidence.assess(values, params, knee)
    for other_values, other_params, other_knee in before:  # other windows first: the memo must not matter
        confidence.assess(other_values, other_params, other_knee)
    assert confidence.assess(dict(values), params, knee) == alone
    assert confidence.assess({**values, "not_a_feature": math.nan}, params, knee)[0] == alone[0]
