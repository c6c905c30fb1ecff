"""The CLI's one grammar: the flags verbs share, every flag's environment variable, old spellings.

- **Shared flags** (``SHARED``) mean the same thing in every verb that has them and are spelled,
  typed and named in the environment the same way: ``--engine-url``, ``--exporter``,
  ``--prometheus``, ``--model`` (a model spec: config.json, folder, cached Hugging Face id or
  built-in name), ``--gpu``, ``--slo-ms``, ``--json``, ...
- **Every flag has a variable** where one makes sense (not ``-o``, ``--json``, ``--help`` and the
  like): a shared flag's is ``KVDOCTOR_<FLAG>`` in every verb, the exporter's own are its settings'
  (``exporter/settings.py``: ``KVDOCTOR_<FIELD>``, read and checked there), any other flag of verb
  VERB reads ``KVDOCTOR_<VERB>_<FLAG>``. ``bind`` names each in the flag's help; ``parse`` reads
  them through pydantic-settings (``sources/environment.py``, as the exporter and the dashboard
  read theirs) and checks each with its flag's own type, as the parser's defaults, so a flag on
  the command line wins. A value the flag would
  refuse is an error: one line, exit status 2. An empty variable counts as unset.
- **Old spellings** (``deprecate``) keep working for one release, hidden from the help but for one
  line at its end, and print one ``DEPRECATED: use X`` line on stderr when used.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NoReturn, TextIO

from kvdoctor.arguments import boolean
from kvdoctor.sources.environment import ENV_PREFIX, read_variables

# Flags no variable stands for: each run's own (a file to write, the output format, a one-off check).
WITHOUT_VARIABLE = frozenset({"-h", "--help", "-o", "--output", "--json", "--check", "--list-gpus", "--version"})


@dataclass(frozen=True)
class Shared:
    """A flag with one meaning in every verb that takes it."""

    flag: str
    metavar: str | None
    meaning: str

    @property
    def env(self) -> str | None:
        """``KVDOCTOR_<FLAG>``; None for a per-invocation choice (``WITHOUT_VARIABLE``)."""
        return None if self.flag in WITHOUT_VARIABLE else variable_name(ENV_PREFIX, self.flag)


def variable_name(prefix: str, flag: str) -> str:
    """The environment variable for ``flag``: ``--engine-url`` -> ``<prefix>ENGINE_URL``."""
    return prefix + flag.removeprefix("--").upper().replace("-", "_").replace(".", "_")


SHARED: dict[str, Shared] = {
    s.flag: s
    for s in (
        Shared("--engine-url", "URL", "the inference engine (its /metrics; stress: its API)"),
        Shared("--exporter", "URL", "a running kvdoctor exporter"),
        Shared("--prometheus", "URL", "a Prometheus (or compatible) scraping exporters"),
        Shared(
            "--model",
            "MODEL",
            "the model: a config.json, a model folder, a cached Hugging Face id or a built-in name",
        ),
        Shared("--gpu", "NAME", "the GPU: its NVML device name or a short name meaning one GPU (H100 SXM)"),
        Shared("--gpu-peak-bandwidth", "BYTES_PER_S", "one GPU's peak DRAM bandwidth"),
        Shared("--slo-ms", "MS", "the per-token latency (ITL p95) SLO in milliseconds"),
        Shared("--thresholds", "FILE", "a YAML file overriding the decision tree's thresholds"),
        Shared("--scrape-interval", "DURATION", "Prometheus' scrape interval"),
        Shared("--runbook-base-url", "URL", "where the alerts' runbooks are"),
        Shared("--dashboard-base-url", "URL", "the dashboard's external address"),
        Shared("--timeout", "S", "seconds to wait for a source's answer"),
        Shared("--engine", "NAME", "the engine adapter (vllm, sglang, ...)"),
        Shared("--json", None, "one JSON object on stdout instead of text"),
    )
}

# Old variable -> (its replacement, the verbs that read it): read for one release, with a warning.
DEPRECATED_VARIABLES: dict[str, tuple[str, tuple[str, ...]]] = {
    "KVDOCTOR_MODEL_CONFIG": ("KVDOCTOR_MODEL", ("exporter",)),
    "KVDOCTOR_MODEL_CONFIG_PATH": ("KVDOCTOR_MODEL", ("exporter",)),
    "KVDOCTOR_NVML": ("KVDOCTOR_COLLECTOR_NVML", ("exporter",)),
    "KVDOCTOR_DASHBOARD_EXPORTER_URL": ("KVDOCTOR_EXPORTER", ("dashboard",)),
    "KVDOCTOR_DASHBOARD_PROMETHEUS_URL": ("KVDOCTOR_PROMETHEUS", ("dashboard",)),
}

# ------------------------------------------------------------------------------ declaring flags


def add(parser: Any, flag: str, *names: str, **kwargs: Any) -> argparse.Action:
    """Adds shared flag ``flag`` (and old ``names``, deprecated) with its shared metavar."""
    shared = SHARED[flag]
    if shared.metavar and kwargs.get("action") is None:
        kwargs.setdefault("metavar", shared.metavar)
    action: argparse.Action = parser.add_argument(flag, *names, **kwargs)
    if names:
        deprecate(action, *names)
    return action


def deprecate(action: argparse.Action, *old: str) -> argparse.Action:
    """Marks ``old`` spellings of ``action`` (already among its option strings) as deprecated."""
    missing = [name for name in old if name not in action.option_strings]
    if missing:
        raise ValueError(f"{missing} are not spellings of {action.option_strings}")
    marked = dict(getattr(action, "deprecated", {}))
    canonical = next(s for s in action.option_strings if s not in old)
    for name in old:
        marked[name] = _replacement(name, canonical)
    action.deprecated = marked  # type: ignore[attr-defined]
    return action


def _replacement(old: str, canonical: str) -> str:
    """``--no-nvml`` is replaced by ``--no-collector.nvml``; anything else by the canonical flag."""
    if old.startswith("--no-") and not canonical.startswith("--no-"):
        return "--no-" + canonical.removeprefix("--")
    return canonical


def deprecated_spellings(action: argparse.Action) -> dict[str, str]:
    return dict(getattr(action, "deprecated", {}))


def canonical_flag(action: argparse.Action) -> str | None:
    """The long flag the help shows first (``--engine-url``), None for a positional."""
    old = deprecated_spellings(action)
    shown = [s for s in action.option_strings if s not in old]
    long = [s for s in shown if s.startswith("--") and not s.startswith("--no-")]
    return (long or shown or [None])[0]


def variable_of(action: argparse.Action) -> str | None:
    return getattr(action, "env", None)


def bind(verb: str, parser: argparse.ArgumentParser, without: Sequence[str] = ()) -> None:
    """Names each flag's variable in its help, and the deprecated spellings at the end of the help.

    ``without``: more flags of this verb no variable stands for. A flag that already names its
    variable (the exporter's, from its settings) keeps it."""
    prefix = f"{ENV_PREFIX}{verb.upper().replace('-', '_')}_"
    old_lines = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            continue
        flag = canonical_flag(action)
        if flag is None:
            continue
        for old, new in deprecated_spellings(action).items():
            old_lines.append(f"  {old} -> {new}")
        if getattr(action, "env", None) is not None or flag in WITHOUT_VARIABLE or flag in without:
            continue
        if action.help == argparse.SUPPRESS or (action.nargs == 0 and not _is_switch(action)):
            continue
        shared = SHARED.get(flag)
        env = shared.env if shared else variable_name(prefix, flag)
        if env is None:
            continue
        action.env = env  # type: ignore[attr-defined]
        if action.help and env not in action.help:
            action.help = _with_variable(action.help, env)
    if old_lines:
        note = "deprecated spellings (they still work for one release, with a warning):\n" + "\n".join(old_lines)
        parser.epilog = f"{parser.epilog}\n\n{note}" if parser.epilog else note


def _with_variable(help_text: str, env: str) -> str:
    """``... (default 5)`` -> ``... (default 5; env X)``; else ``... (env X)``."""
    default = re.search(r"\((default[^()]*)\)$", help_text)
    if default:
        return f"{help_text[: default.start()]}({default.group(1)}; env {env})"
    return f"{help_text} (env {env})"


def _is_switch(action: argparse.Action) -> bool:
    return isinstance(action, argparse.BooleanOptionalAction) or (
        action.nargs == 0 and isinstance(action.const, bool) and isinstance(action.default, bool)
    )


# ------------------------------------------------------------------------------ parsing


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs as written (they hold examples and tables)."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, whose help and usage leave the deprecated
    spellings out (but for the note at the end), and which takes no abbreviated flags (an
    abbreviation would become ambiguous when a flag is added, and hides which flag was meant)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:  # one clear line, not a usage dump
        self.exit(2, f"{self.prog}: error: {_plain(message)}\n")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        """Ends parsing: ``message`` on stderr, then ``Refused`` (a ``SystemExit``) carrying it, so
        the caller can also print it as JSON where ``--json`` was asked for."""
        if message:
            sys.stderr.write(message)
        raise Refused(status, (message or "").strip())

    def format_usage(self) -> str:
        with _without_old_spellings(self):
            return super().format_usage()

    def format_help(self) -> str:
        with _without_old_spellings(self):
            return super().format_help()


class Refused(SystemExit):
    """argparse ended the command line: ``code`` its exit status, ``line`` what it printed."""

    def __init__(self, code: int, line: str = "") -> None:
        super().__init__(code)
        self.line = line


def _plain(message: str) -> str:
    """argparse's wording, said the way kvdoctor's other errors are."""
    choice = re.match(r"argument (\S+?)(?:/\S+)?: invalid choice: '(.*)' \(choose from (.*)\)$", message, re.S)
    if choice:  # "argument COMMAND: invalid choice: 'diagnos' (...)" -> "unknown command 'diagnos'; did you mean ..."
        what, given, options = choice.groups()
        return unknown_choice(what, given, re.findall(r"'([^']*)'", options))
    found = re.match(r"argument (\S+?)(?:/\S+)?: (.*)$", message, re.S)
    if found:  # "argument --timeout: must be ..." -> "--timeout must be ..."
        flag, rest = found.groups()
        return f"{flag}: {rest}"
    return message


def unknown_choice(what: str, given: str, names: Sequence[str]) -> str:
    """ "unknown command 'diagnsoe'; did you mean 'diagnose'? (choose from ...)": ``what`` is the
    subcommand's metavar (COMMAND, ACTION) or its name."""
    guess = difflib.get_close_matches(given, names, n=1, cutoff=0.6)
    kind = what.lower() if what.isupper() else what
    hint = f"; did you mean {guess[0]!r}?" if guess else ""
    return f"unknown {kind} {given!r}{hint} (choose from {', '.join(names)})"


def unknown_flag(parser: argparse.ArgumentParser, argv: Sequence[str]) -> str | None:
    """The first verb or flag of ``argv`` that neither ``parser`` nor the verbs it chooses know,
    said as "unknown command 'diagnsoe'; did you mean 'diagnose'?" or "unknown flag --exproter; did
    you mean --exporter?": a misspelt verb is named whatever flags follow it, and a misspelt flag
    before argparse would complain about a required flag the misspelling was meant to be; None
    when every verb and flag is known."""
    current = parser
    known = dict(parser._option_string_actions)
    takes_value = False
    for token in argv:
        if token == "--":
            return None
        if takes_value:
            takes_value = False
            continue
        sub = next((a for a in current._actions if isinstance(a, argparse._SubParsersAction)), None)
        if sub is not None and token in sub.choices:
            current = sub.choices[token]
            known = dict(current._option_string_actions)
            continue
        if sub is not None and not token.startswith("-"):  # where a verb (or an action) must come
            return f"{current.prog}: error: {unknown_choice(str(sub.metavar or sub.dest), token, list(sub.choices))}"
        if not token.startswith("-") or token == "-" or _NUMBER.match(token):
            continue
        name = token.split("=", 1)[0]
        action = known.get(name)
        if action is None and not name.startswith("--"):
            action = known.get(name[:2])  # -oFILE
            if action is not None:
                continue
        if action is None:
            shown = [s for a in current._actions for s in a.option_strings if s not in deprecated_spellings(a)]
            guess = difflib.get_close_matches(name, shown, n=1, cutoff=0.6)
            hint = f"; did you mean {guess[0]}?" if guess else f"; see: {current.prog} --help"
            return f"{current.prog}: unknown flag {name}{hint}"
        takes_value = "=" not in token and action.nargs is None and bool(action.option_strings)
    return None


_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+(e[+-]?\d+)?$", re.I)


@contextmanager
def _without_old_spellings(parser: argparse.ArgumentParser) -> Iterator[None]:
    saved = []
    for action in parser._actions:
        old = deprecated_spellings(action)
        if old:
            saved.append((action, action.option_strings))
            action.option_strings = [s for s in action.option_strings if s not in old]
    try:
        yield
    finally:
        for action, strings in saved:
            action.option_strings = strings


def chosen_parsers(root: argparse.ArgumentParser, argv: Sequence[str]) -> list[tuple[str, argparse.ArgumentParser]]:
    """The (name, parser) chain ``argv`` selects: the verb's, then its action's (``rules export``)."""
    chain: list[tuple[str, argparse.ArgumentParser]] = []
    parser = root
    tokens = list(argv)
    while True:
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if sub is None:
            return chain
        chosen = next((i for i, t in enumerate(tokens) if t in sub.choices), None)
        if chosen is None or any(t == "--" for t in tokens[:chosen]):
            return chain
        name = tokens[chosen]
        parser = sub.choices[name]
        chain.append((name, parser))
        tokens = tokens[chosen + 1 :]


def given_on_command_line(action: argparse.Action, argv: Sequence[str]) -> bool:
    strings = set(action.option_strings)
    for token in argv:
        if token == "--":
            return False
        if token.split("=", 1)[0] in strings:
            return True
    return False


def parse(
    root: argparse.ArgumentParser,
    argv: Sequence[str],
    environ: Mapping[str, str] | None = None,
    stderr: TextIO | None = None,
) -> argparse.Namespace:
    """``root.parse_args(argv)`` with the chosen verb's variables as its defaults (a bad value: one
    line, exit 2) and one DEPRECATED line per old spelling used. The variables are read from
    ``environ`` (None: the process's environment) by pydantic-settings (``read_variables``). The
    namespace's ``_from_env`` maps each destination a variable set to that variable, and ``_argv``
    holds ``argv`` (for a command that tells how to run it again)."""
    err = stderr or sys.stderr
    unknown = unknown_flag(root, argv)
    if unknown:
        root.exit(2, unknown + "\n")
    chain = chosen_parsers(root, argv)
    verb = chain[0][0] if chain else ""
    from_env: dict[str, str] = {}
    for _, parser in chain:
        from_env.update(_apply_environment(parser, verb, argv, environ, err))
        _warn_deprecated_flags(parser, argv, err)
    args = root.parse_args(argv)
    args._from_env = from_env
    args._argv = list(argv)
    return args


def _warn_deprecated_flags(parser: argparse.ArgumentParser, argv: Sequence[str], err: TextIO) -> None:
    old = {name: new for action in parser._actions for name, new in deprecated_spellings(action).items()}
    warned = set()
    for token in argv:
        if token == "--":
            break
        name = token.split("=", 1)[0]
        if name in old and name not in warned:
            warned.add(name)
            err.write(f"{parser.prog}: DEPRECATED: use {old[name]} (not {name}, which goes in the next release)\n")


def _variables(parser: argparse.ArgumentParser, verb: str) -> dict[str, list[str]]:
    """Each variable this parser reads -> [it, then its deprecated names]."""
    names: dict[str, list[str]] = {}
    for action in parser._actions:
        env = variable_of(action)
        if env:
            names[env] = [env]
    for old, (new, verbs) in DEPRECATED_VARIABLES.items():
        if new in names and verb in verbs:
            names[new].append(old)
    return names


def _apply_environment(
    parser: argparse.ArgumentParser,
    verb: str,
    argv: Sequence[str],
    environ: Mapping[str, str] | None,
    err: TextIO,
) -> dict[str, str]:
    names = _variables(parser, verb)
    env = read_variables((name for spellings in names.values() for name in spellings), environ)
    groups = {id(a): g for g in parser._mutually_exclusive_groups for a in g._group_actions}
    given = {id(a) for a in parser._actions if a.option_strings and given_on_command_line(a, argv)}
    defaults: dict[str, Any] = {}
    from_env: dict[str, str] = {}
    set_in_group: dict[int, list[tuple[argparse.Action, str]]] = {}
    for action in parser._actions:
        var = variable_of(action)
        if not var:
            continue
        found = [(n, env[n]) for n in names[var] if n in env]
        for old, _ in found:
            if old != var:
                err.write(f"{parser.prog}: DEPRECATED: use {var} (not {old}, which goes in the next release)\n")
        if not found or getattr(action, "env_read_by_settings", False):
            continue
        name, raw = found[0]
        group = groups.get(id(action))
        if id(action) in given or (group is not None and any(id(a) in given for a in group._group_actions)):
            continue  # the command line wins, over this flag and over the others of its group
        value = _convert(parser, action, name, raw)
        defaults[action.dest] = value
        from_env[action.dest] = name
        action.required = False
        if group is not None:
            set_in_group.setdefault(id(group), []).append((action, name))
    for members in set_in_group.values():
        if len(members) > 1:
            names_text = " and ".join(n for _, n in members)
            flags_text = ", ".join(canonical_flag(a) or "" for a, _ in members)
            parser.exit(2, f"{parser.prog}: error: {names_text} are both set: give one of {flags_text}\n")
        groups[id(members[0][0])].required = False
    if defaults:
        parser.set_defaults(**defaults)
    return from_env


def _convert(parser: argparse.ArgumentParser, action: argparse.Action, name: str, raw: str) -> Any:
    flag = canonical_flag(action)
    try:
        if _is_switch(action):
            on = boolean(raw)
            if isinstance(action, argparse.BooleanOptionalAction):
                return on
            return action.const if on else action.default
        value = action.type(raw) if callable(action.type) else raw  # type: ignore[misc]
    except argparse.ArgumentTypeError as exc:
        parser.exit(2, f"{parser.prog}: error: {name}={raw!r}: {flag} {exc}\n")
    except (TypeError, ValueError):
        kind = getattr(action.type, "__name__", "value")
        parser.exit(2, f"{parser.prog}: error: {name}={raw!r}: {flag} needs {kind} value\n")
    if action.choices is not None and value not in action.choices:
        choices = ", ".join(map(str, action.choices))
        parser.exit(2, f"{parser.prog}: error: {name}={raw!r}: {flag} must be one of {choices}\n")
    return value


def blame(message: str, args: argparse.Namespace) -> str:
    """``message`` with the variable named, where it is about a flag whose value came from one (it
    names the flag, or quotes the value)."""
    for dest, var in (getattr(args, "_from_env", None) or {}).items():
        value = getattr(args, dest, None)
        quoted = isinstance(value, str) and value.strip() and value.strip() in message
        if var not in message and ("--" + dest.replace("_", "-") in message or quoted):
            return f"{message} (from {var})"
    return message
