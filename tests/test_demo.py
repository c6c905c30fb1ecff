"""``kvdoctor demo`` in-process: its status line, its argument errors, and a short run.

The real-process acceptance (default port, promtool, Ctrl-C) is tests/e2e/test_demo_acceptance.py.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import threading

import httpx
import pytest

from kvdoctor import cli
from kvdoctor.commands.demo import status_line
from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.window import Snapshot, Window, labels_of

ENGINE = labels_of(engine="vllm", model_name="m", dp_rank="0")
GPU = labels_of(gpu="0", uuid="GPU-x", model="NVIDIA H100 80GB HBM3", method="gpm")
BOUNDS = ("0.01", "0.025", "0.05", "+Inf")


def window_of(seconds: int = 10) -> Window:
    """10 s at 1 Hz: 100 ITL observations per second, 60 in (0, 10 ms], 40 in (10, 25 ms];
    2 preemptions per second; KV at 50%, DRAM bandwidth 85%, SM 30%."""
    snaps = []
    for i in range(seconds + 1):
        snap = Snapshot(1000.0 + i)
        snap.add(S.KV_CACHE_USAGE, 0.5, ENGINE)
        snap.add(S.PREEMPTIONS, 7 + 2 * i, ENGINE)
        snap.add(S.GPU_DRAM_BANDWIDTH_UTILIZATION, 0.85, GPU)
        snap.add(S.GPU_SM_ACTIVE, 0.30, GPU)
        cumulative = {"0.01": 60 * i, "0.025": 100 * i, "0.05": 100 * i, "+Inf": 100 * i}
        for le in BOUNDS:
            snap.add(S.INTER_TOKEN_LATENCY + "_bucket", 5 + cumulative[le], labels_of(dict(ENGINE), le=le))
        snaps.append(snap)
    return Window.from_snapshots(snaps)


def test_status_line_reads_the_window():
    line = status_line(window_of(), {"verdict": "memory_bandwidth_bound", "confidence": 0.81}, now=0)
    # p50: rank 500 of 1000 in the first bucket -> 10 ms x 500/600; p95: 950 -> 10 + 15 x (950-600)/400
    assert "KV  50%" in line
    assert "ITL p50 8.3 ms p95 23.1 ms" in line
    assert "DRAM BW  85%" in line and "SM  30%" in line
    assert "preemptions 2.0/s" in line
    assert line.endswith("verdict memory_bandwidth_bound (0.81)")


def test_status_line_without_data_says_so():
    line = status_line(Window.empty(), None, now=0)
    assert "KV   --" in line and "ITL p50 -- ms p95 -- ms" in line and line.endswith("verdict --")


def run_demo(capsys, *args):
    try:
        rc = cli.main(["demo", *map(str, args)])
    except SystemExit as exc:
        rc = exc.code
    return (rc, *capsys.readouterr())


def test_unknown_scenario_is_a_usage_error(capsys):
    rc, out, err = run_demo(capsys, "--scenario", "nope")
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and "unknown --scenario 'nope'" in err


@pytest.mark.parametrize("flag, value", [("--interval", "0"), ("--slo-ms", "-3"), ("--port", "70000")])
def test_bad_numbers_are_usage_errors(capsys, flag, value):
    rc, out, err = run_demo(capsys, flag, value)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and flag in err


def test_port_in_use_is_one_line_and_exit_2(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        rc, out, err = run_demo(capsys, "--port", port, "--no-dashboard", "--status-every", "0")
    assert (rc, out) == (2, "")
    assert err.strip().splitlines() == [
        f"kvdoctor demo: error: exporter: port {port} on 127.0.0.1 is already in use (choose another with --port)"
    ]


def test_dashboard_port_in_use_is_one_line_and_exit_2(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        rc, out, err = run_demo(capsys, "--port", 0, "--dashboard-port", port, "--status-every", "0")
    assert rc == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert str(port) in line and "--dashboard-port" in line


def test_bad_dashboard_users_are_one_line_and_exit_2(capsys, monkeypatch):
    monkeypatch.setenv("KVDOCTOR_DASHBOARD_USERS", "no-colon-here")
    rc, out, err = run_demo(capsys, "--port", 0, "--dashboard-port", 0, "--status-every", "0")
    assert rc == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith("kvdoctor demo: error: dashboard:") and "KVDOCTOR_DASHBOARD_USERS" in line


@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(), reason="needs the main thread for signals"
)
def test_a_short_run_serves_and_stops_on_sigint(capsys):
    """The demo in-process: URLs first, a status line with a verdict, /metrics with the canonical
    signals, a scenario switch over HTTP, then SIGINT ends it with 0."""
    seen: dict = {}

    def drive():
        try:
            out = ""
            for _ in range(300):  # up to 30 s for the URLs (imports, the simulation's warm-up)
                out = capsys.readouterr().out
                seen["out"] = seen.get("out", "") + out
                if "Ctrl-C to stop." in seen["out"]:
                    break
                threading.Event().wait(0.1)
            metrics_url = re.search(r"metrics\s+(\S+)", seen["out"]).group(1)
            engine_url = re.search(r"engine\s+(\S+)/metrics", seen["out"]).group(1)
            for _ in range(100):
                body = httpx.get(metrics_url, timeout=5).text
                if S.GPU_SM_ACTIVE in body and S.DIAGNOSIS_VERDICT in body:
                    break
                threading.Event().wait(0.2)
            seen["metrics"] = body
            seen["switch"] = httpx.post(engine_url + "/scenario", json={"scenario": "tier_miss"}, timeout=5).json()
            for _ in range(50):  # a status line every 0.2 s
                threading.Event().wait(0.1)
                seen["out"] += capsys.readouterr().out
                if seen["out"].count("verdict kv_") or seen["out"].count("verdict healthy"):
                    break
        finally:
            os.kill(os.getpid(), signal.SIGINT)

    driver = threading.Thread(target=drive)
    driver.start()
    rc = cli.main(["demo", "--port", "0", "--no-dashboard", "--status-every", "0.2", "--interval", "0.2"])
    driver.join(60)
    seen["out"] += capsys.readouterr().out
    assert rc == 0
    lines = seen["out"].splitlines()
    assert lines[0].startswith("kvdoctor demo: simulated vLLM engine")
    assert [line.split()[0] for line in lines[1:5]] == ["metrics", "diagnosis", "engine", "Ctrl-C"]
    assert re.search(r"verdict (healthy|kv_tier_miss) \(", seen["out"])
    assert lines[-1] == "kvdoctor demo: stopping"
    assert seen["switch"]["active"] == "tier_miss"
    for name in (
        S.KV_CACHE_USAGE,
        S.INTER_TOKEN_LATENCY + "_bucket",
        S.GPU_DRAM_BANDWIDTH_UTILIZATION,
        S.DECODE_STEP_FLOOR,
        S.DIAGNOSIS_VERDICT,
    ):
        assert f"\n{name}" in seen["metrics"], name
