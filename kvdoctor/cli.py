"""The ``kvdoctor`` console script: a thin dispatcher over ``kvdoctor.commands.*``.

Each command module defines ``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``.
Exit status, in every command: 0 healthy or idle (or done), 1 a slow verdict, 2 bad usage or input
(argparse's errors and a ``UsageError``), 3 a source that could not be read (a ``SourceUnreadable``)
or an internal error: any other exception is a bug, reported as one ``internal error`` line (the
traceback too when the environment sets ``KVDOCTOR_DEBUG``).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

from kvdoctor.commands import dashboard, demo, diagnose, exporter, grafana, ledger, record, rules, stress, version
from kvdoctor.errors import EXIT_STATUS_HELP, EXIT_UNREADABLE, EXIT_USAGE, SourceUnreadable, UsageError
from kvdoctor.sources.http import SourceError

# Command modules, in the order ``kvdoctor --help`` lists them.
COMMANDS = (demo, exporter, dashboard, diagnose, record, ledger, rules, grafana, stress, version)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one clear line, not a usage dump
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kvdoctor", description="Says why LLM decode is slow.", epilog=EXIT_STATUS_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module in COMMANDS:
        description = getattr(module, "DESCRIPTION", module.HELP)
        p = sub.add_parser(
            module.NAME,
            help=module.HELP,
            description=description,
            epilog=None if "exit status" in description else EXIT_STATUS_HELP,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except UsageError as exc:
        print(f"kvdoctor {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (SourceUnreadable, SourceError) as exc:  # an exporter, Prometheus or engine that cannot be read
        print(f"kvdoctor {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_UNREADABLE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `kvdoctor diagnose | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:  # last resort: one line, never a traceback (unless asked for)
        if os.environ.get("KVDOCTOR_DEBUG"):
            traceback.print_exc(file=sys.stderr)
        message = " ".join(str(exc).split())
        print(
            f"kvdoctor {args.command}: internal error: {type(exc).__name__}: {message}".rstrip(": ").rstrip(),
            file=sys.stderr,
        )
        return EXIT_UNREADABLE
