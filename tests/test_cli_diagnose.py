"""`kvdoctor diagnose` and `kvdoctor record`: sources, output, exit codes, and every bad input."""

from __future__ import annotations

import contextlib
import io
import json
import os
import pty
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple
from urllib.parse import parse_qs

import httpx
import numpy as np
import pytest

from kvdoctor.cli import main as kvdoctor_main
from kvdoctor.exporter.replay import AdapterNormaliser
from kvdoctor.ledger.model import COMMON_MODELS
from kvdoctor.rules.context import Context, context_to_json
from kvdoctor.rules.promql import record_name, rule_thresholds
from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.trace import format_raw_captures
from kvdoctor.signals.window import Window
from kvdoctor.sources.prometheus import MAX_POINTS, PrometheusClient, PrometheusSource, parse_selector
from kvdoctor.sources.traces import load_trace, write_window
from tests.support import servers
from tests.support.processes import kvdoctor
from tests.support.scenarios import SCENARIO_BY_NAME
from tests.support.tools import requires_prometheus

ROOT = Path(__file__).resolve().parents[1]
FILL = sorted((ROOT / "tests/fixtures/vllm-0.32-cpu/fill-sequence").glob("*.txt"))
T0 = 1_700_000_000.0
GPU_SIGNAL = "kvdoctor_gpu_dram_bandwidth_utilization_ratio"
ITL_RECORD = record_name("itl_p95_seconds", rule_thresholds(None, None))
ANSI = "\x1b["


# ------------------------------------------------------------------------------------- helpers


def scenario_trace(path: Path, name: str, start: float = T0, keep: float = 150.0) -> Path:
    """The last ``keep`` seconds of a scenario of tests/support/scenarios.py as a canonical trace."""
    full = SCENARIO_BY_NAME[name].full_window()
    cut = full.slice(full.end - keep, full.end)
    write_window(Window(cut.timestamps - cut.start + start, cut.series), path)
    return path


@pytest.fixture
def fill_trace(tmp_path) -> Path:
    """The real vLLM fill sequence (16 scrapes) as a raw trace, one second apart from T0."""
    path = tmp_path / "fill.om"
    path.write_text(format_raw_captures([(T0 + i, p.read_text()) for i, p in enumerate(FILL)]))
    return path


class Result(NamedTuple):
    rc: int
    stdout: str
    stderr: str


@pytest.fixture
def cli() -> Callable[..., Result]:
    """``cli("diagnose", ...)`` runs the command in this process (a subprocess costs seconds of
    start-up on a busy machine; a few tests below use ``run_cli`` for the real entry point)."""

    def run(*args) -> Result:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = kvdoctor_main([str(a) for a in args])
            except SystemExit as exc:  # argparse
                rc = exc.code if isinstance(exc.code, int) else 2
        return Result(rc, out.getvalue(), err.getvalue())

    return run


def one_error_line(result, *phrases: str, rc: int = 2) -> str:
    """Asserts exit ``rc`` (2: bad usage or input; 3: a source that could not be read) and exactly
    one line on stderr (containing ``phrases``); returns it."""
    assert result.rc == rc, (result.rc, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for phrase in phrases:
        assert phrase in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def fake_http(fake_server):
    """fake_http(route, delay=0.0): a server on a free port answering ``route(path) -> (status, type, body)``."""
    return lambda route, delay=0.0: fake_server(servers.computed(route, delay))


def closed_port_url(free_port: int) -> str:
    return f"http://127.0.0.1:{free_port}"


# ------------------------------------------------------------------------------ diagnose: replay


def test_replay_of_a_real_vllm_recording_prints_the_report_and_exits_1(run_cli, fill_trace):
    result = run_cli("diagnose", "--replay", fill_trace)
    assert result.rc == 1, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("kv_capacity_pressure  (confidence ")
    assert lines[1].startswith("KV capacity pressure")
    assert "16 snapshots" in result.stdout and "raw vllm families through the vllm adapter" in result.stdout
    table = lines[lines.index("evidence") + 1 :]
    # each row in words and units, no feature ids (those are in --json)
    kv = next(line for line in table if line.startswith("  KV cache usage"))
    assert kv == "  KV cache usage over the last 15 s: 97% (threshold ≥ 90%)  [decides]"
    itl = next(line for line in table if line.startswith("  ITL p95"))
    assert itl.startswith("  ITL p95 over the last 15 s: ") and itl.endswith(" ms (SLO 100 ms)  [explains]")
    assert not any("_seconds" in line or "kv_usage" in line for line in table if not line.startswith("  missing"))
    assert not any("swapped" in line or "host KV" in line for line in table)  # V0 only: left out on V1
    assert any(line.startswith("  missing signals: ") and GPU_SIGNAL in line for line in table)
    assert not any(line.startswith("  PCIe") for line in table)  # not on the path
    assert "(3 more with --json)" in result.stdout
    assert "Mitigate now (minutes, no redeploy), cheapest first" in lines
    assert "Fix (a redeploy), cheapest first" in lines
    assert "ITL SLO 100 ms (default)" in result.stdout
    assert "--kv-cache-dtype fp8" in result.stdout
    assert ANSI not in result.stdout  # not a terminal: no colour
    assert result.stderr == ""


def test_json_is_one_object_with_the_diagnosis(cli, fill_trace):
    result = cli("diagnose", "--replay", fill_trace, "--json")
    assert result.rc == 1
    payload = json.loads(result.stdout)
    assert {"verdict", "confidence", "headline", "evidence", "actions"} <= set(payload)
    assert payload["verdict"] == "kv_capacity_pressure"
    assert all({"signal", "value", "threshold", "measured"} <= set(e) for e in payload["evidence"])


@pytest.mark.parametrize(
    "name, verdict, rc",
    [
        ("baseline", "healthy", 0),
        ("idle_stale_kv", "idle", 0),
        ("high_hit_ratio_bandwidth_bound", "memory_bandwidth_bound", 1),
    ],
)
def test_exit_status_follows_the_verdict(cli, tmp_path, name, verdict, rc):
    result = cli("diagnose", "--replay", scenario_trace(tmp_path / "s.om", name), "--json")
    assert (result.rc, json.loads(result.stdout)["verdict"]) == (rc, verdict)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_colour_on_a_terminal_unless_no_color(tmp_path, monkeypatch):
    trace = scenario_trace(tmp_path / "s.om", "high_hit_ratio_bandwidth_bound")
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    for no_color, coloured in ((None, True), ("1", False)):
        if no_color:
            monkeypatch.setenv("NO_COLOR", no_color)
        out = _Terminal()
        with contextlib.redirect_stdout(out):
            assert kvdoctor_main(["diagnose", "--replay", str(trace)]) == 1
        assert (ANSI + "31m" + "memory_bandwidth_bound" in out.getvalue()) is coloured
        assert (ANSI in out.getvalue()) is coloured


@pytest.mark.slow
def test_colour_only_on_a_terminal(tmp_path):
    trace = scenario_trace(tmp_path / "s.om", "high_hit_ratio_bandwidth_bound")
    leader, follower = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env["TERM"] = "xterm"
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvdoctor", "diagnose", "--replay", str(trace)],
        stdout=follower,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # EIO once the child has closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=60) == 1
    os.close(leader)
    out = b"".join(chunks).decode()
    assert ANSI + "31m" + "memory_bandwidth_bound" in out
    assert "Cache hit but slow" in out


def test_at_picks_an_earlier_window_as_unix_seconds_or_rfc3339(cli, fill_trace):
    # 3 s into the fill sequence the pool is at 97% but nobody waits yet
    unix = cli("diagnose", "--replay", fill_trace, "--at", str(T0 + 2), "--json")
    rfc = cli("diagnose", "--replay", fill_trace, "--at", "2023-11-15T00:13:22+02:00", "--json")
    assert unix.rc == rfc.rc
    assert json.loads(unix.stdout) == json.loads(rfc.stdout)
    early = json.loads(unix.stdout)
    assert early["window"]["samples"] == 3
    assert early["verdict"] != "kv_capacity_pressure"


def test_window_seconds_bounds_what_is_diagnosed(cli, fill_trace):
    result = cli("diagnose", "--replay", fill_trace, "--window", "4", "--json")
    assert json.loads(result.stdout)["window"]["samples"] == 5


def test_slo_and_thresholds_change_the_verdict(cli, tmp_path, fill_trace):
    trace = scenario_trace(tmp_path / "s.om", "slo_just_under")  # ITL p95 ~95 ms
    assert json.loads(cli("diagnose", "--replay", trace, "--json").stdout)["verdict"] == "healthy"
    tight = cli("diagnose", "--replay", trace, "--json", "--slo-ms", "80")
    assert (tight.rc, json.loads(tight.stdout)["verdict"]) == (1, "memory_bandwidth_bound")

    thresholds = tmp_path / "t.yaml"
    thresholds.write_text("kv_ceiling_ratio: 0.99\n")
    relaxed = cli("diagnose", "--replay", fill_trace, "--json", "--thresholds", thresholds)
    assert json.loads(relaxed.stdout)["verdict"] != "kv_capacity_pressure"


def test_model_config_and_gpu_give_predicted_effects(cli, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "num_hidden_layers": 32,
                "hidden_size": 4096,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "intermediate_size": 14336,
                "vocab_size": 128256,
                "torch_dtype": "bfloat16",
            }
        )
    )
    trace = scenario_trace(tmp_path / "s.om", "high_hit_ratio_bandwidth_bound")
    plain = json.loads(cli("diagnose", "--replay", trace, "--json").stdout)
    ledger = json.loads(cli("diagnose", "--replay", trace, "--json", "--model", config, "--gpu", "H100 SXM").stdout)
    assert plain["verdict"] == ledger["verdict"] == "memory_bandwidth_bound"
    assert not any(a["effect"] for a in plain["actions"])
    assert any(a["effect"] for a in ledger["actions"])


def test_engine_forces_the_adapter_of_a_raw_trace(cli, fill_trace):
    forced = cli("diagnose", "--replay", fill_trace, "--engine", "vllm", "--json")
    assert json.loads(forced.stdout)["verdict"] == "kv_capacity_pressure"
    wrong = cli("diagnose", "--replay", fill_trace, "--engine", "sglang")
    one_error_line(wrong, "no samples kvdoctor can use")


# ---------------------------------------------------------------------------- diagnose: bad input

BAD_TRACE_TEXTS = {
    "empty": "",
    "truncated": '# TYPE kvdoctor_requests_running gauge\nkvdoctor_requests_running{engine="vllm"} 1 1700000000\n',
    "not OpenMetrics": "<html><body>404</body></html>\n",
    "no timestamps": '# TYPE kvdoctor_requests_running gauge\nkvdoctor_requests_running{engine="vllm"} 1\n# EOF\n',
    "non-monotonic": (
        "# TYPE kvdoctor_requests_running gauge\nkvdoctor_requests_running 1 1700000002\n"
        "kvdoctor_requests_running 1 1700000001\n# EOF\n"
    ),
}


@pytest.mark.parametrize("case", BAD_TRACE_TEXTS, ids=list(BAD_TRACE_TEXTS))
def test_bad_traces_exit_2_with_one_line(cli, tmp_path, case):
    path = tmp_path / "bad.om"
    path.write_text(BAD_TRACE_TEXTS[case])
    one_error_line(cli("diagnose", "--replay", path), "kvdoctor diagnose: error:", str(path))


@pytest.mark.parametrize(
    "args, phrase",
    [
        (["--at", "yesterday"], "RFC 3339"),
        (["--at", "2023-11-14T22:13:22"], "no time zone"),
        (["--at", "1700000000000"], "milliseconds"),
        (["--at", "1600000000"], "no samples in the 60 s before"),
        (["--window", "0"], "--window"),
        (["--slo-ms", "0"], "--slo-ms"),
        (["--gpu", "X100"], "unknown GPU"),
        (["--gpu", "H100 SXM", "--gpu-peak-bandwidth", "1e12"], "not allowed with"),
        (["--gpu-peak-bandwidth", "-5"], "--gpu-peak-bandwidth"),
        (["--model", "/nonexistent/config.json"], "no such file"),
        (["--model", "{notjson}"], "not JSON"),
        (["--thresholds", "/nonexistent/t.yaml"], "cannot read thresholds"),
        (["--thresholds", "{badyaml}"], "unknown threshold"),
        (["--engine", "nope"], "unknown engine"),
        (["--selector", '{pod="x"}'], "--selector goes with --prometheus"),
        (["--exporter", "http://127.0.0.1:9"], "not allowed with"),
        (["--namespace", "x"], "--namespace goes with --prometheus"),
        (["--timeout", "0"], "--timeout"),
    ],
)
def test_bad_arguments_to_a_replay_exit_2_with_one_line(cli, tmp_path, fill_trace, args, phrase):
    """``diagnose --replay TRACE`` (a good trace) with ``args``; ``{notjson}`` and ``{badyaml}`` name bad files."""
    notjson = tmp_path / "config.json"
    notjson.write_text("{nope")
    badyaml = tmp_path / "t.yaml"
    badyaml.write_text("kv_ceiling: 0.9\n")
    fills = {"{notjson}": str(notjson), "{badyaml}": str(badyaml)}
    args = [fills.get(a, a) for a in args]
    one_error_line(cli("diagnose", "--replay", fill_trace, *args), phrase)


@pytest.mark.parametrize(
    "args, phrase",
    [
        (["--selector", 'kvdoctor_x{pod="a"}'], "label matchers only"),
        (["--selector", "{pod=a}"], "bad selector"),
        (["--namespace", " "], "namespace is empty"),
        (["--limit", "-1"], "--limit: must be from 0 up to"),
    ],
)
def test_bad_arguments_to_prometheus_exit_2_with_one_line(cli, args, phrase):
    one_error_line(cli("diagnose", "--prometheus", "http://127.0.0.1:9", *args), phrase)


@pytest.mark.parametrize(
    "args, phrase",
    [
        ([], "one of the arguments"),
        (["--replay", "/nonexistent/trace.om"], "cannot read"),
        (["--exporter", "http://127.0.0.1:9", "--engine", "vllm"], "--engine goes with --replay"),
        (["--exporter", "http://127.0.0.1:9", "--limit", "3"], "--limit goes with --prometheus"),
        (["--exporter", "ftp://x"], "http(s) URL"),
        (["--prometheus", "not a url"], "http(s) URL"),
    ],
)
def test_bad_sources_exit_2_with_one_line(cli, args, phrase):
    one_error_line(cli("diagnose", *args), phrase)


def test_unreachable_sources_exit_3_with_one_line(cli, run_cli, free_port, tmp_path):
    url = closed_port_url(free_port)
    one_error_line(cli("diagnose", "--exporter", url), "cannot reach the exporter", "connection refused", rc=3)
    # through the real entry point: one line on stderr, no traceback
    truncated = tmp_path / "t.om"
    truncated.write_text(BAD_TRACE_TEXTS["truncated"])
    one_error_line(run_cli("diagnose", "--replay", truncated), "does not end with a '# EOF' line")
    one_error_line(
        cli("diagnose", "--prometheus", url, "--selector", '{pod="x"}'),
        "cannot reach Prometheus",
        "connection refused",
        rc=3,
    )
    # through the real entry point too
    one_error_line(run_cli("diagnose", "--exporter", url), "cannot reach the exporter", rc=3)


def test_a_malformed_url_is_bad_input_not_an_unreadable_source(cli):
    one_error_line(cli("diagnose", "--exporter", "ftp://nowhere"), rc=2)
    one_error_line(cli("diagnose", "--prometheus", "not a url"), rc=2)


def test_an_internal_error_is_one_line_and_exit_3(cli, fill_trace, monkeypatch):
    from kvdoctor.commands import diagnose as command

    def broken(*args, **kwargs):
        raise RuntimeError("a bug\nover two lines")

    monkeypatch.setattr(command, "diagnose", broken)
    line = one_error_line(
        cli("diagnose", "--replay", fill_trace), "internal error: RuntimeError: a bug over two lines", rc=3
    )
    assert line.startswith("kvdoctor diagnose: internal error")


def test_help_states_the_exit_status(cli):
    for command in ("diagnose", "rules", "record", "stress", "ledger", "version"):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
            kvdoctor_main([command, "--help"])
        assert "exit status" in out.getvalue() and "3" in out.getvalue().split("exit status")[1], command


def test_slow_sources_time_out_with_one_line(cli, fake_http):
    slow = fake_http(lambda path: (200, "application/json", b"{}"), delay=3.0)
    one_error_line(cli("diagnose", "--exporter", slow.url(), "--timeout", "0.5"), "did not answer within 0.5 s", rc=3)
    one_error_line(cli("diagnose", "--prometheus", slow.url(), "--timeout", "0.5"), "did not answer within 0.5 s", rc=3)


@pytest.mark.parametrize(
    "status, ctype, body, phrase, rc",
    [
        (
            500,
            "application/json",
            b'{"status":"error","errorType":"internal","error":"tsdb broke"}',
            "HTTP 500: internal: tsdb broke",
            3,
        ),
        (503, "text/html", b"<html>down</html>", "answered HTTP 503", 3),
        (
            400,
            "application/json",
            b'{"status":"error","errorType":"bad_data","error":"parse error: bad matcher"}',
            'rejected the query for selector {pod="x"}: parse error: bad matcher',
            2,  # the selector is bad input
        ),
        (200, "text/html", b"<html>a login page</html>", "does not answer like a Prometheus HTTP API", 3),
        (
            200,
            "application/json",
            b'{"status":"success","data":{"resultType":"vector","result":[]}}',
            'no kvdoctor pods match {pod="x"}',
            3,
        ),
    ],
)
def test_prometheus_errors_exit_with_one_line(cli, fake_http, status, ctype, body, phrase, rc):
    server = fake_http(lambda path: (status, ctype, body))
    one_error_line(cli("diagnose", "--prometheus", server.url(), "--selector", '{pod="x"}'), phrase, rc=rc)


@pytest.mark.parametrize(
    "route, phrase",
    [
        (lambda path: (404, "text/plain", b"not found"), "no /api/v1/window"),
        (lambda path: (500, "text/plain", b"boom"), "answered HTTP 500"),
        (lambda path: (200, "text/html", b"<html></html>"), "did not return a kvdoctor window"),
        (lambda path: (200, "application/json", b'{"timestamps": [], "series": []}'), "holds no samples"),
    ],
)
def test_exporter_errors_exit_3_with_one_line(cli, fake_http, route, phrase):
    one_error_line(cli("diagnose", "--exporter", fake_http(route).url()), phrase, rc=3)


def _vector(*items: tuple[dict, float]) -> bytes:
    result = [{"metric": m, "value": [T0, repr(v)]} for m, v in items]
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


def fake_fleet(verdicts: dict[str, str], itl: dict[str, float]):
    """A fake Prometheus answering the fleet's instant queries (pods in namespace "ns"; pod -> verdict,
    pod -> ITL p95) and, for a range vector, one pod's raw samples."""

    def answer(h) -> None:
        query = parse_qs(h.body.decode())["query"][0]
        ns = {"namespace": "ns"}
        if query.startswith("group by"):
            body = _vector(*(({**ns, "pod": p}, 1.0) for p in verdicts))
        elif query.startswith("max by (namespace, pod, verdict)"):
            body = _vector(*(({**ns, "pod": p, "verdict": v}, 1.0) for p, v in verdicts.items()))
        elif query.startswith('{__name__=~"kvdoctor:'):
            records = [({"__name__": ITL_RECORD, **ns, "pod": p}, v) for p, v in itl.items()]
            body = _vector(*records, *(({"__name__": S.ITL_SLO, **ns, "pod": p}, 0.1) for p in itl))
        elif query.startswith("max(timestamp("):  # the single pod's newest sample
            body = _vector(({}, T0))
        else:  # its window: the raw samples of one series
            series = {
                "metric": {"__name__": S.REQUESTS_RUNNING, **ns, "pod": "a"},
                "values": [[T0 - 2, "1"], [T0 - 1, "1"], [T0, "2"]],
            }
            body = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [series]}}).encode()
        servers.send(h, body, 200, servers.JSON)

    return servers.FakeServer(answer)


def test_a_selector_matching_several_pods_prints_the_fleet_worst_first(cli):
    pods = {"a": "healthy", "b": "kv_thrashing", "c": "compute_bound", "d": "idle"}
    with fake_fleet(pods, {"a": 0.02, "b": 0.3, "c": 0.9}) as server:
        text = cli("diagnose", "--prometheus", server.url(), "--limit", "2", "--at", str(T0))
        doc = cli("diagnose", "--prometheus", server.url(), "--json", "--at", str(T0))
        assert len(server.forms()) == 6  # three instant queries each, no range read
    assert text.rc == 1 and text.stderr == ""
    lines = text.stdout.splitlines()
    assert lines[0].startswith("4 pods, 2 slow: 1 idle, 1 healthy, 1 kv_thrashing, 1 compute_bound")
    rows = [line.split()[0] for line in lines[4:6]]
    assert rows == ["ns/c", "ns/b"]  # slow first, by ITL p95 over the SLO
    assert "900 ms / 100 ms (9.0x)" in lines[4] and "Route traffic away" in lines[4]
    assert "(2 more: --limit 0 for all, or --json)" in text.stdout
    payload = json.loads(doc.stdout)
    assert doc.rc == 1 and payload["pods"] == 4 and [r["pod"] for r in payload["rows"]] == ["c", "b", "a", "d"]
    assert payload["counts"]["kv_thrashing"] == 1 and payload["rows"][0]["first_action"] == "route_away"


def test_a_healthy_fleet_exits_0(cli):
    with fake_fleet({"a": "healthy", "b": "idle"}, {"a": 0.02}) as server:
        result = cli("diagnose", "--prometheus", server.url(), "--namespace", "ns", "--at", str(T0))
    assert result.rc == 0 and "2 pods, 0 slow" in result.stdout


def test_a_selector_matching_one_pod_gets_its_full_diagnosis_from_its_own_window(cli):
    with fake_fleet({"a": "healthy"}, {"a": 0.02}) as server:
        result = cli("diagnose", "--prometheus", server.url(), "--selector", '{job="x"}', "--json", "--at", str(T0))
        window_query = server.forms()[-1]["query"][0]
    assert result.rc in (0, 1) and "verdict" in json.loads(result.stdout)
    assert window_query.startswith('{__name__=~"kvdoctor_.+",namespace="ns",pod="a"}[')  # the pod's, GPUs included


# ------------------------------------------------------------------------- the Prometheus source


@pytest.mark.parametrize(
    "selector, matchers",
    [
        ('{pod="vllm-0"}', 'pod="vllm-0"'),
        ('pod="vllm-0"', 'pod="vllm-0"'),
        ('{ pod = "a" , namespace=~"team-.*" }', 'pod="a",namespace=~"team-.*"'),
        ('{model_name!="x \\"y\\""}', 'model_name!="x \\"y\\""'),
        ("{}", ""),
        ("", ""),
        (None, ""),
    ],
)
def test_selectors_are_label_matchers(selector, matchers):
    assert parse_selector(selector) == matchers


@pytest.mark.parametrize(
    "selector, phrase",
    [
        ("{pod=vllm-0}", "label matchers such as"),
        ('kvdoctor_kv_cache_usage_ratio{pod="a"}', "label matchers only"),
        ('{__name__="x"}', "do not match __name__"),
        ('{pod="a" namespace="b"}', "separated by commas"),
        ('{pod="a"', "label matchers only"),
    ],
)
def test_bad_selectors_are_refused_before_asking(selector, phrase):
    with pytest.raises(ValueError, match=phrase):
        parse_selector(selector)


def _matrix(*series) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": list(series)}}).encode()


def test_raw_samples_of_series_scraped_at_different_times_line_up_in_one_window(fake_http):
    engine = {
        "metric": {"__name__": S.REQUESTS_RUNNING, "pod": "a", "instance": "x:1", "job": "j"},
        "values": [[T0 + 0.0, "1"], [T0 + 1.0, "2"], [T0 + 2.0, "3"]],
    }
    gpu = {
        "metric": {"__name__": S.GPU_SM_ACTIVE, "pod": "a", "gpu": "0"},
        "values": [[T0 + 0.5, "0.5"], [T0 + 2.0, "0.7"]],
    }
    server = fake_http(lambda path: (200, "application/json", _matrix(engine, gpu)))
    with PrometheusSource(server.url(), '{pod="a"}') as source:
        window = source.window(60, at=T0 + 2)
    assert server.paths == ["/api/v1/query"]
    assert server.forms()[0]["query"] == ['{__name__=~"kvdoctor_.+",pod="a"}[61s]']
    assert list(window.timestamps) == [T0, T0 + 0.5, T0 + 1, T0 + 2]
    (running,) = window.select(S.REQUESTS_RUNNING).values()
    (sm,) = window.select(S.GPU_SM_ACTIVE).values()
    assert np.array_equal(running, [1, np.nan, 2, 3], equal_nan=True)
    assert np.array_equal(sm, [np.nan, 0.5, np.nan, 0.7], equal_nan=True)


def test_long_windows_use_a_range_query_at_window_over_n(fake_http):
    series = {"metric": {"__name__": S.REQUESTS_RUNNING}, "values": [[T0 - 7.2, "1"], [T0, "2"]]}
    server = fake_http(lambda path: (200, "application/json", _matrix(series)))
    with PrometheusSource(server.url(), "") as source:
        window = source.window(7200, at=T0)
    assert server.paths == ["/api/v1/query_range"]
    assert server.forms()[0]["step"] == [f"{7200 / MAX_POINTS:g}"]
    assert float(server.forms()[0]["start"][0]) == T0 - 7200
    assert len(window) == 2


def test_the_newest_sample_is_found_without_colliding_series(fake_http):
    def route(path):
        return (
            200,
            "application/json",
            json.dumps(
                {
                    "status": "success",
                    "data": {"resultType": "vector", "result": [{"metric": {}, "value": [T0 + 99, str(T0 + 42)]}]},
                }
            ).encode(),
        )

    server = fake_http(route)
    with PrometheusSource(server.url(), '{pod="a"}') as source:
        assert source.newest_sample_time(at=T0 + 99) == T0 + 42
    expression = server.forms()[0]["query"][0]
    assert expression.startswith("max(timestamp(") and f'timestamp({S.REQUESTS_WAITING}{{pod="a"}})' in expression
    assert "_bucket" not in expression


# --------------------------------------------------------------------------- a real exporter


@pytest.fixture
def live_exporter(demo):
    """A real exporter scraping the simulated vLLM engine over HTTP, serving its API on a free port."""
    return demo("kv_thrashing", in_process=True)


@pytest.mark.slow
def test_diagnose_reads_a_live_exporter(cli, live_exporter):
    result = cli("diagnose", "--exporter", live_exporter.exporter_url, "--json", "--window", "5")
    assert result.rc in (0, 1), result.stderr
    payload = json.loads(result.stdout)
    assert payload["verdict"] != "idle"
    assert 2 <= payload["window"]["samples"] <= 5 / 0.25 + 2
    # the base URL may also be given as its /metrics; --at picks a window ending earlier
    deadline = time.monotonic() + 20
    while live_exporter.exporter.cycles < 16 and time.monotonic() < deadline:  # 4 s of history
        time.sleep(0.1)
    at = time.time() - 1
    again = cli("diagnose", "--exporter", live_exporter.metrics_url, "--window", "2", "--at", at, "--json")
    assert again.rc in (0, 1), again.stderr
    assert 2 <= json.loads(again.stdout)["window"]["samples"] <= 2 / 0.25 + 1


# ------------------------------------------------------------------------------------- record


@pytest.mark.slow
def test_record_writes_a_trace_that_replays(run_cli, cli, live_exporter, tmp_path):
    out = tmp_path / "rec.om"
    result = run_cli(
        "record", "--exporter", live_exporter.exporter_url, "--seconds", "2", "--interval", "0.5", "-o", out
    )
    assert result.rc == 0, result.stderr
    assert "wrote" in result.stderr
    trace = load_trace(out, AdapterNormaliser())
    assert trace.canonical_families and not trace.raw_families
    assert len(trace.window) >= 2 / 0.25 - 2  # every exporter cycle, not one per poll
    gaps = np.diff(trace.window.timestamps)
    assert gaps.max() < 0.25 * 3
    assert trace.window.select(S.KV_CACHE_USAGE)
    replay = cli("diagnose", "--replay", out, "--json")
    assert replay.rc in (0, 1) and json.loads(replay.stdout)["verdict"] != "idle"


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_stopping_record_early_keeps_what_was_collected(live_exporter, spawn, tmp_path, sig):
    out = tmp_path / "rec.om"
    args = ("record", "--exporter", live_exporter.exporter_url, "--seconds", "120", "--interval", "0.25", "-o", out)
    record = spawn(kvdoctor(*args, merge_stderr=False))
    record.wait_for_line("recording", stream="stderr")  # "recording ... into FILE": the first poll is done
    time.sleep(1.5)
    started = time.monotonic()
    assert record.stop(sig, timeout=20) == 0, record.errors
    assert time.monotonic() - started < 10
    assert "stopped early; wrote" in record.errors
    window = load_trace(out, AdapterNormaliser()).window
    assert len(window) >= 4
    assert window.end - window.start >= 1.0


def test_record_falls_back_to_metrics_without_the_window_api(cli, fake_http, tmp_path):
    count = {"n": 0}

    def route(path):
        if path.startswith("/metrics"):
            count["n"] += 1
            page = (
                f"# TYPE {S.GENERATION_TOKENS} counter\n"
                f'{S.GENERATION_TOKENS}{{engine="vllm",model_name="m"}} {100 * count["n"]}\n'
                f'# TYPE {S.KV_CACHE_USAGE} gauge\n{S.KV_CACHE_USAGE}{{engine="vllm",model_name="m"}} 0.5\n'
                "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 3\n"
            )
            return 200, "text/plain", page.encode()
        return 404, "application/json", b'{"detail":"Not Found"}'

    out = tmp_path / "rec.om"
    result = cli("record", "--exporter", fake_http(route).url(), "--seconds", "1.2", "--interval", "0.3", "-o", out)
    assert result.rc == 0, result.stderr
    assert "(/metrics)" in result.stderr
    window = load_trace(out, AdapterNormaliser()).window
    assert len(window) >= 3
    (gen,) = window.select(S.GENERATION_TOKENS).values()
    assert np.all(np.diff(gen) > 0)
    assert not any(name.startswith("process_") for name, _ in window.series)


def test_record_engine_url_writes_a_raw_trace_of_the_real_pages(cli, fake_http, tmp_path):
    pages = iter(p.read_bytes() for p in FILL)
    last = {"page": FILL[0].read_bytes()}

    def route(path):
        last["page"] = next(pages, last["page"])
        return 200, "text/plain; version=0.0.4", last["page"]

    server = fake_http(route)
    out = tmp_path / "raw.om"
    result = cli("record", "--engine-url", server.url(), "--seconds", "1.5", "--interval", "0.25", "-o", out)
    assert result.rc == 0, result.stderr
    assert "of vllm metrics" in result.stderr
    assert "# TYPE vllm:kv_cache_usage_perc gauge" in out.read_text()
    trace = load_trace(out, AdapterNormaliser())
    assert trace.engine == "vllm" and len(trace.window) >= 4


@pytest.mark.parametrize(
    "args, phrase, rc",
    [
        (["--exporter", "{closed}", "--seconds", "5", "-o", "{out}"], "cannot reach the exporter", 3),
        (["--engine-url", "{closed}/metrics", "--seconds", "5", "-o", "{out}"], "GET", 3),
        (["--exporter", "{closed}", "--seconds", "0", "-o", "{out}"], "--seconds", 2),
        (["--exporter", "{closed}", "--seconds", "5", "--interval", "-1", "-o", "{out}"], "--interval", 2),
        (["--exporter", "{closed}", "--seconds", "5", "-o", "/nonexistent/dir/x.om"], "does not exist", 2),
        (["--exporter", "{closed}", "--seconds", "5", "-o", "{tmp}"], "is a directory", 2),
        (
            ["--exporter", "{closed}", "--engine-url", "{closed}", "--seconds", "5", "-o", "{out}"],
            "not allowed with",
            2,
        ),
        (["--seconds", "5", "-o", "{out}"], "one of the arguments", 2),
        (["--exporter", "{closed}", "-o", "{out}"], "--seconds", 2),
        (["--exporter", "ftp://x", "--seconds", "5", "-o", "{out}"], "http(s) URL", 2),
    ],
)
def test_record_bad_input_or_an_unreadable_source_exits_with_one_line(cli, tmp_path, free_port, args, phrase, rc):
    closed = closed_port_url(free_port)
    fills = {"{out}": str(tmp_path / "x.om"), "{tmp}": str(tmp_path)}
    args = [fills.get(a, a.replace("{closed}", closed)) for a in args]
    one_error_line(cli("record", *args), phrase, rc=rc)
    assert not (tmp_path / "x.om").exists()


def test_record_refuses_a_page_no_engine_adapter_knows(cli, fake_http, tmp_path):
    server = fake_http(lambda path: (200, "text/plain", b"# TYPE foo gauge\nfoo 1\n"))
    one_error_line(
        cli("record", "--engine-url", server.url(), "--seconds", "1", "-o", tmp_path / "x.om"), "no engine adapter"
    )


# ----------------------------------------------------------------- one context, one verdict (#14)


@pytest.mark.slow
@pytest.mark.timeout(300)
@requires_prometheus
def test_the_exporter_diagnose_prometheus_and_the_dashboard_agree_on_a_non_default_slo(cli, demo, prometheus_server):
    """The demo's simulated engine, bandwidth bound at ITL ~19 ms, and an exporter started with
    --slo-ms 15: the exporter, `diagnose --exporter`, `diagnose --prometheus` (a real Prometheus
    scraping it) and the dashboard's Prometheus-backed diagnosis give the same slow verdict on the
    same window; with the 100 ms default every one of them would have said healthy."""
    from kvdoctor.dashboard.sources import prometheus_diagnosis  # the [dashboard] extra

    live = demo("bandwidth_bound", in_process=True, interval=0.5, slo_ms=15)
    target = live.exporter_url.removeprefix("http://")
    prom = prometheus_server(targets=[target], scrape_interval="1s", evaluation_interval="1s")
    prom.wait_for_targets_up()
    prom.wait_for_value("kvdoctor_inter_token_latency_slo_seconds", lambda v: v == 0.015, timeout=30)
    status = json.loads(httpx.get(f"{live.exporter_url}/api/v1/status", timeout=10).text)
    assert status["context"]["slo_seconds"] == 0.015
    time.sleep(25)  # a window's worth of scrapes in Prometheus (the state sub-window and more)
    end = time.time() - 2
    seconds = "20"

    exporter_verdict = live.verdict()
    via_exporter = json.loads(
        cli("diagnose", "--exporter", live.exporter_url, "--json", "--at", end, "--window", seconds).stdout
    )
    via_prometheus = json.loads(
        cli("diagnose", "--prometheus", prom.url, "--selector", f'{{instance="{target}"}}', "--json", "--at", end,
            "--window", seconds).stdout
    )  # fmt: skip
    with PrometheusClient(prom.url) as client:
        dashboard, _ = prometheus_diagnosis(client, target, end)
    verdicts = {
        "exporter": exporter_verdict,
        "diagnose --exporter": via_exporter["verdict"],
        "diagnose --prometheus": via_prometheus["verdict"],
        "dashboard": dashboard["verdict"] if dashboard else None,
    }
    assert set(verdicts.values()) == {"memory_bandwidth_bound"}, verdicts
    for payload in (via_exporter, via_prometheus, dashboard):
        assert payload["context"]["slo_seconds"] == 0.015
        assert payload["context"]["slo_source"] == "published by the exporter"
        assert 0.015 <= payload["features"]["itl_p95_seconds"] < 0.1  # slow only against the published SLO
    # told otherwise, each says what the 100 ms default says
    told = cli(
        "diagnose", "--exporter", live.exporter_url, "--json", "--at", end, "--window", seconds, "--slo-ms", "100"
    )
    assert (told.rc, json.loads(told.stdout)["verdict"]) == (0, "healthy")


def _exporter_serving(fake_http, window: Window, context: dict | None):
    """A fake exporter answering /api/v1/window with ``window`` and /api/v1/status with ``context``."""

    def route(path):
        if path.startswith("/api/v1/window"):
            return 200, "application/json", json.dumps(window.to_json()).encode()
        if path.startswith("/api/v1/status"):
            return 200, "application/json", json.dumps({"version": "x", "context": context}).encode()
        return 404, "text/plain", b""

    return fake_http(route)


def test_diagnose_exporter_uses_the_slo_and_model_the_exporter_publishes(cli, fake_http):
    scenario = SCENARIO_BY_NAME["slo_just_under"]  # ITL p95 ~95 ms: healthy at 100 ms, slow at 50 ms
    window = scenario.window()
    window = Window(window.timestamps - window.timestamps[-1] + time.time(), window.series)
    published = context_to_json(Context(slo_seconds=0.05, model=COMMON_MODELS["Llama-3.1-8B"]))
    server = _exporter_serving(fake_http, window, published)
    result = cli("diagnose", "--exporter", server.url(), "--json")
    payload = json.loads(result.stdout)
    assert (result.rc, payload["verdict"]) == (1, "memory_bandwidth_bound")
    assert payload["context"]["slo_seconds"] == 0.05 and payload["context"]["slo_source"] == "published by the exporter"
    assert payload["context"]["model"]["name"] == "Llama-3.1-8B"
    assert any(a["effect"] and "per token" in a["effect"] for a in payload["actions"])  # the published model's ledger
    told = cli("diagnose", "--exporter", server.url(), "--json", "--slo-ms", "100")
    assert (told.rc, json.loads(told.stdout)["verdict"]) == (0, "healthy")
    older = _exporter_serving(fake_http, window, None)  # an exporter that publishes no context
    assert json.loads(cli("diagnose", "--exporter", older.url(), "--json").stdout)["context"]["slo_source"] == "default"
