"""kvdoctor.cli.main: an unexpected exception in a command is one line on stderr and exit 1."""

from __future__ import annotations

import kvdoctor.commands.version as version_command
from kvdoctor import cli


def _boom(args):
    raise RuntimeError("something broke\nacross two lines")


def test_unexpected_exception_is_one_line_and_exit_1(monkeypatch, capsys):
    monkeypatch.delenv("KVDOCTOR_DEBUG", raising=False)
    monkeypatch.setattr(version_command, "run", _boom)
    assert cli.main(["version"]) == 1
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert lines == ["kvdoctor version: internal error: RuntimeError: something broke across two lines"], captured.err
    assert "Traceback" not in captured.err


def test_kvdoctor_debug_shows_the_traceback(monkeypatch, capsys):
    monkeypatch.setenv("KVDOCTOR_DEBUG", "1")
    monkeypatch.setattr(version_command, "run", _boom)
    assert cli.main(["version"]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "_boom" in err
    assert (
        err.strip().splitlines()[-1]
        == "kvdoctor version: internal error: RuntimeError: something broke across two lines"
    )


def test_usage_error_still_exits_2(monkeypatch, capsys):
    def bad(args):
        raise cli.UsageError("bad input")

    monkeypatch.setattr(version_command, "run", bad)
    assert cli.main(["version"]) == 2
    assert capsys.readouterr().err.strip() == "kvdoctor version: error: bad input"
