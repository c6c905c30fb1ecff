"""A queue behind each demo scenario (``kvdoctor demo --queue``): the physics, the switch, and what
the exporter diagnoses.

The physics tests drive a ``Simulation`` on an injected clock; the diagnosis tests run the demo's
whole pipeline on simulated time (tests/support/sim_pipeline.py): simulated engine over loopback
HTTP -> the exporter's collectors and vLLM adapter -> the rules' diagnosis with the demo's SLO.

Issue 24's "the demo shows it": with a queue behind a slow engine the verdict is still the cause of
the slow decode, and the queue is listed among the contributing causes as its consequence
(``differential``: an entry ``request_queueing`` with ``consequence`` true). Those diagnosis tests
fail on the tree before the reorder (it answered ``request_queueing`` and had no differential).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import signal
import statistics
import threading

import httpx
import pytest

from kvdoctor import cli
from kvdoctor.signals import vocabulary as S
from kvdoctor.simulator import scenarios
from kvdoctor.simulator.engine_server import EngineServer
from kvdoctor.simulator.physics import Simulation
from kvdoctor.simulator.scenarios import (
    GROWING_CLIENTS_PER_SECOND,
    QUEUE_CHOICES,
    SCENARIOS,
    STEADY_OPEN_LOOP_WAITING,
    with_queue,
)
from tests.support.sim_pipeline import SimulatedDemo

T0 = 1_800_000_000.0
SLOW = [name for name, s in SCENARIOS.items() if s.expected_verdict != "healthy"]
CLOSED_LOOP_SLOW = [name for name in SLOW if SCENARIOS[name].arrival_rate <= 0]


class Clock:
    def __init__(self, t: float = T0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def run(scenario: str, queue: str, seconds: int = 30, seed: int = 0):
    """(sim, readings): (state, stats, gpu) after each simulated second."""
    clock = Clock()
    sim = Simulation(scenario, seed=seed, clock=clock, warmup=12.0, queue=queue)
    readings = [(sim.state(), sim.snapshot()[1], sim.gpu_reading())]
    for _ in range(seconds):
        clock.t += 1.0
        sim.sync()
        readings.append((sim.state(), sim.snapshot()[1], sim.gpu_reading()))
    return sim, readings


def mean_itl(first, last) -> float:
    h0 = first.histograms["vllm:inter_token_latency_seconds"]
    h1 = last.histograms["vllm:inter_token_latency_seconds"]
    return (h1.sum - h0.sum) / (sum(h1.counts) - sum(h0.counts))


def mean_ttft(first, last) -> float:
    h0 = first.histograms["vllm:time_to_first_token_seconds"]
    h1 = last.histograms["vllm:time_to_first_token_seconds"]
    return (h1.sum - h0.sum) / max(1, sum(h1.counts) - sum(h0.counts))


def gpu_busy(sim: Simulation, first, last) -> tuple[float, float]:
    elapsed = last.time - first.time
    dram = (last.dram_bytes - first.dram_bytes) / (elapsed * sim.config.gpu.peak_bandwidth)
    return dram, (last.sm_active_seconds - first.sm_active_seconds) / elapsed


# ------------------------------------------------------------------------------------- the workload


def test_no_queue_is_the_workload_itself():
    for scenario in SCENARIOS.values():
        assert with_queue(scenario, "none") is scenario


def test_an_unknown_queue_is_refused():
    with pytest.raises(ValueError, match=r"unknown queue 'long'.*none, steady, growing"):
        Simulation("healthy", queue="long", warmup=0)
    with pytest.raises(ValueError, match="unknown queue"):
        with_queue(SCENARIOS["healthy"], "long")


@pytest.mark.parametrize("queue", ["steady", "growing"])
def test_only_healthy_changes_its_expected_verdict_and_only_with_a_growing_queue(queue):
    for name, scenario in SCENARIOS.items():
        queued = with_queue(scenario, queue)
        want = "request_queueing" if (name, queue) == ("healthy", "growing") else scenario.expected_verdict
        assert queued.expected_verdict == want, name
        assert queued.name == name and queued.queue == queue


# ------------------------------------------------------------------------------------- the physics


@pytest.mark.parametrize("name", ["healthy", *CLOSED_LOOP_SLOW])
def test_a_steady_queue_waits_beside_the_same_batch_and_delays_the_first_token(name):
    """The sequence limit holds the batch at the workload's size: the per-token symptoms are the
    workload's own; the extra clients wait (a constant number), and their wait shows in TTFT."""
    sim0, alone = run(name, "none")
    sim, queued = run(name, "steady")
    base = SCENARIOS[name].clients
    extra = sim.active_scenario.clients - base
    assert extra == max(1, math.ceil(base * scenarios.STEADY_EXTRA_SHARE))
    assert max(r[0].running for r in queued) <= base
    waiting = [r[0].waiting for r in queued]
    if name != "kv_thrashing":  # there the pool, not the limit, holds requests back: its queue is its own
        assert statistics.median(waiting) == extra and max(waiting) <= extra + 1
        assert statistics.median(r[0].running for r in queued) == statistics.median(r[0].running for r in alone)
    assert mean_itl(queued[0][1], queued[-1][1]) == pytest.approx(mean_itl(alone[0][1], alone[-1][1]), rel=0.1)
    dram, sm = gpu_busy(sim, queued[0][2], queued[-1][2])
    dram0, sm0 = gpu_busy(sim0, alone[0][2], alone[-1][2])
    assert dram == pytest.approx(dram0, abs=0.05) and sm == pytest.approx(sm0, abs=0.05)
    assert mean_ttft(queued[0][1], queued[-1][1]) > mean_ttft(alone[0][1], alone[-1][1])


@pytest.mark.parametrize("name", ["healthy", "bandwidth_bound", "host_overhead", "compute_bound", "tier_miss"])
def test_a_growing_queue_grows_by_the_newcomers_and_ttft_rises_with_it(name):
    _sim, readings = run(name, "growing", seconds=40)
    waiting = [r[0].waiting for r in readings]
    growth = (waiting[-1] - waiting[10]) / 30
    assert growth == pytest.approx(GROWING_CLIENTS_PER_SECOND, abs=0.25), waiting
    early = mean_ttft(readings[0][1], readings[20][1])
    late = mean_ttft(readings[20][1], readings[-1][1])
    assert late > early, (early, late)


def test_the_queue_limit_turns_newcomers_away(monkeypatch):
    monkeypatch.setitem(SCENARIOS, "host_overhead", dataclasses.replace(SCENARIOS["host_overhead"], max_waiting=10))
    _sim, readings = run("host_overhead", "growing", seconds=30)
    assert max(r[0].waiting for r in readings) <= 10
    assert readings[-1][1].labelled["vllm:admission_rejections"]["max_num_queued_reqs"] >= 10


def test_a_steady_queue_caps_the_open_loop_workloads_own_queue():
    _sim, readings = run("capacity_pressure", "steady")
    waiting = [r[0].waiting for r in readings[5:]]
    assert max(waiting) <= STEADY_OPEN_LOOP_WAITING and min(waiting) >= STEADY_OPEN_LOOP_WAITING - 5
    assert readings[-1][1].labelled["vllm:admission_rejections"]["max_num_queued_reqs"] > 0
    assert readings[-1][1].counters["vllm:num_preemptions"] == 0  # still capacity pressure, not thrashing


def test_the_queue_stays_across_switches_until_changed():
    clock = Clock()
    sim = Simulation("bandwidth_bound", clock=clock, warmup=5, queue="growing")
    sim.set_scenario("host_overhead")
    assert sim.queue == "growing" and sim.active_scenario.clients_joining == GROWING_CLIENTS_PER_SECOND
    sim.set_scenario("host_overhead", "none")
    assert sim.queue == "none" and sim.active_scenario == SCENARIOS["host_overhead"]
    sim.set_scenario("cycle", "steady")
    clock.t += scenarios.CYCLE_PERIOD_SECONDS + 1
    sim.sync()
    assert sim.active_scenario.name == scenarios.CYCLE_ORDER[1] and sim.active_scenario.queue == "steady"
    assert sim.state().queue == "steady"


def test_the_queue_switches_over_http():
    with EngineServer(Simulation("healthy", seed=0, warmup=5)) as server, httpx.Client(base_url=server.url) as client:
        state = client.get("/scenario").json()
        assert state["queue"] == "none" and state["queue_choices"] == list(QUEUE_CHOICES)
        state = client.post("/scenario", json={"scenario": "bandwidth_bound", "queue": "growing"}).json()
        assert (state["active"], state["queue"]) == ("bandwidth_bound", "growing")
        assert "growing queue" in state["summary"] and state["expected_verdict"] == "memory_bandwidth_bound"
        state = client.post("/scenario", json={"scenario": "healthy"}).json()  # the queue stays
        assert (state["active"], state["queue"], state["expected_verdict"]) == (
            "healthy",
            "growing",
            "request_queueing",
        )
        state = client.post("/scenario", params={"queue": "steady"}).json()  # the queue alone
        assert (state["active"], state["queue"], state["expected_verdict"]) == ("healthy", "steady", "healthy")
        bad = client.post("/scenario", json={"scenario": "healthy", "queue": "long"})
        assert bad.status_code == 400 and bad.json()["queue_choices"] == list(QUEUE_CHOICES)
        assert server.sim.queue == "steady"


@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(), reason="needs the main thread for signals"
)
def test_the_demo_runs_with_a_queue_behind_its_scenario(capsys):
    """``kvdoctor demo --scenario host_overhead --queue growing`` in-process: the engine says which
    queue it runs, and the exporter's page shows requests waiting behind the running ones."""
    seen: dict = {"out": ""}

    def drive():
        try:
            for _ in range(300):  # up to 30 s for the URLs (imports, the simulation's warm-up)
                seen["out"] += capsys.readouterr().out
                if "Ctrl-C to stop." in seen["out"]:
                    break
                threading.Event().wait(0.1)
            metrics_url = re.search(r"metrics\s+(\S+)", seen["out"]).group(1)
            engine_url = re.search(r"engine\s+(\S+)/metrics", seen["out"]).group(1)
            seen["scenario"] = httpx.get(engine_url + "/scenario", timeout=5).json()
            pattern = re.compile(rf"^{S.REQUESTS_WAITING}\{{[^}}]*\}} (\S+)$", re.M)
            for _ in range(100):
                match = pattern.search(httpx.get(metrics_url, timeout=5).text)
                if match and float(match.group(1)) > 0:
                    seen["waiting"] = float(match.group(1))
                    break
                threading.Event().wait(0.2)
        finally:
            os.kill(os.getpid(), signal.SIGINT)

    driver = threading.Thread(target=drive)
    driver.start()
    argv = ["demo", "--port", "0", "--no-dashboard", "--status-every", "0", "--interval", "0.2"]
    rc = cli.main([*argv, "--scenario", "host_overhead", "--queue", "growing"])
    driver.join(60)
    assert rc == 0
    assert (seen["scenario"]["active"], seen["scenario"]["queue"]) == ("host_overhead", "growing")
    assert seen["scenario"]["expected_verdict"] == "host_overhead_bound"
    assert seen.get("waiting", 0) >= 2  # the 2 held back at once, more as newcomers join


def test_the_demo_refuses_an_unknown_queue(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["demo", "--queue", "long"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--queue 'long'" in err and "steady" in err


# ------------------------------------------------------------------------------------- the diagnosis


def contributing(diagnosis: dict) -> dict[str, dict]:
    """The differential by verdict."""
    return {entry["verdict"]: entry for entry in diagnosis.get("differential") or []}


def assert_queue_is_a_consequence(diagnosis: dict) -> None:
    queue = contributing(diagnosis).get("request_queueing")
    assert queue is not None, f"no queue in the differential: {diagnosis.get('differential')}"
    assert queue["consequence"] is True and 0 < queue["confidence"] <= 1
    assert queue["summary"] and isinstance(queue["evidence"], list)


@pytest.mark.parametrize("queue", ["steady", "growing"])
@pytest.mark.parametrize("name", SLOW)
def test_the_demo_names_the_cause_and_the_queue_behind_it(name, queue):
    """A slow scenario with a queue behind it: the verdict is the scenario's cause (not
    ``request_queueing``) for the last 15 s of a 45 s run, and the queue is a consequence."""
    with SimulatedDemo(name, queue=queue) as demo:
        diagnoses = demo.run(45)
    expected = SCENARIOS[name].expected_verdict
    last = diagnoses[-1]
    assert [d["verdict"] for d in diagnoses[-15:]] == [expected] * 15, last["headline"]
    assert last["features"]["requests_waiting"] >= 1
    assert_queue_is_a_consequence(last)
    assert expected not in contributing(last)  # the verdict is not its own contributing cause


def test_a_steady_queue_on_a_fast_engine_is_healthy():
    """Issue 24, case 2 on the demo: two requests wait at every scrape, TTFT p95 under a second,
    decode well within the SLO: nobody is delayed, so the verdict is healthy."""
    with SimulatedDemo("healthy", queue="steady") as demo:
        diagnoses = demo.run(45)
    last = diagnoses[-1]
    assert last["features"]["requests_waiting"] >= 1 and last["features"]["ttft_p95_seconds"] < 2.0
    assert [d["verdict"] for d in diagnoses[-15:]] == ["healthy"] * 15, last["headline"]


def test_a_growing_queue_on_a_fast_engine_is_request_queueing():
    with SimulatedDemo("healthy", queue="growing") as demo:
        diagnoses = demo.run(45)
    last = diagnoses[-1]
    assert last["features"]["itl_p95_seconds"] < demo.slo_ms / 1e3
    assert [d["verdict"] for d in diagnoses[-15:]] == ["request_queueing"] * 15, last["headline"]


def test_the_exporters_api_lists_the_queue_behind_a_host_bound_engine():
    """The same through ``GET /api/v1/diagnosis``, the JSON on-call and the dashboard read."""
    with SimulatedDemo("host_overhead", queue="growing", serve=True) as demo:
        demo.run(45)
        payload = demo.http_diagnosis()
    assert payload["verdict"] == "host_overhead_bound", payload["headline"]
    assert_queue_is_a_consequence(payload)
    verdicts = [entry["verdict"] for entry in payload["differential"]]
    assert len(verdicts) == len(set(verdicts)) and "host_overhead_bound" not in verdicts
