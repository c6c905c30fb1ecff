"""A real HTTP server on 127.0.0.1 whose every answer is decided by the test, down to the socket.

``FaultServer`` serves GET and POST; each request is handed to the current ``behaviour``, a
function of the request handler that writes whatever it wants: a normal answer, half a body and a
TCP reset, a trickle, a lie about the length, a gzip bomb. Behaviours for the common faults are
below; tests switch them at will (``server.behaviour = reset_mid_body(page)``).
"""

from __future__ import annotations

import functools
import socket
import ssl
import struct
import threading
import time
import zlib
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Behaviour = Callable[[BaseHTTPRequestHandler], None]
EXPOSITION = "text/plain; version=0.0.4; charset=utf-8"


class FaultServer:
    """``behaviour(handler)`` answers every request (``routes(...)`` for one per path).

    Counts ``requests``, ``connections`` opened and connections the server closed (``closed``,
    a semaphore released once per closed connection); ``tls``: serve https with that context."""

    def __init__(self, behaviour: Behaviour, port: int = 0, tls: ssl.SSLContext | None = None):
        self.behaviour = behaviour
        self.requests = 0
        self.connections = 0
        self.closed = threading.Semaphore(0)
        self.bodies: list[bytes] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                outer.connections += 1

            def _answer(self) -> None:
                outer.requests += 1
                length = int(self.headers.get("Content-Length") or 0)
                outer.bodies.append(self.rfile.read(length) if length else b"")
                try:
                    outer.behaviour(self)
                except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
                    self.close_connection = True  # the client gave up first (its timeout or cap)

            do_GET = _answer
            do_POST = _answer

            def log_message(self, *args) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            allow_reuse_address = True

            def handle_error(self, request, client_address) -> None:
                pass  # resets and abandoned answers are what these tests are made of

            def shutdown_request(self, request) -> None:
                super().shutdown_request(request)
                outer.closed.release()

        self._server = Server(("127.0.0.1", port), Handler)
        if tls is not None:
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
        self.scheme = "https" if tls is not None else "http"
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def url_of(self, path: str, host: str = "127.0.0.1") -> str:
        return f"{self.scheme}://{host}:{self.port}{path}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


# ----------------------------------------------------------------------------------- behaviours


def respond(
    body: bytes,
    status: int = 200,
    content_type: str = EXPOSITION,
    headers: dict | None = None,
    delay: float = 0.0,
    close_after: bool = False,
) -> Behaviour:
    """One answer with a Content-Length; ``close_after``: then close the connection without saying
    so (no ``Connection: close``), as a server does to a keep-alive connection idle too long."""

    def behave(h: BaseHTTPRequestHandler) -> None:
        if delay:
            time.sleep(delay)
        h.send_response(status)
        h.send_header("Content-Type", content_type)
        h.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(body)
        if close_after:
            h.close_connection = True

    return behave


def routes(by_path: dict[str, Behaviour]) -> Behaviour:
    """Each path's own behaviour (looked up per request, so the dict may change); 404 elsewhere."""

    def behave(h: BaseHTTPRequestHandler) -> None:
        by_path.get(h.path, respond(b"not found\n", status=404))(h)

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


def gzipped(body: bytes, content_type: str = EXPOSITION) -> Behaviour:
    return respond(body, content_type=content_type, headers={"Content-Encoding": "gzip"})


def dynamic(make: Callable[[], bytes], content_type: str = EXPOSITION) -> Behaviour:
    """A new body for every request (``make()``)."""

    def behave(h: BaseHTTPRequestHandler) -> None:
        respond(make(), content_type=content_type)(h)

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
