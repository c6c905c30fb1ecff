"""One context, published: the exporter's SLO, model shape, GPU and peak bandwidth travel with its
samples (an SLO gauge and an info metric) and in its status, and every reader resolves them alike."""

from __future__ import annotations

import numpy as np
import pytest

from kvdoctor.ledger.model import COMMON_MODELS
from kvdoctor.rules import context as C
from kvdoctor.rules.diagnosis import diagnose
from kvdoctor.signals.vocabulary import CONTEXT_INFO, ITL_SLO
from kvdoctor.signals.window import Window, labels_of
from tests.support.scenarios import SCENARIO_BY_NAME

SHAPE = COMMON_MODELS["Llama-3.1-8B"]
PUBLISHED = C.Context(model=SHAPE, gpu_peak_bandwidth=3.35e12, slo_seconds=0.015, gpu_model="NVIDIA H100 80GB HBM3")


def test_the_info_metric_carries_the_whole_context_back():
    (slo_name, _, slo), (info_name, labels, one) = C.published_samples(PUBLISHED)
    assert (slo_name, slo, info_name, one) == (ITL_SLO, 0.015, CONTEXT_INFO, 1.0)
    assert labels["model"] == "Llama-3.1-8B" and labels["model_num_kv_heads"] == "8"
    back = C.context_from_info(labels, slo)
    assert back.model == SHAPE and back.gpu_peak_bandwidth == 3.35e12 and back.gpu_model == PUBLISHED.gpu_model
    assert back.slo_seconds == 0.015


def test_the_status_json_round_trips():
    back = C.context_from_json(C.context_to_json(PUBLISHED))
    assert back.model == SHAPE and back.slo_seconds == 0.015 and back.gpu_peak_bandwidth == 3.35e12
    with pytest.raises(ValueError):
        C.context_from_json({"model": "not a shape"})


def test_given_wins_then_published_then_the_default():
    assert C.resolve(C.Context(slo_seconds=0.05), PUBLISHED).slo == 0.05
    assert C.resolve(C.Context(slo_seconds=0.05), PUBLISHED).slo_source == C.GIVEN
    assert C.resolve(C.Context(), PUBLISHED).slo == 0.015
    assert C.resolve(C.Context(), PUBLISHED).slo_source == C.PUBLISHED
    assert C.resolve(C.Context(), C.Context()).slo == 0.1 and C.resolve(None, None).slo_source == C.DEFAULT
    # resolving twice keeps a published SLO findable: an unresolved SLO stays None
    assert C.resolve(C.resolve(None, None), PUBLISHED).slo == 0.015


def _with_published(window: Window, ctx: C.Context) -> Window:
    series = dict(window.series)
    n = len(window)
    for name, labels, value in C.published_samples(ctx):
        series[(name, labels_of(labels, pod="vllm-0"))] = np.full(n, value)
    return Window(window.timestamps, series)


def test_diagnose_reads_the_context_its_window_carries():
    window = SCENARIO_BY_NAME["slo_just_under"].window()  # ITL p95 ~95 ms
    assert diagnose(window).verdict == "healthy"
    published = diagnose(_with_published(window, C.Context(slo_seconds=0.05, model=SHAPE)))
    assert published.verdict == "memory_bandwidth_bound" and published.context.model == SHAPE
    assert published.to_json()["context"]["slo_seconds"] == 0.05
    assert published.to_json()["context"]["slo_source"] == C.PUBLISHED
    fp8 = next(a for a in published.actions if a.id == "fp8_kv_cache")
    assert fp8.effect.startswith("FP8 KV: 128 KiB -> 64 KiB per token")  # the published model's ledger


def test_the_newest_published_slo_wins_after_a_restart_with_another():
    window = SCENARIO_BY_NAME["slo_just_under"].window()
    series = dict(window.series)
    values = np.full(len(window), 0.2)
    values[-10:] = 0.05  # restarted with --slo-ms 50 ten seconds ago
    series[(ITL_SLO, labels_of(pod="vllm-0"))] = values
    assert diagnose(Window(window.timestamps, series)).context.slo == 0.05
