"""Acceptance: ``kvdoctor demo`` as a new user runs it, in a real process.

It serves /metrics with every canonical signal the demo can produce, ``promtool check metrics``
passes on it, the dashboard answers, a scenario switch over HTTP changes the verdict, and Ctrl-C
(SIGINT) or SIGTERM stops it with exit code 0 and no traceback. Once on the default port 9745
(skipped when something else holds it) and once on a free port.
"""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path

import httpx
import pytest

from kvdoctor.exporter.adapters import ADAPTERS
from kvdoctor.signals import vocabulary as S
from tests.support import tools
from tests.support.demo import DemoProcess
from tests.support.processes import run

pytestmark = pytest.mark.slow

DEFAULT_PORT = 9745


def demo_signals() -> set[str]:
    """Sample names the demo produces: every canonical signal except what vLLM cannot provide, what
    only vLLM V0 published, the error counter (it appears only after an error) and the TTFT SLO with
    its counter (published only where one is set: the demo sets none)."""
    vllm = ADAPTERS["vllm"]
    absent = set(vllm.cannot_provide) | set(vllm.legacy_only) | {S.SOURCE_ERRORS, S.TTFT_SLO, S.REQUESTS_OVER_TTFT_SLO}
    return {series for name, sig in S.SIGNALS.items() if name not in absent for series in sig.series_names}


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def metrics_with_every_signal(url: str, timeout: float = 30.0) -> str:
    wanted = demo_signals()
    deadline = time.monotonic() + timeout
    missing: set[str] = wanted
    while time.monotonic() < deadline:
        body = httpx.get(url, timeout=5).text
        present = {line.split("{")[0].split(" ")[0] for line in body.splitlines() if line and not line.startswith("#")}
        missing = wanted - present
        if not missing:
            return body
        time.sleep(0.5)
    raise AssertionError(f"/metrics still lacks {sorted(missing)} after {timeout:.0f} s")


def stopped_cleanly(demo: DemoProcess) -> str:
    """Asserts the stopped demo exited 0 with no traceback; returns its stdout."""
    out, err = demo.process.output, demo.process.errors
    assert demo.process.returncode == 0, err
    assert "Traceback" not in err and "Traceback" not in out
    return out


def check_demo(port: int, tmp_path: Path) -> None:
    demo = DemoProcess(port=port, dashboard=True, dashboard_port=tools.free_port(), status_every=2, merge_stderr=False)
    try:
        urls = demo.start().urls
        assert urls["metrics"] == f"http://127.0.0.1:{port}/metrics"
        names = [line.split()[0] for line in demo.printed()[1:] if line.startswith("  ")]
        if "dashboard" in urls:  # printed first
            assert names[0] == "dashboard"
            assert httpx.get(urls["dashboard"], timeout=20).status_code == 200

        body = metrics_with_every_signal(urls["metrics"])
        promtool = tools.promtool()
        if promtool is not None:
            check = run([promtool, "check", "metrics"], input=body)
            assert check.rc == 0, check.stdout + check.stderr

        assert demo.switch("kv_thrashing")["scenario"] == "kv_thrashing"
        tools.wait_until(
            lambda: demo.verdict() == "kv_thrashing",
            timeout=30,
            interval=0.5,
            what="the kv_thrashing verdict after the switch",
        )
    finally:
        demo.stop(signal.SIGINT)
    out = stopped_cleanly(demo)
    assert "| verdict " in out  # the live status line
    assert out.rstrip().endswith("kvdoctor demo: stopping")
    if tools.promtool() is None:
        pytest.skip(f"served every signal; promtool check not run: {tools.missing_reason('promtool')}")


def test_demo_on_the_default_port(tmp_path):
    if not port_free(DEFAULT_PORT):
        pytest.skip(f"port {DEFAULT_PORT} is in use on this machine")
    check_demo(DEFAULT_PORT, tmp_path)


def test_demo_on_a_free_port(tmp_path):
    check_demo(tools.free_port(), tmp_path)


def test_sigterm_stops_it_cleanly():
    demo = DemoProcess("cycle", merge_stderr=False)
    try:
        demo.start()
    finally:
        demo.stop(signal.SIGTERM)
    stopped_cleanly(demo)


def test_port_in_use_is_one_line_and_exit_2(run_cli):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("demo", "--port", port, "--no-dashboard", timeout=120)
    assert result.rc == 2
    assert result.stderr.strip().splitlines() == [
        f"kvdoctor demo: error: exporter: port {port} on 127.0.0.1 is already in use (choose another with --port)"
    ]
