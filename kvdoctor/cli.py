"""The ``kvdoctor`` console script: a thin dispatcher over ``kvdoctor.commands.*``.

Each command module defines ``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``
(and may define ``DESCRIPTION``, with its examples, and ``WITHOUT_VARIABLE``, its flags no
environment variable stands for). The grammar every verb shares (flag names, variables, old
spellings) is ``kvdoctor/flags.py``'s.
Exit status, in every command: 0 healthy or idle (or done), 1 a slow verdict, 2 bad usage or input
(argparse's errors and a ``UsageError``), 3 a source that could not be read (a ``SourceUnreadable``)
or an internal error: any other exception is a bug, reported as one ``internal error`` line (the
traceback too when the environment sets ``KVDOCTOR_DEBUG``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Sequence
from importlib import import_module
from types import ModuleType

from kvdoctor import flags
from kvdoctor.commands import version
from kvdoctor.errors import EXIT_STATUS_HELP, EXIT_UNREADABLE, EXIT_USAGE, SourceUnreadable, UsageError
from kvdoctor.signals.collection import SourceError

# The verbs, in the order ``kvdoctor --help`` lists them: each is the module kvdoctor.commands.<verb>.
VERBS = ("demo", "exporter", "dashboard", "diagnose", "record", "ledger", "rules", "grafana", "stress", "version")


def command_modules(argv: Sequence[str] | None = None) -> list[ModuleType]:
    """The command modules a command line needs: only its verb's where it names one (a verb's module
    may import the exporter, the simulator or numpy: ``kvdoctor diagnose`` need not wait for the
    others to load), else every verb's (for ``kvdoctor --help`` and for a verb that does not exist)."""
    verb = next((a for a in argv or () if not a.startswith("-")), None)
    names = (verb,) if verb in VERBS else VERBS
    return [import_module(f"kvdoctor.commands.{name}") for name in names]


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every verb, or (given ``argv``) of the verb ``argv`` names alone."""
    parser = flags.Parser(
        prog="kvdoctor",
        description="Says why LLM decode is slow.\n\nexamples:\n  kvdoctor demo\n  kvdoctor diagnose --exporter "
        "http://127.0.0.1:9745",
        epilog=f"{EXIT_STATUS_HELP}\n\nEvery flag also reads an environment variable, named in each command's --help.",
    )
    parser.add_argument("--version", action="version", version=version.version_line(), help="print the version")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in command_modules(argv):
        description = getattr(module, "DESCRIPTION", module.HELP)
        p = sub.add_parser(
            module.NAME,
            help=module.HELP,
            description=description,
            epilog=None if "exit status" in description else getattr(module, "EXIT_STATUS", EXIT_STATUS_HELP),
        )
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
        actions = _action_parsers(p)
        for each in (p, *actions.values()):
            flags.bind(module.NAME, each, getattr(module, "WITHOUT_VARIABLE", ()))
        for name, child in actions.items():  # `kvdoctor rules --help` shows what `rules export` takes
            p.epilog = f"{p.epilog or ''}\n\n--- {p.prog} {name} ---\n{child.format_help()}".lstrip()
    return parser


def _action_parsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parsers of a verb's actions (``rules export``), by name."""
    return {
        name: child
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for name, child in action.choices.items()
    }


def parse_arguments(argv: list[str] | None = None, environ=None) -> argparse.Namespace:
    """The namespace ``kvdoctor ARGV`` runs with: the flags, over their environment variables."""
    argv = sys.argv[1:] if argv is None else argv
    return flags.parse(build_parser(argv), argv, environ)


def wants_json(argv: Sequence[str]) -> bool:
    """``--json`` among the flags (before any ``--``)."""
    for token in argv:
        if token == "--":
            return False
        if token == "--json":
            return True
    return False


def print_json_error(message: str, code: int) -> None:
    """The failure as the one JSON object ``--json`` promises on stdout (the line stays on stderr)."""
    line = message.strip()
    if line.startswith("kvdoctor"):  # the object holds the message, not who said it
        line = line.split(": ", 1)[-1]
    line = line.removeprefix("error: ")
    print(json.dumps({"error": line, "exit_code": code}), flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv == ["--version"]:  # answered before any verb's module (the web stack) is imported
        print(version.version_line())
        return 0
    as_json = wants_json(argv)
    try:
        args = parse_arguments(argv)
    except flags.Refused as refused:
        if as_json and refused.code:
            print_json_error(refused.line, int(refused.code))
        raise
    if not getattr(args, "_run", None):
        build_parser().print_help()
        return 2
    code, message = _run(args)
    if message is not None:
        print(f"kvdoctor {args.command}: {message}", file=sys.stderr)
        if as_json:
            print_json_error(message, code)
    return code


def _run(args: argparse.Namespace) -> tuple[int, str | None]:
    """The command's exit status, and the one line it failed with (None when it did not fail)."""
    try:
        return int(args._run(args) or 0), None
    except UsageError as exc:
        return EXIT_USAGE, f"error: {flags.blame(str(exc), args)}"
    except (SourceUnreadable, SourceError) as exc:  # an exporter, Prometheus or engine that cannot be read
        return EXIT_UNREADABLE, f"error: {exc}"
    except KeyboardInterrupt:
        return 130, None
    except BrokenPipeError:  # `kvdoctor diagnose | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0, None
    except Exception as exc:  # last resort: one line, never a traceback (unless asked for)
        if os.environ.get("KVDOCTOR_DEBUG"):
            traceback.print_exc(file=sys.stderr)
        message = " ".join(str(exc).split())
        return EXIT_UNREADABLE, f"internal error: {type(exc).__name__}: {message}".rstrip(": ").rstrip()
