"""kvdoctor version"""

from __future__ import annotations

NAME = "version"
HELP = "print the kvdoctor version"


def add_arguments(parser) -> None:
    pass


def run(args) -> int:
    from kvdoctor import __version__

    print(f"kvdoctor {__version__}")
    return 0
