"""The runbook links of the alerts and of the Grafana dashboard: one base, one join, one check.

``kvdoctor rules export`` writes each alert's ``runbook_url`` and ``kvdoctor grafana export`` the
dashboard's runbook links from the same ``--runbook-base-url``; both take it through
``runbook_base`` (refused with one line where it is not an http(s) URL or a path) and join it to an
alert's name with ``runbook_url``, so ``https://wiki.example.com/runbooks`` gives
``https://wiki.example.com/runbooks/KVCacheThrashing.md`` in both.
"""

from __future__ import annotations

import re

# The runbooks' path in this repository (the dashboard serves them at /runbooks/<Alert>).
RUNBOOKS_IN_REPOSITORY = "docs/runbooks/"
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
_HTTP_URL = re.compile(r"^https?://[^/?#\s:@]+(:\d{1,5})?(/[^?#\s]*)?$", re.I)


def runbook_base(text: str | None) -> str | None:
    """The base ``text`` names, ending in ``/``: an absolute http(s) URL with a host (no query, no
    fragment), so a link opens from Alertmanager, Slack or PagerDuty; None where none is given (the
    alerts then carry no runbook link rather than a relative path). ``ValueError`` of one line otherwise."""
    return absolute_base(
        text, "--runbook-base-url", "https://kvdoctor.example.com/runbooks/ (the dashboard serves them at /runbooks/)"
    )


def absolute_base(text: str | None, flag: str, example: str) -> str | None:
    """``text`` checked as ``runbook_base`` checks it, ``flag`` and ``example`` in its error."""
    if text is None:
        return None
    base = text.strip()
    scheme = _SCHEME.match(base)
    if not scheme or scheme.group(1).lower() not in ("http", "https") or not _HTTP_URL.match(base):
        raise ValueError(
            f"{flag} must be an absolute http(s) URL with a host and no query or fragment, "
            f"such as {example}, got {text!r}"
        )
    return base if base.endswith("/") else base + "/"


def runbook_url(base: str, alert: str) -> str:
    """The runbook of ``alert`` (a name, or a Grafana template such as ``${__value.raw}``) under ``base``."""
    return f"{base if base.endswith('/') else base + '/'}{alert}.md"


def browsable(base: str) -> bool:
    """An address a browser opens from anywhere (the default base is a path in the repository)."""
    return base.lower().startswith(("https://", "http://"))
