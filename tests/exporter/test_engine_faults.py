"""Engine faults against a real local HTTP server playing the engine, and a real exporter
(collection thread + HTTP server, in this process).

In each case: /metrics keeps serving, ``kvdoctor_source_up{source="engine"}`` goes to 0 within
two cycles of the fault, the reason is counted, and the source recovers by itself once the
engine behaves again.
"""

from __future__ import annotations

import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvdoctor.exporter.app import create_app
from kvdoctor.exporter.collectors.engine import EngineCollector
from kvdoctor.exporter.runtime import Exporter
from kvdoctor.exporter.server import serve_in_thread
from kvdoctor.exporter.settings import ExporterSettings
from kvdoctor.rules import signals as S
from tests import tools

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures/vllm-0.32-cpu/fill-sequence/08.txt"
INTERVAL = 0.2
SCRAPE_TIMEOUT = 0.3
HANG_SECONDS = 1.5


class FakeEngine:
    """A vLLM-like /metrics on 127.0.0.1 whose behaviour the test switches at will."""

    def __init__(self, body: bytes):
        self.body = body
        self.mode = "ok"
        self.port = 0
        self._server: ThreadingHTTPServer | None = None
        self.requests = 0

    def start(self, port: int = 0) -> FakeEngine:
        engine = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # one request per connection: a stopped engine is really gone
            disable_nagle_algorithm = True

            def do_GET(self):
                engine.requests += 1
                mode = engine.mode
                if mode == "error500":
                    self.send_error(500, "engine exploded")
                elif mode == "garbage":
                    self._send(b"<html><body><h1>502 Bad Gateway</h1></body></html>", "text/html")
                elif mode == "huge":
                    self._send_huge()
                elif mode == "hang":
                    time.sleep(HANG_SECONDS)
                    self._send(engine.body, "text/plain; version=0.0.4")
                else:
                    self._send(engine.body, "text/plain; version=0.0.4")

            def _send(self, body: bytes, content_type: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _send_huge(self) -> None:
                # 50 MB of exposition lines, without Content-Length: only a streamed cap can stop it.
                chunk = b"".join(
                    b'vllm:num_requests_running{engine="0",model_name="m%d"} 1.0\n' % i for i in range(16000)
                )
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                sent = 0
                try:
                    while sent < 50 * 1024 * 1024:
                        self.wfile.write(chunk)
                        sent += len(chunk)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args) -> None:
                pass

        class Server(ThreadingHTTPServer):
            allow_reuse_address = True
            daemon_threads = True

            def handle_error(self, request, client_address) -> None:
                pass  # a client that hangs up on a huge body is expected here

        self._server = Server(("127.0.0.1", port), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"


class Rig:
    """A real exporter (collection thread + HTTP server) scraping a FakeEngine."""

    def __init__(self, engine_url: str):
        os.environ.pop("KVDOCTOR_POD", None)
        self.settings = ExporterSettings(
            engine_url=engine_url, interval=INTERVAL, scrape_timeout=SCRAPE_TIMEOUT, nvml=False
        )
        self.collector = EngineCollector(
            self.settings.engine_url, "auto", timeout=SCRAPE_TIMEOUT, max_body_bytes=self.settings.max_body_bytes
        )
        self.exporter = Exporter(self.settings, [self.collector]).start()
        self.http = serve_in_thread(create_app(self.exporter), "127.0.0.1", 0)
        self.client = httpx.Client(timeout=5)

    def metrics(self) -> dict[tuple[str, frozenset], float]:
        resp = self.client.get(f"{self.http.url}/metrics")
        assert resp.status_code == 200
        out = {}
        for family in text_string_to_metric_families(resp.text):
            for s in family.samples:
                out[(s.name, frozenset(s.labels.items()))] = s.value
        return out

    def up(self) -> float | None:
        return self.metrics().get((S.SOURCE_UP, frozenset({("source", "engine")})))

    def errors(self, reason: str) -> float:
        return self.metrics().get((S.SOURCE_ERRORS, frozenset({("source", "engine"), ("reason", reason)})), 0.0)

    def engine_up_after(self, since: float) -> list[float]:
        """source_up of every cycle that finished after ``since``, oldest first."""
        window = self.exporter.store.window(600)
        [values] = window.select(S.SOURCE_UP, source="engine").values() or [[]]
        return [float(v) for t, v in zip(window.timestamps, values) if t > since]

    def wait_up(self, value: float, timeout: float = 15.0) -> None:
        tools.wait_until(
            lambda: self.up() == value, timeout=timeout, interval=0.05, what=f"source_up{{source=engine}} == {value}"
        )

    def close(self) -> None:
        self.client.close()
        self.http.stop()
        self.exporter.stop()


@pytest.fixture
def engine():
    fake = FakeEngine(FIXTURE.read_bytes()).start()
    yield fake
    fake.mode = "ok"
    fake.stop()


@pytest.fixture
def rig(engine):
    r = Rig(engine.url)
    yield r
    r.close()


def assert_down_within_two_cycles(rig: Rig, since: float, timeout: float = 15.0) -> None:
    def seen() -> list[float] | None:
        ups = rig.engine_up_after(since)
        return ups if len(ups) >= 2 else None

    ups = tools.wait_until(seen, timeout=timeout, interval=0.05, what="two cycles after the fault")
    assert 0.0 in ups[:2], f"source_up after the fault: {ups[:5]}"


@pytest.mark.parametrize(
    "mode, reason",
    [
        ("error500", "http_500"),
        ("garbage", "parse_error"),
        ("huge", "body_too_large"),
        ("hang", "timeout"),
    ],
)
def test_engine_fault_is_reported_counted_and_recovered(rig, engine, mode, reason):
    rig.wait_up(1.0)
    assert (
        rig.metrics()[(S.GENERATION_TOKENS, frozenset({("engine", "vllm"), ("model_name", "tiny"), ("dp_rank", "0")}))]
        > 0
    )

    fault_at = time.time()
    engine.mode = mode
    assert_down_within_two_cycles(rig, fault_at)
    rig.wait_up(0.0)
    assert rig.errors(reason) >= 1
    assert S.SOURCE_UP in {name for name, _ in rig.metrics()}  # /metrics keeps serving

    engine.mode = "ok"
    rig.wait_up(1.0, timeout=HANG_SECONDS * 4 + 10)
    status = rig.client.get(f"{rig.http.url}/api/v1/status").json()["sources"]["engine"]
    assert status["up"] is True and status["errors"][reason] >= 1


def test_connection_refused_from_the_start_then_the_engine_comes_up():
    engine = FakeEngine(FIXTURE.read_bytes()).start()
    port = engine.port
    engine.stop()  # nothing listens on the port now
    rig = Rig(f"http://127.0.0.1:{port}/metrics")
    try:
        rig.wait_up(0.0)
        assert rig.errors("connection_refused") >= 1
        assert rig.client.get(f"{rig.http.url}/readyz").status_code == 200  # ready: cycles run, engine down
        engine.start(port)
        rig.wait_up(1.0)
    finally:
        rig.close()
        engine.stop()


def test_engine_disappears_mid_run_and_comes_back(rig, engine):
    rig.wait_up(1.0)
    port = engine.port
    gone_at = time.time()
    engine.stop()
    assert_down_within_two_cycles(rig, gone_at)
    assert rig.errors("connection_refused") >= 1
    engine.start(port)
    rig.wait_up(1.0)
    assert rig.up() == 1.0


@pytest.mark.slow
def test_metrics_stays_fast_while_the_engine_hangs(rig, engine):
    """/metrics never waits on the engine: scrapes during a hang answer from the last page."""
    rig.wait_up(1.0)
    engine.mode = "hang"
    deadline = time.monotonic() + HANG_SECONDS + 0.3
    slowest = 0.0
    while time.monotonic() < deadline:
        started = time.perf_counter()
        assert rig.client.get(f"{rig.http.url}/metrics").status_code == 200
        slowest = max(slowest, time.perf_counter() - started)
        time.sleep(0.02)
    # Waiting on the engine would take the whole hang (1.5 s); a loaded machine may add a little.
    assert slowest < 1.0, f"a /metrics scrape took {slowest:.3f} s during an engine hang"
