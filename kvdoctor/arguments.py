"""Argument values a verb checks itself, in its own words: a number within bounds, and the
thresholds of ``--thresholds FILE``. (``kvdoctor/flags.py`` has the value types every verb shares.)"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeVar

from kvdoctor.errors import UsageError
from kvdoctor.rules.thresholds import Thresholds

N = TypeVar("N", int, float)


def checked(text: str, kind: Callable[[str], N], what: str, ok: Callable[[N], bool], bounds: str) -> N:
    """``kind(text)`` (not stripped): "must be WHAT" if it is not one, "must be BOUNDS" unless ``ok``."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"must be {bounds}, got {text!r}")
    return value


def read_thresholds(path: str | None) -> Thresholds:
    """The thresholds of ``--thresholds FILE`` (the defaults without one); a bad file: UsageError."""
    if not path:
        return Thresholds()
    try:
        return Thresholds.from_yaml(path)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
