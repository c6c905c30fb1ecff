"""`kvdoctor exporter` as a user runs it: bad configuration fails in one line, a good one serves."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from tests import tools

CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("KVDOCTOR_")}


def run_exporter(*args, env=None, timeout=60):
    proc = subprocess.run(
        [sys.executable, "-m", "kvdoctor", "exporter", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**CLEAN_ENV, **(env or {})},
        stdin=subprocess.DEVNULL,
    )
    return proc.returncode, proc.stdout, proc.stderr


BAD_CONFIGS = [
    (["--engine", "nosuchengine"], {}, "unknown engine 'nosuchengine'"),
    (["--engine-url", "localhost:8000"], {}, "malformed URL"),
    (["--engine-url", "http://engine:port/metrics"], {}, "malformed URL"),
    (["--dcgm-url", "ftp://x"], {}, "--dcgm-url"),
    (["--interval", "0"], {}, "--interval (KVDOCTOR_INTERVAL): must be greater than 0"),
    (["--interval", "-2"], {}, "must be greater than 0"),
    ([], {"KVDOCTOR_INTERVAL": "0"}, "--interval (KVDOCTOR_INTERVAL): must be greater than 0"),
    ([], {"KVDOCTOR_ENGINE": "bogus"}, "unknown engine 'bogus'"),
    (["--port", "70000"], {}, "--port"),
    (["--interval", "soon"], {}, "--interval"),
    (["--model-config", "/nonexistent/config.json"], {}, "no such file"),
]


@pytest.mark.parametrize("args, env, expected", BAD_CONFIGS)
def test_bad_configuration_exits_2_with_one_line(args, env, expected, monkeypatch, capsys):
    """In process (fast): the same code path as the console script, less the interpreter start."""
    from kvdoctor.cli import main

    for key in list(os.environ):
        if key.startswith("KVDOCTOR_"):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    try:
        rc = main(["exporter", *args])
    except SystemExit as exc:  # argparse's own type errors exit from inside parse_args
        rc = exc.code
    out, err = capsys.readouterr()
    assert rc == 2
    assert out == ""
    assert len(err.splitlines()) == 1, err
    assert expected in err


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, env, expected",
    [
        (["--engine", "nosuchengine"], {}, "unknown engine 'nosuchengine'"),
        (["--engine-url", "localhost:8000"], {}, "malformed URL"),
        ([], {"KVDOCTOR_INTERVAL": "-1"}, "--interval (KVDOCTOR_INTERVAL): must be greater than 0"),
    ],
)
def test_bad_configuration_through_the_console_entry_point(args, env, expected):
    rc, out, err = run_exporter(*args, env=env)
    assert (rc, out) == (2, "")
    assert len(err.splitlines()) == 1 and expected in err, err


def test_a_port_in_use_fails_in_one_line_before_anything_starts(monkeypatch, capsys):
    from kvdoctor.cli import main

    for key in list(os.environ):
        if key.startswith("KVDOCTOR_"):
            monkeypatch.delenv(key)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        rc = main(["exporter", "--port", str(port), "--engine-url", "http://127.0.0.1:9/metrics"])
    out, err = capsys.readouterr()
    assert (rc, out) == (2, "")
    assert err.splitlines() == [
        f"kvdoctor exporter: error: port {port} on 127.0.0.1 is already in use (choose another with --port)"
    ]


@pytest.mark.slow
def test_a_port_in_use_exits_2_with_one_line():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        rc, out, err = run_exporter("--port", port, "--no-nvml")
    assert rc == 2
    assert err.splitlines() == [
        f"kvdoctor exporter: error: port {port} on 127.0.0.1 is already in use (choose another with --port)"
    ]


@pytest.mark.slow
def test_help_lists_the_collectors_and_what_each_adapter_cannot_provide():
    from kvdoctor.exporter.adapters import ADAPTERS
    from kvdoctor.exporter.settings import collector_registry

    rc, out, _ = run_exporter("--help")
    assert rc == 0
    assert "enabled by default" in out
    for name in collector_registry():
        assert re.search(rf"^\s+{re.escape(name)}\s+(yes|no)\s+", out, re.M), name
        assert f"--collector.{name}" in out
    assert "cannot provide" in out
    compact = " ".join(out.split())
    for name, adapter in ADAPTERS.items():
        assert f"{name}:" in out
        for signal_name in adapter.cannot_provide:
            assert signal_name in compact


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_the_exporter_serves_and_stops_cleanly_on_a_signal(signum):
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvdoctor", "exporter", "--port", "0", "--no-nvml", "--interval", "0.2", "--pod", "p0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=CLEAN_ENV,
        stdin=subprocess.DEVNULL,
    )
    try:
        line = proc.stdout.readline()
        match = re.search(r"serving (http://\S+)/metrics", line)
        assert match, line + proc.stderr.read() if proc.poll() is not None else line
        url = match.group(1)
        tools.wait_until(
            lambda: httpx.get(f"{url}/readyz", timeout=2).status_code == 200,
            timeout=20,
            interval=0.1,
            what="exporter ready",
        )
        assert httpx.get(f"{url}/healthz", timeout=2).json() == {"status": "ok"}
        assert httpx.get(f"{url}/metrics", timeout=2).status_code == 200
        started = time.monotonic()
        proc.send_signal(signum)  # the main thread waits without a timeout: the signal must wake it
        assert proc.wait(timeout=15) == 0
        assert time.monotonic() - started < 10
        assert "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
