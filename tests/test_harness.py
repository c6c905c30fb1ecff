"""The test harness itself: tool lookup, the CLI runner, the Prometheus fixture, the install script."""

from __future__ import annotations

import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests import tools
from tests.tools import requires_prometheus


def test_missing_tool_reason_names_the_need_and_the_install_command():
    for name in tools.TOOLS:
        reason = tools.missing_reason(name)
        assert reason.startswith("needs ")
        assert "scripts/install-test-deps.sh --only" in reason


def test_require_fails_instead_of_skipping_when_the_tool_is_required(monkeypatch):
    monkeypatch.setitem(tools.TOOLS, "nothing", (lambda: None, "a tool that is not there", "true"))
    monkeypatch.delenv("KVDOCTOR_REQUIRE_TOOLS", raising=False)  # CI sets it: start from a developer's shell
    with pytest.raises(pytest.skip.Exception):
        tools.require("nothing")
    monkeypatch.setenv("KVDOCTOR_REQUIRE_TOOLS", "promtool,nothing")
    with pytest.raises(pytest.fail.Exception):
        tools.require("nothing")


def test_wait_until_returns_the_probe_value_and_times_out_with_the_last_error():
    calls = iter([None, 0, "ready"])
    assert tools.wait_until(lambda: next(calls), timeout=5, interval=0.01) == "ready"

    def broken():
        raise ConnectionError("refused")

    with pytest.raises(TimeoutError, match="refused"):
        tools.wait_until(broken, timeout=0.2, interval=0.05, what="server")


def test_run_cli_returns_exit_code_and_streams(run_cli):
    rc, out, err = run_cli("version")
    assert rc == 0 and out.strip() and not err
    rc, out, err = run_cli("no-such-command")
    assert rc == 2 and "error" in err and "Traceback" not in err


def test_install_script_rejects_an_unknown_step():
    proc = subprocess.run(
        ["bash", str(tools.ROOT / "scripts/install-test-deps.sh"), "--only", "nosuch"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2 and "unknown step 'nosuch'" in proc.stderr


class _Metrics(BaseHTTPRequestHandler):
    body = b'# TYPE harness_probe_value gauge\nharness_probe_value{kind="real"} 42\n'

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


@pytest.mark.slow
@requires_prometheus
def test_prometheus_server_scrapes_a_target_and_evaluates_rule_files(prometheus_server):
    target = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=target.serve_forever, daemon=True).start()
    try:
        rules = {
            "groups": [
                {
                    "name": "harness",
                    "rules": [
                        {"record": "harness:probe_doubled", "expr": "harness_probe_value * 2"},
                        {
                            "alert": "HarnessProbeHigh",
                            "expr": "harness_probe_value > 40",
                            "labels": {"severity": "info"},
                        },
                    ],
                }
            ]
        }
        prom = prometheus_server(targets=[f"127.0.0.1:{target.server_port}"], rule_files={"harness.yml": rules})
        prom.wait_for_targets_up()
        assert prom.wait_for_value('harness_probe_value{kind="real"}', lambda v: v == 42) == 42
        assert prom.wait_for_value("harness:probe_doubled", lambda v: v > 0) == 84
        assert prom.wait_for_alert("HarnessProbeHigh")["labels"]["severity"] == "info"
    finally:
        target.shutdown()
        target.server_close()
