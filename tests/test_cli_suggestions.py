"""What the CLI suggests is right: a misspelt verb is named whatever follows it, a ``--check`` never
suggests overwriting a file another export wrote, and every verb checks a URL the same way."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from kvdoctor import cli
from kvdoctor.output import written_by

ROOT = Path(__file__).resolve().parents[1]
RULES_FILE = ROOT / "rules/alerts.yaml"
GRAFANA_FILE = ROOT / "grafana/kvdoctor-dashboard.json"
VERBS = ", ".join(cli.VERBS)


class Run:
    """``kvdoctor ARGV`` in this process: exit status, stdout, stderr's lines."""

    def __init__(self, *argv: object):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                self.rc = cli.main([str(a) for a in argv])
            except SystemExit as exc:
                self.rc = exc.code if isinstance(exc.code, int) else 2
        self.out, self.lines = out.getvalue(), err.getvalue().splitlines()


@pytest.fixture(autouse=True)
def no_variables(monkeypatch):
    for name in list(__import__("os").environ):
        if name.startswith("KVDOCTOR_"):
            monkeypatch.delenv(name)


# ------------------------------------------------------------------ a misspelt verb


@pytest.mark.parametrize(
    "argv",
    [
        ["diagnsoe"],
        ["diagnsoe", "--exporter", "http://127.0.0.1:9"],
        ["diagnsoe", "--prometheus", "http://127.0.0.1:9", "--selector", '{pod="x"}'],
        ["diagnsoe", "-o", "x.om", "--exporter=http://127.0.0.1:9"],
    ],
)
def test_a_misspelt_verb_is_corrected_whatever_flags_follow_it(argv):
    ran = Run(*argv)
    assert ran.rc == 2 and ran.out == ""
    assert ran.lines == [f"kvdoctor: error: unknown command 'diagnsoe'; did you mean 'diagnose'? (choose from {VERBS})"]


def test_a_misspelt_verb_with_json_is_corrected_in_the_json_too():
    ran = Run("diagnsoe", "--exporter", "http://127.0.0.1:9", "--json")
    answer = json.loads(ran.out)
    assert ran.rc == 2 and answer["exit_code"] == 2
    assert answer["error"].startswith("unknown command 'diagnsoe'; did you mean 'diagnose'?")
    assert "--version" not in answer["error"]


def test_a_misspelt_action_is_corrected_whatever_flags_follow_it():
    ran = Run("rules", "exprot", "--check", "-o", RULES_FILE)
    assert ran.rc == 2
    assert ran.lines == ["kvdoctor rules: error: unknown action 'exprot'; did you mean 'export'? (choose from export)"]


def test_a_word_like_no_verb_gets_no_guess():
    assert Run("frobnicate", "--json").lines == [f"kvdoctor: error: unknown command 'frobnicate' (choose from {VERBS})"]


def test_a_misspelt_flag_of_a_known_verb_is_still_corrected_as_a_flag():
    ran = Run("diagnose", "--exproter", "http://127.0.0.1:9")
    assert ran.rc == 2 and ran.lines == ["kvdoctor diagnose: unknown flag --exproter; did you mean --exporter?"]


# ------------------------------------------------------------------ --check names the right export


def test_the_committed_documents_are_known_by_who_wrote_them():
    assert written_by(RULES_FILE.read_text()) == "kvdoctor rules export"
    assert written_by(GRAFANA_FILE.read_text()) == "kvdoctor grafana export"
    assert written_by("{}") == "kvdoctor grafana export"
    assert written_by("groups: []\n") == "kvdoctor rules export"
    for other in ("", "notes\n", "[1, 2]", "{not json"):
        assert written_by(other) is None, other


@pytest.mark.parametrize(
    "argv, line",
    [
        (
            ["rules", "export", "--check", "-o", "{grafana}"],
            "kvdoctor rules: error: {grafana} holds a Grafana dashboard, not Prometheus rules; "
            "check it with: kvdoctor grafana export --check -o {grafana}",
        ),
        (  # the flags both exports take go with the suggestion; the rules' own (--dashboard-base-url) do not
            [
                "rules",
                "export",
                "--check",
                "--slo-ms",
                "50",
                "--dashboard-base-url",
                "http://d.example/",
                "-o",
                "{grafana}",
            ],
            "kvdoctor rules: error: {grafana} holds a Grafana dashboard, not Prometheus rules; "
            "check it with: kvdoctor grafana export --check --slo-ms 50 -o {grafana}",
        ),
        (
            ["grafana", "export", "--check", "--scrape-interval=1m", "-o", "{rules}"],
            "kvdoctor grafana: error: {rules} holds Prometheus rules, not a Grafana dashboard; "
            "check it with: kvdoctor rules export --check --scrape-interval=1m -o {rules}",
        ),
        (
            ["rules", "export", "--check", "-o", "{notes}"],
            "kvdoctor rules: error: {notes} holds no Prometheus rules: give -o the file kvdoctor rules export wrote",
        ),
    ],
)
def test_check_on_a_file_another_export_wrote_never_suggests_overwriting_it(argv, line, tmp_path):
    files = {"grafana": tmp_path / "dash.json", "rules": tmp_path / "alerts.yaml", "notes": tmp_path / "notes.txt"}
    files["grafana"].write_text(GRAFANA_FILE.read_text())
    files["rules"].write_text(RULES_FILE.read_text())
    files["notes"].write_text("what happened at 3 a.m.\n")
    before = {name: path.read_text() for name, path in files.items()}
    ran = Run(*(a.format(**files) for a in argv))
    assert ran.rc == 2 and ran.lines == [line.format(**files)]
    assert {name: path.read_text() for name, path in files.items()} == before


def test_check_on_a_stale_file_regenerates_it_with_the_flags_it_was_checked_with(tmp_path):
    stale = tmp_path / "alerts.yaml"
    stale.write_text(RULES_FILE.read_text())
    ran = Run("rules", "export", "--check", "--slo-ms", "50", "--scrape-interval", "30s", "-o", stale)
    assert ran.rc == 1
    assert ran.lines == [
        f"{stale} is out of date; regenerate it with: "
        f"kvdoctor rules export --slo-ms 50 --scrape-interval 30s -o {stale}"
    ]
    regenerated = Run("rules", "export", "--slo-ms", "50", "--scrape-interval", "30s", "-o", stale)
    assert regenerated.rc == 0
    assert Run("rules", "export", "--check", "--slo-ms", "50", "--scrape-interval", "30s", "-o", stale).rc == 0


# ------------------------------------------------------------------ one URL check in every verb

# Each verb's URL flags, with what the verb needs besides to get as far as checking them.
URL_FLAGS = [
    (["dashboard"], "--exporter"),
    (["dashboard"], "--prometheus"),
    (["diagnose"], "--exporter"),
    (["diagnose"], "--prometheus"),
    (["record", "-o", "{tmp}/r.om"], "--exporter"),
    (["record", "-o", "{tmp}/r.om"], "--engine-url"),
    (["stress", "-o", "{tmp}/stress"], "--engine-url"),
    (["exporter", "--port", "0"], "--engine-url"),
]


@pytest.mark.parametrize("verb, flag", URL_FLAGS, ids=[f"{v[0]} {f}" for v, f in URL_FLAGS])
def test_every_verb_refuses_a_url_without_a_scheme_alike(verb, flag, tmp_path):
    argv = [a.format(tmp=tmp_path) for a in verb]
    ran = Run(*argv, flag, "127.0.0.1:9745")
    assert ran.rc == 2 and len(ran.lines) == 1, ran.lines
    assert ran.lines[0].startswith(f"kvdoctor {verb[0]}: error: {flag}")
    assert ran.lines[0].endswith(
        "needs an http(s) URL such as http://host:port, got '127.0.0.1:9745' (did you mean 'http://127.0.0.1:9745'?)"
    )


def test_the_dashboards_variable_is_checked_as_its_flag(monkeypatch):
    monkeypatch.setenv("KVDOCTOR_EXPORTER", "exporter:9745")
    ran = Run("dashboard")
    assert ran.rc == 2 and len(ran.lines) == 1
    assert ran.lines[0].startswith("kvdoctor dashboard: error: KVDOCTOR_EXPORTER='exporter:9745': --exporter needs")
