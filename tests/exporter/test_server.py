"""The exporter served by uvicorn as it ships (exporter/server.py), on real sockets: what a
scraper's connection sees (keep-alive, pipelining, HEAD, HTTP/1.0, Connection: close), stopping
with idle connections open, and ``serve``'s exit status."""

from __future__ import annotations

import email.utils
import socket
import threading
import time

import httpx
import pytest

from kvdoctor.exporter.app import create_app
from kvdoctor.exporter.server import serve_in_thread
from kvdoctor.signals.textformat import CONTENT_TYPE
from tests.exporter.test_exporter_app import make_exporter, serving

served = pytest.fixture(name="served")(serving)


def _connect(handle) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", handle.port), timeout=5)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _read_response(sock: socket.socket, buffer: bytearray, head_only: bool = False) -> tuple[bytes, dict, bytes]:
    """(status line, headers, body) of one response; ``buffer`` keeps bytes of the next one."""
    while b"\r\n\r\n" not in buffer:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before a response head")
        buffer += chunk
    end = buffer.index(b"\r\n\r\n")
    lines = bytes(buffer[:end]).split(b"\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(b":") for line in lines[1:])}
    length = 0 if head_only else int(headers[b"content-length"])
    while len(buffer) < end + 4 + length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before the body ended")
        buffer += chunk
    body = bytes(buffer[end + 4 : end + 4 + length])
    del buffer[: end + 4 + length]
    return lines[0], headers, body


def _closed(sock: socket.socket) -> bool:
    sock.settimeout(5)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


GET_METRICS = b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n"


def test_metrics_is_the_rendered_page_with_its_content_type(served):
    exporter, handle = served
    response = httpx.get(f"{handle.url}/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"] == CONTENT_TYPE
    assert response.content == exporter.metrics_bytes()


def test_keep_alive_connection_sees_each_new_page(served):
    exporter, handle = served
    buffer = bytearray()
    with _connect(handle) as sock:
        sock.sendall(GET_METRICS)
        _, _, first = _read_response(sock, buffer)
        exporter.run_cycle()
        sock.sendall(GET_METRICS)
        status, _, second = _read_response(sock, buffer)
    assert status == b"HTTP/1.1 200 OK"
    assert first != second and second == exporter.metrics_bytes()


def test_pipelined_and_byte_by_byte_requests_are_answered_in_order(served):
    exporter, handle = served
    buffer = bytearray()
    with _connect(handle) as sock:
        sock.sendall(GET_METRICS * 3)
        bodies = [_read_response(sock, buffer)[2] for _ in range(3)]
        for byte in GET_METRICS.replace(b"/metrics", b"/metrics?x=1"):
            sock.sendall(bytes([byte]))
        bodies.append(_read_response(sock, buffer)[2])
    assert bodies == [exporter.metrics_bytes()] * 4


def test_head_has_the_length_and_no_body(served):
    exporter, handle = served
    buffer = bytearray()
    with _connect(handle) as sock:
        sock.sendall(b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n" + GET_METRICS)
        _, headers, body = _read_response(sock, buffer, head_only=True)
        assert headers[b"content-length"] == str(len(exporter.metrics_bytes())).encode() and body == b""
        assert _read_response(sock, buffer)[2] == exporter.metrics_bytes()  # the next answer is intact


def test_http10_and_connection_close_end_the_connection(served):
    _, handle = served
    for request in (b"GET /metrics HTTP/1.0\r\n\r\n", b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n"):
        buffer = bytearray()
        with _connect(handle) as sock:
            sock.sendall(request)
            status, headers, _ = _read_response(sock, buffer)
            assert status.endswith(b"200 OK") and headers[b"connection"] == b"close"
            assert _closed(sock)


def test_the_api_and_metrics_share_one_connection(served):
    exporter, handle = served
    buffer = bytearray()
    with _connect(handle) as sock:
        sock.sendall(GET_METRICS + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _read_response(sock, buffer)[2] == exporter.metrics_bytes()
        status, _, body = _read_response(sock, buffer)
        assert status == b"HTTP/1.1 200 OK" and body == b'{"status":"ok"}'
        sock.sendall(b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        assert _read_response(sock, buffer)[0] == b"HTTP/1.1 405 Method Not Allowed"
        sock.sendall(GET_METRICS)
        assert _read_response(sock, buffer)[2] == exporter.metrics_bytes()


def test_a_malformed_request_is_400_and_the_server_keeps_serving(served):
    exporter, handle = served
    for garbage in (b"GARBAGE\r\n\r\n", b"GET /metrics HTTP/1.1\r\nHost x\r\n\r\n", b"\x16\x03\x01\x00\xa5"):
        with _connect(handle) as sock:
            sock.sendall(garbage)
            sock.settimeout(5)
            assert sock.recv(64).startswith(b"HTTP/1.1 400")
    assert httpx.get(f"{handle.url}/metrics").content == exporter.metrics_bytes()


def test_stop_closes_idle_scraper_connections_promptly(served):
    _, handle = served
    buffer = bytearray()
    sock = _connect(handle)
    sock.sendall(GET_METRICS)
    _read_response(sock, buffer)
    started = time.monotonic()
    handle.stop()
    assert time.monotonic() - started < 3.0
    assert _closed(sock)
    sock.close()


def test_uvicorns_tick_runs_once_a_second_and_keeps_the_date_current(monkeypatch):
    """uvicorn's housekeeping (the Date header, should_exit) once a second, not ten times: an idle
    exporter's event loop wakes once a second, and the Date is never more than a second old."""
    from kvdoctor.exporter import server as server_module

    ticks: list[int] = []
    original = server_module._Server.on_tick

    async def counting(self, counter):
        ticks.append(counter)
        return await original(self, counter)

    monkeypatch.setattr(server_module._Server, "on_tick", counting)
    exporter = make_exporter()
    handle = serve_in_thread(create_app(exporter), "127.0.0.1", 0)
    try:
        time.sleep(3.2)
        idle_ticks = len(ticks)
        before = int(time.time())
        date = httpx.get(f"{handle.url}/healthz").headers["date"]
        after = int(time.time())
        assert before - 1 <= email.utils.parsedate_to_datetime(date).timestamp() <= after
    finally:
        started = time.monotonic()
        handle.stop(timeout=30)
        exporter.stop()
    assert 3 <= idle_ticks <= 5  # uvicorn's own loop: ~32 in 3.2 s
    assert set(ticks) == {0}  # every tick refreshes the Date, as uvicorn's tenth tick does
    assert time.monotonic() - started < 3 and not handle.alive


def test_serve_returns_1_when_the_server_dies_and_0_when_asked_to_stop():
    from kvdoctor.exporter.server import serve

    exporter = make_exporter()
    app = create_app(exporter)
    killed = serve(app, "127.0.0.1", 0, on_started=lambda handle: handle.stop())  # not through serve()
    stop = threading.Event()
    asked = serve(app, "127.0.0.1", 0, on_started=lambda handle: stop.set(), stop_event=stop)
    exporter.stop()
    assert (killed, asked) == (1, 0)
