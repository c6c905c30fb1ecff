"""Whether a server speaks what its URL says: ``https://`` against a plain-HTTP server (and the
reverse) is told within a second, before any request waits for its timeout.

An HTTPS client's handshake sent to a plain-HTTP server gets no answer the client understands: it
may wait for its whole timeout, then say "did not answer". So, before the command's first request,
one short look at the port with the stock clients: the scheme its URL names first (a TLS handshake
with the ``ssl`` module, or an HTTP ``HEAD /`` with httpx), then, where the port does not answer
in it, the other one. Nothing is decided where the port does not answer at all (the command's own
request then says what is wrong).
"""

from __future__ import annotations

import socket
import ssl
import time
from urllib.parse import urlsplit

import httpx

from kvdoctor.errors import UsageError

PROBE_SECONDS = 1.0
TLS, HTTP = "https", "http"


def check_scheme(url: str | None, flag: str, budget: float = PROBE_SECONDS) -> None:
    """``UsageError`` naming ``flag`` when the server at ``url`` speaks the other scheme."""
    if not url:
        return
    parts = urlsplit(url.strip())
    try:
        port = parts.port or (443 if parts.scheme == TLS else 80)
    except ValueError:
        return  # a bad port: the URL's own check says so
    if parts.scheme not in (TLS, HTTP) or not parts.hostname:
        return
    spoken = speaks(parts.hostname, port, first=parts.scheme, budget=budget)
    if spoken is None or spoken == parts.scheme:
        return
    fixed = spoken + url.strip()[len(parts.scheme) :]
    what = "plain HTTP, not HTTPS" if spoken == HTTP else "HTTPS (TLS), not plain HTTP"
    raise UsageError(f"{flag} {url.strip()}: the server at {parts.netloc} speaks {what}; give {fixed}")


def speaks(host: str, port: int, first: str = TLS, budget: float = PROBE_SECONDS) -> str | None:
    """``"https"``, ``"http"``, or None (no answer either way within ``budget`` seconds)."""
    deadline = time.monotonic() + budget
    order = (first, HTTP if first == TLS else TLS)
    for attempt in order:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        answered = _answers_tls(host, port, left / 2) if attempt == TLS else _answers_http(host, port, left / 2)
        if answered is None:
            return None  # refused or unreachable: the command's own request says so
        if answered:
            return attempt
    return None


def _answers_tls(host: str, port: int, timeout: float) -> bool | None:
    """Whether the port completes a TLS handshake, or refuses it with a TLS alert (it wants a client
    certificate, say); None when the port could not be reached. Nothing is verified: the question
    is only which protocol the port speaks."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # no trust store to load: nothing is verified
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        conn = socket.create_connection((host, port), timeout=timeout)
    except (OSError, UnicodeError):
        return None
    try:
        with context.wrap_socket(conn, server_hostname=host):
            return True
    except ssl.SSLError as error:  # an alert is TLS; bytes that are no TLS record (HTTP/...) are not
        return "ALERT" in (error.reason or "")
    except OSError:  # silence within the timeout, a reset, a close
        return False
    finally:
        conn.close()


def _answers_http(host: str, port: int, timeout: float) -> bool | None:
    """Whether the port answers ``HEAD /`` in HTTP (any status); None when it could not be reached.
    The port itself is asked: no proxy from the environment."""
    try:
        url = httpx.URL(scheme=HTTP, host=host, port=port, path="/")
        with httpx.Client(timeout=timeout, trust_env=False, verify=False) as client:  # plain HTTP: no TLS
            client.head(url, headers={"User-Agent": "kvdoctor"})
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.InvalidURL):
        return None
    except httpx.HTTPError:  # silence within the timeout, a close, bytes that are no HTTP answer
        return False
    return True
