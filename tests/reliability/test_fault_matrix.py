"""The engine fault matrix, against a real local HTTP server playing the engine.

tests/exporter/test_engine_faults.py already covers connection refused, an engine that stops and
comes back, a 500, an HTML page, a 50 MB body without Content-Length and a hang before the
headers. This file adds the rest of issue 7's matrix: a reset mid-body, a 404, a body trickling
past the timeout, a declared gigantic body, a gzip bomb, invalid UTF-8, duplicate series, NaN and
Inf, a counter decrease and a label explosion. For each, with the real engine collector, runtime
(diagnosis included) and HTTP app:

- the exporter keeps serving (``/metrics`` and ``/healthz`` answer 200 every fault cycle);
- the reason is counted in ``kvdoctor_source_errors_total{source="engine",reason}``;
- memory stays bounded: the peak of Python allocations during the fault cycles stays under a
  bound derived from ``max_body_bytes``, and nothing is retained from one fault cycle to the next;
- the next good scrape is used: once the engine answers well again, its new values are on the page.
"""

from __future__ import annotations

import gc
import json
import math
import random
import re
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvdoctor.exporter.adapters.base import MAX_CACHED_KEYS
from kvdoctor.signals import vocabulary as S
from tests.support import servers
from tests.support.exporter_rig import ExporterRig

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures/vllm-0.32-cpu/fill-sequence/08.txt"
MAX_BODY = 4 * 2**20
MAX_SERIES = 600
SCRAPE_TIMEOUT = 0.5
FAULT_CYCLES = 6
# Peak Python allocations allowed while faults are handled: a body up to the cap, held as bytes
# and then as text, its parse, plus headroom for the runtime's own per-cycle work.
PEAK_BOUND = 4 * MAX_BODY + 16 * 2**20
RETAINED_GROWTH_BOUND = 2 * 2**20  # from fault cycle 2 to the last one: nothing accumulates
ENGINE = {"engine": "vllm", "model_name": "tiny", "dp_rank": "0"}
GEN = 'vllm:generation_tokens_total{engine="0",model_name="tiny"}'
PROMPT = 'vllm:prompt_tokens_total{engine="0",model_name="tiny"}'
KV = 'vllm:kv_cache_usage_perc{engine="0",model_name="tiny"}'


def page(**values: str) -> bytes:
    """The vLLM fixture with some samples' values replaced: ``page(**{GEN: "10.0"})``."""
    text = FIXTURE.read_text()
    for series, value in values.items():
        text, n = re.subn(rf"^{re.escape(series)} \S+$", f"{series} {value}", text, flags=re.M)
        assert n == 1, series
    return text.encode()


GOOD = page()
FIXTURE_GEN = 4808.0
INVALID_UTF8 = GOOD.replace(b'model_name="tiny"} 4808.0', b'model_name="ti\xff\xfeny"} 4808.0')
assert INVALID_UTF8 != GOOD


def good_page_with(generation_tokens: float) -> bytes:
    return page(**{GEN: repr(generation_tokens)})


def label_explosion() -> bytes:
    """The good page plus 2,000 series of a family the adapter keeps, new label values each time."""
    salt = random.getrandbits(32)
    lines = "".join(f'vllm:num_requests_running{{engine="0",model_name="m{salt:x}-{i}"}} 1.0\n' for i in range(2_000))
    return GOOD + lines.encode()


def exploding() -> servers.Behaviour:
    """A new label explosion for every scrape."""
    return servers.computed(lambda path: (200, servers.EXPOSITION, label_explosion()))


# ------------------------------------------------------------------------------------------ rig


class Rig(ExporterRig):
    """The real engine collector, runtime (diagnosis included) and HTTP app, with this file's
    bounds; cycles run when the test says."""

    def __init__(self, engine_url: str, scrape_timeout: float = SCRAPE_TIMEOUT):
        super().__init__(
            engine_url,
            scrape_timeout=scrape_timeout,
            diagnose=True,
            max_body_bytes=MAX_BODY,
            max_series=MAX_SERIES,
            max_snapshots=4,
        )

    def engine_value(self, name: str) -> float | None:
        return self.page().get((name, frozenset(ENGINE.items())))


@pytest.fixture
def engine(fake_server):
    return fake_server(servers.respond(GOOD))


@pytest.fixture
def rig(engine, request):
    fault = request.node.callspec.params.get("fault") if hasattr(request.node, "callspec") else None
    r = Rig(engine.url("/metrics"), scrape_timeout=fault.scrape_timeout if fault else SCRAPE_TIMEOUT)
    yield r
    r.close()


# --------------------------------------------------------------------------------- extra checks


def not_doubled(rig: Rig) -> None:
    assert rig.engine_value(S.GENERATION_TOKENS) == FIXTURE_GEN, "a duplicated counter line was added up"


def no_infinite_counter(rig: Rig) -> None:
    value = rig.engine_value(S.GENERATION_TOKENS)
    assert value is None or math.isfinite(value), f"{S.GENERATION_TOKENS} reached the page as {value}"
    assert rig.errors("exception", source="diagnosis") == 0


def reset_passes_through(rig: Rig) -> None:
    """A counter reset reaches the page as it is, and the rates derived from it stay sane."""
    assert rig.engine_value(S.GENERATION_TOKENS) == 10.0  # raw counters: Prometheus' rate() handles resets
    diagnosis = rig.get("/api/v1/diagnosis").json()
    for item in diagnosis.get("evidence", []):
        value, unit = item.get("value"), str(item.get("unit", ""))
        if value is not None and ("/s" in unit or "per " in unit):
            assert math.isfinite(value) and value >= 0, f"{item['feature']} = {value} {unit} after a counter reset"


def capped(rig: Rig) -> None:
    assert len(rig.exporter.store.latest().samples) <= MAX_SERIES
    assert len(rig.get("/metrics").content) < 200 * MAX_SERIES  # the page is bounded too


@dataclass
class Fault:
    id: str
    answer: servers.Behaviour | bytes  # bytes: that page, as a normal answer
    reason: str
    up: float  # source_up during the fault: 0 (the scrape failed) or 1 (used, with the reason counted)
    check: Callable[[Rig], None] | None = None
    # Parsing thousands of series under tracemalloc is slow on a busy machine: a longer timeout
    # keeps that case about the cap, not about the timeout.
    scrape_timeout: float = SCRAPE_TIMEOUT
    slow: bool = False  # several seconds: marked slow (deselected by -m "not slow")
    # New labels every scrape refill the adapter's bounded key cache (MAX_CACHED_KEYS, ~1 KiB a key)
    # between any two cycles: that much may differ between the early and the late reading.
    churns_keys: bool = False

    @property
    def behaviour(self) -> servers.Behaviour:
        return servers.respond(self.answer) if isinstance(self.answer, bytes) else self.answer


FAULTS = [
    Fault("reset_mid_body", servers.reset_mid_body(GOOD), "transport_error", 0.0),
    Fault("http_404", servers.respond(b"404 page not found\n", status=404, content_type="text/plain"), "http_404", 0.0),
    Fault("slow_body_past_the_timeout", servers.trickle(GOOD, chunk=2048, pause=0.1), "timeout", 0.0, slow=True),
    Fault("declared_gigantic_body", servers.declared_huge(200 * 2**20), "body_too_large", 0.0),
    Fault("gzip_bomb", servers.gzip_bomb_answer(256 * 2**20), "body_too_large", 0.0, slow=True),
    Fault("invalid_utf8", INVALID_UTF8, "parse_error", 0.0),
    Fault("duplicate_series", GOOD + f"{GEN} {FIXTURE_GEN!r}\n".encode(), "duplicate_series", 1.0, check=not_doubled),
    Fault("nan_and_inf", page(**{KV: "NaN", GEN: "+Inf"}), "non_finite_value", 1.0, check=no_infinite_counter),
    Fault("counter_decrease", page(**{GEN: "10.0", PROMPT: "5.0"}), "counter_reset", 1.0, check=reset_passes_through),
    Fault(
        "label_explosion",
        exploding(),
        "series_cap",
        1.0,
        check=capped,
        scrape_timeout=3.0,
        slow=True,
        churns_keys=True,
    ),
]


def traced() -> tuple[int, int]:
    gc.collect()
    return tracemalloc.get_traced_memory()


@pytest.mark.parametrize("fault", [pytest.param(f, id=f.id, marks=[pytest.mark.slow] * f.slow) for f in FAULTS])
def test_engine_fault(rig: Rig, engine: servers.FakeServer, fault: Fault):
    for _ in range(2):
        rig.cycle()
    assert rig.up() == 1.0 and rig.engine_value(S.GENERATION_TOKENS) == FIXTURE_GEN

    engine.behaviour = fault.behaviour
    tracemalloc.start()
    try:
        start, _ = traced()
        tracemalloc.reset_peak()
        retained_early = 0
        for i in range(FAULT_CYCLES):
            rig.cycle()
            assert rig.get("/metrics").status_code == 200
            assert rig.get("/healthz").status_code == 200
            if i == 1:
                retained_early, _ = traced()
        retained_late, peak = traced()
    finally:
        tracemalloc.stop()

    assert rig.errors(fault.reason) >= 1, f"reason {fault.reason!r} not counted: {rig.exporter.status()['engine']}"
    assert rig.up() == fault.up
    if fault.check is not None:
        fault.check(rig)
    assert peak - start <= PEAK_BOUND, f"peak Python allocations {(peak - start) / 2**20:.1f} MiB during the fault"
    growth = retained_late - retained_early
    assert growth <= RETAINED_GROWTH_BOUND + fault.churns_keys * MAX_CACHED_KEYS * 2**10, (
        f"{growth / 2**20:.1f} MiB retained across fault cycles"
    )

    engine.behaviour = servers.respond(good_page_with(123456.0))
    for _ in range(5):
        rig.cycle()
        if rig.up() == 1.0 and rig.engine_value(S.GENERATION_TOKENS) == 123456.0:
            break
    assert rig.up() == 1.0
    assert rig.engine_value(S.GENERATION_TOKENS) == 123456.0, "the next good scrape was not used"
    status = rig.get("/api/v1/status").json()["sources"]["engine"]
    assert status["errors"].get(fault.reason, 0) >= 1 and status["up"] is True
    json.dumps(status)  # the status stays plain JSON after the fault


def test_a_label_explosion_does_not_crowd_out_the_real_signals(engine):
    rig = Rig(engine.url("/metrics"), scrape_timeout=3.0)
    try:
        rig.cycle()
        engine.behaviour = exploding()
        rig.cycle()
        assert rig.errors("series_cap") >= 1
        assert rig.engine_value(S.GENERATION_TOKENS) == FIXTURE_GEN, "the cap dropped a real signal"
        assert rig.engine_value(S.KV_CACHE_USAGE) is not None
    finally:
        rig.close()
