"""`kvdoctor exporter` as a user runs it: bad configuration fails in one line, a good one serves."""

from __future__ import annotations

import re
import signal
import socket
import time

import httpx
import pytest

from tests.support.processes import http_ok, kvdoctor, run_kvdoctor


def run_exporter(*args, env=None, timeout=60):
    return run_kvdoctor("exporter", *args, env=env, clean_env=True, timeout=timeout)


BAD_CONFIGS = [
    (["--engine", "nosuchengine"], {}, "unknown engine 'nosuchengine'"),
    (["--engine-url", "localhost:8000"], {}, "needs an http(s) URL"),
    (["--engine-url", "http://engine:port/metrics"], {}, "has a bad port"),
    (["--dcgm-url", "ftp://x"], {}, "--dcgm-url"),
    (["--interval", "0"], {}, "--interval (KVDOCTOR_INTERVAL): must be greater than 0"),
    (["--interval", "-2"], {}, "must be greater than 0"),
    ([], {"KVDOCTOR_INTERVAL": "0"}, "--interval (KVDOCTOR_INTERVAL): must be greater than 0"),
    ([], {"KVDOCTOR_ENGINE": "bogus"}, "unknown engine 'bogus'"),
    (["--port", "70000"], {}, "--port"),
    (["--interval", "soon"], {}, "--interval"),
    (["--model", "/nonexistent/config.json"], {}, "no such file"),
]


@pytest.mark.parametrize("args, env, expected", BAD_CONFIGS)
def test_bad_configuration_exits_2_with_one_line(args, env, expected, clean_env, monkeypatch, capsys):
    """In process (fast): the same code path as the console script, less the interpreter start."""
    from kvdoctor.cli import main

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
        (["--engine-url", "localhost:8000"], {}, "needs an http(s) URL"),
        ([], {"KVDOCTOR_INTERVAL": "-1"}, "--interval (KVDOCTOR_INTERVAL): must be greater than 0"),
    ],
)
def test_bad_configuration_through_the_console_entry_point(args, env, expected):
    rc, out, err = run_exporter(*args, env=env)
    assert (rc, out) == (2, "")
    assert len(err.splitlines()) == 1 and expected in err, err


def test_a_port_in_use_fails_in_one_line_before_anything_starts(clean_env, capsys):
    from kvdoctor.cli import main

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
        rc, out, err = run_exporter("--port", port, "--no-collector.nvml")
    assert (rc, out) == (2, "")
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
def test_the_exporter_serves_and_stops_cleanly_on_a_signal(signum, spawn):
    args = ("exporter", "--port", "0", "--no-collector.nvml", "--interval", "0.2", "--pod", "p0")
    exporter = spawn(kvdoctor(*args, clean_env=True, merge_stderr=False))
    url = exporter.wait_for_line(r"serving (http://\S+)/metrics", timeout=60).group(1)
    exporter.wait_for(http_ok(f"{url}/readyz"), timeout=20, interval=0.1, what="exporter ready")
    assert httpx.get(f"{url}/healthz", timeout=2).json() == {"status": "ok"}
    assert httpx.get(f"{url}/metrics", timeout=2).status_code == 200
    started = time.monotonic()
    assert exporter.stop(signum) == 0  # the main thread waits without a timeout: the signal must wake it
    assert time.monotonic() - started < 10
    assert "Traceback" not in exporter.errors


# ------------------------------------------------------------------- flags built from the settings

# A value for each setting: text the setting keeps as given, then what it parses or normalises.
KEPT = {
    "engine": "vllm",
    "dcgm_url": "http://127.0.0.1:9400/metrics",
    "gpu_filter": "all",
    "host": "0.0.0.0",
    "pod": "vllm-0",
    "log_level": "debug",
    "served_model": "Qwen/Qwen3-8B",
}
PARSED = {
    "engine_url": ("http://127.0.0.1:8000", "http://127.0.0.1:8000/metrics"),
    "scrape_timeout": ("2.5", 2.5),
    "gpu_peak_bandwidth": ("3.35e12", 3.35e12),
    "slo_ms": ("42", 42.0),
    "ttft_slo_ms": ("800", 800.0),
    "diagnosis_window": ("30", 30.0),
    "interval": ("2", 2.0),
    "retention_seconds": ("1800", 1800.0),
    "port": ("0", 0),
    "max_body_bytes": ("2048", 2048),
    "max_snapshots": ("10", 10),
    "max_series": ("100", 100),
    "max_window_seconds": ("60", 60),
}


def exporter_parser():
    from kvdoctor.cli import build_parser

    return build_parser()._subparsers._group_actions[0].choices["exporter"]


def test_the_exporter_flags_are_exactly_those_of_the_settings():
    from kvdoctor.exporter.settings import options

    actions = exporter_parser()._actions
    parsed = {flag for action in actions for flag in action.option_strings} - {"-h", "--help"}
    old = {flag for action in actions for flag in getattr(action, "deprecated", {})}  # one release, hidden
    assert parsed - old == {flag for option in options() for flag in option.flag_names()}
    assert old == {"--model-config", "--nvml", "--no-nvml"}


def test_every_flag_sets_its_field(clean_env, tmp_path):
    from kvdoctor.commands.exporter import settings_from_args
    from kvdoctor.exporter.settings import options

    config = tmp_path / "config.json"
    config.write_text("{}")
    web = tmp_path / "web.yml"
    web.write_text("")
    kept = {**KEPT, "model_config_path": str(config), "web_config_file": str(web)}
    values = {**{field: (text, text) for field, text in kept.items()}, **PARSED}
    argv, expected = [], {}
    for option in options():
        if option.is_collectors:
            argv += ["--no-collector.dcgm", "--collector.engine"]
            expected["collectors"] = {"dcgm": False, "engine": True}
        elif option.is_switch:
            argv.append("--no-" + option.flag.removeprefix("--"))
            expected[option.field] = not option.default
        else:
            given, wanted = values[option.field]
            argv += [option.flag, given]
            expected[option.field] = wanted
    settings = settings_from_args(exporter_parser().parse_args(argv))
    assert {field: getattr(settings, field) for field in expected} == expected


def test_a_flag_wins_over_its_variable(monkeypatch):
    from kvdoctor.commands.exporter import settings_from_args

    monkeypatch.setenv("KVDOCTOR_RETENTION_SECONDS", "120")
    monkeypatch.setenv("KVDOCTOR_POD", "from-env")
    settings = settings_from_args(exporter_parser().parse_args(["--retention", "60"]))
    assert (settings.retention_seconds, settings.pod) == (60.0, "from-env")


def test_help_names_each_variable():
    from kvdoctor.exporter.settings import options

    text = " ".join(exporter_parser().format_help().split())
    for option in options():
        if not option.is_collectors:
            assert f"env {option.env[0]}" in text, option.field
