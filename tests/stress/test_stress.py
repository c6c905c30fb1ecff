"""kvdoctor stress: the schedule, the binning, saturation and the verdict on recorded windows, the
report folder, and the command against a small OpenAI-compatible server in this process.

The real thing (a real vLLM and exporter) is tests/e2e/test_stress_vllm.py.
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import httpx
import numpy as np
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.window import Snapshot, Window, labels_of
from kvdoctor.stress.load import EndpointError, LoadRunner, _chunk_tokens, api_root, discover, make_prompt
from kvdoctor.stress.plan import (
    BANDWIDTH,
    NO_KNEE,
    PREEMPTION_ONSET,
    QUEUE,
    TTFT,
    UNKNOWN,
    StressSettings,
    dram_bandwidth_peak,
    find_saturation,
    step_schedule,
    stress_verdict,
    summarise_steps,
)
from kvdoctor.stress.timeline import Bins, RequestRecord, StepRecord, bin_run
from tests.support.cli import exit_status

T0 = 1_700_000_000.0
ENGINE = labels_of(engine="vllm", model_name="tiny")
LE = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, math.inf)
FILL = sorted((Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32-cpu" / "fill-sequence").glob("*.txt"))


# ----------------------------------------------------------------------------------------- helpers


def recorded_window(
    kv: list[float],
    itl: list[float],
    tokens_per_interval: float = 100.0,
    preemptions: list[float] | None = None,
    start: float = T0,
    interval: float = 1.0,
    reset_at: int | None = None,
) -> Window:
    """What an exporter records: one snapshot per interval, KV usage, the preemption counter, and the
    ITL histogram with ``tokens_per_interval`` tokens per interval all at latency ``itl[i]`` (the
    first snapshot is the baseline). ``reset_at``: the engine restarted there (counters from zero)."""
    snaps = []
    cumulative = {le: 0.0 for le in LE}
    total = count = pre_total = 0.0
    for i, usage in enumerate(kv):
        if reset_at is not None and i == reset_at:
            cumulative = {le: 0.0 for le in LE}
            total = count = pre_total = 0.0
        if i > 0:
            for le in LE:
                if itl[i] <= le:
                    cumulative[le] += tokens_per_interval
            total += itl[i] * tokens_per_interval
            count += tokens_per_interval
            pre_total += (preemptions or [0.0] * len(kv))[i]
        snap = Snapshot(start + i * interval)
        snap.add(S.KV_CACHE_USAGE, usage, ENGINE)
        snap.add(S.PREEMPTIONS, pre_total, ENGINE)
        snap.add(S.REQUESTS_WAITING, 0.0, ENGINE)
        for le in LE:
            snap.add(
                S.INTER_TOKEN_LATENCY + "_bucket",
                cumulative[le],
                dict(ENGINE, le="+Inf" if math.isinf(le) else repr(le)),
            )
        snap.add(S.INTER_TOKEN_LATENCY + "_sum", total, ENGINE)
        snap.add(S.INTER_TOKEN_LATENCY + "_count", count, ENGINE)
        snaps.append(snap)
    return Window.from_snapshots(snaps)


def steps_over(n_intervals: int, per_step: int, start: float = T0) -> list[StepRecord]:
    """Steps x1, x2, x4, ... of ``per_step`` intervals each, covering ``n_intervals``."""
    levels = [2**i for i in range(math.ceil(n_intervals / per_step))]
    return [StepRecord(i, c, start + i * per_step, start + (i + 1) * per_step) for i, c in enumerate(levels)]


def bins_of(window: Window, steps: list[StepRecord]) -> Bins:
    return bin_run([], steps, window, float(window.timestamps[0]), float(window.timestamps[-1]))


# ---------------------------------------------------------------------------------------- schedule


@pytest.mark.parametrize(
    "start, maximum, expected",
    [
        (1, 1, [1]),
        (1, 16, [1, 2, 4, 8, 16]),
        (1, 24, [1, 2, 4, 8, 16, 24]),
        (3, 20, [3, 6, 12, 20]),
        (4, 4, [4]),
    ],
)
def test_step_schedule_doubles_up_to_the_maximum(start, maximum, expected):
    assert step_schedule(start, maximum) == expected


@pytest.mark.parametrize("start, maximum", [(0, 4), (5, 4), (-1, 1)])
def test_step_schedule_refuses_impossible_ranges(start, maximum):
    with pytest.raises(ValueError):
        step_schedule(start, maximum)


@pytest.mark.parametrize(
    "changes, flag",
    [
        (dict(prompt_tokens=0), "--prompt-tokens"),
        (dict(max_tokens=1), "--max-tokens"),
        (dict(start_concurrency=0), "--start-concurrency"),
        (dict(start_concurrency=8, max_concurrency=4), "--max-concurrency"),
        (dict(step_seconds=0), "--step-seconds"),
        (dict(step_seconds=math.nan), "--step-seconds"),
        (dict(kv_saturation=1.5), "--kv-saturation"),
    ],
)
def test_settings_name_the_flag_that_is_wrong(changes, flag):
    with pytest.raises(ValueError, match=flag):
        StressSettings(endpoint="http://x", **changes).validate()


# ----------------------------------------------------------------------------------------- binning


def test_bins_follow_the_exporter_intervals_with_the_engine_latency():
    kv = [0.0, 0.1, 0.2, 0.3, 0.4]
    itl = [0.0, 0.012, 0.02, 0.04, 0.2]
    window = recorded_window(kv, itl, preemptions=[0, 0, 0, 2, 1])
    bins = bins_of(window, steps_over(4, 2))

    assert len(bins) == 4 and bins.latency_source == "engine"
    np.testing.assert_allclose(bins.edges, window.timestamps)
    np.testing.assert_allclose(bins.kv_usage, kv[1:])  # the KV sample at the end of each interval
    np.testing.assert_allclose(bins.itl_mean, itl[1:])
    np.testing.assert_allclose(bins.tokens, 100)
    np.testing.assert_allclose(bins.preemptions, [0, 0, 2, 1])
    # every token of an interval sits in one bucket: the quantiles stay inside it
    for lat, p50, p95 in zip(itl[1:], bins.itl_p50, bins.itl_p95, strict=True):
        upper = min(le for le in LE if lat <= le)
        lower = max([le for le in LE if le < upper], default=0.0)
        assert lower <= p50 <= p95 <= upper
    assert list(bins.step) == [0, 0, 1, 1]


def test_an_engine_restart_is_not_a_negative_interval():
    kv = [0.1] * 8
    itl = [0.0] + [0.02] * 7
    window = recorded_window(kv, itl, preemptions=[0, 0, 1, 0, 0, 0, 0, 0], reset_at=4)
    bins = bins_of(window, steps_over(7, 7))
    assert (bins.tokens >= 0).all() and (bins.preemptions >= 0).all()
    np.testing.assert_allclose(bins.itl_mean, 0.02)  # no interval mixes the two counters' scales
    assert bins.preemptions.sum() == 1


def test_without_an_exporter_window_the_client_gaps_are_binned_per_second():
    record = RequestRecord(step=0, started=T0, status="ok")
    record.token_times = [T0 + 0.5, T0 + 0.6, T0 + 0.7, T0 + 1.2, T0 + 1.8, T0 + 2.9]
    steps = [StepRecord(0, 1, T0, T0 + 3)]
    bins = bin_run([record], steps, None, T0, T0 + 3)
    assert bins.latency_source == "client" and len(bins) == 3
    np.testing.assert_allclose(bins.tokens, [2, 2, 1])
    np.testing.assert_allclose(bins.itl_mean, [0.1, 0.55, 1.1], rtol=1e-6)
    assert np.isnan(bins.kv_usage).all()


def test_a_missed_exporter_cycle_keeps_the_last_kv_for_two_bins_only():
    window = recorded_window([0.5] * 4, [0.0] + [0.02] * 3)
    gap = Window(window.timestamps, dict(window.series))
    key = (S.KV_CACHE_USAGE, ENGINE)
    gap.series[key] = np.array([0.5, 0.5, np.nan, np.nan])
    bins = bins_of(gap, steps_over(3, 3))
    np.testing.assert_allclose(bins.kv_usage, [0.5, 0.5, 0.5])
    long_gap = recorded_window([0.5] * 6, [0.0] + [0.02] * 5)
    long_gap.series[key] = np.array([0.5, 0.5, np.nan, np.nan, np.nan, np.nan])
    bins = bins_of(long_gap, steps_over(5, 5))
    assert np.isnan(bins.kv_usage[-1]) and bins.kv_usage[2] == 0.5


# -------------------------------------------------------------------------- saturation and verdict


def test_saturation_is_the_first_preemption_with_the_fullest_kv_seen_until_then():
    kv = [0.0, 0.3, 0.6, 0.92, 0.4, 0.9]  # a preemption frees blocks: usage dips as it happens
    window = recorded_window(kv, [0.0] + [0.02] * 5, preemptions=[0, 0, 0, 0, 1, 0])
    steps = steps_over(5, 2)
    sat = find_saturation(bins_of(window, steps), steps)
    assert sat.reached and sat.reason == "preemptions"
    assert sat.kv_usage == pytest.approx(0.92) and sat.concurrency == 2  # interval 3..4 s: step x2


def test_saturation_at_the_kv_ceiling_without_preemption():
    window = recorded_window([0.0, 0.5, 0.96, 0.97], [0.0, 0.02, 0.02, 0.02])
    steps = steps_over(3, 1)
    sat = find_saturation(bins_of(window, steps), steps, kv_ceiling=0.95)
    assert (sat.reached, sat.reason, sat.concurrency) == (True, "kv_ceiling", 2)
    assert not find_saturation(bins_of(window, steps), steps, kv_ceiling=0.99).reached


def test_latency_that_jumps_once_kv_passes_a_level_is_preemption_onset():
    kv = [0.0, *np.linspace(0.1, 1.0, 30)]
    itl = [0.0] + [0.02 if u < 0.8 else 0.2 for u in kv[1:]]
    pre = [0.0] + [1.0 if u >= 0.8 else 0.0 for u in kv[1:]]
    window = recorded_window(kv, itl, preemptions=pre)
    steps = steps_over(30, 10)
    bins = bins_of(window, steps)
    verdict = stress_verdict(bins, find_saturation(bins, steps))
    assert verdict.pattern == PREEMPTION_ONSET
    assert verdict.knee.kv_level == pytest.approx(0.8, abs=0.05)
    assert "jumps" in verdict.headline and "preempt" in verdict.headline
    assert verdict.knee_time is not None and bins.kv_usage[np.searchsorted(bins.centres, verdict.knee_time)] >= 0.75


def test_latency_rising_with_kv_is_bandwidth_bound():
    kv = [0.0, *np.linspace(0.1, 0.9, 30)]
    itl = [0.0] + [0.01 * (1 + 2 * u) for u in kv[1:]]
    window = recorded_window(kv, itl)
    steps = steps_over(30, 10)
    bins = bins_of(window, steps)
    verdict = stress_verdict(bins, find_saturation(bins, steps))
    assert verdict.pattern == BANDWIDTH
    assert "rises in step with KV" in verdict.headline and "10% -> 90%" in verdict.headline


def with_gpu_counters(window: Window, dram: float, method: str = "gpm") -> Window:
    """``window`` with a GPU's DRAM bandwidth utilisation recorded at ``dram`` in every snapshot."""
    gpu = labels_of(gpu="0", method=method)
    series = dict(window.series)
    series[(S.GPU_DRAM_BANDWIDTH_UTILIZATION, gpu)] = np.full(len(window), dram)
    return Window(window.timestamps, series)


def test_a_rise_without_gpu_counters_names_the_pattern_but_not_the_cause():
    kv = [0.0, *np.linspace(0.1, 0.9, 30)]
    window = recorded_window(kv, [0.0] + [0.01 * (1 + 2 * u) for u in kv[1:]])
    steps = steps_over(30, 10)
    bins = bins_of(window, steps)
    assert dram_bandwidth_peak(window) is None
    cpu_only = stress_verdict(bins, find_saturation(bins, steps), dram_peak=dram_bandwidth_peak(window))
    assert cpu_only.pattern == BANDWIDTH and "memory-bandwidth-bound pattern" in cpu_only.headline
    assert "no GPU counter was recorded" in cpu_only.headline and "cannot be attributed to HBM" in cpu_only.headline
    # NVML's duty cycle is no bandwidth counter; GPM (or DCGM) is, and the headline quotes it
    assert dram_bandwidth_peak(with_gpu_counters(window, 0.9, method=S.METHOD_NVML_UTIL)) is None
    measured = with_gpu_counters(window, 0.87)
    assert dram_bandwidth_peak(measured) == pytest.approx(0.87)
    on_gpu = stress_verdict(bins, find_saturation(bins, steps), dram_peak=dram_bandwidth_peak(measured))
    assert "DRAM bandwidth up to 87% of peak" in on_gpu.headline and "cannot be attributed" not in on_gpu.headline


def test_flat_latency_has_no_knee_and_says_whether_kv_saturated():
    kv = [0.0, *np.linspace(0.1, 0.9, 30)]
    window = recorded_window(kv, [0.0] + [0.02] * 30)
    steps = steps_over(30, 10)
    bins = bins_of(window, steps)
    verdict = stress_verdict(bins, find_saturation(bins, steps))
    assert verdict.pattern == NO_KNEE and "did not saturate" in verdict.headline


def test_without_kv_the_pattern_is_unknown():
    record = RequestRecord(step=0, started=T0, status="ok", token_times=[T0 + 0.1 * i for i in range(30)])
    steps = [StepRecord(0, 1, T0, T0 + 3)]
    bins = bin_run([record], steps, None, T0, T0 + 3)
    assert stress_verdict(bins, find_saturation(bins, steps)).pattern == UNKNOWN


def test_step_summaries_count_requests_tokens_and_the_exporter_signals():
    window = recorded_window([0.0, 0.2, 0.3, 0.6, 0.7], [0.0, 0.01, 0.01, 0.03, 0.03], preemptions=[0, 0, 0, 0, 2])
    steps = steps_over(4, 2)
    done = RequestRecord(0, T0 + 0.1, [T0 + 0.5, T0 + 0.6, T0 + 2.5], T0 + 2.6, "ok")
    failed = RequestRecord(1, T0 + 2.1, [], T0 + 2.2, "failed", "HTTP 500")
    bins = bins_of(window, steps)
    first, second = summarise_steps([done, failed], steps, bins, window)
    assert (first.requests_started, first.requests_completed, first.requests_failed) == (1, 1, 0)
    assert (second.requests_started, second.requests_failed) == (1, 1)
    assert first.tokens == 2 and second.tokens == 1  # the first token and one gap, then one gap
    assert first.kv_usage_max == pytest.approx(0.3) and second.kv_usage_max == pytest.approx(0.7)
    assert second.preemptions == 2 and first.preemptions == 0
    assert first.itl_p95_ms <= 10 < second.itl_p50_ms <= 50  # from the engine's buckets


# ----------------------------------------------------------------------------------- the endpoint


@pytest.mark.parametrize(
    "url, expected",
    [
        ("http://h:8000/v1", "http://h:8000/v1"),
        ("http://h:8000/v1/completions", "http://h:8000/v1"),
        ("https://gw.example/llm/v1/chat/completions", "https://gw.example/llm/v1"),
    ],
)
def test_api_root_accepts_the_api_root_or_one_of_its_endpoints(url, expected):
    """Beside the engine URL the exporter takes (tests/sources/test_urls.py)."""
    assert api_root(url) == expected


@pytest.mark.parametrize("url", ["ftp://h", "h:8000", "", "http://h:99999"])
def test_api_root_refuses_what_is_not_an_http_url(url):
    with pytest.raises(EndpointError):
        api_root(url)


@pytest.mark.parametrize(
    "data, kind, expected",
    [
        ('{"choices":[{"text":"ab","finish_reason":null}]}', "completions", (1, None)),
        ('{"choices":[{"text":"","finish_reason":null}]}', "completions", (1, None)),
        ('{"choices":[{"text":"","finish_reason":"length"}]}', "completions", (0, None)),
        ('{"choices":[{"text":"x"}],"usage":{"completion_tokens":7}}', "completions", (1, 7)),
        ('{"choices":[{"delta":{"content":"hi"},"finish_reason":null}]}', "chat", (1, None)),
        ('{"choices":[],"usage":{"completion_tokens":32}}', "completions", (None, 32)),
        ("[DONE]", "completions", (None, None)),
        ("not json", "completions", (None, None)),
    ],
)
def test_streamed_chunks_are_read_as_tokens(data, kind, expected):
    assert _chunk_tokens(data, kind) == expected


def test_prompts_share_the_text_after_a_per_request_tag():
    a, b = make_prompt(50, "[1]"), make_prompt(50, "[2]")
    assert a != b and a.split(" ", 1)[1] == b.split(" ", 1)[1]
    assert len(make_prompt(50).split()) == 50


# ------------------------------------------------------ the command against a small server in process


class FakeEngine:
    """An OpenAI-compatible server (completions, streamed) whose /metrics replays real vLLM 0.32
    scrapes of a KV cache filling up; two prompt tokens a word, ``token_seconds`` between tokens.

    ``usage``: how a streamed answer reports its completion tokens: ``"usage_chunk"`` (a last
    chunk with usage and no choices, vLLM with include_usage), ``"final"`` (in the chunk that
    carries finish_reason, llama.cpp), ``"per_chunk"`` (a running count in every chunk, vLLM's
    continuous_usage_stats), ``"none"``. ``context``: prompts over this many tokens get llama.cpp's
    HTTP 400 (with n_ctx). ``slots``: /metrics is a llama.cpp page without KV usage instead, the
    requests beyond ``slots`` in flight counted as deferred."""

    def __init__(
        self,
        token_seconds: float = 0.01,
        chat_only: bool = False,
        strict: bool = False,
        usage: str = "usage_chunk",
        context: int = 4000,
        slots: int | None = None,
    ):
        self.token_seconds = token_seconds
        self.pages = [p.read_text() for p in FILL]
        self.scrapes = 0
        self.requests: list[dict] = []
        self.in_flight = 0
        self.tokens_sent = 0
        app = FastAPI()

        @app.get("/v1/models")
        def models():
            return {"data": [{"id": "tiny"}]}

        @app.get("/metrics")
        def metrics():
            if slots is not None:
                return PlainTextResponse(
                    f"llamacpp:requests_processing {min(self.in_flight, slots)}\n"
                    f"llamacpp:requests_deferred {max(0, self.in_flight - slots)}\n"
                    f"llamacpp:tokens_predicted_total {self.tokens_sent}\n"
                )
            page = self.pages[min(self.scrapes, len(self.pages) - 1)]
            self.scrapes += 1
            return PlainTextResponse(page)

        @app.post("/v1/completions")
        async def completions(request: Request):
            if chat_only:
                return JSONResponse({"detail": "Not Found"}, status_code=404)
            return await answer(request, "completions")

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            return await answer(request, "chat")

        async def answer(request: Request, kind: str):
            body = await request.json()
            self.requests.append(body)
            if strict and "ignore_eos" in body:  # an OpenAI-strict server: unknown fields are errors
                return JSONResponse(
                    {"error": {"message": "Unrecognized request argument: ignore_eos"}}, status_code=400
                )
            prompt = body["prompt"] if kind == "completions" else body["messages"][0]["content"]
            prompt_tokens = 2 * len(prompt.split()) + (0 if kind == "completions" else 5)
            if prompt_tokens > context:
                error = {"message": "prompt too long", "n_prompt_tokens": prompt_tokens, "n_ctx": context}
                return JSONResponse({"error": error}, status_code=400)
            n = int(body["max_tokens"])
            if not body.get("stream"):
                return {
                    "choices": [{"text": "x" * n}],
                    "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n},
                }

            def chunk(i: int, last: bool) -> str:
                text = {"text": f"t{i}"} if kind == "completions" else {"delta": {"content": f"t{i}"}}
                choice = {**text, "finish_reason": "length" if last and usage == "final" else None}
                obj: dict = {"choices": [choice]}
                if usage == "per_chunk" or (last and usage == "final"):
                    obj["usage"] = {"completion_tokens": i + 1}
                return f"data: {json.dumps(obj)}\n\n"

            async def chunks():
                self.in_flight += 1
                try:
                    for i in range(n):
                        await asyncio.sleep(self.token_seconds)
                        self.tokens_sent += 1
                        yield chunk(i, i == n - 1)
                    if usage == "usage_chunk":
                        yield f'data: {{"choices":[],"usage":{{"completion_tokens":{n}}}}}\n\n'
                    yield "data: [DONE]\n\n"
                finally:
                    self.in_flight -= 1

            return StreamingResponse(chunks(), media_type="text/event-stream")

        self.app = app

    def __enter__(self) -> FakeEngine:
        from kvdoctor.exporter.server import serve_in_thread

        self.handle = serve_in_thread(self.app, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.handle.port}"
        return self

    def __exit__(self, *exc) -> None:
        self.handle.stop()


def _steps(url: str, out: Path, **flags: float) -> list[str]:
    """``--engine-url URL``, then ``--flag-name VALUE`` for each of ``flags``, then ``-o OUT``."""
    named = [text for name, value in flags.items() for text in ("--" + name.replace("_", "-"), f"{value:g}")]
    return ["--engine-url", url, *named, "-o", str(out)]


def run_stress(argv: list[str]) -> int | str | None:
    from kvdoctor.cli import main

    return exit_status(main, ["stress", *argv])  # a flag refused while parsing exits as argparse does


def test_stress_writes_the_report_folder_from_an_in_process_exporter(tmp_path, capsys):
    out = tmp_path / "report"
    with FakeEngine() as engine:
        rc = run_stress(_steps(engine.url, out, prompt_tokens=200, max_tokens=40, max_concurrency=4, step_seconds=1))
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert sorted(p.name for p in out.iterdir()) == ["kv-latency.png", "report.html", "summary.json", "trace.om"]

    summary = json.loads((out / "summary.json").read_text())
    assert abs(summary["endpoint"]["prompt_tokens"] - 200) <= 4  # calibrated on the server's count, within 2 %
    assert {r["max_tokens"] for r in engine.requests if r.get("stream")} == {40}
    assert all(r.get("ignore_eos") for r in engine.requests)
    assert [s["concurrency"] for s in summary["steps"]][:2] == [1, 2]
    assert summary["signals"]["source"].startswith("in-process exporter") and summary["signals"]["snapshots"] >= 3
    # the replayed vLLM pages fill the KV cache to 0.97: saturated, not a limit reached
    assert summary["saturation"]["reached"] and summary["saturation"]["reason"] == "kv_ceiling"
    assert summary["steps"][0]["tokens"] > 0 and summary["steps"][0]["itl_p50_ms"] is not None

    assert (out / "kv-latency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (out / "report.html").read_text()
    assert "data:image/png;base64," in page and 'src="http' not in page and "<link" not in page
    from kvdoctor.sources.traces import load_trace

    replayed = load_trace(out / "trace.om").window
    assert replayed.select(S.KV_CACHE_USAGE) and len(replayed) == summary["signals"]["snapshots"]
    assert "report:" in captured.out and str(out) in captured.out
    assert "step 1/" in captured.err  # plain progress lines: stderr is not a terminal here


@pytest.mark.parametrize(
    "engine_options, kind, note",
    [
        (dict(chat_only=True), "chat", "using /v1/chat/completions"),
        (dict(strict=True), "completions", "the server refused ignore_eos"),
    ],
)
def test_stress_adapts_to_what_the_endpoint_accepts(engine_options, kind, note, tmp_path, capsys):
    out = tmp_path / "report"
    with FakeEngine(**engine_options) as engine:
        rc = run_stress(_steps(engine.url, out, prompt_tokens=100, max_tokens=20, max_concurrency=1, step_seconds=0.5))
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["endpoint"]["kind"] == kind
    assert any(note in n for n in summary["endpoint"]["notes"]) and note in captured.err
    assert summary["steps"][0]["tokens"] > 0 and summary["steps"][0]["requests_failed"] == 0


@pytest.mark.parametrize(
    "argv, message, status",
    [
        (["--engine-url", "http://127.0.0.1:1"], "cannot reach http://127.0.0.1:1/v1: connection refused", 3),
        (["--engine-url", "ftp://x"], "--engine-url: needs an http(s) URL", 2),
        (["--max-concurrency", "0"], "--max-concurrency (0) is below --start-concurrency (1)", 2),
        (["--ttft-slo-ms", "0"], "--ttft-slo-ms must be a positive number, got 0", 2),
        (["--prompt-tokens", "5000"], "refused a ~5000-token prompt: prompt too long", 3),
        (["--served-model-name", "other"], "model 'other' is not served", 3),
        (["--exporter", "http://127.0.0.1:1"], "cannot reach the exporter at http://127.0.0.1:1", 3),
    ],
)
def test_bad_arguments_exit_2_and_an_unreadable_endpoint_or_exporter_3_in_one_line(
    argv, message, status, tmp_path, capsys
):
    with FakeEngine() as engine:
        if "--engine-url" not in argv:
            argv = ["--engine-url", engine.url, *argv]
        rc = run_stress([*argv, "-o", str(tmp_path / "r"), "--step-seconds", "1"])
    err = capsys.readouterr().err
    assert rc == status
    assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "r").exists()


def test_the_exporter_url_must_be_a_kvdoctor_exporter(tmp_path, capsys):
    with FakeEngine() as engine:
        rc = run_stress(["--engine-url", engine.url, "--exporter", engine.url, "-o", str(tmp_path / "r")])
    assert rc == 3
    assert "has no /api/v1/window: is it a kvdoctor exporter?" in capsys.readouterr().err


def test_the_progress_bar_redraws_one_line_on_a_terminal_only():
    import io

    from kvdoctor.commands.stress import Progress

    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty, plain = Tty(), io.StringIO()
    for stream in (tty, plain):
        bar = Progress(stream)
        bar.update(0.5, "step 1/3")
        bar.update(0.75, "step 2/3")
        bar.line("step 2 done")
        bar.close()
    assert tty.getvalue().count("\r") >= 3 and "████" in tty.getvalue() and tty.getvalue().endswith("step 2 done\n")
    assert plain.getvalue() == "step 2 done\n"


# ------------------------------------------------ every engine: tokens once, small contexts, prefixes, queues


async def _one_request(engine: FakeEngine, max_tokens: int) -> RequestRecord:
    """One streamed request of a LoadRunner against ``engine``, read to its end."""
    async with httpx.AsyncClient() as client:
        endpoint = await discover(api_root(engine.url), None, 50, max_tokens, client)
        runner = LoadRunner(endpoint, max_tokens, client)
        runner.set_concurrency(1, 0)
        while not any(r.status == "ok" for r in runner.requests):
            await asyncio.sleep(0.01)
        await runner.stop()
    return next(r for r in runner.requests if r.status == "ok")


@pytest.mark.parametrize("usage", ["usage_chunk", "final", "per_chunk", "none"])
def test_every_token_is_counted_once_however_the_server_reports_usage(usage):
    """Usage in a last chunk of its own (vLLM), in the finishing chunk (llama.cpp), running in
    every chunk, or not at all: 20 tokens are 20, and the gaps between them are the server's."""
    with FakeEngine(token_seconds=0.02, usage=usage) as engine:
        record = asyncio.run(_one_request(engine, 20))
    assert len(record.token_times) == 20
    _, gaps = record.gaps()
    assert np.median(gaps) > 0.01  # no burst of re-counted tokens squeezed into the last gap
    assert record.completion_tokens == (None if usage == "none" else 20)


def test_the_calibration_probe_shrinks_to_fit_a_small_context():
    async def calibrate(prompt_tokens: int):
        async with httpx.AsyncClient() as client:
            return await discover(api_root(engine.url), None, prompt_tokens, 8, client)

    with FakeEngine(context=150) as engine:  # the first 200-word probe is 400 tokens: refused
        endpoint = asyncio.run(calibrate(100))
        assert abs(endpoint.prompt_tokens - 100) <= 2
        with pytest.raises(EndpointError, match=r"refused a ~300-token prompt.*its context holds 150 tokens"):
            asyncio.run(calibrate(300))


def test_each_run_tags_its_prompts_with_a_fresh_id_unless_asked_to_share_the_prefix():
    from kvdoctor.stress.load import Endpoint

    endpoint = Endpoint("http://h/v1", "completions", "m", prompt_words=30)
    first, second = LoadRunner(endpoint, 8, None), LoadRunner(endpoint, 8, None)
    assert first.run_id != second.run_id
    a, b, c = first.prompt(1), first.prompt(2), second.prompt(1)
    assert len({a.split()[0], b.split()[0], c.split()[0]}) == 3  # no two requests start alike
    assert a.split()[1:] == c.split()[1:]  # then the same text
    shared = LoadRunner(endpoint, 8, None, share_prefix=True)
    x, y = shared.prompt(1), shared.prompt(2)
    assert x.split()[:-1] == y.split()[:-1] == a.split()[1:] and x != y  # the text first, the tag last


@pytest.mark.parametrize("share", [False, True])
def test_the_report_says_what_was_asked_of_prefix_caching(share, tmp_path, capsys):
    out = tmp_path / "report"
    with FakeEngine() as engine:
        argv = ["--engine-url", engine.url, "--prompt-tokens", "60", "--max-tokens", "8"]
        argv += ["--max-concurrency", "2", "--step-seconds", "0.6", "-o", str(out)]
        rc = run_stress(argv + (["--share-prefix"] if share else []))
        prompts = [r["prompt"] for r in engine.requests if r.get("stream") and "[probe]" not in r["prompt"]]
    assert rc == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    run_id = summary["prompts"]["run_id"]
    assert summary["prompts"]["shared_prefix"] is share and len(prompts) >= 2
    tags = [p.split()[-1] if share else p.split()[0] for p in prompts]
    assert all(t.startswith(f"[{run_id}-") for t in tags) and len(set(tags)) == len(tags)
    page = (out / "report.html").read_text()
    if share:
        assert "prefix caching can share that text" in page and "cannot share" not in page
    else:
        assert "prefix caching cannot share KV between requests, nor with an earlier run" in page


def test_without_a_kv_signal_the_run_stops_on_the_queue_and_says_so(tmp_path, capsys):
    """A llama.cpp-like page (no KV usage) with 2 slots: at 4 requests in flight 2 wait."""
    out = tmp_path / "report"
    with FakeEngine(token_seconds=0.02, slots=2, usage="final") as engine:
        rc = run_stress(
            [
                *("--engine-url", engine.url, "--prompt-tokens", "40", "--max-tokens", "30"),
                *("--max-concurrency", "16", "--step-seconds", "3", "-o", str(out)),
            ]
        )
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    summary = json.loads((out / "summary.json").read_text())
    saturation = summary["saturation"]
    assert (saturation["reached"], saturation["reason"], saturation["concurrency"]) == (True, QUEUE, 4)
    assert saturation["waiting"] >= 1 and [s["concurrency"] for s in summary["steps"]] == [1, 2, 4]
    assert "stopped on the queue at concurrency ×4" in summary["verdict"]["headline"]
    assert "stopping on the queue" in captured.err and "stopped on the queue" in captured.out
    assert "No KV usage signal, so the run stopped on the queue" in (out / "report.html").read_text()
    # the client's tokens/s and the engine's own counter agree over the run
    client = sum(s["tokens"] for s in summary["steps"])
    engine_tokens = sum(s["engine_tokens_per_second"] * s["seconds"] for s in summary["steps"])
    assert engine_tokens == pytest.approx(client, rel=0.15)


def test_queue_saturation_needs_waiting_requests_or_a_slow_first_token_and_no_kv():
    waiting_window = []
    for i, waiting in enumerate([0, 0, 0, 0, 0, 0, 3, 3]):
        snap = Snapshot(T0 + i)
        snap.add(S.REQUESTS_WAITING, float(waiting), ENGINE)
        waiting_window.append(snap)
    window = Window.from_snapshots(waiting_window)
    steps = [StepRecord(0, 1, T0, T0 + 3), StepRecord(1, 2, T0 + 3, T0 + 5), StepRecord(2, 4, T0 + 5, T0 + 7)]
    bins = bins_of(window, steps)
    sat = find_saturation(bins, steps)
    assert (sat.reached, sat.reason, sat.concurrency, sat.step) == (True, QUEUE, 4, 2)
    # a queue that never forms, but a first token slower than its SLO from the second step on
    calm = Window.from_snapshots([Snapshot(T0 + i, {(S.REQUESTS_WAITING, ENGINE): 0.0}) for i in range(8)])
    calm_bins = bins_of(calm, steps)
    summaries = summarise_steps(
        [
            RequestRecord(0, T0 + 0.5, [T0 + 0.6, T0 + 0.7], T0 + 0.8, "ok"),
            RequestRecord(1, T0 + 3.1, [T0 + 4.9, T0 + 4.95], T0 + 5.0, "ok"),
        ],
        steps,
        calm_bins,
        calm,
    )
    sat = find_saturation(calm_bins, steps, summaries=summaries, ttft_slo=1.0)
    assert (sat.reached, sat.reason, sat.concurrency) == (True, TTFT, 2) and sat.ttft_p50_ms == pytest.approx(1800)
    assert not find_saturation(calm_bins, steps, summaries=summaries, ttft_slo=2.0).reached
    # with KV usage recorded, the queue is no stop: KV decides
    kv_bins = bins_of(recorded_window([0.1] * 8, [0.01] * 8), steps)
    assert not find_saturation(kv_bins, steps, summaries=summaries, ttft_slo=1.0).reached


def test_step_summaries_give_the_engines_mean_time_per_token_from_its_counters():
    snaps = []
    for i in range(5):  # 50 tokens a second at 20 ms each, counted by the engine
        snap = Snapshot(T0 + i)
        snap.add(S.GENERATION_TOKENS, 50.0 * i, ENGINE)
        snap.add(S.GENERATION_SECONDS, 1.0 * i, ENGINE)
        snaps.append(snap)
    window = Window.from_snapshots(snaps)
    steps = steps_over(4, 2)
    first, second = summarise_steps([], steps, bins_of(window, steps), window)
    assert first.engine_mean_per_token_ms == pytest.approx(20.0) == second.engine_mean_per_token_ms
    assert first.engine_tokens_per_second == pytest.approx(50.0)
    assert (
        summarise_steps([], steps, bins_of(recorded_window([0.1] * 5, [0.01] * 5), steps))[0].engine_mean_per_token_ms
        is None
    )


def test_tokens_read_together_share_the_time_since_the_previous_read():
    """A busy client reads what piled up: 3 tokens at once after 30 ms are 10 ms each, and the
    tokens that came with the first one have no time of their own."""
    t = [T0, T0 + 1e-5, T0 + 2e-5, T0 + 0.03, T0 + 0.03 + 1e-5, T0 + 0.03 + 2e-5, T0 + 0.05]
    record = RequestRecord(0, T0 - 0.5, t, T0 + 0.06, "ok")
    arrivals, gaps = record.gaps()
    assert gaps * 1000 == pytest.approx([10.0, 10.0, 10.0, 19.98], abs=0.01)
    assert arrivals - T0 == pytest.approx([0.01, 0.02, 0.03, 0.05], abs=1e-4)
    assert record.ttft == pytest.approx(0.5)
    steady = RequestRecord(0, T0, [T0 + 0.1, T0 + 0.12, T0 + 0.15], T0 + 0.2, "ok")
    assert steady.gaps()[1] == pytest.approx([0.02, 0.03], abs=1e-6)  # one token a read: the gaps as they came
    assert RequestRecord(0, T0, [T0, T0 + 1e-5], T0 + 1, "ok").gaps()[1].size == 0
    # every token still counts in the step's tokens
    (step,) = summarise_steps([record], [StepRecord(0, 1, T0 - 1, T0 + 1)], bin_run([record], [], None, T0 - 1, T0 + 1))
    assert step.tokens == 7
