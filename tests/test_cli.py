"""kvdoctor.cli.main: an unexpected exception in a command is one line on stderr and exit 1; a
missing optional extra is one line naming it and exit 2."""

from __future__ import annotations

import sys

import pytest

import kvdoctor.commands.version as version_command
from kvdoctor import cli
from kvdoctor.errors import UsageError


def _boom(args):
    raise RuntimeError("something broke\nacross two lines")


def test_unexpected_exception_is_one_line_and_exit_3(monkeypatch, capsys):
    monkeypatch.delenv("KVDOCTOR_DEBUG", raising=False)
    monkeypatch.setattr(version_command, "run", _boom)
    assert cli.main(["version"]) == 3  # an internal error: never 1, which means a slow verdict
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert lines == ["kvdoctor version: internal error: RuntimeError: something broke across two lines"], captured.err
    assert "Traceback" not in captured.err


def test_kvdoctor_debug_shows_the_traceback(monkeypatch, capsys):
    monkeypatch.setenv("KVDOCTOR_DEBUG", "1")
    monkeypatch.setattr(version_command, "run", _boom)
    assert cli.main(["version"]) == 3  # an internal error: never 1, which means a slow verdict
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "_boom" in err
    assert (
        err.strip().splitlines()[-1]
        == "kvdoctor version: internal error: RuntimeError: something broke across two lines"
    )


def test_usage_error_still_exits_2(monkeypatch, capsys):
    def bad(args):
        raise UsageError("bad input")

    monkeypatch.setattr(version_command, "run", bad)
    assert cli.main(["version"]) == 2
    assert capsys.readouterr().err.strip() == "kvdoctor version: error: bad input"


# ---------------------------------------------------------------- without the [dashboard] extra


@pytest.fixture
def without_dashboard_extra(monkeypatch):
    """As if ``pip install kvdoctor`` without ``[dashboard]``: importing dash fails, and the
    dashboard app (imported by earlier tests) is imported afresh."""
    import kvdoctor.dashboard

    monkeypatch.setitem(sys.modules, "dash", None)  # `import dash` raises ModuleNotFoundError
    monkeypatch.delitem(sys.modules, "kvdoctor.dashboard.app", raising=False)
    monkeypatch.delattr(kvdoctor.dashboard, "app", raising=False)


EXTRA_LINE = "the dashboard is not installed; install it with: pip install 'kvdoctor[dashboard]'"


@pytest.mark.parametrize("args", [[], ["--exporter", "http://127.0.0.1:9745"]], ids=["bare", "with-exporter"])
def test_dashboard_without_the_extra_names_it_in_one_line(without_dashboard_extra, capsys, args):
    assert cli.main(["dashboard", *args]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [f"kvdoctor dashboard: error: {EXTRA_LINE}"]


def test_demo_without_the_extra_names_it_before_starting_anything(without_dashboard_extra, capsys):
    assert cli.main(["demo", "--port", "0", "--status-every", "0"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [f"kvdoctor demo: error: {EXTRA_LINE} (or run the demo with --no-dashboard)"]


def test_a_missing_module_outside_the_extra_is_not_blamed_on_it(monkeypatch):
    import kvdoctor.dashboard
    from kvdoctor.commands.dashboard import load_dashboard_app

    monkeypatch.setitem(sys.modules, "kvdoctor.dashboard.sources", None)  # a bug of ours, not the extra
    monkeypatch.delitem(sys.modules, "kvdoctor.dashboard.app", raising=False)
    monkeypatch.delattr(kvdoctor.dashboard, "app", raising=False)
    with pytest.raises(ModuleNotFoundError):
        load_dashboard_app()
