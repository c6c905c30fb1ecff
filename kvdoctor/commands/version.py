"""kvdoctor version"""

from __future__ import annotations

import argparse

from kvdoctor import __version__

NAME = "version"
HELP = "print the kvdoctor version"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    print(f"kvdoctor {__version__}")
    return 0
