"""One fake HTTP server for every test (and benchmark) that needs something at the other end of a socket.

``FakeServer`` is a real HTTP/1.1 server on 127.0.0.1 (a free port, or the one given) serving GET
and POST. Each request goes to a *behaviour*, a function of the request handler that writes
whatever it wants: a normal answer, half a body and a TCP reset, a trickle, a lie about the
length, a gzip bomb. The behaviour is chosen by path (``routes``, a dict the test may change at
any time) or is the same for every path (``behaviour``; 404 when neither applies):

    server = FakeServer({"/metrics": respond(page)})
    server.routes["/metrics"] = reset_mid_body(page)   # switch faults at will
    collector = EngineCollector(server.url("/metrics"))

It counts ``requests``, ``connections`` opened and connections closed (``closed``, a semaphore
released once per closed connection), and keeps the paths asked for and the bodies sent.
``stop()`` closes the port *and* the kept-alive connections (a stopped server is really gone);
``start()`` serves again on the same port. ``tls``: serve https with that context. Connection
refused is ``refusing_url()``: a port where nothing listens.

``python -m tests.support.servers FILE`` serves FILE on every path in its own process (a
benchmark's engine, so its CPU is not counted), printing the URL on the first line.
"""

from __future__ import annotations

import contextlib
import functools
import json
import socket
import ssl
import struct
import sys
import threading
import time
import zlib
from collections.abc import Callable, MutableMapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.support.tools import free_port

Behaviour = Callable[[BaseHTTPRequestHandler], None]
EXPOSITION = "text/plain; version=0.0.4; charset=utf-8"
JSON = "application/json"


class FakeServer:
    """A real HTTP server whose every answer the test decides, down to the socket (see the module)."""

    def __init__(
        self,
        routes: MutableMapping[str, Behaviour] | Behaviour | None = None,
        *,
        port: int = 0,
        tls: ssl.SSLContext | None = None,
    ):
        if callable(routes):
            self.routes: MutableMapping[str, Behaviour] = {}
            self.behaviour: Behaviour = routes
        else:
            self.routes = routes if routes is not None else {}
            self.behaviour = respond(b"not found\n", status=404)
        self.tls = tls
        self.port = port
        self.requests = 0
        self.connections = 0
        self.closed = threading.Semaphore(0)
        self.paths: list[str] = []
        self.bodies: list[bytes] = []
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self.start()

    # -- lifecycle
    def start(self) -> FakeServer:
        """Serves (again) on ``port`` (a free one the first time when it is 0)."""
        if self._server is not None:
            return self
        server = _Server(("127.0.0.1", self.port), _handler_for(self))
        server.owner = self
        if self.tls is not None:
            server.socket = self.tls.wrap_socket(server.socket, server_side=True)
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Closes the port and every open connection, as a process that went away would."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        with self._lock:
            connections = list(self._open)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._thread.join(5)

    close = stop

    def __enter__(self) -> FakeServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- addresses and what was asked
    def url(self, path: str = "", host: str = "127.0.0.1") -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://{host}:{self.port}{path}"

    def forms(self) -> list[dict[str, list[str]]]:
        """The form-encoded bodies received (POSTs), parsed, in order."""
        return [parse_qs(body.decode()) for body in self.bodies if body]

    def _answer(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        with self._lock:
            self.requests += 1
            self.paths.append(handler.path)
            self.bodies.append(body)
        handler.body = body  # type: ignore[attr-defined]  # what this request sent (a POSTed form), for its behaviour
        behaviour = self.routes.get(urlsplit(handler.path).path, self.behaviour)
        try:
            behaviour(handler)
        except OSError:  # the client gave up first (its timeout or cap), or stop() closed the connection
            handler.close_connection = True


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True  # start() again on the same port at once
    owner: FakeServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # resets, abandoned answers and failed TLS handshakes are what these tests are made of

    def shutdown_request(self, request: Any) -> None:
        super().shutdown_request(request)
        self.owner.closed.release()


def _handler_for(owner: FakeServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, like the engines and the exporter: reuse is visible
        disable_nagle_algorithm = True  # headers and body are two writes: no delayed-ACK stall

        def setup(self) -> None:
            super().setup()
            with owner._lock:
                owner.connections += 1
                owner._open.add(self.connection)

        def finish(self) -> None:
            with owner._lock:
                owner._open.discard(self.connection)
            with contextlib.suppress(OSError):
                super().finish()

        def _answer(self) -> None:
            owner._answer(self)

        do_GET = _answer
        do_POST = _answer

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


def refusing_url(path: str = "") -> str:
    """A URL on 127.0.0.1 where nothing listens (connection refused)."""
    return f"http://127.0.0.1:{free_port()}{path}"


# ----------------------------------------------------------------------------------- behaviours


def send(
    h: BaseHTTPRequestHandler,
    body: bytes,
    status: int = 200,
    content_type: str = EXPOSITION,
    headers: dict[str, str] | None = None,
) -> None:
    """Writes one whole answer with its Content-Length."""
    h.send_response(status)
    h.send_header("Content-Type", content_type)
    h.send_header("Content-Length", str(len(body)))
    for name, value in (headers or {}).items():
        h.send_header(name, value)
    h.end_headers()
    h.wfile.write(body)


def send_json(h: BaseHTTPRequestHandler, payload: object, status: int = 200) -> None:
    send(h, json.dumps(payload).encode(), status, JSON)


def respond(
    body: bytes,
    status: int = 200,
    content_type: str = EXPOSITION,
    headers: dict[str, str] | None = None,
    delay: float = 0.0,
    close_after: bool = False,
) -> Behaviour:
    """One answer with a Content-Length, after ``delay`` seconds (a hang); ``close_after``: then
    close the connection without saying so (no ``Connection: close``), as a server does to a
    keep-alive connection idle too long."""

    def behave(h: BaseHTTPRequestHandler) -> None:
        if delay:
            time.sleep(delay)
        send(h, body, status, content_type, headers)
        if close_after:
            h.close_connection = True

    return behave


def gzipped(body: bytes, content_type: str = EXPOSITION) -> Behaviour:
    """``body`` (already gzip-compressed) sent with ``Content-Encoding: gzip``."""
    return respond(body, content_type=content_type, headers={"Content-Encoding": "gzip"})


def computed(answer: Callable[[str], tuple[int, str, bytes]], delay: float = 0.0) -> Behaviour:
    """Each answer made for its request: ``answer(path with query) -> (status, content type, body)``."""

    def behave(h: BaseHTTPRequestHandler) -> None:
        if delay:
            time.sleep(delay)
        status, content_type, body = answer(h.path)
        send(h, body, status, content_type)

    return behave


def reset_mid_body(body: bytes, content_type: str = EXPOSITION) -> Behaviour:
    """Headers announcing the whole body, half of it, then a TCP reset (SO_LINGER 0)."""

    def behave(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", content_type)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body[: len(body) // 2])
        h.wfile.flush()
        time.sleep(0.05)  # let the half arrive before the reset
        h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        h.connection.close()
        h.close_connection = True

    return behave


def trickle(body: bytes, chunk: int = 1024, pause: float = 0.1, content_type: str = EXPOSITION) -> Behaviour:
    """Headers at once, then the body ``chunk`` bytes every ``pause`` seconds (each read is quick,
    the whole answer is slow: a per-read timeout never fires)."""

    def behave(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", content_type)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        for i in range(0, len(body), chunk):
            h.wfile.write(body[i : i + chunk])
            h.wfile.flush()
            time.sleep(pause)

    return behave


def stream(body: bytes, total: int, content_type: str = EXPOSITION) -> Behaviour:
    """``body`` again and again until ``total`` bytes, with no Content-Length (only a cap on the
    bytes read can stop it), then the connection closed."""

    def behave(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", content_type)
        h.send_header("Connection", "close")
        h.end_headers()
        h.close_connection = True
        sent = 0
        while sent < total:
            h.wfile.write(body)
            sent += len(body)

    return behave


def declared_huge(size: int, first: bytes = b"# HELP x\n") -> Behaviour:
    """A Content-Length of ``size`` bytes, a few bytes of it, then nothing until the client leaves."""

    def behave(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", EXPOSITION)
        h.send_header("Content-Length", str(size))
        h.end_headers()
        h.wfile.write(first)
        h.wfile.flush()
        time.sleep(0.3)
        h.close_connection = True

    return behave


@functools.lru_cache(maxsize=4)
def gzip_bomb(inflated: int) -> bytes:
    """A gzip body of exposition lines that inflates to ``inflated`` bytes (compressed ~1000:1)."""
    line = b'vllm:num_requests_running{engine="0",model_name="bomb"} 1.0\n'
    block = line * (2**20 // len(line))
    comp = zlib.compressobj(6, zlib.DEFLATED, 31)
    parts = [comp.compress(block) for _ in range(max(1, inflated // len(block)))]
    parts.append(comp.flush())
    return b"".join(parts)


def gzip_bomb_answer(inflated: int) -> Behaviour:
    """``Content-Encoding: gzip`` and a body inflating to ``inflated`` bytes, made once, when first
    asked for. Made for every request, 256 MiB took the server over a second to compress: the client
    timed out before the headers instead of meeting its cap, and the server's thread went on
    compressing beside it, in the process whose memory the fault matrix traces."""
    made: list[Behaviour] = []
    lock = threading.Lock()

    def behave(h: BaseHTTPRequestHandler) -> None:
        with lock:  # a request that comes while the first is compressing waits for that body
            if not made:
                made.append(gzipped(gzip_bomb(inflated)))
        made[0](h)

    return behave


def first_then(first: Behaviour, then: Behaviour, n: int = 1) -> Behaviour:
    """``first`` for the first ``n`` requests, ``then`` for the rest (a server dying mid-run)."""
    seen = {"count": 0}
    lock = threading.Lock()

    def behave(h: BaseHTTPRequestHandler) -> None:
        with lock:
            seen["count"] += 1
            current = first if seen["count"] <= n else then
        current(h)

    return behave


def serve_until_killed(server: FakeServer) -> None:
    """Prints the server's URL on the first line, then serves until the process is stopped."""
    print(server.url(), flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.support.servers FILE``: FILE as an exposition page on every path."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m tests.support.servers FILE", file=sys.stderr)
        return 2
    serve_until_killed(FakeServer(respond(Path(args[0]).read_bytes())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
