"""`kvdoctor demo` then `kvdoctor stress` as a new user runs them (#17): the demo's simulated
engine answers completions, its exporter records the signals, and the report shows both curves."""

from __future__ import annotations

import json

import pytest

from kvdoctor.cli import main as kvdoctor_main


@pytest.mark.slow
def test_stress_runs_a_short_plan_against_kvdoctor_demo(demo, tmp_path, capsys):
    running = demo("healthy")  # the `kvdoctor demo` process, on free ports
    out = tmp_path / "report"
    rc = kvdoctor_main(
        ["stress", "--engine-url", running.engine_url, "--exporter", running.exporter_url,
         "--prompt-tokens", "1500", "--max-tokens", "200", "--start-concurrency", "8", "--max-concurrency", "32",
         "--step-seconds", "5", "-o", str(out), "--json"]
    )  # fmt: skip
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    summary = json.loads(captured.out)  # --json: the summary on stdout, as summary.json holds it
    assert summary == json.loads((out / "summary.json").read_text())
    assert summary["signals"]["source"].startswith("exporter") and summary["signals"]["snapshots"] >= 10
    steps = summary["steps"]
    assert [s["concurrency"] for s in steps] == [8, 16, 32] and all(s["requests_failed"] == 0 for s in steps)
    # the two curves: more sequences hold more KV, and each token waits longer
    assert steps[-1]["kv_usage_max"] > steps[0]["kv_usage_max"]
    assert steps[-1]["itl_p50_ms"] > steps[0]["itl_p50_ms"]
    assert (out / "kv-latency.png").stat().st_size > 10_000 and (out / "trace.om").stat().st_size > 0
    # the report's diagnosis (and its figure's SLO line) use the SLO the demo's exporter publishes
    assert summary["diagnosis"]["slo_seconds"] == pytest.approx(0.015)
    assert summary["diagnosis"]["slo_source"] == "published by the exporter"
    # the simulated GPU publishes DRAM bandwidth, so a rise with KV is attributed with the counter's number
    if summary["verdict"]["pattern"] == "bandwidth_bound":
        assert "GPU DRAM bandwidth up to" in summary["verdict"]["headline"]
