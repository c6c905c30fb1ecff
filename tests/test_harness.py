"""The test harness itself (tests/support): tool lookup and the needs_tools marker, the fake HTTP
server, the process runner, the Prometheus fixture, the install script, the annotation template oracle."""

from __future__ import annotations

import math
import signal
import sys

import httpx
import pytest

from tests.support import go_templates, tools
from tests.support.processes import Process, ProcessError, run
from tests.support.servers import first_then, respond, stream
from tests.support.tools import requires_prometheus


def test_missing_tool_reason_names_the_need_and_the_install_command():
    for name in tools.TOOLS:
        reason = tools.missing_reason(name)
        assert reason.startswith("needs ")
        assert "scripts/install-test-deps.sh --only" in reason


@pytest.fixture
def nothing(monkeypatch):
    """A tool that is never there, required outside any test's marker check."""
    monkeypatch.setitem(tools.TOOLS, "nothing", (lambda: None, "a tool that is not there", "true"))
    monkeypatch.setattr(tools, "current_test", None)
    monkeypatch.delenv("KVDOCTOR_REQUIRE_TOOLS", raising=False)  # CI sets it: start from a developer's shell
    return "nothing"


def test_require_fails_instead_of_skipping_when_the_tool_is_required(nothing, monkeypatch):
    with pytest.raises(pytest.skip.Exception, match="needs a tool that is not there"):
        tools.require(nothing)
    monkeypatch.setenv("KVDOCTOR_REQUIRE_TOOLS", "promtool,nothing")
    with pytest.raises(pytest.fail.Exception, match="KVDOCTOR_REQUIRE_TOOLS"):
        tools.require(nothing)


def test_require_in_a_test_without_the_marker_fails(request, nothing, monkeypatch):
    monkeypatch.setattr(tools, "current_test", request.node)
    with pytest.raises(pytest.fail.Exception, match="not marked needs_tools"):
        tools.require(nothing)


def test_the_marker_names_known_tools_only():
    assert tools.requires_promtool.mark.args == ("promtool",)
    assert tools.requires_promtool.mark.name == "needs_tools"
    with pytest.raises(ValueError, match="unknown tool"):
        tools.needs("nosuch")


def test_wait_until_returns_the_probe_value_and_times_out_with_the_last_error():
    calls = iter([None, 0, "ready"])
    assert tools.wait_until(lambda: next(calls), timeout=5, interval=0.01) == "ready"

    def broken():
        raise ConnectionError("refused")

    with pytest.raises(TimeoutError, match="refused"):
        tools.wait_until(broken, timeout=0.2, interval=0.05, what="server")


def test_install_script_rejects_an_unknown_step():
    result = run(["bash", tools.ROOT / "scripts/install-test-deps.sh", "--only", "nosuch"], timeout=30)
    assert result.rc == 2 and "unknown step 'nosuch'" in result.stderr


# ----------------------------------------------------------------------------- the fake server


def test_fake_server_routes_counts_and_records(fake_server):
    server = fake_server({"/metrics": respond(b"up 1\n")})
    with httpx.Client() as client:
        assert client.get(server.url("/metrics?x=1")).text == "up 1\n"
        assert client.post(server.url("/nowhere"), data={"q": "a"}).status_code == 404
    assert server.requests == 2 and server.connections == 1  # kept alive
    assert server.paths == ["/metrics?x=1", "/nowhere"]
    assert server.forms() == [{"q": ["a"]}]


def test_a_stopped_fake_server_is_gone_until_started_again_on_its_port(fake_server):
    server = fake_server(first_then(respond(b"first"), respond(b"then")))
    with httpx.Client() as client:
        assert client.get(server.url()).text == "first"
        port = server.port
        server.stop()
        with pytest.raises(httpx.ConnectError):  # the kept-alive connection is closed too
            client.get(server.url())
        server.start()
        assert server.port == port and client.get(server.url()).text == "then"


def test_a_streamed_answer_has_no_length_and_ends_with_the_connection(fake_server):
    server = fake_server(stream(b"x" * 1000, 10_000))
    response = httpx.get(server.url())
    assert len(response.content) == 10_000 and "content-length" not in response.headers


def test_the_fake_server_serves_a_file_in_its_own_process(spawn, tmp_path):
    page = tmp_path / "page.txt"
    page.write_text("vllm:num_requests_running 3\n")
    served = spawn(Process([sys.executable, "-m", "tests.support.servers", page]))
    url = served.wait_for_line(r"^(http://\S+)", timeout=30).group(1)
    assert httpx.get(url + "/metrics", timeout=5).text == page.read_text()


# --------------------------------------------------------------------------- the process runner


def test_a_process_keeps_its_output_apart_and_its_exit_status():
    script = "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"
    process = Process([sys.executable, "-c", script], merge_stderr=False).start()
    assert process.wait(timeout=30) == 3
    assert (process.output, process.errors) == ("out", "err")


def test_a_process_that_exits_before_it_is_ready_says_so_with_its_output():
    process = Process([sys.executable, "-c", "print('address already in use')"]).start()
    with pytest.raises(ProcessError, match="address already in use") as caught:
        process.wait_for_line("never printed", timeout=30)
    assert caught.value.port_taken and not process.running


def test_stopping_sends_the_signal_then_kills_what_ignores_it(spawn):
    script = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    )
    stubborn = spawn(Process([sys.executable, "-c", script]))
    stubborn.wait_for_line("ready", timeout=30)
    assert stubborn.stop(signal.SIGTERM, timeout=0.5) == -signal.SIGKILL


def test_run_cli_returns_exit_code_and_streams(run_cli):
    rc, out, err = run_cli("version")
    assert rc == 0 and out.strip() and not err
    rc, out, err = run_cli("no-such-command")
    assert rc == 2 and "error" in err and "Traceback" not in err


# ------------------------------------------------------------------------------------ Prometheus


@pytest.mark.slow
@requires_prometheus
def test_prometheus_server_scrapes_a_target_and_evaluates_rule_files(prometheus_server, fake_server):
    target = fake_server(respond(b'# TYPE harness_probe_value gauge\nharness_probe_value{kind="real"} 42\n'))
    rules = {
        "groups": [
            {
                "name": "harness",
                "rules": [
                    {"record": "harness:probe_doubled", "expr": "harness_probe_value * 2"},
                    {"alert": "HarnessProbeHigh", "expr": "harness_probe_value > 40", "labels": {"severity": "info"}},
                ],
            }
        ]
    }
    prom = prometheus_server(targets=[f"127.0.0.1:{target.port}"], rule_files={"harness.yml": rules})
    prom.wait_for_targets_up()
    assert prom.wait_for_value('harness_probe_value{kind="real"}', lambda v: v == 42) == 42
    assert prom.wait_for_value("harness:probe_doubled", lambda v: v > 0) == 84
    assert prom.wait_for_alert("HarnessProbeHigh")["labels"]["severity"] == "info"


# ------------------------------------------------------------ the annotation template oracle


@pytest.mark.parametrize(
    "value, text",
    [
        (0.1234, "123.4m"),
        (1.5e9, "1.5G"),
        (0, "0"),
        (math.nan, "NaN"),
        (3.0, "3"),
        (1234567, "1.235M"),
    ],
)
def test_the_template_oracles_humanize_matches_prometheus(value, text):
    assert go_templates.humanize(value) == text


def test_the_template_oracle_renders_what_it_knows_and_refuses_the_rest():
    out = go_templates.render(
        "{{ $labels.pod }}: {{ $value | humanizePercentage }} ({{ $labels.none }})", {"pod": "vllm-0"}, 0.953
    )
    assert out == "vllm-0: 95.3% ()"
    with pytest.raises(ValueError, match="not supported"):
        go_templates.render("{{ $value | title }}", {}, 1.0)
