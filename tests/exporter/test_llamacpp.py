"""llama.cpp: its /metrics with its /slots and /props, read by the engine collector.

The pages are real: captured from llama-server 11434 (tests/fixtures/llamacpp-11434/README.md),
served here by the fake server so each endpoint can fail on its own. The real binary itself is
tests/e2e/test_llamacpp_e2e.py.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from pathlib import Path

import httpx
import pytest

from kvdoctor.exporter.adapters import ADAPTERS, detect
from kvdoctor.exporter.adapters.llamacpp import PROPS, SLOTS
from kvdoctor.exporter.collectors import engine as engine_module
from kvdoctor.exporter.collectors.engine import EngineCollector, endpoint_url, engine_status
from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.textparse import family_names
from tests.support.processes import kvdoctor
from tests.support.servers import JSON, respond
from tests.support.tools import wait_until

CAPTURED = Path(__file__).resolve().parents[1] / "fixtures" / "llamacpp-11434"
SECRET = "zebracanary"  # in every prompt the busy /slots page shows
METRICS = (CAPTURED / "metrics-busy.txt").read_bytes()
SLOTS_BUSY = (CAPTURED / "slots-busy-debug.json").read_bytes()
SLOTS_IDLE = (CAPTURED / "slots-idle.json").read_bytes()
SLOTS_OFF = (CAPTURED / "slots-disabled.json").read_bytes()
PROPS_PAGE = (CAPTURED / "props.json").read_bytes()
ENGINE = (("engine", "llamacpp"),)


def busy_tokens() -> list[int]:
    return [s["n_prompt_tokens"] for s in json.loads(SLOTS_BUSY) if s["is_processing"]]


@pytest.fixture
def llama(fake_server):
    """A fake llama-server answering the captured pages (each route replaceable)."""
    return fake_server(
        {
            "/metrics": respond(METRICS),
            "/slots": respond(SLOTS_BUSY, content_type=JSON),
            "/props": respond(PROPS_PAGE, content_type=JSON),
        }
    )


def collect(url: str, **options):
    collector = EngineCollector(url, **options)
    try:
        return collector, collector.collect()
    finally:
        collector.close()


def value(samples: dict, name: str) -> float:
    hits = [v for (n, _), v in samples.items() if n == name]
    assert len(hits) == 1, f"{name}: {hits}"
    return hits[0]


def info_labels(samples: dict) -> dict[str, str]:
    (labels,) = [dict(lab) for (n, lab) in samples if n == S.ENGINE_INFO]
    return labels


# ----------------------------------------------------------------------------- the readers


def test_slots_give_the_kv_usage_of_the_busy_slots_over_the_capacity_of_all():
    samples = {name: v for name, _, v in SLOTS.samples(SLOTS_BUSY.decode())}
    assert samples == {
        "llamacpp_slots:capacity_tokens": 2048.0,  # 4 slots x 512
        "llamacpp_slots:kv_usage_ratio": sum(busy_tokens()) / 2048,
    }
    assert len(busy_tokens()) == 4


def test_an_idle_slots_leftover_tokens_are_a_prefix_cache_not_pressure():
    assert any(s.get("n_prompt_tokens") for s in json.loads(SLOTS_IDLE))  # slot 3 kept its prompt
    samples = {name: v for name, _, v in SLOTS.samples(SLOTS_IDLE.decode())}
    assert samples == {"llamacpp_slots:capacity_tokens": 2048.0, "llamacpp_slots:kv_usage_ratio": 0.0}


def test_props_give_the_capacity_slots_times_their_context():
    assert PROPS.samples(PROPS_PAGE.decode()) == [("llamacpp_props:capacity_tokens", {}, 2048.0)]


@pytest.mark.parametrize(
    "body",
    [
        "{}",  # not a list
        '[{"id": 0}]',  # no n_ctx
        '[{"n_ctx": "512"}]',  # not a number
        "not json " + SECRET,
        "[" * 100_000,  # nested past the parser's recursion limit
    ],
)
def test_a_slots_page_that_is_not_what_llama_cpp_writes_is_a_value_error(body):
    with pytest.raises((ValueError, RecursionError)) as caught:
        SLOTS.samples(body)
    assert SECRET not in str(caught.value)


def test_builds_before_n_prompt_tokens_give_the_capacity_only():
    old = [{"id": 0, "n_ctx": 4096, "is_processing": True}, {"id": 1, "n_ctx": 4096, "is_processing": False}]
    assert {n for n, _, _ in SLOTS.samples(json.dumps(old))} == {"llamacpp_slots:capacity_tokens"}


@pytest.mark.parametrize(
    ("metrics", "expected"),
    [
        ("http://h:8080/metrics", "http://h:8080/slots"),
        ("http://h:8080/llm/metrics", "http://h:8080/llm/slots"),
        ("https://h/llm/metrics/", "https://h/llm/slots"),
        ("http://h:8080/prometheus", "http://h:8080/slots"),
        ("http://h:8080/metrics?x=1", "http://h:8080/slots"),
    ],
)
def test_endpoints_are_found_next_to_metrics(metrics, expected):
    assert endpoint_url(metrics, "/slots") == expected


# ----------------------------------------------------------------------------- the collector


def test_a_busy_server_gives_kv_usage_capacity_and_the_queue_and_names_its_adapter(llama):
    collector, collected = collect(llama.url("/metrics"), extra_labels={"pod": "l-0"})
    samples = collected.samples
    assert collector.adapter is ADAPTERS["llamacpp"] and collected.partial_errors == []
    assert value(samples, S.KV_CACHE_USAGE) == sum(busy_tokens()) / 2048
    assert value(samples, S.KV_CACHE_CAPACITY) == 2048
    assert (value(samples, S.REQUESTS_RUNNING), value(samples, S.REQUESTS_WAITING)) == (4, 2)
    assert value(samples, S.PROMPT_TOKENS) == 83 + 1  # processed + reused from the cache
    assert value(samples, S.GENERATION_SECONDS) == 0.004255
    assert "/props" not in llama.paths  # /slots gave the capacity: /props is not asked
    info = info_labels(samples)
    assert info == {
        "pod": "l-0",
        "engine": "llamacpp",
        "adapter": "llamacpp",
        "selection": "auto",
        "endpoints": "/metrics,/slots",
        "cannot_provide": ",".join(sorted(n.removeprefix("kvdoctor_") for n in ADAPTERS["llamacpp"].cannot_provide)),
    }
    status = collector.describe()
    assert status["adapter"] == "llamacpp" and status["endpoints"]["/slots"]["up"] is True
    assert engine_status([object(), collector]) == status and engine_status([]) is None


def test_the_text_slots_carry_is_never_kept_logged_or_exported(llama, caplog):
    caplog.set_level(logging.DEBUG, logger="kvdoctor")
    assert SECRET.encode() in SLOTS_BUSY  # the page does carry prompts
    collector, collected = collect(llama.url("/metrics"))
    llama.routes["/slots"] = respond(b"{" + SECRET.encode() + b" not json", content_type=JSON)
    second = EngineCollector(llama.url("/metrics"))
    try:
        broken = second.collect()
    finally:
        second.close()
    assert broken.partial_errors == ["slots_parse_error"]
    kept = repr((collected.samples, broken.samples, collector.describe(), second.describe(), caplog.text))
    assert SECRET not in kept
    assert "slots" in caplog.text  # the failure itself was logged, without the body


@pytest.mark.parametrize(
    ("slots", "reason"),
    [
        (respond(SLOTS_OFF, status=501, content_type=JSON), "slots_http_501"),  # --no-slots
        (respond(b"unauthorized", status=401), "slots_http_401"),  # an API key guards /slots
        (respond(b"[]", content_type=JSON), None),  # no slot: nothing to say, no error
    ],
)
def test_without_slots_the_metrics_part_stays_up_and_props_gives_the_capacity(llama, slots, reason):
    llama.routes["/slots"] = slots
    collector = EngineCollector(llama.url("/metrics"))
    try:
        first = collector.collect()
        second = collector.collect()
        status = collector.describe()
    finally:
        collector.close()
    assert first.partial_errors == ([reason] if reason else [])
    for collected in (first, second):
        assert value(collected.samples, S.REQUESTS_WAITING) == 2  # the engine source is up
        assert value(collected.samples, S.KV_CACHE_CAPACITY) == 2048  # from /props
        assert not any(n == S.KV_CACHE_USAGE for n, _ in collected.samples)
    if reason:
        # "not here" is asked again only after a while: no error every cycle
        assert llama.paths.count("/slots") == 1 and second.partial_errors == []
        assert S.KV_CACHE_USAGE in status["cannot_provide"] and S.KV_CACHE_CAPACITY not in status["cannot_provide"]
        assert info_labels(second.samples)["endpoints"] == "/metrics,/props"
        assert status["endpoints"]["/slots"] == {
            "url": llama.url("/slots"),
            "up": False,
            "last_error_reason": reason.removeprefix("slots_"),
        }
    assert llama.paths.count("/props") == 2


def test_a_hung_slots_endpoint_costs_only_what_is_left_of_the_timeout(llama):
    llama.routes["/slots"] = respond(SLOTS_BUSY, content_type=JSON, delay=3)
    started = time.monotonic()
    _, collected = collect(llama.url("/metrics"), timeout=0.8)
    assert time.monotonic() - started < 1.5
    # /slots used the time left; /props, next, had none: both counted, the /metrics part kept
    assert collected.partial_errors == ["slots_timeout", "props_timeout"] and "/props" not in llama.paths
    assert value(collected.samples, S.REQUESTS_RUNNING) == 4


def test_a_slots_body_over_its_cap_is_a_partial_error(llama, monkeypatch):
    big = json.dumps([{"n_ctx": 512, "is_processing": True, "prompt": "x" * 4096}] * 1100).encode()
    assert len(big) > SLOTS.max_body_bytes
    llama.routes["/slots"] = respond(big, content_type=JSON)
    _, collected = collect(llama.url("/metrics"))
    assert collected.partial_errors == ["slots_body_too_large"]
    assert value(collected.samples, S.KV_CACHE_CAPACITY) == 2048  # /props stood in


def test_a_slots_endpoint_that_answers_again_is_read_again(llama, monkeypatch):
    monkeypatch.setattr(engine_module, "ENDPOINT_RETRY_SECONDS", 0.0)
    llama.routes["/slots"] = respond(SLOTS_OFF, status=501, content_type=JSON)
    collector = EngineCollector(llama.url("/metrics"), engine="llamacpp")
    try:
        assert collector.collect().partial_errors == ["slots_http_501"]
        llama.routes["/slots"] = respond(SLOTS_BUSY, content_type=JSON)
        again = collector.collect()
    finally:
        collector.close()
    assert again.partial_errors == [] and value(again.samples, S.KV_CACHE_USAGE) > 0
    assert info_labels(again.samples)["selection"] == "configured"
    assert collector.cannot_provide() == sorted(ADAPTERS["llamacpp"].cannot_provide)


def test_the_adapter_is_logged_once_with_what_the_engine_cannot_provide(llama, caplog):
    caplog.set_level(logging.INFO, logger="kvdoctor.exporter")
    with contextlib.closing(EngineCollector(llama.url("/metrics"))) as collector:
        for _ in range(3):
            collector.collect()
    lines = [r.getMessage() for r in caplog.records if "adapter llamacpp" in r.getMessage()]
    assert len(lines) == 1
    assert "(recognised from its /metrics); reads /metrics, /slots, /props; cannot provide:" in lines[0]
    assert "inter_token_latency_seconds" in lines[0] and "kv_cache_usage_ratio" not in lines[0]


def test_the_captured_page_is_recognised_as_llama_cpp():
    assert detect(family_names(METRICS.decode())) is ADAPTERS["llamacpp"]


@pytest.mark.parametrize("engine", ["auto", "llamacpp"])
def test_the_exporter_says_which_adapter_it_uses_at_start_and_in_its_status(llama, engine):
    with kvdoctor(
        *("exporter", "--engine-url", llama.url("/metrics"), "--engine", engine, "--port", "0", "--no-collector.nvml"),
        clean_env=True,
    ) as exporter:
        line = exporter.wait_for_line(r"serving (http://\S+)/metrics", timeout=60)
        if engine == "auto":
            assert "(adapter: recognised from its /metrics" in line.string
            exporter.wait_for_line(r"adapter llamacpp \(recognised from its /metrics\); reads", timeout=30)
        else:
            assert "(adapter llamacpp, configured; cannot provide: preemptions_total," in line.string
        url = line.group(1)

        def slots_read() -> dict | None:  # the adapter is known before its endpoints are first read
            block = httpx.get(f"{url}/api/v1/status", timeout=5).json()["engine"]
            return block if block["adapter"] and block["endpoints"].get("/slots", {}).get("up") is not None else None

        engine_block = wait_until(slots_read)
        assert engine_block["adapter"] == "llamacpp"
    assert engine_block["selection"] == ("auto" if engine == "auto" else "configured")
    assert engine_block["endpoints"]["/slots"]["up"] is True, engine_block
