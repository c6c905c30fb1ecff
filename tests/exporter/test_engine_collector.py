"""The engine collector against a real HTTP server on loopback: good pages, every failure reason,
engine recognition (and recognising again), KV-tier adapters, and its factory."""

from __future__ import annotations

import contextlib
import gzip
import socket
import time
from pathlib import Path

import pytest

from kvdoctor.exporter.adapters import ADAPTERS, TIER_ADAPTERS, UNATTRIBUTED_TIER
from kvdoctor.exporter.collectors.engine import EngineCollector, engine_collector
from kvdoctor.exporter.settings import ExporterSettings
from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.collection import NotApplicable, SourceError
from kvdoctor.signals.textparse import iter_samples
from tests.support.servers import gzipped, respond, stream

ROOT = Path(__file__).resolve().parents[2]
VLLM_PAGE = (ROOT / "tests/fixtures/vllm-0.32-cpu/fill-sequence/08.txt").read_bytes()
SGLANG_PAGE = ROOT / "tests/fixtures/engines/sglang/current.txt"
LMCACHE_PAGE = ROOT / "tests/fixtures/engines/lmcache/vllm-with-lmcache.txt"


@pytest.fixture
def server(fake_server):
    return fake_server()


def engine_info(engine: str = "vllm", selection: str = "auto", **extra) -> tuple:
    """The ``kvdoctor_engine_info`` series every collection of a page without JSON endpoints adds."""
    cannot = ",".join(sorted(n.removeprefix("kvdoctor_") for n in ADAPTERS[engine].cannot_provide))
    labels = {**extra, "engine": engine, "adapter": engine, "selection": selection, "endpoints": "/metrics"}
    return (S.ENGINE_INFO, tuple(sorted({**labels, "cannot_provide": cannot}.items())))


def expected_vllm(text: bytes, selection: str = "auto", **extra) -> dict:
    adapter = ADAPTERS["vllm"]
    out = adapter.normalise(((n, lab, v) for n, lab, v, _ in iter_samples(text.decode())), extra)
    return {**out, engine_info("vllm", selection, **extra): 1.0}


def reason_of(collector: EngineCollector) -> str:
    with pytest.raises(SourceError) as caught:
        collector.collect()
    return caught.value.reason


def test_a_vllm_page_is_recognised_and_normalised(server):
    server.routes["/metrics"] = respond(VLLM_PAGE)
    collector = EngineCollector(server.url("/metrics"), extra_labels={"pod": "vllm-0"})
    try:
        collected = collector.collect()
    finally:
        collector.close()
    assert collector.adapter is ADAPTERS["vllm"]
    assert collected.samples == expected_vllm(VLLM_PAGE, pod="vllm-0")
    assert (
        collected.samples[
            (S.KV_CACHE_USAGE, (("dp_rank", "0"), ("engine", "vllm"), ("model_name", "tiny"), ("pod", "vllm-0")))
        ]
        == 0.9032258064516129
    )
    assert collected.partial_errors == []


def test_one_connection_is_reused_and_gzip_is_inflated(server):
    server.routes["/metrics"] = respond(VLLM_PAGE)
    server.routes["/gz"] = gzipped(gzip.compress(VLLM_PAGE))
    with contextlib.closing(EngineCollector(server.url("/metrics"))) as collector:
        for _ in range(3):
            collector.collect()
    assert server.requests == 3 and server.connections == 1
    gz = EngineCollector(server.url("/gz"), max_body_bytes=len(VLLM_PAGE) + 1)
    try:
        assert gz.collect().samples == expected_vllm(VLLM_PAGE)
    finally:
        gz.close()
    bomb = EngineCollector(server.url("/gz"), max_body_bytes=len(VLLM_PAGE) // 2)  # the cap is on inflated bytes
    try:
        assert reason_of(bomb) == "body_too_large"
    finally:
        bomb.close()


@pytest.mark.parametrize(
    ("page", "reason"),
    [
        (respond(b"engine exploded\n", status=500), "http_500"),
        (respond(b"<html><body><h1>502 Bad Gateway</h1></body></html>\n", content_type="text/html"), "parse_error"),
        (respond(b"\xff\xfe\x00binary\x00", content_type="application/octet-stream"), "parse_error"),
        (respond(b"# only a comment\nup 1\n"), "unknown_engine"),
        (stream(b'vllm:num_requests_running{engine="0"} 1\n' * 100, 4 * 1024 * 1024), "body_too_large"),
        (respond(b"x" * (512 * 1024)), "body_too_large"),  # declared Content-Length over the cap
        # not asked for, cannot be capped
        (respond(b"\x1b\x00\x00", headers={"Content-Encoding": "br"}), "unsupported_encoding"),
    ],
    ids=["500", "html", "binary", "unknown-engine", "huge-streamed", "huge-declared", "brotli"],
)
def test_failures_have_a_reason(server, page, reason):
    server.routes["/metrics"] = page
    collector = EngineCollector(server.url("/metrics"), max_body_bytes=256 * 1024)
    try:
        assert reason_of(collector) == reason
    finally:
        collector.close()


def test_missing_path_is_http_404(server):
    collector = EngineCollector(server.url("/no-such-path"))
    try:
        assert reason_of(collector) == "http_404"
    finally:
        collector.close()


def test_a_hanging_engine_times_out_promptly(server):
    server.routes["/metrics"] = respond(VLLM_PAGE, delay=1.5)
    collector = EngineCollector(server.url("/metrics"), timeout=0.3)
    start = time.monotonic()
    try:
        assert reason_of(collector) == "timeout"
    finally:
        collector.close()
    assert time.monotonic() - start < 1.2


def test_refused_connection():
    with socket.socket() as sock:  # a port nothing listens on once the socket closes
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    collector = EngineCollector(f"http://127.0.0.1:{port}/metrics", timeout=1.0)
    try:
        assert reason_of(collector) == "connection_refused"
    finally:
        collector.close()


@pytest.mark.skipif("sglang" not in ADAPTERS, reason="needs the sglang adapter (exporter/adapters/sglang.py)")
def test_the_engine_is_recognised_again_after_a_failure_or_a_change(server):
    server.routes["/metrics"] = respond(VLLM_PAGE)
    collector = EngineCollector(server.url("/metrics"))
    try:
        collector.collect()
        assert collector.adapter.name == "vllm"
        server.routes["/metrics"] = respond(b"down\n", status=503)
        assert reason_of(collector) == "http_503"
        assert collector.adapter is None  # will recognise the engine again
        server.routes["/metrics"] = respond(SGLANG_PAGE.read_bytes())
        out = collector.collect().samples
        assert collector.adapter.name == "sglang"
        assert {dict(lab)["engine"] for _, lab in out} == {"sglang"}
        server.routes["/metrics"] = respond(VLLM_PAGE)  # replaced without any failed scrape in between
        assert collector.collect().samples == expected_vllm(VLLM_PAGE)
        assert collector.adapter.name == "vllm"
    finally:
        collector.close()


@pytest.mark.skipif("sglang" not in ADAPTERS, reason="needs the sglang adapter (exporter/adapters/sglang.py)")
def test_a_fixed_engine_is_not_second_guessed(server):
    server.routes["/metrics"] = respond(SGLANG_PAGE.read_bytes())
    collector = EngineCollector(server.url("/metrics"), engine="vllm")
    try:
        assert collector.collect().samples == {engine_info("vllm", "configured"): 1.0}  # no vLLM family read
        assert collector.adapter is ADAPTERS["vllm"]
    finally:
        collector.close()


@pytest.mark.skipif(
    "lmcache" not in TIER_ADAPTERS, reason="needs the lmcache tier adapter (exporter/adapters/lmcache.py)"
)
def test_kv_tier_families_on_the_engine_page_are_applied(server):
    page = LMCACHE_PAGE.read_bytes()
    server.routes["/metrics"] = respond(page)
    collector = EngineCollector(server.url("/metrics"))
    try:
        out = collector.collect().samples
    finally:
        collector.close()
    tier = TIER_ADAPTERS["lmcache"].normalise(
        ((n, lab, v) for n, lab, v, _ in iter_samples(page.decode())), {"engine": "vllm"}
    )
    assert tier, "the fixture has LMCache families"
    assert {k: out[k] for k in tier} == tier
    assert {dict(lab)["engine"] for _, lab in tier} == {"vllm"}
    # vLLM's own series, but the connector hits it could not place in a tier: LMCache names them
    named_by_the_tier = {key for key in expected_vllm(page) if ("tier", UNATTRIBUTED_TIER) in key[1]}
    assert named_by_the_tier and not named_by_the_tier & set(out)
    assert set(expected_vllm(page)) - named_by_the_tier <= set(out)


def test_the_collectors_are_registered():
    from kvdoctor.exporter.collectors import REGISTRY
    from kvdoctor.exporter.collectors.dcgm import dcgm_collector
    from kvdoctor.exporter.collectors.nvml import nvml_collector

    assert {name: spec.factory for name, spec in REGISTRY.items() if name in ("engine", "nvml", "dcgm")} == {
        "engine": engine_collector,
        "nvml": nvml_collector,
        "dcgm": dcgm_collector,
    }
    assert all(REGISTRY[name].enabled_by_default for name in ("engine", "nvml", "dcgm"))


def test_no_url_is_not_applicable():
    with pytest.raises(NotApplicable):
        EngineCollector(None).collect()
    with pytest.raises(NotApplicable):
        engine_collector(ExporterSettings(engine_url=None, nvml=False))


def test_unknown_engine_name_is_refused():
    with pytest.raises(ValueError, match="unknown engine"):
        EngineCollector("http://127.0.0.1:1/metrics", engine="nope")


def test_factory_uses_the_settings(server):
    server.routes["/metrics"] = respond(VLLM_PAGE)
    settings = ExporterSettings(
        engine_url=server.url(""), engine="vllm", pod="p-1", scrape_timeout=0.7, max_body_bytes=200_000, nvml=False
    )
    collector = engine_collector(settings)
    try:
        assert collector.url == server.url("/metrics")  # the settings add /metrics
        assert collector.adapter is ADAPTERS["vllm"]
        out = collector.collect().samples
    finally:
        collector.close()
    assert out == expected_vllm(VLLM_PAGE, "configured", pod="p-1")
