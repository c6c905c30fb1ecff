"""Engine faults against a real local HTTP server playing the engine, and a real exporter
(collection thread + HTTP server, in this process).

In each case: /metrics keeps serving, ``kvdoctor_source_up{source="engine"}`` goes to 0 within
two cycles of the fault, the reason is counted, and the source recovers by itself once the
engine behaves again.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kvdoctor.signals import vocabulary as S
from tests.support import servers, tools
from tests.support.exporter_rig import ExporterRig

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures/vllm-0.32-cpu/fill-sequence/08.txt"
INTERVAL = 0.2
SCRAPE_TIMEOUT = 0.3
HANG_SECONDS = 1.5
BODY = FIXTURE.read_bytes()
# 50 MB of exposition lines, without Content-Length: only a streamed cap can stop it.
HUGE_CHUNK = b"".join(b'vllm:num_requests_running{engine="0",model_name="m%d"} 1.0\n' % i for i in range(16000))
MODES = {
    "ok": servers.respond(BODY),
    "error500": servers.respond(b"engine exploded\n", status=500),
    "garbage": servers.respond(b"<html><body><h1>502 Bad Gateway</h1></body></html>", content_type="text/html"),
    "huge": servers.stream(HUGE_CHUNK, 50 * 1024 * 1024),
    "hang": servers.respond(BODY, delay=HANG_SECONDS),
}


class Rig(ExporterRig):
    """A real exporter (collection thread + HTTP server) scraping the fake engine."""

    def __init__(self, engine_url: str):
        super().__init__(engine_url, scrape_timeout=SCRAPE_TIMEOUT, interval=INTERVAL, start=True)

    def engine_up_after(self, since: float) -> list[float]:
        """source_up of every cycle that finished after ``since``, oldest first."""
        window = self.exporter.store.window(600)
        [values] = window.select(S.SOURCE_UP, source="engine").values() or [[]]
        return [float(v) for t, v in zip(window.timestamps, values, strict=True) if t > since]


@pytest.fixture
def engine(fake_server):
    return fake_server(MODES["ok"])


@pytest.fixture
def rig(engine):
    r = Rig(engine.url("/metrics"))
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
        rig.page()[(S.GENERATION_TOKENS, frozenset({("engine", "vllm"), ("model_name", "tiny"), ("dp_rank", "0")}))] > 0
    )

    fault_at = time.time()
    engine.behaviour = MODES[mode]
    assert_down_within_two_cycles(rig, fault_at)
    rig.wait_up(0.0)
    assert rig.errors(reason) >= 1
    assert S.SOURCE_UP in {name for name, _ in rig.page()}  # /metrics keeps serving

    engine.behaviour = MODES["ok"]
    rig.wait_up(1.0, timeout=HANG_SECONDS * 4 + 10)
    status = rig.client.get(f"{rig.http.url}/api/v1/status").json()["sources"]["engine"]
    assert status["up"] is True and status["errors"][reason] >= 1


def test_connection_refused_from_the_start_then_the_engine_comes_up():
    engine = servers.FakeServer(MODES["ok"])
    engine.stop()  # nothing listens on the port now
    rig = Rig(engine.url("/metrics"))
    try:
        rig.wait_up(0.0)
        assert rig.errors("connection_refused") >= 1
        assert rig.client.get(f"{rig.http.url}/readyz").status_code == 200  # ready: cycles run, engine down
        engine.start()  # on the same port
        rig.wait_up(1.0)
    finally:
        rig.close()
        engine.stop()


def test_engine_disappears_mid_run_and_comes_back(rig, engine):
    rig.wait_up(1.0)
    gone_at = time.time()
    engine.stop()
    assert_down_within_two_cycles(rig, gone_at)
    assert rig.errors("connection_refused") >= 1
    engine.start()  # on the same port
    rig.wait_up(1.0)
    assert rig.up() == 1.0


@pytest.mark.slow
def test_metrics_stays_fast_while_the_engine_hangs(rig, engine):
    """/metrics never waits on the engine: scrapes during a hang answer from the last page."""
    rig.wait_up(1.0)
    engine.behaviour = MODES["hang"]
    deadline = time.monotonic() + HANG_SECONDS + 0.3
    slowest = 0.0
    while time.monotonic() < deadline:
        started = time.perf_counter()
        assert rig.client.get(f"{rig.http.url}/metrics").status_code == 200
        slowest = max(slowest, time.perf_counter() - started)
        time.sleep(0.02)
    # Waiting on the engine would take the whole hang (1.5 s); a loaded machine may add a little.
    assert slowest < 1.0, f"a /metrics scrape took {slowest:.3f} s during an engine hang"
