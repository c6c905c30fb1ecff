"""Agreement, the replay way: every scenario written as a trace and replayed through
`kvdoctor diagnose --replay` gives its expected verdict, with the very numbers the Python
evaluator computes on the scenario's window; real vLLM recordings replay through the vLLM adapter;
and a real Prometheus holding the same samples (backfilled with promtool) gives the same answer."""

from __future__ import annotations

import contextlib
import io
import json
import math
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from kvdoctor.cli import main as kvdoctor_main
from kvdoctor.exporter.replay import AdapterNormaliser
from kvdoctor.rules.diagnosis import diagnose
from kvdoctor.rules.thresholds import Thresholds, sized_for_interval
from kvdoctor.rules.verdicts import VERDICTS
from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.trace import format_raw_captures, format_window
from kvdoctor.signals.window import Snapshot, Window
from kvdoctor.sources.prometheus import PrometheusSource
from kvdoctor.sources.traces import load_trace, write_window
from tests.support import tools
from tests.support.scenarios import SCENARIOS, Scenario

ROOT = Path(__file__).resolve().parents[2]
FILL = sorted((ROOT / "tests/fixtures/vllm-0.32-cpu/fill-sequence").glob("*.txt"))
RECORDED = ROOT / "tests/fixtures/traces"
T0 = 1_700_000_000  # whole seconds: timestamps stay exact through the trace's milliseconds
NAMES = [s.name for s in SCENARIOS]


def shifted(window: Window, start: float) -> Window:
    return Window(window.timestamps - window.timestamps[0] + start, window.series)


def scenario_trace_window(scenario: Scenario, start: float = T0, pod: str | None = None) -> Window:
    """The scenario's last two windows and a half (a trace longer than the window it is judged
    on, so replay has to cut the window out), shifted to ``start``, optionally relabelled."""
    full = scenario.full_window()
    keep = 2.5 * scenario.window_seconds
    cut = shifted(full.slice(full.end - keep, full.end), start)
    return relabelled(cut, pod=pod) if pod is not None else cut


def expected_exit(verdict: str) -> int:
    """``kvdoctor diagnose``'s exit status for a verdict: 0 nothing slow, 2 a window too short to
    judge (``unknown``), 1 a slow verdict."""
    return {"idle": 0, "healthy": 0, "unknown": 2}.get(verdict, 1)


def replay_json(*args) -> tuple[int, dict]:
    """``kvdoctor diagnose --json ...`` in this process: (exit status, the JSON object)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = kvdoctor_main(["diagnose", "--json", *map(str, args)])
    assert rc in (0, 1, 2), err.getvalue()
    if rc == 2 and not out.getvalue().strip():  # a window it cannot judge: a one-line reason, maybe no JSON
        return rc, {"verdict": "unknown", "headline": err.getvalue()}
    return rc, json.loads(out.getvalue())


def assert_same_features(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for name, value in want.items():
        if value is None:
            assert got[name] is None, name
        else:
            assert got[name] == pytest.approx(value, rel=1e-9, abs=1e-12), name


def fill_captures(start: float, files=FILL) -> list[tuple[float, str]]:
    return [(start + i, path.read_text()) for i, path in enumerate(files)]


# ------------------------------------------------------------------------------ the scenario suite


def test_the_suite_is_big_enough_to_mean_something():
    assert len(SCENARIOS) >= 20
    assert {s.expected for s in SCENARIOS} >= set(VERDICTS) - {"request_queueing", "unknown"}


@pytest.mark.parametrize("name", NAMES)
def test_replay_gives_the_expected_verdict_and_the_evaluators_numbers(tmp_path, name):
    scenario = next(s for s in SCENARIOS if s.name == name)
    path = tmp_path / f"{name}.om"
    write_window(scenario_trace_window(scenario), path)
    rc, payload = replay_json("--replay", path, "--window", f"{scenario.window_seconds:g}")
    # a window too short to judge is refused: exit 2, and with --json the error object
    verdict = payload.get("verdict", "unknown" if rc == 2 and "error" in payload else None)
    assert verdict == scenario.expected, f"{name}: {scenario.why}\n{payload.get('headline', payload)}"
    assert rc == expected_exit(scenario.expected)
    if "features" not in payload:
        return  # unknown: a reason, no numbers
    listed = {entry["verdict"] for entry in payload.get("differential", [])}
    assert set(scenario.contributing) <= listed, f"{name}: contributing {listed}, expected {scenario.contributing}"
    # the trace loses nothing: the replayed window gives the evaluator's own numbers
    direct = diagnose(scenario.window()).to_json()
    assert_same_features(payload["features"], direct["features"])
    assert payload["window"]["samples"] == direct["window"]["samples"]


TIMELESS = [s.name for s in SCENARIOS if s.timeless]


@pytest.mark.parametrize("interval", [15, 30, 60])
@pytest.mark.parametrize("name", TIMELESS[::3])
def test_replay_of_sparse_samples_reads_the_window_the_rules_read(tmp_path, name, interval):
    """A trace scraped every 15 s, 30 s or 1 m replays on the window the rules for that interval read
    (12 intervals, its state the last 4) and gives the scenario's verdict, as promtool does."""
    sized = sized_for_interval(Thresholds(), interval)
    scenario = next(s for s in SCENARIOS if s.name == name).at_interval(interval)
    assert scenario.window_seconds == sized.window_seconds
    path = tmp_path / f"{name}-{interval}s.om"
    write_window(scenario_trace_window(scenario), path)
    rc, payload = replay_json("--replay", path)
    assert payload["verdict"] == scenario.expected, f"{name} at {interval} s: {payload['headline']}"
    assert payload["window"]["seconds"] == sized.window_seconds
    assert rc == expected_exit(scenario.expected)


@pytest.mark.slow
@pytest.mark.timeout(900)  # ~45 interpreter start-ups
def test_every_scenario_through_the_real_entry_point(tmp_path, run_cli):
    """The same, as `python -m kvdoctor diagnose --replay FILE --json` subprocesses (a few at once)."""
    paths = {}
    for scenario in SCENARIOS:
        paths[scenario.name] = tmp_path / f"{scenario.name}.om"
        write_window(scenario_trace_window(scenario), paths[scenario.name])

    def replay(scenario: Scenario):
        return scenario, run_cli(
            "diagnose",
            "--replay",
            paths[scenario.name],
            "--json",
            "--window",
            f"{scenario.window_seconds:g}",
            timeout=180,
        )

    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(replay, SCENARIOS))
    wrong = []
    for scenario, result in results:
        if result.rc in (0, 1) or (result.rc == 2 and result.stdout.strip().startswith("{")):
            payload = json.loads(result.stdout)
            verdict = payload.get("verdict", "unknown" if result.rc == 2 and "error" in payload else "no verdict")
        else:
            verdict = "unknown" if result.rc == 2 else f"exit {result.rc}: {result.stderr}"
        if verdict != scenario.expected or result.rc != expected_exit(scenario.expected):
            wrong.append(f"{scenario.name}: expected {scenario.expected}, got {verdict} (exit {result.rc})")
    assert not wrong, "\n".join(wrong)


# ------------------------------------------------------------------------- real vLLM recordings


def test_a_real_vllm_fill_sequence_replays_as_kv_capacity_pressure(tmp_path):
    """16 scrapes of a real vLLM 0.32 (CPU) while 16 requests fill an 8 MiB KV cache: usage at 0.97
    within 3 s, the queue grows to 13, no preemption in these 16 s. The tree's step 2 says
    kv_capacity_pressure (pool at the ceiling, queue backed up, no preemption yet)."""
    path = tmp_path / "fill.om"
    path.write_text(format_raw_captures(fill_captures(T0)))
    rc, payload = replay_json("--replay", path)
    assert (rc, payload["verdict"]) == (1, "kv_capacity_pressure"), payload["headline"]
    features = payload["features"]
    assert features["kv_usage"] == pytest.approx(0.9677, abs=1e-3)
    assert features["requests_waiting"] >= 1 and features["preemptions_per_minute"] == 0
    assert features["generation_tokens_per_second"] > 0
    assert "kvdoctor_gpu_dram_bandwidth_utilization_ratio" in payload["missing"]  # a CPU build
    # the replayed raw trace and the same samples written canonically agree exactly
    canonical = tmp_path / "fill-canonical.om"
    write_window(load_trace(path, AdapterNormaliser()).window, canonical)
    assert replay_json("--replay", canonical)[1] == payload


def test_a_vllm_restart_inside_the_window_is_a_counter_reset_not_a_collapse(tmp_path):
    """Real vLLM scrapes, the engine restarted at t=16..19: its counters start again from their first
    values. Over the window t=10..22 the generation counter ends *below* where it started; a naive
    last-minus-first says no tokens (idle). Reset handling gives the real rate, and the verdict stays
    kv_capacity_pressure (the pool was full before the restart and again after it)."""
    captures = fill_captures(T0) + fill_captures(T0 + 19, FILL[:4])
    path = tmp_path / "restart.om"
    path.write_text(format_raw_captures(captures))
    window = load_trace(path, AdapterNormaliser()).window.slice(T0 + 10, T0 + 22)
    (gen,) = window.select(S.GENERATION_TOKENS).values()
    assert gen[-1] < gen[0]  # the naive difference is negative
    increase = float(np.sum(np.where(np.diff(gen) >= 0, np.diff(gen), gen[1:])))  # a drop restarts from 0
    expected_rate = increase / (window.end - window.start)

    rc, payload = replay_json("--replay", path, "--at", T0 + 22, "--window", 12)
    assert (rc, payload["verdict"]) == (1, "kv_capacity_pressure"), payload["headline"]
    assert payload["features"]["generation_tokens_per_second"] == pytest.approx(expected_rate, rel=0.25)
    assert payload["features"]["preemptions_per_minute"] == 0


def test_the_recorded_simulator_trace_replays(tmp_path):
    """A trace `kvdoctor record` wrote from an exporter scraping the simulated engine in its
    kv_thrashing scenario (tests/fixtures/traces/README.md)."""
    path = RECORDED / "simulator-kv-thrashing.om"
    trace = load_trace(path, AdapterNormaliser())
    assert trace.canonical_families and not trace.raw_families
    rc, payload = replay_json("--replay", path)
    assert (rc, payload["verdict"]) == (1, "kv_thrashing"), payload["headline"]


# --------------------------------------------------------------------- a real Prometheus, backfilled


@pytest.fixture
def backfilled_prometheus(request, monkeypatch, tmp_path):
    """Factory: backfill a trace with `promtool tsdb create-blocks-from openmetrics` and start a real
    prometheus (the harness's ``prometheus_server``) on those blocks. The harness picks the TSDB
    folder when it starts the server, so the blocks are copied in by a wrapper run as its binary."""
    promtool = tools.require("promtool")
    real = tools.require("prometheus")

    def start(trace: Path):
        blocks = tmp_path / "blocks"
        made = subprocess.run(
            [promtool, "tsdb", "create-blocks-from", "openmetrics", str(trace), str(blocks)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert made.returncode == 0, made.stderr
        wrapper = tmp_path / "prometheus-with-backfill"
        wrapper.write_text(
            "#!/bin/sh\n"
            'for arg in "$@"; do case "$arg" in --storage.tsdb.path=*)\n'
            '  dir="${arg#*=}"; mkdir -p "$dir" && cp -R ' + f'"{blocks}"' + '/. "$dir"/ ;; esac; done\n'
            f'exec "{real}" "$@"\n'
        )
        wrapper.chmod(0o755)
        monkeypatch.setitem(tools.TOOLS, "prometheus", (lambda: str(wrapper), *tools.TOOLS["prometheus"][1:]))
        factory = request.getfixturevalue("prometheus_server")
        return factory(config={"global": {"scrape_interval": "15s", "evaluation_interval": "15s"}})

    return start


@pytest.mark.slow
@pytest.mark.timeout(600)
@tools.requires_promtool
@tools.requires_prometheus
def test_prometheus_holding_the_same_samples_gives_the_same_diagnosis(tmp_path, backfilled_prometheus):
    """Every scenario (one pod each) and the real vLLM recording, backfilled into one Prometheus:
    `diagnose --prometheus --selector {pod=...}` equals `diagnose --replay` of the same samples."""
    keep = 2.5 * max(s.window_seconds for s in SCENARIOS)
    start = math.floor(time.time() - keep - 30)  # ends 30 s ago: the newest sample is found by default
    windows: list[Window] = []
    replays: dict[str, dict] = {}
    seconds: dict[str, float] = {}
    for scenario in SCENARIOS:
        if scenario.expected == "unknown":  # too few snapshots: both refuse it (exit 2), no features to compare
            continue
        window = scenario_trace_window(scenario, start, pod=scenario.name)
        path = tmp_path / f"{scenario.name}.om"
        write_window(window, path)
        replays[scenario.name] = replay_json("--replay", path, "--window", f"{scenario.window_seconds:g}")[1]
        seconds[scenario.name] = scenario.window_seconds
        windows.append(window)
    raw = tmp_path / "fill-raw.om"
    raw.write_text(format_raw_captures(fill_captures(start + keep - len(FILL) + 1)))
    fill = relabelled(load_trace(raw, AdapterNormaliser()).window, pod="vllm-fill")
    write_window(fill, tmp_path / "fill.om")
    replays["vllm-fill"] = replay_json("--replay", tmp_path / "fill.om")[1]
    seconds["vllm-fill"] = 60.0
    windows.append(fill)

    combined = tmp_path / "all.om"
    combined.write_text(format_window(merged(windows)))
    prom = backfilled_prometheus(combined)

    mismatches = []
    for pod, want in replays.items():
        _, got = replay_json(
            "--prometheus", prom.url, "--selector", f'{{pod="{pod}"}}', "--window", f"{seconds[pod]:g}"
        )
        if got["verdict"] != want["verdict"]:
            mismatches.append(f"{pod}: replay {want['verdict']}, prometheus {got['verdict']}")
            continue
        try:
            assert_same_features(got["features"], want["features"])
        except AssertionError as exc:
            mismatches.append(f"{pod}: features differ: {exc}")
    assert not mismatches, "\n".join(mismatches)
    assert replays["vllm-fill"]["verdict"] == "kv_capacity_pressure"

    # --at as RFC 3339, and a range query at the scenarios' own step, give the same numbers
    name = "thrashing_kv_oscillates_under_preemption"
    end = start + keep
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(end))
    _, got = replay_json("--prometheus", prom.url, "--selector", f'{{pod="{name}"}}', "--at", at)
    assert_same_features(got["features"], replays[name]["features"])
    with PrometheusSource(prom.url, f'{{pod="{name}"}}') as source:
        stepped = diagnose(source.window(60, at=end, step=1.0)).to_json()
    assert stepped["verdict"] == replays[name]["verdict"]

    # a selector Prometheus itself rejects: exit 2, one line
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = kvdoctor_main(["diagnose", "--prometheus", prom.url, "--selector", '{pod=~"("}'])
    assert rc == 2 and len(err.getvalue().splitlines()) == 1 and "rejected the query" in err.getvalue()


def relabelled(window: Window, **labels: str) -> Window:
    return Window(
        window.timestamps,
        {(name, tuple(sorted({**dict(lb), **labels}.items()))): values for (name, lb), values in window.series.items()},
    )


def merged(windows: list[Window]) -> Window:
    """One window holding the series of all (each series in one of them), aligned by timestamp."""
    by_ts: dict[float, dict] = {}
    for window in windows:
        for snap in window.snapshots():
            by_ts.setdefault(snap.ts, {}).update(snap.samples)
    return Window.from_snapshots(Snapshot(ts, samples) for ts, samples in by_ts.items())
