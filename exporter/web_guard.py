"""Enforcing the web configuration (``web_config.py``) on every connection and request.

``WebGuard`` holds the checks of one configuration: the server (``server.py``) takes its TLS
context and, with ``client_allowed_sans``, checks each connection's client certificate; the ASGI
middleware (``GuardMiddleware``) holds basic auth, the rate limit and the extra headers on every
request, ``/metrics`` included:

- TLS: ``ssl_context`` is given to the listening server; a client without a required
  certificate is refused in the handshake; one whose certificate names none of
  ``client_allowed_sans`` is closed before any byte of HTTP. The certificate, key and client CA files are watched:
  a handshake after they change (a rotated Kubernetes Secret) uses the new ones.
- Basic auth: the ``Authorization`` header is checked against the bcrypt hashes with a constant-
  time comparison (``bcrypt.checkpw``); an unknown user is checked against a dummy hash so the
  answer takes as long. Results are cached by a SHA-256 of the header, so a scraper pays bcrypt
  (~70 ms at cost 10) once, not every scrape; bcrypt runs on one worker thread, never on the
  event loop. A wrong or missing password is a 401 with ``WWW-Authenticate: Basic``.
- ``/healthz`` and ``/readyz`` answer without basic auth (not without TLS): Kubernetes probes
  cannot send a password without putting it in the pod spec, and the two say only "alive" and
  "ready". Everything else, ``/metrics`` and the JSON API included, needs the password.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import hashlib
import logging
import os
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import bcrypt

from kvdoctor.exporter.web_config import RateLimit, TLSServerConfig, WebConfig, WebConfigError
from kvdoctor.sources.paths import PROBE_PATHS

log = logging.getLogger("kvdoctor.exporter")

CACHE_SIZE = 256  # distinct Authorization headers remembered (verified or refused)
_UNAUTHORIZED = b"Unauthorized\n"
_TOO_MANY = b"Too Many Requests\n"

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class BasicAuth:
    """``basic_auth_users`` checked with bcrypt, the answers cached per header."""

    def __init__(self, users: dict[str, bytes]):
        self._users = dict(users)
        self._cache: dict[bytes, bool] = {}
        self._lock = threading.Lock()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._dummy: bytes | None = None

    def cached(self, header: bytes | None) -> bool | None:
        """The answer for this ``Authorization`` value if known (False without one), else None."""
        if not header:
            return False
        return self._cache.get(hashlib.sha256(header).digest())

    def verify(self, header: bytes | None) -> bool:
        """Check ``header`` (runs bcrypt unless cached; blocking)."""
        known = self.cached(header)
        if known is not None or header is None:
            return bool(known)
        ok = self._check(header)
        with self._lock:
            if len(self._cache) >= CACHE_SIZE:
                self._cache.pop(next(iter(self._cache)))
            self._cache[hashlib.sha256(header).digest()] = ok
        return ok

    def verify_async(self, header: bytes | None) -> asyncio.Future[bool]:
        """``verify`` on the bcrypt worker thread, as a future of the running loop."""
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kvdoctor-bcrypt")
        return asyncio.get_running_loop().run_in_executor(self._executor, self.verify, header)

    def _check(self, header: bytes) -> bool:
        scheme, _, token = header.strip().partition(b" ")
        if scheme.lower() != b"basic":
            return False
        try:
            user, sep, password = base64.b64decode(token.strip(), validate=True).partition(b":")
            name = user.decode("utf-8")
        except (binascii.Error, ValueError):
            return False
        hashed = self._users.get(name) if sep else None
        try:
            matched = bcrypt.checkpw(password, hashed or self._dummy_hash())
        except ValueError:  # a password over bcrypt's 72 bytes, or a malformed hash
            matched = False
        return matched and hashed is not None

    def _dummy_hash(self) -> bytes:
        """A hash with the users' highest cost, so an unknown user costs as much as a known one."""
        if self._dummy is None:
            cost = max((int(h.split(b"$")[2]) for h in self._users.values()), default=10)
            self._dummy = bcrypt.hashpw(os.urandom(16), bcrypt.gensalt(rounds=max(4, min(cost, 31))))
        return self._dummy


class TokenBucket:
    """``rate_limit``: one token per ``interval`` seconds, at most ``burst`` saved up."""

    def __init__(self, limit: RateLimit, clock: Callable[[], float] = time.monotonic):
        self._interval, self._burst, self._clock = limit.interval, float(limit.burst), clock
        self._tokens, self._last = float(limit.burst), clock()
        self._lock = threading.Lock()

    def allow(self) -> bool:
        with self._lock:
            now = self._clock()
            self._tokens = min(self._burst, self._tokens + (now - self._last) / self._interval)
            self._last = now
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return True
            return False


class ReloadingContext:
    """The server SSLContext, rebuilt when the certificate, key or CA files change.

    Python's equivalent of exporter-toolkit's per-connection config: ``sni_callback`` runs in
    every handshake (with or without SNI) and swaps in a context made from the current files. A
    change that does not load (a half-written Secret) keeps the previous context, logged once.
    """

    def __init__(self, tls: TLSServerConfig):
        self._tls = tls
        self._stamp = self._files_stamp()
        self.context = self._make()

    def _make(self) -> ssl.SSLContext:
        ctx = self._tls.context()
        ctx.sni_callback = self._on_hello
        return ctx

    def _files_stamp(self) -> tuple:
        stamp = []
        for path in self._tls.files:
            try:
                st = os.stat(path)
                stamp.append((st.st_ino, st.st_mtime_ns, st.st_size))
            except OSError:
                stamp.append(None)
        return tuple(stamp)

    def _on_hello(self, ssl_object: ssl.SSLObject, server_name: str | None, context: ssl.SSLContext) -> None:
        stamp = self._files_stamp()
        if stamp != self._stamp:
            self._stamp = stamp
            try:
                self.context = self._make()
                log.info("TLS: certificate files changed; new connections use them")
            except WebConfigError as exc:
                log.warning("TLS: certificate files changed but do not load, keeping the previous ones: %s", exc)
        if self.context is not context:
            ssl_object.context = self.context


class WebGuard:
    """The checks of one web configuration, shared by the server (TLS, client SANs) and the ASGI middleware."""

    def __init__(self, config: WebConfig):
        self.config = config
        self.tls = ReloadingContext(config.tls) if config.tls is not None else None
        self.auth = BasicAuth(dict(config.users)) if config.users else None
        self.limiter = TokenBucket(config.rate_limit) if config.rate_limit is not None else None
        self.allowed_sans = frozenset(config.tls.client_allowed_sans) if config.tls is not None else frozenset()
        self.asgi_headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in config.headers]

    @property
    def ssl_context(self) -> ssl.SSLContext | None:
        return self.tls.context if self.tls is not None else None

    @staticmethod
    def exempt_from_auth(path: str) -> bool:
        return path in PROBE_PATHS

    def allow_rate(self, path: str) -> bool:
        """False when the rate limit refuses this request (probes are never limited)."""
        return self.limiter is None or path in PROBE_PATHS or self.limiter.allow()

    def peer_allowed(self, transport: asyncio.BaseTransport) -> bool:
        """``client_allowed_sans``: whether the verified client certificate names an allowed SAN."""
        if not self.allowed_sans:
            return True
        cert = transport.get_extra_info("peercert") or {}
        names = {
            value for kind, value in cert.get("subjectAltName", ()) if kind in ("DNS", "IP Address", "email", "URI")
        }
        if names & self.allowed_sans:
            return True
        log.warning("refused a client certificate without an allowed SAN (it has %s)", sorted(names) or "none")
        return False


class GuardMiddleware:
    """The same checks for every request uvicorn's protocol hands to the app (pure ASGI)."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], guard: WebGuard):
        self.app = app
        self.guard = guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        guard, path = self.guard, scope.get("path", "")
        if not guard.allow_rate(path):
            await self._refuse(send, 429)
            return
        if guard.auth is not None and not guard.exempt_from_auth(path):
            header = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), None)
            ok = guard.auth.cached(header)
            if ok is None:
                ok = await guard.auth.verify_async(header)
            if not ok:
                await self._refuse(send, 401)
                return
        if not guard.asgi_headers:
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), *guard.asgi_headers]
            await send(message)

        await self.app(scope, receive, send_with_headers)

    async def _refuse(self, send: Send, status: int) -> None:
        body = _UNAUTHORIZED if status == 401 else _TOO_MANY
        headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"%d" % len(body))]
        if status == 401:
            headers.append((b"www-authenticate", b'Basic realm="kvdoctor"'))
        await send({"type": "http.response.start", "status": status, "headers": headers + self.guard.asgi_headers})
        await send({"type": "http.response.body", "body": body})


__all__ = ["BasicAuth", "GuardMiddleware", "ReloadingContext", "TokenBucket", "WebGuard"]
