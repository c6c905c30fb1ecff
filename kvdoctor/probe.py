"""Whether a server speaks what its URL says: ``https://`` against a plain-HTTP server (and the
reverse) is told within a second, before any request waits for its timeout.

An HTTPS client's first bytes (a TLS ClientHello) sent to a plain-HTTP server get no answer the
client understands: it waits for its whole timeout, then says "did not answer". So, before the
command's first request, one short look at the port: the bytes the server sends back to the
opening its URL's scheme makes (TLS records start 0x16 or 0x15; HTTP answers with ``HTTP/``), and,
where they are not what the scheme expects, to the other opening. Nothing is decided where the
port does not answer at all (the command's own request then says what is wrong).
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import time
from urllib.parse import urlsplit

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
        reply = _first_bytes(host, port, _tls_hello(host) if attempt == TLS else _http_request(host), left / 2)
        if reply is None:
            return None  # refused or unreachable: the command's own request says so
        if reply.startswith(b"HTTP/"):
            return HTTP
        if reply[:1] in (b"\x15", b"\x16"):  # a TLS alert or handshake record
            return TLS
    return None


def _first_bytes(host: str, port: int, opening: bytes, timeout: float) -> bytes | None:
    """The server's first bytes (at most 5) after ``opening``; b"" when it said nothing in time or
    closed; None when the port could not be reached."""
    try:
        conn = socket.create_connection((host, port), timeout=timeout)
    except OSError:
        return None
    try:
        conn.sendall(opening)
        data = b""
        while len(data) < 5:
            chunk = conn.recv(5 - len(data))
            if not chunk:
                break
            data += chunk
        return data
    except OSError:  # timed out, or reset
        return b""
    finally:
        conn.close()


def _tls_hello(host: str) -> bytes:
    """The bytes a TLS client opens with (its ClientHello), made without sending them."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=host)
    with contextlib.suppress(ssl.SSLWantReadError):  # it waits for the server's answer: not sent
        tls.do_handshake()
    return outgoing.read()


def _http_request(host: str) -> bytes:
    return f"HEAD / HTTP/1.0\r\nHost: {host}\r\nUser-Agent: kvdoctor\r\n\r\n".encode("ascii", "replace")
