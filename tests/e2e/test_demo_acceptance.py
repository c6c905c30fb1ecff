"""Acceptance: ``kvdoctor demo`` as a new user runs it, in a real process.

It serves /metrics with every canonical signal the demo can produce, ``promtool check metrics``
passes on it, the dashboard answers, a scenario switch over HTTP changes the verdict, and Ctrl-C
(SIGINT) or SIGTERM stops it with exit code 0 and no traceback. Once on the default port 9745
(skipped when something else holds it) and once on a free port.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from kvdoctor.exporter.adapters import ADAPTERS
from kvdoctor.rules import signals as S
from tests import tools

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 90.0  # imports and the simulation's warm-up, on a busy 2-core machine
DEFAULT_PORT = 9745


def demo_signals() -> set[str]:
    """Sample names the demo produces: every canonical signal except what vLLM cannot provide and
    the error counter (it appears only after an error)."""
    absent = set(ADAPTERS["vllm"].cannot_provide) | {S.SOURCE_ERRORS}
    return {series for name, sig in S.SIGNALS.items() if name not in absent for series in sig.series_names}


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class Demo:
    """``python -m kvdoctor demo ARGS`` with its output collected line by line."""

    def __init__(self, *args: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kvdoctor", "demo", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.lines: list[str] = []

    def wait_started(self) -> dict[str, str]:
        """The URLs it printed, by name (dashboard, metrics, diagnosis, engine)."""
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise AssertionError(f"demo exited ({self.proc.wait()}) before it started:\n{self.proc.stderr.read()}")
            self.lines.append(line.rstrip("\n"))
            if line.startswith("Ctrl-C to stop."):
                break
        else:
            raise AssertionError(f"demo did not start within {START_TIMEOUT:.0f} s: {self.lines}")
        urls = {}
        for line in self.lines[1:]:
            words = line.split()
            if len(words) >= 2 and words[1].startswith("http"):
                urls[words[0]] = words[1]
        return urls

    def stop(self, signum: int = signal.SIGINT, timeout: float = 20.0) -> tuple[int, str, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            raise AssertionError(f"demo did not stop within {timeout:.0f} s of signal {signum}")
        return self.proc.returncode, "\n".join(self.lines) + out, err


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


def verdict(diagnosis_url: str) -> str | None:
    payload = httpx.get(diagnosis_url, timeout=5).json()
    return payload.get("verdict") if isinstance(payload, dict) else None


def check_demo(port: int, tmp_path: Path) -> None:
    dashboard_port = tools.free_port()
    demo = Demo("--port", str(port), "--dashboard-port", str(dashboard_port), "--status-every", "2")
    try:
        urls = demo.wait_started()
        assert urls["metrics"] == f"http://127.0.0.1:{port}/metrics"
        names = [line.split()[0] for line in demo.lines[1:] if line.startswith("  ")]
        if "dashboard" in urls:  # printed first
            assert names[0] == "dashboard"
            assert httpx.get(urls["dashboard"], timeout=20).status_code == 200

        body = metrics_with_every_signal(urls["metrics"])
        promtool = tools.promtool()
        if promtool is not None:
            page = tmp_path / "metrics.txt"
            page.write_text(body)
            check = subprocess.run([promtool, "check", "metrics"], stdin=page.open(), capture_output=True, text=True)
            assert check.returncode == 0, check.stdout + check.stderr

        engine = urls["engine"].removesuffix("/metrics")
        switched = httpx.post(engine + "/scenario", json={"scenario": "kv_thrashing"}, timeout=5)
        assert switched.status_code == 200
        tools.wait_until(
            lambda: verdict(urls["diagnosis"]) == "kv_thrashing",
            timeout=30,
            interval=0.5,
            what="the kv_thrashing verdict after the switch",
        )
    finally:
        rc, out, err = demo.stop(signal.SIGINT)
    assert rc == 0, err
    assert "Traceback" not in err and "Traceback" not in out
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
    demo = Demo("--port", "0", "--no-dashboard", "--scenario", "cycle")
    demo.wait_started()
    rc, out, err = demo.stop(signal.SIGTERM)
    assert rc == 0 and "Traceback" not in err


def test_port_in_use_is_one_line_and_exit_2():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "kvdoctor", "demo", "--port", str(port), "--no-dashboard"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
        )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"kvdoctor demo: error: exporter: port {port} on 127.0.0.1 is already in use (choose another with --port)"
    ]
