"""A real HTTP server on 127.0.0.1 (a free port) serving pages a test sets per path.

Each route is a ``Page``: a status, a body, and how to misbehave (hang before answering, stream
without Content-Length, count connections). Used by the engine and dcgm collector tests.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Page:
    body: bytes = b""
    status: int = 200
    content_type: str = "text/plain; version=0.0.4; charset=utf-8"
    hang: float = 0.0  # seconds to wait before answering
    stream_bytes: int = 0  # > 0: send this many bytes of ``body`` repeated, chunked, no Content-Length
    content_encoding: str = ""  # e.g. "gzip" (the body must then be compressed already)


class PageServer:
    def __init__(self):
        self.pages: dict[str, Page] = {}
        self.connections = 0
        self.requests = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, so connection reuse is visible

            def setup(self):
                super().setup()
                server.connections += 1

            def do_GET(self):
                server.requests += 1
                page = server.pages.get(self.path)
                if page is None:
                    page = Page(b"404 page not found\n", 404)
                if page.hang:
                    time.sleep(page.hang)
                self.send_response(page.status)
                self.send_header("Content-Type", page.content_type)
                if page.content_encoding:
                    self.send_header("Content-Encoding", page.content_encoding)
                if page.stream_bytes:
                    self.send_header("Connection", "close")
                    self.end_headers()
                    sent = 0
                    try:
                        while sent < page.stream_bytes:
                            self.wfile.write(page.body)
                            sent += len(page.body)
                    except (BrokenPipeError, ConnectionResetError):
                        pass
                    self.close_connection = True
                    return
                self.send_header("Content-Length", str(len(page.body)))
                self.end_headers()
                try:
                    self.wfile.write(page.body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address) -> None:
                pass  # clients hanging up early are part of these tests

        self._server = Server(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
