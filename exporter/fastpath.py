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
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping

MAX_HEAD_BYTES = 8192  # longer request heads go to uvicorn (which applies its own limits)
MAX_WRITE_BUFFER = 1 << 20  # stop reading while this much is unsent (a client pipelining and not reading)
_HEAD_END = b"\r\n\r\n"
_BODY_HEADERS = (b"content-length:", b"transfer-encoding:", b"expect:", b"upgrade:")

# path -> (content type, a callable returning the current bytes)
Prerendered = Mapping[str, tuple[str, Callable[[], bytes]]]


class PrerenderedFront(asyncio.Protocol):
    """One connection: prerendered GET/HEAD answered here, anything else delegated to uvicorn."""

    def __init__(self, delegate_class, paths: Prerendered, config, server_state, app_state=None, _loop=None):
        self._delegate_args = dict(config=config, server_state=server_state, app_state=app_state, _loop=_loop)
        self._delegate_class = delegate_class
        self._paths = {path.encode("ascii"): (ctype.encode("latin-1"), get) for path, (ctype, get) in paths.items()}
        self._connections = server_state.connections
        self._keep_alive_seconds = config.timeout_keep_alive
        self._loop = _loop or asyncio.get_event_loop()
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._idle: asyncio.TimerHandle | None = None
        self._paused = False

    # --------------------------------------------------------------------- asyncio.Protocol
    def connection_made(self, transport) -> None:
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
        while self._transport is not None and not self._paused:
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
            response, keep_alive = answer
            del self._buffer[: end + len(_HEAD_END)]
            self._transport.write(response)
            if not keep_alive:
                self._transport.close()
                return
            if self._transport.get_write_buffer_size() > MAX_WRITE_BUFFER:
                self.pause_writing()  # resumed by the transport once it has drained

    def _answer(self, head: bytes) -> tuple[bytes, bool] | None:
        """The whole response and whether to keep the connection, or None to hand it over."""
        line, _, headers = head.partition(b"\r\n")
        parts = line.split(b" ")
        if len(parts) != 3 or parts[0] not in (b"GET", b"HEAD") or parts[2] not in (b"HTTP/1.1", b"HTTP/1.0"):
            return None
        target = self._paths.get(parts[1].partition(b"?")[0])
        if target is None:
            return None
        lower = headers.lower()
        if any(name in lower for name in _BODY_HEADERS):
            return None  # a body, a 100-continue or an upgrade: uvicorn knows those
        connection = b""
        for header in lower.split(b"\r\n"):
            if header.startswith(b"connection:"):
                connection = header[11:].strip()
        keep_alive = (connection != b"close") if parts[2] == b"HTTP/1.1" else (connection == b"keep-alive")
        content_type, get = target
        body = get()
        response = b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n%s\r\n" % (
            content_type,
            len(body),
            b"" if keep_alive else b"connection: close\r\n",
        )
        return (response + body if parts[0] == b"GET" else response), keep_alive

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


def front_protocol(delegate_class, paths: Prerendered):
    """The protocol class to give uvicorn (``Config.http_protocol_class``) in front of ``delegate_class``."""
    return functools.partial(PrerenderedFront, delegate_class, paths)
