"""`kvdoctor record --since`: the minutes before the page, written at once from what a real
exporter's ring store (or a real Prometheus) already holds, and replayed by `diagnose --replay`."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import time
from typing import NamedTuple

import numpy as np
import pytest

from kvdoctor.arguments import since
from kvdoctor.cli import main as kvdoctor_main
from kvdoctor.exporter.replay import AdapterNormaliser
from kvdoctor.signals import vocabulary as S
from kvdoctor.sources.traces import load_trace
from tests.support import servers
from tests.support.tools import requires_prometheus, wait_until

CLOSED = servers.refusing_url()


class Result(NamedTuple):
    rc: int
    stdout: str
    stderr: str


def cli(*args: object) -> Result:
    """``kvdoctor ARGS`` in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = kvdoctor_main([str(a) for a in args])
        except SystemExit as exc:  # argparse
            rc = exc.code if isinstance(exc.code, int) else 2
    return Result(rc, out.getvalue(), err.getvalue())


@pytest.fixture(autouse=True)
def no_variables(monkeypatch):
    for name in list(__import__("os").environ):
        if name.startswith("KVDOCTOR_"):
            monkeypatch.delenv(name)


# ------------------------------------------------------------------ --since, as kubectl reads it


@pytest.mark.parametrize(
    "text, seconds",
    [("90s", 90), ("15m", 900), ("1h", 3600), ("1h30m", 5400), ("1.5h", 5400), ("500ms", 0.5), (" 2m ", 120)],
)
def test_since_reads_a_duration_as_kubectl_logs_does(text, seconds):
    assert since(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["15", "15 m", "1d", "m", "-5m", "0s", "15min", "", "1h-30m"])
def test_since_refuses_what_kubectl_refuses(text):
    with pytest.raises(argparse.ArgumentTypeError, match="must be"):
        since(text)


@pytest.mark.parametrize(
    "args, phrase",
    [
        (["--exporter", "{closed}"], "give --since DURATION (what the source already holds) and/or --seconds S"),
        (["--exporter", "{closed}", "--since", "15"], "--since: must be a duration such as 90s, 15m, 1h or 1h30m"),
        (["--exporter", "{closed}", "--since", "8d"], "--since: must be a duration"),
        (["--exporter", "{closed}", "--since", "200h"], "--since must be more than 0 up to a week"),
        (["--prometheus", "{closed}", "--seconds", "5"], "--prometheus needs --since DURATION"),
        (["--prometheus", "{closed}", "--since", "1h", "--seconds", "5"], "--seconds goes with --exporter"),
        (["--exporter", "{closed}", "--since", "1h", "--selector", '{pod="x"}'], "--selector goes with --prometheus"),
        (["--engine-url", "{closed}", "--since", "1h"], "--since goes with --exporter or --prometheus"),
        (["--prometheus", "{closed}", "--since", "1h", "--selector", "vllm-0"], "bad selector 'vllm-0'"),
    ],
)
def test_record_refuses_what_does_not_go_together_in_one_line(args, phrase, tmp_path):
    out = tmp_path / "r.om"
    result = cli("record", *(a.replace("{closed}", CLOSED) for a in args), "-o", out)
    assert result.rc == 2, result
    (line,) = result.stderr.splitlines()
    assert phrase in line, line
    assert not out.exists()


def test_an_unreachable_source_writes_nothing_and_says_which(tmp_path):
    out = tmp_path / "r.om"
    for source in ("--exporter", "--prometheus"):
        result = cli("record", source, CLOSED, "--since", "15m", "-o", out)
        assert result.rc == 3, result
        (line,) = result.stderr.splitlines()
        assert CLOSED.removeprefix("http://") in line
        assert not out.exists()


# ------------------------------------------------------------------ a real exporter's ring store


@pytest.fixture
def exporter_with_history(demo):
    """A real exporter (in this process) scraping the simulated vLLM engine while it thrashes, with
    a few seconds of cycles in its ring store already."""
    live = demo("kv_thrashing", in_process=True, interval=0.25)
    wait_until(lambda: live.exporter.cycles >= 16, timeout=30, interval=0.1, what="16 cycles")
    return live


@pytest.mark.slow
def test_record_since_writes_at_once_what_the_exporter_already_holds(exporter_with_history, tmp_path):
    live = exporter_with_history
    out = tmp_path / "incident.om"
    held = live.exporter.store.window(900)
    started = time.monotonic()
    result = cli("record", "--exporter", live.exporter_url, "--since", "15m", "-o", out, "--json")
    took = time.monotonic() - started
    assert result.rc == 0, result.stderr
    assert took < 5  # at once: not 15 minutes of recording
    summary = json.loads(result.stdout)
    trace = load_trace(out, AdapterNormaliser())
    window = trace.window
    # the store's oldest cycle is in the trace (the window asked for covers all it holds), and every cycle since
    assert window.start == pytest.approx(held.start, abs=1e-3)
    assert len(window) >= len(held)
    assert np.diff(window.timestamps).max() < 0.25 * 3
    assert summary["snapshots"] == len(window) and summary["seconds"] >= 3
    assert "the exporter held" in result.stderr and "of the 900 s asked for" in result.stderr
    assert window.select(S.PREEMPTIONS) and window.select(S.KV_CACHE_USAGE)
    replay = cli("diagnose", "--replay", out, "--json")
    assert replay.rc == 1, replay.stderr
    assert json.loads(replay.stdout)["verdict"] == "kv_thrashing"


@pytest.mark.slow
def test_record_since_takes_the_longest_window_an_exporter_serves(demo, tmp_path):
    live = demo("kv_thrashing", in_process=True, interval=0.25, max_window_seconds=2)
    wait_until(lambda: live.exporter.cycles >= 16, timeout=30, interval=0.1, what="16 cycles")
    out = tmp_path / "incident.om"
    result = cli("record", "--exporter", live.exporter_url, "--since", "1h", "-o", out)
    assert result.rc == 0, result.stderr
    assert "(it serves at most 2 s: its --max-window)" in result.stderr
    window = load_trace(out, AdapterNormaliser()).window
    assert 1 <= window.end - window.start <= 2.5


@pytest.mark.slow
def test_record_since_and_seconds_keep_the_past_and_record_on(exporter_with_history, tmp_path):
    live = exporter_with_history
    out = tmp_path / "incident.om"
    oldest = live.exporter.store.window(900).start
    started = time.time()
    result = cli("record", "--exporter", live.exporter_url, "--since", "15m", "--seconds", "1.5", "-o", out)
    assert result.rc == 0, result.stderr
    window = load_trace(out, AdapterNormaliser()).window
    assert window.start == pytest.approx(oldest, abs=1e-3)
    assert window.end >= started + 1.0
    assert np.diff(window.timestamps).max() < 0.25 * 3  # no gap between the past and what followed


def test_record_since_an_exporter_without_the_window_api_says_its_past_cannot_be_read(fake_server, tmp_path):
    server = fake_server(servers.computed(lambda path: (404, "application/json", b'{"detail":"Not Found"}')))
    result = cli("record", "--exporter", server.url(), "--since", "15m", "-o", tmp_path / "r.om")
    assert result.rc == 3
    (line,) = result.stderr.splitlines()
    assert "has no /api/v1/window, so its past cannot be read; record it forward with --seconds" in line


# ------------------------------------------------------------------ a real Prometheus


@pytest.mark.slow
@pytest.mark.timeout(180)
@requires_prometheus
def test_record_since_from_prometheus_writes_one_pods_series_and_replays(demo, prometheus_server, tmp_path):
    live = demo("kv_thrashing", in_process=True, interval=0.5)
    target = live.exporter_url.removeprefix("http://")
    prom = prometheus_server(targets=[target], scrape_interval="1s")
    prom.wait_for_targets_up()
    prom.wait_for_value(S.PREEMPTIONS, lambda v: v > 0, timeout=30)
    time.sleep(12)  # a dozen scrapes: more than the replay's state window needs
    out = tmp_path / "incident.om"
    selector = f'{{instance="{target}"}}'
    result = cli("record", "--prometheus", prom.url, "--selector", selector, "--since", "1h", "-o", out, "--json")
    assert result.rc == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["mode"] == f"Prometheus {selector}" and summary["snapshots"] >= 10
    window = load_trace(out, AdapterNormaliser()).window
    assert len(window) == summary["snapshots"]
    assert {name for name, _ in window.series} >= {S.PREEMPTIONS, S.KV_CACHE_USAGE, S.GENERATION_TOKENS}
    assert all(name.startswith("kvdoctor_") for name, _ in window.series)
    assert {dict(labels).get("instance") for _, labels in window.series} == {target}
    replay = cli("diagnose", "--replay", out, "--json")
    assert replay.rc == 1, replay.stderr
    assert json.loads(replay.stdout)["verdict"] == "kv_thrashing"
    # a selector matching nothing there: nothing written, one line naming it
    none = cli("record", "--prometheus", prom.url, "--selector", '{pod="nowhere"}', "--since", "15m", "-o", out)
    assert none.rc == 3 and '{pod="nowhere"}' in none.stderr
