"""Answering ``GET /metrics`` at the connection, before uvicorn and the ASGI app see it.

The page is rendered once per collection cycle into bytes, so serving it is a ``transport.write``.
Through uvicorn and FastAPI the same answer costs a parsed request, a scope, an ASGI task and
several ``send`` calls: ~2x the time per request, which is what 16 scrapers arriving at the same
instant queue behind. ``PrerenderedFront`` is the protocol uvicorn runs for each connection: while
a connection asks only for prerendered paths (a Prometheus scraper's does) it answers them itself;
the first request for anything else hands the connection, with every byte not yet answered, to
uvicorn's own HTTP protocol for good. Only uvicorn's public protocol interface is used (a protocol
class built with ``config``/``server_state``/``app_state``; ``server_state.connections`` for a
graceful shutdown); a request this module does not fully understand is handed over, never refused.

Each prerendered path maps to a callable that takes the request's ``Accept`` value and returns the
content type and the bytes (``exposition.MetricsPages.negotiate``: classic text or OpenMetrics).
With a web configuration (``web_guard.WebGuard``) the same rules hold here as in the app: the rate
limit, basic auth (a header not verified yet is checked on the bcrypt thread while this connection
waits; the answer is cached), the configured response headers, and ``client_allowed_sans`` checked
when the TLS connection is made.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping

from kvdoctor.exporter.web_guard import WebGuard

MAX_HEAD_BYTES = 8192  # longer request heads go to uvicorn (which applies its own limits)
MAX_WRITE_BUFFER = 1 << 20  # stop reading while this much is unsent (a client pipelining and not reading)
_HEAD_END = b"\r\n\r\n"
_BODY_HEADERS = frozenset((b"content-length", b"transfer-encoding", b"expect", b"upgrade"))
_PENDING = object()  # _answer: the credentials are being verified; try again when they are

# path -> a callable taking the request's Accept value, returning (content type, current bytes)
Prerendered = Mapping[str, Callable[[bytes], tuple[bytes, bytes]]]


class PrerenderedFront(asyncio.Protocol):
    """One connection: prerendered GET/HEAD answered here, anything else delegated to uvicorn."""

    def __init__(
        self,
        delegate_class,
        paths: Prerendered,
        guard: WebGuard | None,
        config,
        server_state,
        app_state=None,
        _loop=None,
    ):
        self._delegate_args = dict(config=config, server_state=server_state, app_state=app_state, _loop=_loop)
        self._delegate_class = delegate_class
        self._paths = {path.encode("ascii"): get for path, get in paths.items()}
        self._guard = guard
        self._verifying = False  # credentials on the bcrypt thread; the buffer waits
        self._connections = server_state.connections
        self._keep_alive_seconds = config.timeout_keep_alive
        self._loop = _loop or asyncio.get_event_loop()
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._idle: asyncio.TimerHandle | None = None
        self._paused = False

    # --------------------------------------------------------------------- asyncio.Protocol
    def connection_made(self, transport) -> None:
        if self._guard is not None and not self._guard.peer_allowed(transport):
            transport.abort()
            return
        self._transport = transport
        self._connections.add(self)
        self._arm_idle()

    def connection_lost(self, exc) -> None:
        self._connections.discard(self)
        self._cancel_idle()
        self._transport = None

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        self._cancel_idle()
        self._serve_buffer()

    def eof_received(self) -> None:
        pass  # default: the transport closes itself

    def pause_writing(self) -> None:
        self._paused = True
        self._transport.pause_reading()

    def resume_writing(self) -> None:
        self._paused = False
        self._transport.resume_reading()
        self._serve_buffer()

    # ------------------------------------------------------------------- uvicorn's protocol
    def shutdown(self) -> None:
        """uvicorn's graceful shutdown: nothing is ever in flight here, so close now."""
        if self._transport is not None:
            self._transport.close()

    # ------------------------------------------------------------------------------ serving
    def _serve_buffer(self) -> None:
        while self._transport is not None and not self._paused and not self._verifying:
            end = self._buffer.find(_HEAD_END)
            if end < 0:
                if len(self._buffer) > MAX_HEAD_BYTES:
                    self._hand_over()
                elif not self._buffer:
                    self._arm_idle()
                return
            answer = self._answer(bytes(self._buffer[:end]))
            if answer is None:
                self._hand_over()
                return
            if answer[0] is _PENDING:
                self._verify(answer[1])
                return
            response, keep_alive = answer
            del self._buffer[: end + len(_HEAD_END)]
            self._transport.write(response)
            if not keep_alive:
                self._transport.close()
                return
            if self._transport.get_write_buffer_size() > MAX_WRITE_BUFFER:
                self.pause_writing()  # resumed by the transport once it has drained

    def _answer(self, head: bytes) -> tuple | None:
        """(the whole response, whether to keep the connection), None to hand the connection
        over, or (_PENDING, credentials) while the credentials still need checking."""
        line, _, headers = head.partition(b"\r\n")
        parts = line.split(b" ")
        if len(parts) != 3 or parts[0] not in (b"GET", b"HEAD") or parts[2] not in (b"HTTP/1.1", b"HTTP/1.0"):
            return None
        path = parts[1].partition(b"?")[0]
        negotiate = self._paths.get(path)
        if negotiate is None:
            return None
        connection = accept = authorization = b""
        for header in headers.split(b"\r\n"):
            name, _, value = header.partition(b":")
            name = name.lower()
            if name in _BODY_HEADERS or header[:1] in (b" ", b"\t"):
                return None  # a body, a 100-continue, an upgrade or a folded header: uvicorn knows those
            if name == b"connection":
                connection = value.strip().lower()
            elif name == b"accept":
                accept = value.strip()
            elif name == b"authorization" and not authorization:
                authorization = value.strip()
        keep_alive = (connection != b"close") if parts[2] == b"HTTP/1.1" else (connection == b"keep-alive")
        guard = self._guard
        extra = b""
        if guard is not None:
            if not guard.allow_rate(path.decode("latin-1")):
                return guard.refusal(429, keep_alive), keep_alive
            if guard.auth is not None:
                ok = guard.auth.cached(authorization)
                if ok is None:
                    return _PENDING, authorization
                if not ok:
                    return guard.refusal(401, keep_alive), keep_alive
            extra = guard.header_lines
        content_type, body = negotiate(accept)
        response = b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n%s%s\r\n" % (
            content_type,
            len(body),
            extra,
            b"" if keep_alive else b"connection: close\r\n",
        )
        return (response + body if parts[0] == b"GET" else response), keep_alive

    def _verify(self, authorization: bytes) -> None:
        """Check the credentials off the event loop; serving resumes when the answer is cached."""
        self._verifying = True
        self._guard.auth.verify_async(authorization).add_done_callback(self._verified)

    def _verified(self, future: asyncio.Future) -> None:
        self._verifying = False
        if future.cancelled() or future.exception() is not None:
            if self._transport is not None:
                self._transport.close()  # the check itself failed: nothing sensible to answer
            return
        self._serve_buffer()

    def _hand_over(self) -> None:
        """From now on this connection is uvicorn's, starting with the bytes not answered yet."""
        transport, pending = self._transport, bytes(self._buffer)
        self._connections.discard(self)
        self._cancel_idle()
        self._transport, self._buffer = None, bytearray()
        if self._paused:
            transport.resume_reading()
        delegate = self._delegate_class(**self._delegate_args)
        transport.set_protocol(delegate)
        delegate.connection_made(transport)
        if pending:
            delegate.data_received(pending)

    # --------------------------------------------------------------------------- keep-alive
    def _arm_idle(self) -> None:
        if self._idle is None and self._transport is not None:
            self._idle = self._loop.call_later(self._keep_alive_seconds, self._close_idle)

    def _cancel_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def _close_idle(self) -> None:
        self._idle = None
        if self._transport is not None and not self._buffer:
            self._transport.close()


def front_protocol(delegate_class, paths: Prerendered, guard: WebGuard | None = None):
    """The protocol class to give uvicorn (``Config.http_protocol_class``) in front of ``delegate_class``."""
    return functools.partial(PrerenderedFront, delegate_class, paths, guard)
