"""End to end against a real llama.cpp ``llama-server`` (built by scripts/build-llama-server.sh)
serving a random GGUF model: the exporter (a real subprocess), the load, ``kvdoctor stress`` and
``kvdoctor diagnose``.

- a queue on 4 slots with 16 clients: the exporter names its adapter, reads KV usage from /slots
  (and never keeps a word of the prompts /slots shows), and the verdict names the queue;
- a request longer than the diagnosis window on a slow model: llama.cpp counts its tokens only when
  it ends, yet it is not ``idle``;
- a restart of the server: recognised again, counters starting over;
- ``kvdoctor stress``: tokens/s within 10 % of the engine's own counter and a per-token time within
  20 % of the server's log; without /slots (no KV usage) it stops on the queue and says so.

Each test starts its own server (about a second: the model is written in well under one).
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.kvdoctor_stack import ExporterProcess
from tests.e2e.llama_server import SLOW_SHAPE, LlamaServer, make_gguf
from tests.e2e.vllm_server import BackgroundLoad, samples
from tests.support import tools
from tests.support.tools import requires_llama_server, wait_until

pytestmark = [pytest.mark.slow, requires_llama_server]

SECRET = "zebracanary"  # a word in every prompt of the queue test: /slots shows it, kvdoctor must not keep it
WINDOW_SECONDS = 60  # the exporter's default diagnosis window


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gguf")


@pytest.fixture(scope="module")
def tiny_model(gguf_dir: Path) -> Path:
    started = time.monotonic()
    model = make_gguf(gguf_dir / "tiny.gguf")
    assert time.monotonic() - started < 10  # the script itself takes well under a second
    return model


@pytest.fixture
def llama(tmp_path: Path, tiny_model: Path) -> Iterator[Callable[..., LlamaServer]]:
    """llama(**options) starts a llama-server (the tiny model, 4 slots of 512 tokens); all stopped after."""
    servers: list[LlamaServer] = []

    def start(model: Path | None = None, **options) -> LlamaServer:
        server = LlamaServer(tools.require("llama-server"), model or tiny_model, tmp_path / "llama", **options)
        servers.append(server.start())
        return server

    yield start
    for server in servers:
        server.stop()


def exporter_for(server: LlamaServer, tmp_path: Path, pod: str, engine: str = "auto") -> ExporterProcess:
    # --log-level info (after the harness's warning): the adapter line is an INFO line
    return ExporterProcess(server.metrics_url, tmp_path, pod=pod, engine=engine, extra_args=("--log-level", "info"))


def exporter_page(exporter: ExporterProcess) -> str:
    return httpx.get(f"{exporter.url}/metrics", timeout=30).text


def one(page: str, name: str) -> tuple[dict[str, str], float]:
    found = samples(page, name)
    assert len(found) == 1, f"{name}: {found}"
    return found[0]


# ------------------------------------------------------------------------------------ the queue


def test_a_queue_on_four_slots_is_named_with_kv_usage_from_slots(llama, tmp_path, run_cli):
    # LLAMA_SERVER_SLOTS_DEBUG: /slots shows every slot's prompt and generated text
    server = llama(env={"LLAMA_SERVER_SLOTS_DEBUG": "1"})
    exporter = exporter_for(server, tmp_path, "llama-queue").start()
    try:
        prompt = lambda i: f"{SECRET} {i} memory bandwidth decode cache block token"  # noqa: E731
        with BackgroundLoad(server.url, "tiny", concurrency=16, duration_s=120, max_tokens=64, prompt=prompt):
            wait_until(
                lambda: samples(exporter_page(exporter), "kvdoctor_kv_cache_usage_ratio"),
                timeout=30,
                what="the exporter's first KV usage sample",
            )
            wait_until(  # there is text to leak
                lambda: SECRET in server.get("/slots").text, timeout=30, what="a slot holding the secret prompt"
            )
            verdict = wait_until(
                lambda: (d := exporter.diagnosis())["verdict"] == "request_queueing" and d,
                timeout=90,
                interval=1.0,
                what="the verdict request_queueing",
            )
            page = exporter_page(exporter)
            status = exporter.get("/api/v1/status")
            window = httpx.get(f"{exporter.url}/api/v1/window", params={"seconds": 60}, timeout=10).text
            diagnosed = run_cli("diagnose", "--exporter", exporter.url, "--json", timeout=60)
        # once idle, the canonical prompt tokens are the engine's processed + cached, to the token
        wait_until(lambda: server.metrics()["llamacpp:requests_processing"] == 0, timeout=30, what="idle")
        engine = server.metrics()
        time.sleep(2.5)  # two exporter cycles
        settled = exporter_page(exporter)
        log = exporter.process.output
    finally:
        exporter.stop()

    # the adapter, named in the status, the info metric and the log
    assert status["engine"]["adapter"] == "llamacpp" and status["engine"]["selection"] == "auto"
    assert status["engine"]["endpoints"]["/slots"]["up"] is True
    assert "kvdoctor_kv_cache_usage_ratio" not in status["engine"]["cannot_provide"]
    assert "kvdoctor_inter_token_latency_seconds" in status["engine"]["cannot_provide"]
    info, value = one(page, "kvdoctor_engine_info")
    assert value == 1 and info["engine"] == "llamacpp" and info["endpoints"] == "/metrics,/slots"
    assert "time_to_first_token_seconds" in info["cannot_provide"].split(",")
    assert "adapter: recognised from its /metrics" in log  # the start-up line
    assert "adapter llamacpp (recognised from its /metrics); reads /metrics, /slots, /props" in log

    # KV usage from /slots: 4 slots of 512 tokens, each holding a short prompt and 64 tokens
    _, capacity = one(page, "kvdoctor_kv_cache_capacity_tokens")
    _, usage = one(page, "kvdoctor_kv_cache_usage_ratio")
    assert capacity == 2048 and 0.02 < usage < 0.5, usage
    _, running = one(page, "kvdoctor_requests_running")
    assert running <= 4

    # the verdict names the queue, in the exporter and in `kvdoctor diagnose`
    assert verdict["features"]["requests_waiting"] >= 1
    assert diagnosed.rc == 1, diagnosed.stderr
    assert json.loads(diagnosed.stdout)["verdict"] == "request_queueing"

    # nothing of the text /slots carried was kept, served or logged
    for served in (page, settled, window, json.dumps(status), log):
        assert SECRET not in served

    _, prompt_tokens = one(settled, "kvdoctor_prompt_tokens_total")
    assert prompt_tokens == engine["llamacpp:prompt_tokens_total"] + engine["llamacpp:prompt_tokens_cached_total"]
    _, seconds = one(settled, "kvdoctor_generation_seconds_total")
    assert seconds == engine["llamacpp:tokens_predicted_seconds_total"] > 0


# ------------------------------------------------------------------------ a long request, not idle


def test_a_request_longer_than_the_window_is_not_idle(llama, gguf_dir, tmp_path):
    """llama.cpp adds a request's tokens to its counters when it ends: over a window inside one
    long request they do not move, and only the running request says the engine works."""
    slow = gguf_dir / "slow.gguf"
    if not slow.exists():
        make_gguf(slow, **SLOW_SHAPE)
    server = llama(model=slow, parallel=1, context=8192)
    exporter = exporter_for(server, tmp_path, "llama-long", engine="llamacpp").start()
    before = server.metrics()["llamacpp:tokens_predicted_total"]
    chunks: list[float] = []
    stop = threading.Event()

    def stream() -> None:
        body = {"prompt": "memory bandwidth decode", "max_tokens": 8000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=300) as resp:
            for line in resp.iter_lines():
                if line.startswith("data:"):
                    chunks.append(time.monotonic())
                if stop.is_set():
                    return

    streamer = threading.Thread(target=stream, daemon=True)
    streamer.start()
    try:
        wait_until(lambda: chunks, timeout=60, what="the first streamed token")
        time.sleep(max(0.0, chunks[0] + WINDOW_SECONDS + 3 - time.monotonic()))
        assert streamer.is_alive(), f"the request ended after {len(chunks)} tokens: the model is too fast here"
        diagnosis = exporter.diagnosis()
        engine = server.metrics()
    finally:
        stop.set()
        exporter.stop()
    print(f"\n{len(chunks)} tokens in {chunks[-1] - chunks[0]:.0f} s: {diagnosis['verdict']}: {diagnosis['headline']}")
    assert engine["llamacpp:tokens_predicted_total"] == before  # nothing counted yet, after a whole window
    assert len(chunks) > 100  # while it streamed all along
    assert engine["llamacpp:requests_processing"] == 1
    assert diagnosis["verdict"] != "idle", diagnosis["headline"]
    assert diagnosis["features"]["requests_running"] >= 1


# --------------------------------------------------------------------------------- a restart


def test_a_restarted_server_is_recognised_again_and_its_counters_start_over(llama, tmp_path):
    server = llama()
    exporter = exporter_for(server, tmp_path, "llama-restart").start()
    try:
        for _ in range(3):
            server.complete("memory bandwidth decode", 50)
        first = wait_until(
            lambda: (v := one(exporter_page(exporter), "kvdoctor_generation_tokens_total")[1]) >= 158 and v,
            timeout=15,
            what="the exporter counting the first server's tokens",
        )
        server.restart(down_seconds=3)
        server.complete("memory bandwidth decode", 20)
        # the restarted server's warm-up (8 tokens) and this request, counted from zero again
        after = wait_until(
            lambda: one(exporter_page(exporter), "kvdoctor_generation_tokens_total")[1] == 8 + 20,
            timeout=15,
            what="the restarted server's counters",
        )
        status = exporter.get("/api/v1/status")
        diagnosis = exporter.diagnosis()
    finally:
        exporter.stop()
    assert server.starts == 2 and first >= 158 and after
    engine = status["sources"]["engine"]
    assert engine["up"] is True and engine["errors"].get("connection_refused", 0) >= 1
    assert engine["errors"].get("counter_reset") == 1  # flagged, and passed on raw: rate() handles it
    assert status["engine"]["adapter"] == "llamacpp" and status["engine"]["endpoints"]["/slots"]["up"] is True
    assert all(v >= 0 for v in diagnosis["features"].values() if isinstance(v, (int, float)))


# ------------------------------------------------------------------------------- kvdoctor stress


def test_stress_counts_tokens_like_the_engine_and_times_them_like_its_log(llama, tmp_path, run_cli):
    """Usage arrives only in llama.cpp's last chunk: counted once, tokens/s is the engine's."""
    server = llama()
    before, logged = server.metrics(), len(server.eval_timings())
    out = tmp_path / "stress"
    result = run_cli(
        *("stress", "--engine-url", server.url, "--prompt-tokens", "64", "--max-tokens", "64"),
        *("--start-concurrency", "4", "--max-concurrency", "4", "--step-seconds", "15", "-o", out),
        timeout=180,
    )
    after = server.metrics()
    assert result.rc == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    (step,) = summary["steps"]
    assert summary["latency_source"] == "client" and step["requests_failed"] == 0
    assert abs(summary["endpoint"]["prompt_tokens"] - 64) <= 2

    engine_tokens = after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"]
    print(f"\nclient {step['tokens']} tokens ({step['tokens_per_second']:.0f}/s), engine {engine_tokens:.0f}")
    assert step["tokens"] == pytest.approx(engine_tokens, rel=0.10)
    assert step["tokens_per_second"] == pytest.approx(step["engine_tokens_per_second"], rel=0.10)

    # the server's own per-token time of the run's full requests (probes and cut ones left out)
    per_token = [per for _, n, per in server.eval_timings()[logged:] if n == 64]
    logged_ms = statistics.median(per_token)
    print(f"per token: client p50 {step['itl_p50_ms']:.3f} ms, engine mean {step['engine_mean_per_token_ms']:.3f} ms")
    print(f"server log median {logged_ms:.3f} ms over {len(per_token)} requests")
    assert len(per_token) >= 8
    assert step["itl_p50_ms"] == pytest.approx(logged_ms, rel=0.20)
    assert step["engine_mean_per_token_ms"] == pytest.approx(logged_ms, rel=0.20)
    assert step["kv_usage_max"] is not None and 0 < step["kv_usage_max"] < 0.5  # /slots


def test_stress_without_kv_usage_stops_on_the_queue_and_diagnose_names_it(llama, tmp_path, run_cli):
    """16 clients on 4 slots without /slots: no KV usage anywhere, the queue stands in for it.
    (How the steps climb to the first queued one is tests/stress' part; a real llama.cpp's
    deferred count flickers at 8 clients on 4 slots, as the batch's requests end together.)"""
    server = llama(extra_args=("--no-slots",))  # /metrics only: no KV usage anywhere
    out = tmp_path / "stress"
    result = run_cli(
        *("stress", "--engine-url", server.url, "--prompt-tokens", "64", "--max-tokens", "64"),
        *("--start-concurrency", "16", "--max-concurrency", "32", "--step-seconds", "12", "-o", out),
        timeout=240,
    )
    assert result.rc == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    saturation = summary["saturation"]
    assert (saturation["reached"], saturation["reason"], saturation["concurrency"]) == (True, "queue", 16)
    assert saturation["waiting"] >= 4 and [s["concurrency"] for s in summary["steps"]] == [16]
    assert summary["steps"][0]["kv_usage_max"] is None
    assert "stopped on the queue at concurrency ×16" in summary["verdict"]["headline"]
    assert "stopped on the queue" in result.stdout and "stopping on the queue" in result.stderr
    assert summary["diagnosis"]["verdict"] == "request_queueing", summary["diagnosis"]

    replayed = run_cli("diagnose", "--replay", out / "trace.om", "--json", timeout=60)
    assert replayed.rc == 1, replayed.stderr
    assert json.loads(replayed.stdout)["verdict"] == "request_queueing"
