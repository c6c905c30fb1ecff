"""The runtime: collector isolation, NotApplicable, self metrics, the page, the diagnosis hook."""

from __future__ import annotations

import subprocess
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvdoctor.exporter import accounting, isolation, live_diagnosis
from kvdoctor.exporter.exposition import render_samples
from kvdoctor.exporter.runtime import Exporter
from kvdoctor.exporter.settings import ExporterSettings
from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.collection import Collected, SourceError
from kvdoctor.signals.window import labels_of
from tests.exporter.exporter_fakes import (
    BlockingCollector,
    FakeClock,
    ScriptedCollector,
    StaticCollector,
    engine_samples,
    failing,
    gpu_samples,
    not_applicable,
)
from tests.support import tools
from tests.support.models import write_config

pytestmark = pytest.mark.usefixtures("clean_env")  # no KVDOCTOR_* from the caller's environment


def settings(**kw) -> ExporterSettings:
    return ExporterSettings(**{"interval": 0.1, **kw})


def parse(page: bytes) -> dict[tuple, float]:
    """{(sample name, frozenset(labels)): value} via prometheus_client's own parser."""
    out = {}
    for family in text_string_to_metric_families(page.decode()):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def value(page: bytes, name: str, **labels) -> float | None:
    want = frozenset(labels.items())
    for (n, lbls), v in parse(page).items():
        if n == name and want <= lbls:
            return v
    return None


def families(page: bytes) -> dict[str, str]:
    return {f.name: f.type for f in text_string_to_metric_families(page.decode())}


# ---------------------------------------------------------------------------------- isolation


def test_failing_collectors_do_not_affect_the_others():
    exp = Exporter(
        settings(),
        [
            StaticCollector("gpu", lambda step: gpu_samples(2, step)),
            failing("engine", "connection_refused"),
            ScriptedCollector("dcgm", [ZeroDivisionError("bug in a collector")]),
        ],
    )
    exp.run_cycle()
    page = exp.metrics_bytes()
    assert value(page, S.SOURCE_UP, source="gpu") == 1.0
    assert value(page, S.SOURCE_UP, source="engine") == 0.0
    assert value(page, S.SOURCE_UP, source="dcgm") == 0.0
    assert value(page, S.SOURCE_ERRORS, source="engine", reason="connection_refused") == 1.0
    errors = {k: v for k, v in parse(page).items() if k[0] == S.SOURCE_ERRORS}
    reasons = {dict(k[1])["source"]: dict(k[1])["reason"] for k in errors}
    assert reasons == {"engine": "connection_refused", "dcgm": "exception"}
    assert value(page, S.GPU_MEMORY_USED, gpu="1") is not None
    status = exp.status()
    assert status["dcgm"]["last_error"].startswith("ZeroDivisionError")
    assert status["engine"]["last_error_reason"] == "connection_refused"


def test_not_applicable_source_has_no_up_series_and_no_error():
    exp = Exporter(settings(), [not_applicable("nvml"), StaticCollector("gpu", lambda s: gpu_samples(1, s))])
    exp.run_cycle()
    exp.run_cycle()
    page = exp.metrics_bytes().decode()
    assert 'source="nvml"' not in page
    assert value(exp.metrics_bytes(), S.SOURCE_UP, source="gpu") == 1.0
    assert exp.status()["nvml"]["applicable"] is False
    assert exp.status()["nvml"]["errors"] == {}


def test_not_applicable_sources_are_asked_again_later_not_every_cycle(monkeypatch):
    monkeypatch.setattr(isolation, "NOT_APPLICABLE_RETRY_SECONDS", 0.2)
    na = not_applicable("nvml")
    exp = Exporter(settings(), [na])
    exp.run_cycle()
    exp.run_cycle()
    assert na.calls == 1
    time.sleep(0.25)
    exp.run_cycle()
    assert na.calls == 2


def test_errors_are_counters_that_accumulate_and_the_source_recovers():
    script = [
        SourceError("http_500"),
        SourceError("http_500"),
        engine_samples(),
        SourceError("timeout"),
        engine_samples(),
    ]
    exp = Exporter(settings(), [ScriptedCollector("engine", script)])
    ups = []
    for _ in script:
        exp.run_cycle()
        ups.append(value(exp.metrics_bytes(), S.SOURCE_UP, source="engine"))
    assert ups == [0.0, 0.0, 1.0, 0.0, 1.0]
    page = exp.metrics_bytes()
    assert value(page, S.SOURCE_ERRORS, reason="http_500") == 2.0
    assert value(page, S.SOURCE_ERRORS, reason="timeout") == 1.0
    assert families(page)[S.SOURCE_ERRORS.removesuffix("_total")] == "counter"


def test_partial_errors_are_counted_but_the_source_stays_up():
    collected = gpu_samples(2)
    collected.partial_errors.append("gpu_lost")
    exp = Exporter(settings(), [ScriptedCollector("nvml", [collected])])
    exp.run_cycle()
    exp.run_cycle()
    page = exp.metrics_bytes()
    assert value(page, S.SOURCE_UP, source="nvml") == 1.0
    assert value(page, S.SOURCE_ERRORS, source="nvml", reason="gpu_lost") == 2.0


def test_reasons_are_cleaned_into_label_values():
    exp = Exporter(settings(), [failing("engine", "HTTP 503 Service/Unavailable")])
    exp.run_cycle()
    assert value(exp.metrics_bytes(), S.SOURCE_ERRORS, reason="http_503_service_unavailable") == 1.0


def test_a_hung_collector_times_out_without_holding_the_cycle():
    stuck = BlockingCollector("engine")
    exp = Exporter(settings(scrape_timeout=0.1), [stuck, StaticCollector("gpu", lambda s: gpu_samples(1, s))])
    try:
        started = time.perf_counter()
        exp.run_cycle()
        first = time.perf_counter() - started
        exp.run_cycle()  # still stuck: reported again without waiting on it
        page = exp.metrics_bytes()
        assert first < 1.0
        assert value(page, S.SOURCE_UP, source="engine") == 0.0
        assert value(page, S.SOURCE_UP, source="gpu") == 1.0
        assert value(page, S.SOURCE_ERRORS, source="engine", reason="timeout") == 2.0
        stuck.release.set()
        time.sleep(0.05)
        exp.run_cycle()  # the late answer was discarded; this cycle asks afresh and gets an answer
        assert value(exp.metrics_bytes(), S.SOURCE_UP, source="engine") == 1.0
    finally:
        stuck.release.set()
        exp.stop()


def test_collect_returning_the_wrong_type_is_an_exception_of_that_source():
    exp = Exporter(settings(), [ScriptedCollector("engine", [{"not": "collected"}])])
    exp.run_cycle()
    assert value(exp.metrics_bytes(), S.SOURCE_ERRORS, source="engine", reason="exception") == 1.0


def test_duplicate_collector_names_are_refused():
    with pytest.raises(ValueError):
        Exporter(settings(), [failing("engine"), failing("engine")])


# ----------------------------------------------------------------------------------- the page


def test_page_before_the_first_cycle_is_a_valid_empty_exposition():
    exp = Exporter(settings(), [])
    assert list(text_string_to_metric_families(exp.metrics_bytes().decode())) == []
    assert not exp.ready.is_set()


def test_page_has_help_and_type_from_the_signal_table_and_histograms_keep_their_buckets():
    exp = Exporter(
        settings(), [StaticCollector("engine", engine_samples), StaticCollector("gpu", lambda s: gpu_samples(8, s))]
    )
    exp.run_cycle()
    page = exp.metrics_bytes().decode()
    fams = {f.name: f for f in text_string_to_metric_families(page)}
    itl = fams[S.INTER_TOKEN_LATENCY]
    assert itl.type == "histogram"
    assert itl.documentation == S.SIGNALS[S.INTER_TOKEN_LATENCY].help
    les = [s.labels["le"] for s in itl.samples if s.name.endswith("_bucket")]
    assert les == ["0.01", "0.025", "0.05", "0.1", "0.25", "+Inf"]
    assert {s.name for s in itl.samples} == {S.INTER_TOKEN_LATENCY + suffix for suffix in ("_bucket", "_sum", "_count")}
    assert fams[S.PREEMPTIONS.removesuffix("_total")].type == "counter"
    assert f"# TYPE {S.PREEMPTIONS} counter" in page
    assert fams[S.GPU_DRAM_BANDWIDTH_UTILIZATION].type == "gauge"
    assert len([s for s in fams[S.GPU_MEMORY_USED].samples]) == 8


def test_counters_keep_their_raw_values_across_cycles():
    exp = Exporter(settings(), [StaticCollector("engine", engine_samples)])
    seen = []
    for _ in range(3):
        exp.run_cycle()
        seen.append(value(exp.metrics_bytes(), S.GENERATION_TOKENS))
    assert seen == [1000.0, 1100.0, 1200.0]


def test_pod_label_is_added_to_every_series():
    exp = Exporter(settings(pod="vllm-0"), [StaticCollector("engine", engine_samples), failing("nvml", "driver")])
    exp.run_cycle()
    samples = parse(exp.metrics_bytes())
    assert samples
    assert all(dict(labels).get("pod") == "vllm-0" for _, labels in samples)
    latest = exp.store.latest()
    assert all(("pod", "vllm-0") in labels for _, labels in latest.samples)


def test_special_values_are_written_as_prometheus_spells_them():
    page = render_samples(
        {
            (S.REQUESTS_RUNNING, ()): float("nan"),
            (S.KV_CACHE_USAGE, ()): float("inf"),
            (S.REQUESTS_WAITING, ()): float("-inf"),
        }
    ).decode()
    assert f"{S.REQUESTS_RUNNING} NaN" in page
    assert f"{S.KV_CACHE_USAGE} +Inf" in page
    assert f"{S.REQUESTS_WAITING} -Inf" in page


def test_label_values_are_escaped():
    key = (S.REQUESTS_RUNNING, labels_of(model_name='we"ird\\name\nx', engine="vllm"))
    page = render_samples({key: 1.0})
    [sample] = [s for f in text_string_to_metric_families(page.decode()) for s in f.samples]
    assert sample.labels["model_name"] == 'we"ird\\name\nx'


@tools.requires_promtool
def test_page_passes_promtool_check_metrics():
    promtool = tools.promtool()
    exp = Exporter(
        settings(pod="p"),
        [
            StaticCollector("engine", engine_samples),
            StaticCollector("gpu", lambda s: gpu_samples(8, s)),
            failing("dcgm"),
        ],
    )
    exp.run_cycle()
    result = subprocess.run([promtool, "check", "metrics"], input=exp.metrics_bytes(), capture_output=True, timeout=30)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()


# --------------------------------------------------------------------------------- series cap


def test_a_label_explosion_is_capped_per_source_and_counted():
    def explode(step):
        out = Collected()
        for i in range(5000):
            out.add(S.REQUESTS_RUNNING, 1.0, labels_of(engine="vllm", model_name=f"lora-{i}"))
        return out

    exp = Exporter(
        settings(max_series=300),
        [StaticCollector("engine", explode), StaticCollector("gpu", lambda s: gpu_samples(8, s))],
    )
    exp.run_cycle()
    exp.run_cycle()
    latest = exp.store.latest()
    assert len(latest.samples) <= 300
    page = exp.metrics_bytes()
    assert value(page, S.SOURCE_ERRORS, source="engine", reason="series_cap") == 2.0
    assert len([k for k in latest.samples if k[0] == S.GPU_MEMORY_USED]) == 8  # the small source is whole
    assert value(page, S.SOURCE_UP, source="engine") == 1.0


def test_error_reasons_per_source_are_bounded():
    script = [SourceError(f"reason_{i}") for i in range(accounting.MAX_REASONS_PER_SOURCE + 5)]
    exp = Exporter(settings(), [ScriptedCollector("engine", script)])
    for _ in script:
        exp.run_cycle()
    reasons = {dict(lb)["reason"] for (n, lb) in parse(exp.metrics_bytes()) if n.startswith("kvdoctor_source_errors")}
    assert len(reasons) == accounting.MAX_REASONS_PER_SOURCE + 1
    assert "other" in reasons


# --------------------------------------------------------------------------- store and clock


def test_cycles_land_in_the_store_with_the_clock_time():
    clock = FakeClock(1000.0)
    exp = Exporter(settings(), [StaticCollector("engine", engine_samples)], clock=clock)
    for _ in range(5):
        exp.run_cycle()
        clock.advance(1.0)
    w = exp.store.window(60)
    assert w.timestamps.tolist() == [1000.0, 1001.0, 1002.0, 1003.0, 1004.0]
    up = w.select(S.SOURCE_UP, source="engine")
    assert [v.tolist() for v in up.values()] == [[1.0] * 5]


def test_a_clock_that_steps_back_does_not_break_collection():
    clock = FakeClock(1000.0)
    exp = Exporter(settings(), [StaticCollector("engine", engine_samples)], clock=clock)
    exp.run_cycle()
    clock.advance(-5)
    exp.run_cycle()
    assert exp.cycles == 2
    ts = exp.store.window(60, now=1001.0).timestamps
    assert ts[1] > ts[0]


# ---------------------------------------------------------------------------------- diagnosis


class FakeDiagnosis:
    def __init__(self, verdict: str, n: int):
        self.verdict = verdict
        self.n = n

    def to_json(self) -> dict:
        return {"verdict": self.verdict, "snapshots": self.n}


def test_diagnose_hook_sees_the_window_and_the_verdict_is_a_state_set(monkeypatch):
    verdicts = ("idle", "healthy", "kv_thrashing")
    monkeypatch.setattr(live_diagnosis, "known_verdicts", lambda: verdicts)
    seen = []

    def hook(window):
        seen.append(len(window))
        return FakeDiagnosis("kv_thrashing", len(window))

    exp = Exporter(settings(), [StaticCollector("engine", engine_samples)], diagnose_hook=hook)
    for _ in range(live_diagnosis.MIN_DIAGNOSIS_SNAPSHOTS - 1):
        exp.run_cycle()
    assert exp.diagnosis() is None and seen == []  # too few snapshots for rates: no verdict yet
    assert S.DIAGNOSIS_VERDICT not in exp.metrics_bytes().decode()
    exp.run_cycle()
    exp.run_cycle()
    n = live_diagnosis.MIN_DIAGNOSIS_SNAPSHOTS
    assert seen == [n, n + 1]
    page = exp.metrics_bytes()
    assert {v: value(page, S.DIAGNOSIS_VERDICT, verdict=v) for v in verdicts} == {
        "idle": 0.0,
        "healthy": 0.0,
        "kv_thrashing": 1.0,
    }
    assert exp.diagnosis()["verdict"] == "kv_thrashing"
    assert exp.diagnosis()["snapshots"] == n + 1


def test_a_failing_diagnosis_is_counted_and_the_page_still_renders(monkeypatch):
    monkeypatch.setattr(live_diagnosis, "known_verdicts", lambda: ("idle",))

    def broken(window):
        raise RuntimeError("bug in the rules")

    exp = Exporter(settings(), [StaticCollector("engine", engine_samples)], diagnose_hook=broken)
    for _ in range(live_diagnosis.MIN_DIAGNOSIS_SNAPSHOTS):
        exp.run_cycle()
    page = exp.metrics_bytes()
    assert value(page, S.SOURCE_ERRORS, source="diagnosis", reason="exception") == 1.0
    assert value(page, S.SOURCE_UP, source="engine") == 1.0
    assert exp.diagnosis() is None


# ------------------------------------------------------------------------------------ ledger


def test_decode_step_floor_follows_the_ledger_formula(tmp_path):
    path = write_config(tmp_path)  # 4 layers, 4 heads of 64, 2 KV heads, float16
    exp = Exporter(
        settings(model_config_path=str(path), gpu_peak_bandwidth=1e12),
        [StaticCollector("engine", lambda s: engine_samples(usage=0.5, capacity=4096))],
    )
    exp.run_cycle()
    kv_per_token = 2 * 4 * 2 * (256 // 4) * 2  # K and V x layers x kv heads x head dim x fp16
    weights = exp.model_shape.weight_bytes
    expected = (weights + kv_per_token * 0.5 * 4096) / 1e12
    assert value(exp.metrics_bytes(), S.DECODE_STEP_FLOOR) == pytest.approx(expected)


def test_no_floor_without_a_model_config():
    exp = Exporter(settings(gpu_peak_bandwidth=1e12), [StaticCollector("engine", engine_samples)])
    exp.run_cycle()
    assert S.DECODE_STEP_FLOOR not in exp.metrics_bytes().decode()


# ---------------------------------------------------------------------------------- lifecycle


def test_the_collection_thread_runs_on_its_interval_and_stops_cleanly():
    engine = StaticCollector("engine", engine_samples)
    exp = Exporter(settings(interval=0.05), [engine])
    started = time.monotonic()
    exp.start()
    try:
        tools.wait_until(lambda: exp.cycles >= 5, timeout=20, interval=0.01, what="5 cycles")
    finally:
        exp.stop()
    elapsed = time.monotonic() - started
    assert exp.cycles <= elapsed / 0.05 + 2  # on its interval: no bursts, whatever the machine's load
    assert engine.closed
    cycles = exp.cycles
    time.sleep(0.15)
    assert exp.cycles == cycles
