"""kvdoctor grafana export: the dashboard JSON to stdout or a file; bad input is one line and exit 2."""

from __future__ import annotations

import json

import pytest

from kvdoctor.cli import main
from kvdoctor.rules.promql import record_name, rule_thresholds
from kvdoctor.rules.thresholds import Thresholds
from tests.grafana import board as B


def test_export_to_a_file_matches_the_committed_dashboard(tmp_path):
    out = tmp_path / "dashboard.json"
    assert main(["grafana", "export", "-o", str(out)]) == 0
    assert out.read_text() == B.COMMITTED.read_text()
    assert out.stat().st_mode & 0o044  # readable by others (a ConfigMap, a provisioning folder)
    assert [p.name for p in tmp_path.iterdir()] == ["dashboard.json"]  # no temporary file left


def test_export_replaces_an_existing_file_keeping_its_mode(tmp_path):
    out = tmp_path / "dashboard.json"
    out.write_text("old")
    out.chmod(0o640)
    assert main(["grafana", "export", "-o", str(out)]) == 0
    assert json.loads(out.read_text())["uid"] == "kvdoctor"
    assert out.stat().st_mode & 0o777 == 0o640


@pytest.mark.parametrize("dash", [[], ["-o", "-"]])
def test_export_to_stdout(dash, capsys):
    assert main(["grafana", "export", *dash]) == 0
    assert capsys.readouterr().out == B.COMMITTED.read_text()


def test_thresholds_interval_slo_and_runbooks_change_the_dashboard(tmp_path, capsys):
    th = tmp_path / "t.yaml"
    th.write_text("window_seconds: 120\nkv_ceiling_ratio: 0.95\n")
    base = "https://git.example.com/runbooks/"
    args = ["--thresholds", str(th), "--slo-ms", "50", "--scrape-interval", "5", "--runbook-base-url", base]
    assert main(["grafana", "export", *args]) == 0
    board = json.loads(capsys.readouterr().out)
    t = rule_thresholds(Thresholds(window_seconds=120, kv_ceiling_ratio=0.95), 5)
    exprs = [t.expr for t in B.targets(board)]
    assert any(e.startswith(record_name("kv_usage", t) + "{") for e in exprs)
    assert any(e.startswith(record_name("preemptions_per_minute", t) + "{") for e in exprs)
    assert any(e.endswith("or vector(0.05)") for e in exprs)
    assert [link["url"] for link in board["links"]] == [base]


# Bad flags (all shared with rules export): tests/test_cli_grammar.py, for both export verbs.
def test_a_directory_or_an_unwritable_place_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["grafana", "export", "-o", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    # /proc takes no new files, even from root: the write itself fails
    assert main(["grafana", "export", "-o", "/proc/kvdoctor-dashboard.json"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvdoctor grafana: error: cannot write /proc/kvdoctor-dashboard.json: ")
    assert err.count("\n") == 1


def test_the_real_command_line_fails_in_one_line(run_cli):
    rc, out, err = run_cli("grafana", "export", "-o", "/nonexistent-dir/dashboard.json")
    assert (rc, out) == (2, "")
    where = "/nonexistent-dir/dashboard.json"
    assert err == f"kvdoctor grafana: error: cannot write {where}: directory /nonexistent-dir does not exist\n"
