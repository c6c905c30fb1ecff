"""kvdoctor version (also ``kvdoctor --version``)"""

from __future__ import annotations

import argparse
import json
import platform

from kvdoctor import __version__
from kvdoctor.exporter.accounting import build_revision

NAME = "version"
HELP = "print the kvdoctor version"
DESCRIPTION = """\
Print kvdoctor's version, the source revision it was built from and the Python running it (the
labels of the exporter's kvdoctor_build_info).

examples:
  kvdoctor version
  kvdoctor version --json
  kvdoctor --version
"""
EXIT_STATUS = "exit status: 0 printed, 2 a usage error (an unknown flag), 3 an internal error."


def version_info() -> dict[str, str]:
    return {"version": __version__, "revision": build_revision(), "python": platform.python_version()}


def version_line() -> str:
    info = version_info()
    return f"kvdoctor {info['version']} (revision {info['revision']}, Python {info['python']})"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object: version, revision, python")


def run(args: argparse.Namespace) -> int:
    print(json.dumps(version_info()) if args.json else version_line())
    return 0
