"""The diagnosis benchmark as a guard: on the small labelled corpus (tests/support/corpus.py), no
cause's accuracy falls below the floor recorded in bench/diagnosis_floors.json, in Python and
through the PromQL rules, so a new verdict cannot take another's cases unseen. And the corpus
itself: deterministic, covering every label, engine, missing family and interval, its engine
expositions going through the real adapters, its changes of cause spliced as counters and gauges
really behave."""

from __future__ import annotations

import functools
import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from kvdoctor.rules.verdicts import verdict_code
from kvdoctor.signals.vocabulary import (
    GENERATION_SECONDS,
    INTER_TOKEN_LATENCY,
    KV_CACHE_USAGE,
    KV_TRANSFER_BYTES,
    PREEMPTIONS,
    PREFIX_CACHE_QUERIES,
    PROMPT_TOKENS,
    REQUESTS_WAITING,
    TIME_TO_FIRST_TOKEN,
)
from tests.support.corpus import (
    ALONE,
    ENGINES,
    INTERVALS,
    LABELS,
    MISSING,
    UNKNOWN,
    Case,
    below_floors,
    change_case,
    corpus,
    judge_promql,
    judge_python,
    lag,
    parse_promtool,
    render_native,
    score,
    splice,
    static_case,
    through_adapter,
)
from tests.support.tools import promtool, requires_promtool

ROOT = Path(__file__).resolve().parents[2]
FLOORS = json.loads((ROOT / "bench" / "diagnosis_floors.json").read_text())


@functools.cache
def small() -> tuple[Case, ...]:
    return tuple(corpus("small"))


@functools.cache
def python_verdicts():
    return judge_python(small())


def _names(case: Case) -> set[str]:
    return {key[0] for key in case.encoded()}


# ------------------------------------------------------------------------------- the guard


def test_python_accuracy_meets_the_recorded_floors():
    scores = score(small(), python_verdicts())
    problems = below_floors(scores, FLOORS["small"]["python"])
    assert not problems, "\n".join(problems)


@requires_promtool
@pytest.mark.slow
def test_promql_accuracy_meets_the_recorded_floors_and_agrees_with_python():
    cases = small()
    verdicts = judge_promql(cases, promtool())
    problems = below_floors(score(cases, verdicts), FLOORS["small"]["promql"])
    assert not problems, "\n".join(problems)
    python = python_verdicts()
    differ = [(c.id, python[c.id], verdicts[c.id]) for c in cases if python[c.id] != verdicts[c.id]]
    assert not differ, f"Python and PromQL disagree (case, Python, PromQL at each instant): {differ[:5]}"


def test_a_verdict_that_takes_another_causes_cases_falls_below_its_floor():
    """The guard the floors exist for: a new branch answering request_queueing on the
    bandwidth-bound cases (as it did once, unseen) fails, naming the cause and what its cases read."""
    cases = small()
    taken = {
        c.id: ({t: "request_queueing" for t in v} if c.truth == "memory_bandwidth_bound" else v)
        for c, v in ((c, python_verdicts()[c.id]) for c in cases)
    }
    problems = below_floors(score(cases, taken), FLOORS["small"]["python"])
    assert any(p.startswith("memory_bandwidth_bound: accuracy") and "request_queueing" in p for p in problems)
    quiet = {
        c.id: ({t: "healthy" for t in v} if c.truth == "compute_bound" else v)
        for c, v in ((c, python_verdicts()[c.id]) for c in cases)
    }
    problems = below_floors(score(cases, quiet), FLOORS["small"]["python"])
    assert any(p.startswith("false-healthy") for p in problems)


def test_the_floors_cover_every_cause_of_the_small_corpus():
    truths = {c.truth for c in small()}
    for half in ("python", "promql"):
        assert set(FLOORS["small"][half]["accuracy"]) == truths
        assert FLOORS["small"][half]["cases"] == len(small())


# ------------------------------------------------------------------------------- the corpus


def test_the_small_corpus_covers_every_label_engine_family_and_interval():
    cases = small()
    assert len({c.id for c in cases}) == len(cases), "case ids must be unique"
    assert {c.truth for c in cases} == set(LABELS)
    assert {c.engine for c in cases} >= set(ENGINES)
    assert {c.missing for c in cases} == set(MISSING)
    assert {c.step for c in cases} == set(INTERVALS)
    kinds = Counter(c.kind for c in cases)
    assert kinds["queue_steady"] == kinds["queue_growing"] == len(ALONE) - 1  # every cause but idle
    assert any(c.noise for c in cases) and kinds["change"] >= 8 and kinds["recorded"] >= 2
    # each cause with a queue keeps its truth; a harmless steady queue is healthy
    assert all(c.truth == c.cause for c in cases if c.kind == "queue_steady")


def test_the_full_corpus_is_every_combination():
    cases = corpus("full")
    static = [c for c in cases if c.kind in ("alone", "queue_steady", "queue_growing") and c.samples is None]
    combos = {(c.engine, c.missing, c.noise, c.step) for c in static}
    assert len(combos) == 2 * 2 * (4 + 4 + 4 + 4 + 3 + 2)  # intervals x noise x (engine, missing family it has)
    changes = {(c.previous, c.cause) for c in cases if c.kind == "change"}
    assert len(changes) == 8 * 7
    assert len({c.id for c in cases}) == len(cases)


def test_the_corpus_is_deterministic_noise_included():
    a, b = static_case("compute_bound", noise=True).scenario, static_case("compute_bound", noise=True).scenario
    assert a is not None and b is not None and a is not b
    first, second = a.series(), b.series()  # computed twice, not cached
    assert first.keys() == second.keys()
    for key in first:
        np.testing.assert_array_equal(first[key], second[key])
    clean = static_case("compute_bound").scenario
    assert clean is not None
    assert any(not np.array_equal(first[k], v, equal_nan=True) for k, v in clean.series().items())  # noise is there


def test_a_queue_grows_over_the_window_or_stays_steady():
    growing = static_case("memory_bandwidth_bound", "queue_growing").window_at(120.0)
    steady = static_case("memory_bandwidth_bound", "queue_steady").window_at(120.0)
    (grow,) = growing.select(REQUESTS_WAITING).values()
    (flat,) = steady.select(REQUESTS_WAITING).values()
    assert grow[0] < 5 and grow[-1] >= 35
    assert np.all(flat == 8)


def test_missing_families_are_missing():
    assert not any(n.startswith("kvdoctor_gpu_") for n in _names(static_case("healthy", missing="gpu")))
    assert not any(n.startswith(INTER_TOKEN_LATENCY) for n in _names(static_case("healthy", missing="itl")))
    assert not any(n.startswith(TIME_TO_FIRST_TOKEN) for n in _names(static_case("healthy", missing="ttft")))
    assert any(n.startswith(INTER_TOKEN_LATENCY) for n in _names(static_case("healthy", missing="gpu")))


def test_a_short_window_keeps_only_its_last_scrapes():
    (case,) = [c for c in small() if c.truth == UNKNOWN and c.samples == 2]
    window = case.window_at(case.end)
    assert len(window) == 2 and window.end == case.end


# ------------------------------------------------------------------------------- engines


def test_vllm_v1_round_trips_through_its_adapter_exactly():
    """Rendered into vLLM's families and normalised back by the real adapter, every engine series
    comes back with the same values (KV moved from the host tier reads as vLLM's "cpu" tier)."""
    for cause in ("kv_tier_miss", "kv_thrashing", "request_queueing"):
        s = static_case(cause).scenario
        assert s is not None
        canonical = s.series()
        back = through_adapter(canonical, "vllm_v1", s.pod)

        def tierless(key):
            name, labels = key
            return (name, tuple(kv for kv in labels if not (name == KV_TRANSFER_BYTES and kv[0] == "tier")))

        want = {tierless(k): v for k, v in canonical.items() if not k[0].startswith("kvdoctor_source_up")}
        got = {tierless(k): v for k, v in back.items()}
        assert set(got) >= set(want)
        for key, values in want.items():
            np.testing.assert_allclose(got[key], values, err_msg=str(key))


def test_each_engine_exposition_is_rendered_in_its_own_families():
    s = static_case("kv_thrashing").scenario
    assert s is not None
    names = {engine: {k[0] for k in render_native(s.series(), engine)} for engine in ENGINES[:-1]}
    assert (
        "vllm:kv_cache_usage_perc" in names["vllm_v1"] and "vllm:inter_token_latency_seconds_bucket" in names["vllm_v1"]
    )
    assert "vllm:gpu_cache_usage_perc" in names["vllm_v0"]  # the V0 names
    assert "vllm:time_per_output_token_seconds_bucket" in names["vllm_v0"]
    assert "sglang:num_retracted_requests_total" in names["sglang"]
    assert "trtllm_kv_cache_utilization" in names["trtllm"] and "trtllm_kv_cache_tokens_per_block" in names["trtllm"]
    assert names["tgi"] >= {
        "tgi_queue_size",
        "tgi_batch_current_size",
        "tgi_request_mean_time_per_token_duration_bucket",
    }
    assert not any(n.startswith("kvdoctor_") for family in names.values() for n in family)


def test_what_an_engine_cannot_publish_is_gone_after_its_adapter():
    def canonical(cause: str, engine: str) -> set[str]:
        return _names(static_case(cause, engine=engine))

    assert KV_CACHE_USAGE not in canonical("kv_thrashing", "tgi")  # TGI has no KV gauge
    assert TIME_TO_FIRST_TOKEN + "_count" not in canonical("healthy", "tgi")
    assert PREEMPTIONS not in canonical("kv_thrashing", "trtllm")  # TensorRT-LLM: no preemption counter
    assert PREEMPTIONS in canonical("kv_thrashing", "sglang")  # SGLang's retractions
    llama = canonical("memory_bandwidth_bound", "llamacpp")
    assert GENERATION_SECONDS in llama and not any(n.startswith(INTER_TOKEN_LATENCY) for n in llama)
    # SGLang's prompt tokens are its prefix queries: one family, both signals equal
    w = static_case("compute_bound", engine="sglang").window_at(120.0)
    (prompts,), (queries,) = w.select(PROMPT_TOKENS).values(), w.select(PREFIX_CACHE_QUERIES).values()
    np.testing.assert_array_equal(prompts, queries)


# ------------------------------------------------------------------------------- changes


def test_a_change_of_cause_continues_counters_and_switches_gauges():
    before = {("c_total", ()): np.array([0.0, 1, 2, 3, 4]), ("g", ()): np.array([5.0] * 5)}
    after = {("c_total", ()): np.array([100.0, 110, 120, 130, 140]), ("h", ()): np.array([7.0] * 5)}
    out = splice(before, after, 2)
    np.testing.assert_array_equal(out[("c_total", ())], [0, 1, 11, 21, 31])  # on from 1 by after's increases
    np.testing.assert_array_equal(out[("g", ())][:2], [5, 5])
    assert np.isnan(out[("g", ())][2:]).all()  # a gauge only the old cause had is gone
    assert np.isnan(out[("h", ())][:2]).all() and (out[("h", ())][2:] == 7).all()


def test_a_change_case_switches_cause_at_its_switch():
    case = change_case("kv_thrashing", "memory_bandwidth_bound")
    assert case.switch_at is not None and case.truth == "memory_bandwidth_bound"
    full = case.full_window()
    (preempted,) = full.select(PREEMPTIONS).values()
    t = full.timestamps
    assert np.all(np.diff(preempted) >= 0)
    assert preempted[t < case.switch_at][-1] > preempted[0]  # preempting before
    assert preempted[-1] == preempted[t < case.switch_at][-1]  # flat after: the counter stays, still
    assert case.eval_times()[0] == case.switch_at and case.eval_times()[-1] == case.end


def test_lag_is_the_time_until_the_verdict_is_the_new_cause_and_stays_it():
    case = change_case("healthy", "compute_bound")
    s = case.switch_at
    assert s is not None
    settles = {s: "healthy", s + 1: "compute_bound", s + 2: "healthy", s + 3: "compute_bound", s + 4: "compute_bound"}
    assert lag(case, settles) == 3.0  # a flap does not count as settled
    assert lag(case, {s: "compute_bound", s + 1: "compute_bound"}) == 0.0
    assert lag(case, {s: "compute_bound", s + 1: "healthy"}) is None


def test_promtool_reports_are_read_case_by_case():
    code = verdict_code("memory_bandwidth_bound")
    report = f"""
  FAILED:
    expr: "label_replace(kvdoctor:verdict or on() vector(0), \\"case\\", \\"3\\", \\"\\", \\"\\")", time: 2m,
        exp: nil
        got: {{__name__="kvdoctor:verdict", case="3", pod="p", verdict="memory_bandwidth_bound"}} {code}E+00
    expr: "label_replace(kvdoctor:verdict or on() vector(0), \\"case\\", \\"4\\", \\"\\", \\"\\")", time: 1m30s,
        exp: nil
        got: {{case="4"}} 0E+00
    expr: "label_replace(kvdoctor:verdict or on() vector(0), \\"case\\", \\"5\\", \\"\\", \\"\\")", time: 1m,
        exp: nil
        got: {{__name__="kvdoctor:verdict", case="5", engine="vllm", pod="p", verdict="healthy"}} {code}E+00
"""
    got = parse_promtool(report)
    assert got[3] == {120.0: "memory_bandwidth_bound"}
    assert got[4] == {90.0: "idle"}  # no verdict sample: an inactive engine
    assert got[5] == {60.0: f"healthy labelled, code {code}"}  # a label and a code that disagree: wrong
    assert math.isclose(min(got[4]), 90.0)
