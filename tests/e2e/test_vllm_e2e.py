"""End to end against a real vLLM: the engine, the kvdoctor exporter (a real subprocess scraping it
every second) and a real Prometheus (scraping the exporter every second, with rules/alerts.yaml).

One vLLM server serves the whole session (tests/e2e/conftest.py); each test has its own exporter
and Prometheus, so each judges only its own traffic. The engine-restart test restarts the shared
server on its port and comes last in this file (the server is usable again afterwards).
"""

from __future__ import annotations

import time

import pytest

from kvdoctor.rules.alert_specs import VERDICT_ALERT
from kvdoctor.rules.promql import condition_name, record_name, rule_thresholds
from tests.e2e.kvdoctor_stack import ALERT_RULES, ExporterProcess, Watcher, prometheus_config, restart_engine
from tests.e2e.vllm_server import BackgroundLoad
from tests.support.tools import requires_prometheus, requires_vllm, wait_until

pytestmark = [pytest.mark.slow, requires_vllm, requires_prometheus]

# The alerts that name a slow cause, one per slow verdict (KvdoctorSourceDown is about the sources).
SLOW_CAUSE_ALERTS = set(VERDICT_ALERT.values())
OK_VERDICTS = {"healthy", "idle"}

# Light load: two short generations in flight (ITL ~20-60 ms on a busy 2-core machine, SLO 100 ms).
LIGHT = dict(concurrency=2, max_tokens=32)
# Saturation: 16 long generations on the ~4,000-token KV cache: 16 x (60 + 1,024) tokens do not fit.
SATURATING = dict(concurrency=16, max_tokens=1024)

# Recording rules built on counters (besides rate/increase of every counter): never negative.
RULES = rule_thresholds(None, None)  # what rules/alerts.yaml is compiled with: names carry their ranges
GENERATION_RATE = record_name("generation_tokens_per_second", RULES)
RATE_RULES = (
    GENERATION_RATE,
    record_name("prompt_tokens_per_second", RULES),
    record_name("preemptions_per_minute", RULES),
)


@pytest.fixture
def stack(vllm_server, prometheus_server, tmp_path, request):
    """An exporter on the shared vLLM and a Prometheus scraping it with the alert rules; both fresh."""
    pod = f"e2e-{request.node.name.removeprefix('test_')[:40].replace('_', '-')}"
    exporter = ExporterProcess(vllm_server.metrics_url, tmp_path, pod=pod).start()
    try:
        prom = prometheus_server(prometheus_config(exporter.target), rule_files=[ALERT_RULES])
        prom.wait_for_targets_up(timeout=30)
        yield exporter, prom
    finally:
        exporter.stop()


def _selector(exporter: ExporterProcess) -> str:
    return f'{{pod="{exporter.pod}"}}'


def _range_values(prom, expr: str, start: float, end: float) -> list[float]:
    data = prom.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step="1")
    return [float(v) for series in data["result"] for _, v in series["values"]]


def _assert_no_negative_rates(prom, start: float, end: float) -> None:
    """rate() and increase() of every counter the exporter served, and the rules built on them."""
    counters = [
        n
        for n in prom.api("label/__name__/values")
        if n.startswith("kvdoctor_") and (n.endswith("_total") or n.endswith("_count") or n.endswith("_bucket"))
    ]
    assert "kvdoctor_generation_tokens_total" in counters, counters
    exprs = [f"{fn}({name}[{rng}])" for name in counters for fn, rng in (("rate", "15s"), ("increase", "60s"))]
    for expr in exprs + list(RATE_RULES):
        values = _range_values(prom, expr, start, end)
        negative = [v for v in values if v < 0]
        assert not negative, f"{expr} went negative: {negative[:5]}"


def _slow_alerts(prom) -> list[tuple[str, str]]:
    return [
        (a["labels"]["alertname"], a["state"])
        for a in prom.alerts()
        if a["labels"].get("alertname") in SLOW_CAUSE_ALERTS
    ]


def _diagnose_prometheus(run_cli, prom, exporter) -> tuple[int, dict, str]:
    import json

    result = run_cli("diagnose", "--prometheus", prom.url, "--selector", _selector(exporter), "--json", timeout=90)
    assert result.rc in (0, 1), f"diagnose --prometheus failed ({result.rc}): {result.stderr}"
    return result.rc, json.loads(result.stdout), result.stderr


# ------------------------------------------------------------------------------------- scenarios


def test_light_load_is_healthy_with_no_slow_cause_alert(stack, vllm_server, run_cli):
    exporter, prom = stack
    with BackgroundLoad(vllm_server.url, vllm_server.model, duration_s=120, **LIGHT) as load:
        # Healthy needs ITL data in the window; wait until the exporter has ~15 s of load.
        wait_until(lambda: exporter.diagnosis()["window"]["samples"] >= 15, timeout=60, what="15 s of samples")
        # Prometheus evaluated the tree on real data: the engine is active and ITL p95 is known.
        prom.wait_for_value(condition_name("engine_active"), lambda v: v == 1, timeout=30)
        prom.wait_for(record_name("itl_p95_seconds", RULES), timeout=30)
        verdicts, alerts = [], []
        for _ in range(8):
            verdicts.append(exporter.diagnosis()["verdict"])
            alerts += _slow_alerts(prom)
            time.sleep(1)
        rc, cli, _ = _diagnose_prometheus(run_cli, prom, exporter)
    assert not load.result.errors, load.result.errors[:3]
    assert load.result.completed >= 5, load.result

    assert set(verdicts) == {"healthy"}, verdicts
    assert not alerts, f"slow-cause alerts under light load: {alerts}"
    assert (rc, cli["verdict"]) == (0, "healthy"), cli["headline"]


def test_saturation_is_kv_thrashing_in_exporter_cli_and_alerts(stack, vllm_server, run_cli):
    exporter, prom = stack
    started = time.monotonic()
    with BackgroundLoad(vllm_server.url, vllm_server.model, duration_s=240, **SATURATING):
        # The pool fills in seconds; preemptions follow once the running requests outgrow it.
        diagnosis = wait_until(
            lambda: (d := exporter.diagnosis())["verdict"] == "kv_thrashing" and d,
            timeout=180,
            interval=1.0,
            what="the exporter's verdict kv_thrashing",
        )
        exporter_seconds = time.monotonic() - started
        alert = wait_until(
            lambda: next(
                (
                    a
                    for a in prom.alerts()
                    if a["labels"].get("alertname") == "KVCacheThrashing" and a["state"] in ("pending", "firing")
                ),
                None,
            ),
            timeout=60,
            interval=1.0,
            what="KVCacheThrashing pending or firing",
        )
        alert_seconds = time.monotonic() - started
        rc, cli, stderr = _diagnose_prometheus(run_cli, prom, exporter)
    print(
        f"\nkv_thrashing from the exporter after {exporter_seconds:.0f} s of load, "
        f"KVCacheThrashing {alert['state']} after {alert_seconds:.0f} s"
    )

    features = diagnosis["features"]
    assert features["preemptions_per_minute"] >= 1, features
    # The pool is mostly full, read as a ratio; not >= 0.9: each preemption frees blocks before the
    # next scrape, and in this small pool the sampled usage under preemption has read 0.81 to 1.0.
    assert features["kv_usage"] >= 0.7, features
    assert diagnosis["branch"] == "thrashing_preemptions", diagnosis["branch"]
    assert alert["labels"].get("pod") == exporter.pod, alert["labels"]
    assert (rc, cli["verdict"]) == (1, "kv_thrashing"), (cli["headline"], stderr)
    assert cli["features"]["preemptions_per_minute"] >= 1, cli["features"]


def test_exporter_restart_mid_run_keeps_rates_and_verdict(stack, vllm_server, run_cli):
    exporter, prom = stack
    began = time.time()
    with BackgroundLoad(vllm_server.url, vllm_server.model, duration_s=180, **LIGHT), Watcher(exporter, prom) as watch:
        prom.wait_for_value(GENERATION_RATE, lambda v: v > 0, timeout=40)
        port = exporter.port
        restarted = time.time()
        exporter.restart(down_seconds=3)
        assert exporter.port == port
        # Prometheus scrapes the new process and the rates carry on.
        prom.wait_for_value("up", lambda v: v == 1, timeout=20)
        wait_until(lambda: len(watch.verdicts(since=restarted)) >= 12, timeout=60, what="12 verdicts after the restart")
        prom.wait_for_value(GENERATION_RATE, lambda v: v > 0, timeout=20)
        rc, cli, _ = _diagnose_prometheus(run_cli, prom, exporter)
    ended = time.time()

    # the gap was real: Prometheus saw the target down
    assert prom.query_values("min_over_time(up[5m])") == [0.0]
    # the exporter passes the engine's counters through: its restart is not a counter reset
    assert prom.query_values("resets(kvdoctor_generation_tokens_total[5m])") == [0.0]
    _assert_no_negative_rates(prom, began, ended)
    assert not watch.negative_features(), watch.negative_features()[:5]
    after = watch.verdicts(since=restarted)
    assert set(after) == {"healthy"}, after
    assert not SLOW_CAUSE_ALERTS & set(watch.alerts_seen), watch.alerts_seen
    assert (rc, cli["verdict"]) == (0, "healthy"), cli["headline"]


def test_engine_restart_mid_run_gives_no_negative_rate_or_false_verdict(stack, vllm_server, run_cli):
    """Last: restarts the shared vLLM (on the same port), so its counters go back to zero."""
    exporter, prom = stack
    began = time.time()
    with Watcher(exporter, prom) as watch:
        with BackgroundLoad(vllm_server.url, vllm_server.model, duration_s=120, **LIGHT):
            prom.wait_for_value(GENERATION_RATE, lambda v: v > 0, timeout=40)
            wait_until(lambda: "healthy" in watch.verdicts(), timeout=30, what="healthy before the restart")
        down = time.time()
        restart_seconds = restart_engine(vllm_server)
        back = time.time()
        with BackgroundLoad(vllm_server.url, vllm_server.model, duration_s=120, **LIGHT) as load:
            # the reset reached Prometheus, and tokens flow again
            prom.wait_for_value("resets(kvdoctor_generation_tokens_total[10m])", lambda v: v >= 1, timeout=30)
            wait_until(
                lambda: watch.verdicts(since=back + 10)[-3:] == ["healthy"] * 3,
                timeout=60,
                what="healthy again after the restart",
            )
            rc, cli, _ = _diagnose_prometheus(run_cli, prom, exporter)
    ended = time.time()
    print(f"\nvLLM restart took {restart_seconds:.0f} s")

    assert not load.result.errors, load.result.errors[:3]
    # the exporter was asked all along, while the engine was down too
    assert sum(1 for o in watch.observations if down <= o.at <= back and o.verdict) >= restart_seconds / 3
    _assert_no_negative_rates(prom, began, ended)
    assert not watch.negative_features(), watch.negative_features()[:5]
    # healthy under load, idle while the engine was down or had just come back: never a slow cause
    assert set(watch.verdicts()) <= OK_VERDICTS, watch.verdicts()
    assert not SLOW_CAUSE_ALERTS & set(watch.alerts_seen), watch.alerts_seen
    assert (rc, cli["verdict"]) == (0, "healthy"), cli["headline"]
