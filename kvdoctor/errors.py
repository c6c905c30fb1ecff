"""The CLI's errors and exit statuses: what a command raises to end with one line and a given status.

Every command: 0 healthy or idle (or done), 1 a slow verdict, 2 bad usage or input, 3 a source that
could not be read, or an internal error.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_SLOW = 1
EXIT_USAGE = 2
EXIT_UNREADABLE = 3
EXIT_STATUS_HELP = (
    "exit status: 0 done (a verdict: healthy or idle), 1 a slow verdict (or the failure this command "
    "reports), 2 bad usage or input, 3 a source that could not be read, or an internal error."
)


class UsageError(Exception):
    """Bad input or configuration: printed as one line, exit code 2."""


class SourceUnreadable(Exception):
    """The source (an exporter, a Prometheus, an engine) could not be read: one line, exit code 3."""
