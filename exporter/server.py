"""Running an ASGI app with uvicorn: in a background thread, or blocking until Ctrl-C / SIGTERM.

Everything on the wire is uvicorn's as it ships (its HTTP protocol and parser, keep-alive, the
Date header); the one change is its housekeeping tick, once a second instead of ten times
(``_Server``: the idle wake-ups were a third of the exporter's CPU budget).

With a web configuration (``app.state.web_guard``, ``exporter/web_guard.py``) uvicorn is given its
TLS context (``ReloadingContext``: certificates reloaded when their files change) and, only when
``client_allowed_sans`` is set, a protocol that checks the client certificate's names when the
connection is made; basic auth, the rate limit and the headers are the app's middleware.

We bind the listening socket ourselves before handing it to uvicorn, so "address already in use"
is a ``PortInUseError`` with a clear message at the call site, instead of uvicorn logging the
error and calling ``sys.exit`` from wherever it happens to run.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, cast

import uvicorn
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from kvdoctor.exporter.web_guard import WebGuard

log = logging.getLogger("kvdoctor.server")

STARTUP_TIMEOUT = 15.0


class ServerError(RuntimeError):
    """The server could not be started."""


class PortInUseError(ServerError):
    """The address is already taken by another process."""


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: any free port); clear errors on failure."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ServerError(f"cannot bind {host}:{port}: unknown host ({exc.strerror})") from None
    family, socktype, proto, _, address = infos[0]
    sock = socket.socket(family, socktype, proto)
    try:
        # TIME_WAIT leftovers of a previous run may be reused; a live listener still refuses.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortInUseError(f"port {port} on {host} is already in use (choose another with --port)") from None
        if exc.errno == errno.EADDRNOTAVAIL:
            raise ServerError(f"cannot bind {host}:{port}: address not available on this machine") from None
        if exc.errno == errno.EACCES:
            raise ServerError(f"cannot bind {host}:{port}: permission denied") from None
        raise ServerError(f"cannot bind {host}:{port}: {exc.strerror or exc}") from None
    sock.setblocking(False)
    return sock


def _checking_client_sans(guard: WebGuard) -> type[asyncio.Protocol]:
    """uvicorn's own HTTP protocol, closing a TLS connection whose client certificate names none of
    ``client_allowed_sans`` as soon as it is made (before any byte of HTTP): the one check of the
    web configuration that neither an SSLContext nor the ASGI app can make (the app never sees
    the certificate). Given to uvicorn through ``Config(http=...)``."""

    class ClientSansChecked(AutoHTTPProtocol):  # type: ignore[misc,valid-type]
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            if not guard.peer_allowed(transport):
                cast(asyncio.Transport, transport).abort()

    return ClientSansChecked


TICK_SECONDS = 1.0


class _Server(uvicorn.Server):
    """uvicorn's server, its housekeeping tick once a second instead of ten times.

    uvicorn's ``main_loop`` wakes every 0.1 s to run ``on_tick``, which refreshes the Date header
    on every tenth tick and checks ``should_exit``. On a small shared VM those ten wake-ups of an
    idle event loop cost ~0.15 % of a core, a third of the exporter's whole budget at 1 Hz. Here
    ``on_tick`` runs once a second as if it were always the tenth (counter 0), so the Date header
    is refreshed as often as uvicorn refreshes it and nothing else differs; a stop is seen within
    a second. The only change to uvicorn: everything on the wire is uvicorn's own.
    """

    async def main_loop(self) -> None:
        while not await self.on_tick(0):
            await asyncio.sleep(TICK_SECONDS)


class ServerHandle:
    """A uvicorn server running in a daemon thread; ``stop()`` shuts it down."""

    def __init__(self, server: _Server, thread: threading.Thread, sock: socket.socket, scheme: str = "http"):
        self._server = server
        self._thread = thread
        self._socket = sock
        address = sock.getsockname()
        self.host: str = address[0]
        self.port: int = address[1]
        self.scheme = scheme
        self.error: BaseException | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float = 5.0) -> None:
        self._server.should_exit = True  # seen at the next tick (TICK_SECONDS)
        self._thread.join(timeout)
        if self._thread.is_alive():  # a stuck connection: stop waiting for it
            self._server.force_exit = True
            self._thread.join(timeout)
        with contextlib.suppress(OSError):
            self._socket.close()

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def serve_in_thread(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 0,
    log_level: str = "warning",
    sock: socket.socket | None = None,
    on_exit: Callable[[], None] | None = None,
) -> ServerHandle:
    """Start ``app`` on ``host:port`` (or on ``sock``, from ``bind_socket``) in a thread; returns
    once it accepts connections. An app whose ``state.web_guard`` is a ``WebGuard``
    (``exporter/web_guard.py``) is served over TLS when its configuration says so. ``on_exit()`` is
    called from the server's thread when it stops, asked to or not.

    Raises ``PortInUseError`` if the port is taken, ``ServerError`` for other start failures.
    """
    if sock is None:
        sock = bind_socket(host, port)
    state = getattr(app, "state", None)
    guard = getattr(state, "web_guard", None)
    guard = guard if isinstance(guard, WebGuard) else None
    config = uvicorn.Config(
        app,
        log_level=log_level,
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=2,
        timeout_keep_alive=30,
        http=_checking_client_sans(guard) if guard is not None and guard.allowed_sans else "auto",
    )
    tls = guard.ssl_context if guard is not None else None
    if tls is not None:
        # uvicorn builds its SSLContext from file names once; ours reloads rotated files and
        # holds the web configuration's versions and ciphers. Set after load(), which would
        # otherwise replace it.
        config.load()
        config.ssl = tls
    server = _Server(config)
    handle_box: list[ServerHandle] = []

    def run() -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as exc:  # SystemExit from uvicorn included: report, don't kill the process
            if handle_box:
                handle_box[0].error = exc
            log.error("HTTP server stopped: %s", exc)
        finally:
            if on_exit is not None:
                on_exit()

    thread = threading.Thread(target=run, name=f"kvdoctor-http-{sock.getsockname()[1]}", daemon=True)
    handle = ServerHandle(server, thread, sock, "https" if tls is not None else "http")
    handle_box.append(handle)
    thread.start()
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            handle.stop(timeout=1.0)
            detail = f": {handle.error}" if handle.error else ""
            raise ServerError(f"the HTTP server on {host}:{handle.port} did not start{detail}")
        time.sleep(0.01)
    return handle


def serve(
    app,
    host: str = "127.0.0.1",
    port: int = 0,
    on_started: Callable[[ServerHandle], None] | None = None,
    stop_event: threading.Event | None = None,
    sock: socket.socket | None = None,
) -> int:
    """Serve ``app`` until Ctrl-C or SIGTERM (or ``stop_event``), then shut down cleanly.

    ``sock`` is a socket from ``bind_socket`` (bind first to fail early on a port in use);
    ``on_started(handle)`` runs once the server accepts connections (start collection, print
    the URL there). Returns 0 after a requested stop, 1 if the server died on its own (which
    sets ``stop_event`` too).
    """
    stop = stop_event or threading.Event()
    server_exited = threading.Event()

    def exited() -> None:
        server_exited.set()
        stop.set()

    handle = serve_in_thread(app, host, port, sock=sock, on_exit=exited)
    previous: dict[int, object] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, lambda *_: stop.set())
    try:
        if on_started is not None:
            on_started(handle)
        # No timeout, no polling: a signal runs its handler during the wait (POSIX lock waits are
        # interruptible), and the server's thread sets the event if it dies.
        stop.wait()
        if server_exited.is_set():
            log.error("the HTTP server stopped unexpectedly%s", f": {handle.error}" if handle.error else "")
            return 1
        return 0
    finally:
        handle.stop()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
