"""One CLI grammar (#17): every verb's help walked, the shared flags spelled the same everywhere,
``--json`` wherever a result is printed, every flag's environment variable read (a flag wins) and a
bad value refused with one line and exit 2, and the old spellings still working with one warning.

Everything runs in this process (``kvdoctor.cli``); nothing here serves or connects for real: a
command whose input passes is pointed at a closed port or has its server start stubbed out."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvdoctor import cli, flag_tables, flags
from kvdoctor.commands import exporter as exporter_command
from kvdoctor.errors import UsageError
from tests.support import servers
from tests.support.cli import exit_status

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "tests/fixtures/traces/simulator-kv-thrashing.om"
VLLM_PAGE = sorted((ROOT / "tests/fixtures/vllm-0.32-cpu/fill-sequence").glob("*.txt"))[-1]
CLOSED = "http://127.0.0.1:9"  # discard: nothing listens there

# Every leaf command, by what it does with its result: a new verb must be put in one of them.
PRINTS_A_RESULT = {"diagnose", "record", "ledger", "stress", "version"}
SERVES = {"demo", "exporter", "dashboard"}  # runs until stopped: no result to print
WRITES_A_DOCUMENT = {"rules export", "grafana export"}  # the document is the output (YAML, JSON)
GROUPS = {"rules", "grafana"}  # hold an action, and show its flags in their help

# The one spelling of each thing, in every verb that takes it.
SPELLINGS = {
    "--engine-url": {"exporter", "record", "stress"},
    "--exporter": {"diagnose", "record", "stress", "dashboard"},
    "--prometheus": {"diagnose", "dashboard"},
    "--model": {"exporter", "diagnose", "ledger"},
    "--gpu-peak-bandwidth": {"exporter", "diagnose", "ledger"},
    "--slo-ms": {"demo", "exporter", "diagnose", "rules export", "grafana export"},
    "--scrape-interval": {"rules export", "grafana export"},
    "--thresholds": {"diagnose", "rules export", "grafana export"},
}
# Spellings that must not name a flag anywhere (the grammar's old or rejected names).
NOT_SPELLINGS = {"--endpoint", "--model-config", "--nvml", "--no-nvml", "--exporter-url", "--prometheus-url", "--url"}

# What each verb needs to parse (and, with a bad value, to get as far as refusing it).
MINIMAL = {
    "diagnose": [("--replay", str(TRACE))],
    "record": [("--exporter", CLOSED), ("--seconds", "1"), ("-o", "{tmp}/r.om")],
    "ledger": [("--model", "Llama-2-7B"), ("--gpu", "H100 SXM")],
    "stress": [("--engine-url", CLOSED), ("-o", "{tmp}/stress")],
    "exporter": [("--port", "0")],
    "dashboard": [("--exporter", CLOSED)],
}
# Flags that only go with another source than MINIMAL's.
WITH_PROMETHEUS = [("--prometheus", CLOSED)]
MINIMAL_FOR = {("diagnose", f): WITH_PROMETHEUS for f in ("--selector", "--namespace", "--limit")}
# Free text: no value is wrong (a name, a selector, an address).
FREE_TEXT = {
    ("exporter", "--pod"),
    ("exporter", "--served-model"),  # an engine's served name: an unknown one is said, never refused
    ("exporter", "--host"),
    ("dashboard", "--host"),
    ("diagnose", "--namespace"),
    ("stress", "--served-model-name"),
}
GOOD = ["http://127.0.0.1:9/metrics", "Llama-2-7B", "vllm", "all", "30s", "3", "2.5", "0.5", "64", "2048", "120"]
BAD = ["not-a-number", "maybe", "ftp://no where", "/nonexistent/kvdoctor-grammar", "-5", "70000", "0", "uuids:"]


def parsers() -> dict[str, argparse.ArgumentParser]:
    return flag_tables.verb_parsers(cli.build_parser())


def leaves() -> dict[str, argparse.ArgumentParser]:
    return {name: p for name, p in parsers().items() if name not in GROUPS}


def flag_actions(parser: argparse.ArgumentParser):
    for action in parser._actions:
        flag = flags.canonical_flag(action)
        if flag and not isinstance(action, argparse._SubParsersAction) and flag not in ("-h", "--help"):
            yield flag, action


def env_actions():
    return [
        pytest.param(verb, flag, id=f"{verb}:{flag}")
        for verb, parser in leaves().items()
        for flag, action in flag_actions(parser)
        if flags.variable_of(action)
    ]


class Run:
    """``kvdoctor ARGV`` in this process: exit status, stdout, stderr."""

    def __init__(self, argv: list[str]):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                self.rc = cli.main(argv)
            except SystemExit as exc:
                self.rc = exc.code if isinstance(exc.code, int) else 2
        self.out, self.err = out.getvalue(), err.getvalue()


def minimal_argv(verb: str, tmp_path: Path, leave_out: argparse.Action | None = None) -> list[str]:
    """``verb`` with what it needs, less ``leave_out`` and the members of its exclusive group."""
    parser = leaves()[verb]
    skip = set()
    if leave_out is not None:
        skip = set(leave_out.option_strings)
        for group in parser._mutually_exclusive_groups:
            if any(a.dest == leave_out.dest for a in group._group_actions):
                skip |= {s for a in group._group_actions for s in a.option_strings}
    argv = verb.split()
    needs = MINIMAL.get(verb, [])
    if leave_out is not None:
        needs = MINIMAL_FOR.get((verb, flags.canonical_flag(leave_out)), needs)
    for flag, value in needs:
        if flag not in skip:
            argv += [flag, value.format(tmp=tmp_path)]
    return argv


def action_of(verb: str, flag: str) -> argparse.Action:
    return dict(flag_actions(leaves()[verb]))[flag]


@pytest.fixture(autouse=True)
def nothing_serves(monkeypatch):
    """A command whose input all passed must not start serving: it ends here with status 3."""

    def refuse(*args, **kwargs):
        raise RuntimeError("would start serving")

    monkeypatch.setattr(exporter_command, "bind_socket", refuse)
    monkeypatch.setattr("kvdoctor.commands.demo.EngineServer", refuse)
    monkeypatch.setattr("kvdoctor.commands.dashboard.load_dashboard_app", _dashboard_that_never_serves)
    for name in list(__import__("os").environ):
        if name.startswith("KVDOCTOR_"):
            monkeypatch.delenv(name)


def _dashboard_that_never_serves(hint: str = ""):
    import kvdoctor.dashboard.app as app

    class NeverServes:
        DEFAULT_PORT, DEFAULT_HOST = app.DEFAULT_PORT, app.DEFAULT_HOST
        create_app = staticmethod(app.create_app)

        @staticmethod
        def serve_in_thread(*args, **kwargs):
            raise RuntimeError("would start serving")

    return NeverServes


# ---------------------------------------------------------------------------------- the help


def test_version_flag_and_verb_print_the_same_line():
    flag, verb = Run(["--version"]), Run(["version"])
    assert flag.rc == verb.rc == 0
    assert flag.out == verb.out and re.match(r"^kvdoctor \d+\.\d+\S* \(revision \S+, Python 3\.\d+", flag.out)
    info = json.loads(Run(["version", "--json"]).out)
    assert set(info) == {"version", "revision", "python"} and flag.out.startswith(f"kvdoctor {info['version']} ")


def test_the_top_help_lists_every_verb_and_the_version_flag():
    text = Run(["--help"]).out
    assert "--version" in text
    for verb in parsers():
        if " " not in verb:
            assert re.search(rf"^    {verb}\b", text, re.M), verb


def test_every_command_is_classified():
    assert set(leaves()) == PRINTS_A_RESULT | SERVES | WRITES_A_DOCUMENT


@pytest.mark.parametrize("verb", sorted(parsers()))
def test_each_help_lists_every_flag_with_an_example(verb):
    text = Run([*verb.split(), "--help"]).out
    assert re.search(r"^examples?:", text, re.M), text
    assert re.search(rf"^  (\S+=\S+ )?kvdoctor {verb}\b", text, re.M), f"no example of `kvdoctor {verb}`"
    listed, _, note = text.partition("deprecated spellings")
    for flag, action in flag_actions(parsers()[verb]):
        assert re.search(rf"(^|[\s,\[]){re.escape(flag)}\b", listed), flag
        for old in flags.deprecated_spellings(action):
            assert not re.search(rf"^\s+{re.escape(old)}[\s,]", listed, re.M), f"{old} is listed"
            assert f"{old} -> " in note


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_a_group_help_shows_its_actions_flags(group):
    text = Run([group, "--help"]).out
    for flag, _ in flag_actions(parsers()[f"{group} export"]):
        assert flag in text, flag
    assert f"kvdoctor {group} export" in text


def test_the_shared_flags_are_spelled_typed_and_named_the_same_everywhere():
    seen: dict[str, dict[str, tuple]] = {}
    for verb, parser in leaves().items():
        for flag, action in flag_actions(parser):
            assert flag not in NOT_SPELLINGS, (verb, flag)
            seen.setdefault(flag, {})[verb] = (action.metavar, flags.variable_of(action))
    for flag, verbs in SPELLINGS.items():
        assert verbs <= set(seen.get(flag, {})), (flag, verbs - set(seen.get(flag, {})))
    for flag, by_verb in seen.items():
        if flag == "--output":
            continue  # -o FILE, or -o DIR (stress writes a folder)
        metavars = {m for m, _ in by_verb.values()}
        assert len(metavars) == 1, (flag, by_verb)  # one metavar: --port PORT, --interval S, ...
        shared = flags.SHARED.get(flag)
        if shared is not None:
            assert metavars == {shared.metavar}, (flag, by_verb)
            assert {v for _, v in by_verb.values()} <= {shared.env, None}, (flag, by_verb)


def test_every_verb_that_prints_a_result_takes_json():
    for verb, parser in leaves().items():
        has_json = any(flag == "--json" for flag, _ in flag_actions(parser))
        assert has_json == (verb in PRINTS_A_RESULT), verb


def test_a_variable_is_named_after_its_flag_and_verb():
    for verb, parser in leaves().items():
        for flag, action in flag_actions(parser):
            env = flags.variable_of(action)
            if env is None or getattr(action, "env_read_by_settings", False) or flag in flags.SHARED:
                continue
            name = flag.removeprefix("--").upper().replace("-", "_").replace(".", "_")
            assert env == f"KVDOCTOR_{verb.split()[0].upper()}_{name}", (verb, flag, env)
            assert env in " ".join(Run([*verb.split(), "--help"]).out.split()), (verb, flag)


# ---------------------------------------------------------------------------------- variables


def _parse(argv: list[str], environ: dict[str, str]) -> argparse.Namespace:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        args = flags.parse(cli.build_parser(), argv, environ, stderr=err)
    return args


def _resolved(verb: str, args: argparse.Namespace, action: argparse.Action):
    """What the command will use: the namespace's value (the exporter's: its settings')."""
    if getattr(action, "env_read_by_settings", False):
        settings = exporter_command.settings_from_args(args)
        if action.dest.startswith("collector__"):
            return settings.collector_enabled(action.dest.removeprefix("collector__"))
        return getattr(settings, action.dest)
    return getattr(args, action.dest)


def _switch(action: argparse.Action, on: bool) -> list[str]:
    """The command line that sets switch ``action`` on or off (off: its --no- form, or nothing)."""
    flag = str(flags.canonical_flag(action))
    off = "--no-" + flag.removeprefix("--")
    return [flag] if on else ([off] if off in action.option_strings else [])


def _command_line_value(verb, action, tmp_path, value):
    """What ``--flag value`` (or the switch) resolves to; None if the command line refuses it."""
    base = minimal_argv(verb, tmp_path, action)
    given = _switch(action, value == "true") if flags._is_switch(action) else [flags.canonical_flag(action), value]
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            return _resolved(verb, _parse([*base, *given], {}), action)
    except (SystemExit, UsageError):
        return None


def _default(verb, action, tmp_path):
    """What the command uses when neither the flag nor its variable is given (None: it cannot run)."""
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            return _resolved(verb, _parse(minimal_argv(verb, tmp_path, action), {}), action)
    except (SystemExit, UsageError):
        return None


@pytest.mark.parametrize("verb, flag", env_actions())
def test_every_variable_sets_its_flag_and_the_flag_wins(verb, flag, tmp_path, monkeypatch):
    action = action_of(verb, flag)
    env = flags.variable_of(action)
    web = tmp_path / "web.yml"
    web.write_text("")
    candidates = ["false", "true"] if flags._is_switch(action) else [*(action.choices or []), *GOOD, str(web)]
    base = minimal_argv(verb, tmp_path, action)
    default = _default(verb, action, tmp_path)
    values = {str(c): _command_line_value(verb, action, tmp_path, str(c)) for c in candidates}
    usable = [c for c, v in values.items() if v is not None and v != default]
    assert usable, f"no value of {flag} found that {env} could set"
    value = usable[0]
    monkeypatch.setenv(env, value)  # the exporter's settings read the process environment
    assert _resolved(verb, _parse(base, {env: value}), action) == values[value], value
    other = next((c for c in usable if values[c] != values[value]), None)
    if other is not None and not flags._is_switch(action):  # the command line wins over the variable
        assert _resolved(verb, _parse([*base, flag, other], {env: value}), action) == values[other]


@pytest.mark.parametrize("verb, flag", env_actions())
def test_a_bad_value_in_a_variable_is_one_line_and_exit_2(verb, flag, tmp_path, monkeypatch):
    action = action_of(verb, flag)
    env = flags.variable_of(action)
    argv = minimal_argv(verb, tmp_path, action)
    if flags._is_switch(action):
        value = "perhaps"
    else:
        value = next((v for v in BAD if Run([*argv, flag, v]).rc == 2), None)
        if value is None:
            assert (verb, flag) in FREE_TEXT, f"no value {flag} refuses: declare it free text"
            return
        assert (verb, flag) not in FREE_TEXT, f"{flag} refuses {value!r}: it is not free text"
    monkeypatch.setenv(env, value)
    result = Run(argv)
    assert result.rc == 2, (value, result.rc, result.err)
    lines = [line for line in result.err.splitlines() if "DEPRECATED" not in line]
    assert len(lines) == 1 and "Traceback" not in result.err, result.err
    assert env in lines[0], lines[0]  # the line says which variable is wrong


# The export verbs share their flags, so they refuse bad input alike.
@pytest.mark.parametrize("verb", ["rules", "grafana"])
@pytest.mark.parametrize(
    "args, message",
    [
        ([], "missing action"),
        (["export", "--slo-ms", "0"], "--slo-ms: must be a positive number"),
        (["export", "--slo-ms", "inf"], "--slo-ms: must be a positive number"),
        (["export", "--scrape-interval", "0"], "--scrape-interval: not a positive duration"),
        (["export", "--scrape-interval", "often"], "--scrape-interval: not a duration"),
        (["export", "-o", "/nonexistent-dir/out"], "directory /nonexistent-dir does not exist"),
        (["export", "--thresholds", "/nonexistent.yaml"], "cannot read thresholds file"),
    ],
)
def test_the_export_verbs_refuse_bad_input_alike(verb, args, message, capsys):
    assert exit_status(cli.main, [verb, *args]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.err.count("\n") == 1
    assert captured.out == ""


def test_two_variables_for_one_exclusive_choice_are_refused(tmp_path):
    environ = {"KVDOCTOR_EXPORTER": CLOSED, "KVDOCTOR_PROMETHEUS": CLOSED}
    err = io.StringIO()
    with pytest.raises(SystemExit) as exited, contextlib.redirect_stderr(err):
        flags.parse(cli.build_parser(), ["diagnose"], environ, stderr=err)
    assert exited.value.code == 2
    assert "KVDOCTOR_EXPORTER and KVDOCTOR_PROMETHEUS are both set" in err.getvalue()
    args = _parse(["diagnose", "--replay", str(TRACE)], environ)  # the command line picks; no error
    assert (args.replay, args.exporter, args.prometheus) == (str(TRACE), None, None)


def test_a_variable_fills_a_required_flag():
    args = _parse(["ledger", "--gpu", "H100 SXM"], {"KVDOCTOR_MODEL": "Llama-2-7B"})
    assert args.model == "Llama-2-7B" and args._from_env == {"model": "KVDOCTOR_MODEL"}


def test_an_empty_variable_is_unset():
    assert _parse(["diagnose", "--replay", str(TRACE)], {"KVDOCTOR_TIMEOUT": ""}).timeout == 10.0


def test_the_variable_and_the_flag_reach_one_setting_from_the_process_environment(monkeypatch, capsys):
    """``parse`` without a mapping reads the process's environment (through pydantic-settings)."""
    replay = ["diagnose", "--replay", str(TRACE)]
    from_flag = _parse([*replay, "--timeout", "3.5"], {}).timeout
    monkeypatch.setenv("KVDOCTOR_TIMEOUT", "3.5")
    args = flags.parse(cli.build_parser(), replay, None, stderr=io.StringIO())
    assert args.timeout == from_flag == 3.5 and args._from_env == {"timeout": "KVDOCTOR_TIMEOUT"}
    monkeypatch.setenv("KVDOCTOR_TIMEOUT", "soon")
    assert exit_status(cli.main, replay) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "KVDOCTOR_TIMEOUT='soon'" in err and "--timeout" in err, err


# ---------------------------------------------------------------------------------- old spellings

# (verb, the command line before the flag, the old spelling, the new one, the flag's value)
OLD = [
    ("stress", [], "--endpoint", "--engine-url", CLOSED),
    ("stress", ["--engine-url", CLOSED], "--model", "--served-model-name", "m"),
    ("diagnose", ["--replay", str(TRACE)], "--model-config", "--model", "Llama-2-7B"),
    ("exporter", [], "--model-config", "--model", "Llama-2-7B"),
    ("exporter", [], "--no-nvml", "--no-collector.nvml", None),
    ("exporter", [], "--nvml", "--collector.nvml", None),
]


@pytest.mark.parametrize("verb, before, old, new, value", OLD, ids=[f"{o[0]}:{o[2]}" for o in OLD])
def test_an_old_spelling_still_works_with_one_deprecation_line(verb, before, old, new, value):
    given = [value] if value is not None else []
    err = io.StringIO()
    with_old = flags.parse(cli.build_parser(), [verb, *before, old, *given], {}, stderr=err)
    with_new = _parse([verb, *before, new, *given], {})
    assert {**vars(with_old), "_argv": None} == {**vars(with_new), "_argv": None}  # all but the words typed
    line = f"kvdoctor {verb}: DEPRECATED: use {new} (not {old}, which goes in the next release)"
    assert err.getvalue().splitlines() == [line]


@pytest.mark.parametrize(
    "verb, old, new",
    [
        ("exporter", "KVDOCTOR_MODEL_CONFIG", "KVDOCTOR_MODEL"),
        ("exporter", "KVDOCTOR_NVML", "KVDOCTOR_COLLECTOR_NVML"),
        ("dashboard", "KVDOCTOR_DASHBOARD_EXPORTER_URL", "KVDOCTOR_EXPORTER"),
    ],
)
def test_an_old_variable_still_works_with_one_deprecation_line(verb, old, new, monkeypatch):
    value = {"KVDOCTOR_NVML": "false", "KVDOCTOR_MODEL_CONFIG": "Llama-2-7B"}.get(old, CLOSED)
    monkeypatch.setenv(old, value)
    err = io.StringIO()
    args = flags.parse(cli.build_parser(), [verb], None, stderr=err)
    line = f"kvdoctor {verb}: DEPRECATED: use {new} (not {old}, which goes in the next release)"
    assert err.getvalue().splitlines() == [line]
    if verb == "exporter":
        settings = exporter_command.settings_from_args(args)
        assert settings.model_config_path == "Llama-2-7B" if "MODEL" in old else not settings.collector_enabled("nvml")
    else:
        assert args.exporter == CLOSED


# ---------------------------------------------------------------------------------- --json


def test_record_json_prints_its_summary(fake_server, tmp_path):
    server = fake_server({"/metrics": servers.respond(VLLM_PAGE.read_bytes())})
    out = tmp_path / "raw.om"
    url = server.url("/metrics")
    result = Run(["record", "--engine-url", url, "--seconds", "0.8", "--interval", "0.2", "-o", str(out), "--json"])
    assert result.rc == 0, result.err
    summary = json.loads(result.out)
    assert summary["output"] == str(out) and out.is_file()
    assert summary["snapshots"] >= 3 and summary["mode"] == "raw vllm /metrics" and summary["stopped_early"] is False
    assert "wrote" in result.err  # the human summary stays on stderr


# ------------------------------------------------------------------------- start-up: one verb loads


def test_each_verb_is_the_command_module_of_its_name():
    assert [module.NAME for module in cli.command_modules()] == list(cli.VERBS)


def test_a_command_line_loads_only_its_verbs_module():
    """`kvdoctor diagnose` (run by on-call, timed by the fleet benchmark) must not wait for the
    exporter's web stack or the simulator to import."""
    probe = (
        "import sys\n"
        "from kvdoctor import cli\n"
        "cli.parse_arguments(['diagnose', '--replay', 'trace.txt'])\n"
        "watched = ('kvdoctor.commands.', 'fastapi', 'kvdoctor.simulator')\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(watched))\n"
        "print(' '.join(loaded))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert "kvdoctor.commands.diagnose" in out
    assert not [m for m in out if m.startswith(("fastapi", "kvdoctor.simulator", "kvdoctor.commands.demo"))], out
    everything = cli.build_parser()
    assert set(flag_tables.verb_parsers(everything)) >= set(cli.VERBS)
