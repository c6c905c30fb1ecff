"""Optional HTTP basic auth for the dashboard.

Users come from ``KVDOCTOR_DASHBOARD_USERS`` (``user:password,user2:password2``) and/or a file
named by ``KVDOCTOR_DASHBOARD_AUTH_FILE`` (one ``user:password`` per line, ``#`` comments; the
shape of a mounted Kubernetes secret). No users: no auth. Every route is protected, assets and
Dash's own endpoints included.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Mapping

from flask import Response, request

from kvdoctor.sources.paths import PROBE_PATHS

USERS_ENV = "KVDOCTOR_DASHBOARD_USERS"
AUTH_FILE_ENV = "KVDOCTOR_DASHBOARD_AUTH_FILE"
REALM = "kvdoctor"


def parse_users(text: str, separator: str = ",", origin: str = USERS_ENV) -> dict[str, str]:
    """``user:password`` entries split by ``separator``; raises ``ValueError`` naming the bad entry's
    position (never its content: it may hold a password)."""
    users: dict[str, str] = {}
    for number, entry in enumerate(text.split(separator), start=1):
        entry = entry.strip()
        if not entry or entry.startswith("#"):
            continue
        user, sep, password = entry.partition(":")
        if not sep or not user.strip() or not password:
            where = f"line {number}" if separator == "\n" else f"entry {number}"
            raise ValueError(f"{origin}: {where} is not user:password")
        users[user.strip()] = password
    return users


def users_from_env(environ: Mapping[str, str]) -> dict[str, str]:
    """Users from the environment variable and the file it may name (the file wins on a clash)."""
    users = parse_users(environ.get(USERS_ENV, ""))
    path = environ.get(AUTH_FILE_ENV)
    if path:
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            raise ValueError(f"{AUTH_FILE_ENV}: cannot read {path}: {exc.strerror}") from None
        users.update(parse_users(text, separator="\n", origin=path))
    return users


def check_authorization(header: str | None, users: Mapping[str, str]) -> bool:
    """True if ``header`` (an ``Authorization`` value) carries a known user and its password."""
    if not header or not header.startswith("Basic "):
        return False
    try:
        decoded = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return False
    user, sep, password = decoded.partition(":")
    expected = users.get(user)
    if not sep or expected is None:
        # Compare anyway so a wrong user name costs the same time as a wrong password.
        hmac.compare_digest(password.encode(), b"\0" * max(1, len(password)))
        return False
    return hmac.compare_digest(password.encode(), expected.encode())


def install(server, users: Mapping[str, str]) -> None:
    """Require basic auth on every request of the Flask ``server`` (does nothing without users)."""
    if not users:
        return
    frozen = dict(users)

    @server.before_request
    def _require_basic_auth():
        if request.path in PROBE_PATHS:  # kubelet probes carry no credentials
            return None
        if check_authorization(request.headers.get("Authorization"), frozen):
            return None
        return Response(
            "authentication required\n",
            status=401,
            headers={"WWW-Authenticate": f'Basic realm="{REALM}", charset="UTF-8"'},
            mimetype="text/plain",
        )
