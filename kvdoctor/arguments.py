"""Argument values a verb checks itself, in its own words: a number within bounds, and the
thresholds of ``--thresholds FILE``; and the value types every verb shares (``kvdoctor/flags.py``
declares the flags that use them)."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from typing import TypeVar

from kvdoctor.errors import UsageError
from kvdoctor.rules.promql import parse_duration
from kvdoctor.rules.thresholds import Thresholds
from kvdoctor.sources.thresholds_file import load_thresholds
from kvdoctor.sources.urls import UrlError, split_http_url

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


def _figure(value: float) -> str:
    """A bound as people write it: 3,600 and 1e+15 alike readable."""
    if value >= 1e7:
        return f"{value:.0e}".replace("e+0", "e").replace("e+", "e")
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:g}"


def ranged(
    kind: Callable[[str], N], low: float, high: float, unit: str = "", *, low_open: bool = True
) -> Callable[[str], N]:
    """An argparse type: a number of ``kind`` within ``low`` (excluded where ``low_open``) and
    ``high``; anything else, infinities and overflows included, is "must be between LOW and HIGH
    UNIT, got '...'" (argparse names the flag in front of it)."""
    what = "a whole number" if kind is int else "a number"
    span = f"{'more than' if low_open else 'from'} {_figure(low)} up to {_figure(high)}{' ' + unit if unit else ''}"

    def parse(text: str) -> N:
        try:
            value = kind(text.strip())
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"must be {what} {span}, got {text!r}") from None
        if not math.isfinite(value) or value > high or value < low or (low_open and value == low):
            raise argparse.ArgumentTypeError(f"must be {span}, got {text!r}")
        return value

    parse.__name__ = f"{kind.__name__}_in_range"
    return parse


MAX_TIMEOUT_SECONDS = 3600.0
timeout_seconds = ranged(float, 0, MAX_TIMEOUT_SECONDS, "seconds")  # ``--timeout``'s type


def check_timeout(seconds: float) -> None:
    """``--timeout`` once more after parsing: a value read from a variable is checked here too."""
    if not 0 < seconds <= MAX_TIMEOUT_SECONDS:
        raise UsageError(f"--timeout must be more than 0 up to {MAX_TIMEOUT_SECONDS:,.0f} seconds, got {seconds:g}")


def one_of(values: tuple[int, ...], why: str) -> Callable[[str], int]:
    """An argparse type: a whole number among ``values`` ("must be 1, 8, ... (WHY), got '7'")."""
    listed = ", ".join(map(str, values[:-1])) + f" or {values[-1]}"

    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            value = None
        if value not in values:
            raise argparse.ArgumentTypeError(f"must be {listed} ({why}), got {text!r}")
        return value

    parse.__name__ = "one_of"
    return parse


def read_thresholds(path: str | None) -> Thresholds:
    """The thresholds of ``--thresholds FILE`` (the defaults without one); a bad file: UsageError."""
    if not path:
        return Thresholds()
    try:
        return load_thresholds(path)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def boolean(text: str) -> bool:
    """true/false, 1/0, yes/no, on/off (any case)."""
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"must be true or false, got {text!r}")


def _number(text: str, kind: Callable[[str], float], what: str) -> float:
    try:
        value = kind(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
    return value


def positive_float(text: str) -> float:
    value = _number(text, float, "a positive number")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    value = _number(text, float, "a number >= 0")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return value


def positive_int(text: str) -> int:
    value = int(_number(text, int, "a positive integer"))
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def integer(text: str) -> int:
    return int(_number(text, int, "an integer"))


def fraction(text: str) -> float:
    """A number in (0, 1]."""
    value = _number(text, float, "a number in (0, 1]")
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text!r}")
    return value


def port(text: str) -> int:
    value = int(_number(text, int, "a port number"))
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port between 0 and 65535, got {text!r}")
    return value


def url(text: str) -> str:
    """An http(s) URL, its scheme included (``sources/urls.py``, the one check every verb makes);
    the text as given, checked."""
    try:
        split_http_url(text)
    except UrlError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text.strip()


def duration(text: str) -> float:
    """A Prometheus duration (15s, 1m, 1m30s) or plain seconds -> seconds."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


_GO_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(h|ms|m|s)")
_GO_DURATION_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def since(text: str) -> float:
    """A relative duration as ``kubectl logs --since`` takes it (Go's): 90s, 15m, 1h, 1h30m, 1.5h
    (units h, m, s, ms; a unit is needed) -> seconds, more than 0."""
    value = text.strip()
    parts = _GO_DURATION_PART.findall(value)
    if not parts or "".join(n + u for n, u in parts) != value:
        raise argparse.ArgumentTypeError(f"must be a duration such as 90s, 15m, 1h or 1h30m, got {text!r}")
    seconds = sum(float(n) * _GO_DURATION_UNITS[u] for n, u in parts)
    if not 0 < seconds < math.inf:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text!r}")
    return seconds
