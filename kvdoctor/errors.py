"""The CLI's errors: what a command raises to end with one line and a given exit status."""

from __future__ import annotations


class UsageError(Exception):
    """Bad input or configuration: printed as one line, exit code 2."""
