"""kvdoctor stress: the KV-cache pressure test against an OpenAI-compatible endpoint."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import shutil
import signal
import sys
import threading
import time

import httpx
import numpy as np

from kvdoctor import arguments, flags, probe
from kvdoctor.errors import SourceUnreadable, UsageError
from kvdoctor.exporter.inprocess import LocalSignals
from kvdoctor.output import check_folder_writable
from kvdoctor.signals.units import MISSING, fmt_ms, fmt_pct
from kvdoctor.sources.paths import METRICS_PATH
from kvdoctor.stress import plan as S
from kvdoctor.stress.load import EndpointError, LoadRunner, api_root, discover, server_root
from kvdoctor.stress.signals import ExporterSignals, SignalRecorder, SignalsError
from kvdoctor.stress.timeline import StepRecord, kv_signals
from kvdoctor.stress_report import TAIL_SECONDS, write_report

NAME = "stress"
HELP = "KV-cache pressure test: step concurrency up until the KV cache saturates; write a report"
DESCRIPTION = """\
The KV-cache pressure test. Sends a fixed long prompt with a fixed generation length to an
OpenAI-compatible endpoint (vLLM, SGLang, trtllm-serve, llama-server, ...; /v1/completions, else
/v1/chat/completions), streaming, with the concurrency stepped up 1, 2, 4, ... every
--step-seconds until the KV cache saturates (usage >= --kv-saturation, or the engine preempts)
or --max-concurrency. An engine that publishes no KV usage cannot saturate it: the run then stops
on the queue (the step's requests wait, or their time to first token passes --ttft-slo-ms) and
says so. Every request's prompt starts with a tag of its own (the run's random id and its number),
so prefix caching shares nothing between requests or runs, unless --share-prefix.

Meanwhile it records what the requests see (time to first token, tokens per second, the gaps
between streamed tokens, each token counted once however the server reports usage) and the
exporter's signals (KV usage, the engine's per-token latency histogram or its mean time per token,
its token counter, preemptions, queue): from --exporter, else from an exporter run in this process
on the engine's own /metrics. The engine's histogram is the per-token latency reported; the
streamed gaps stand in where the engine has none.

It writes a report folder (-o): report.html (self-contained), kv-latency.png (KV usage and
per-token latency p50/p95 on one time axis, steps and knee marked), trace.om (the recorded
signals, OpenMetrics: `kvdoctor diagnose --replay trace.om`) and summary.json; and says which
pattern the run shows: latency rising in step with KV (memory-bandwidth bound) or a jump at
KV ~x% (preemption / paging onset).

It prints the headline, where KV saturated and the report's path (--json: the summary, as
summary.json holds it, on stdout); progress goes to stderr.

exit status: 0 report written, 1 the endpoint failed during the run (report written), 2 bad
arguments, 3 the endpoint or exporter could not be read, or an internal error.

examples:
  kvdoctor stress --engine-url http://127.0.0.1:8000 --exporter http://127.0.0.1:9745
  kvdoctor stress --engine-url http://127.0.0.1:8000 --prompt-tokens 2000 --max-tokens 1000 --max-concurrency 128 -o r1
  kvdoctor demo --no-dashboard &   # then, with the engine URL it prints:
  kvdoctor stress --engine-url http://127.0.0.1:PORT --exporter http://127.0.0.1:9745 --step-seconds 10 --json
"""

DEFAULTS = S.DEFAULTS
DEFAULT_TTFT_SLO_MS = S.DEFAULT_TTFT_SLO_SECONDS * 1000
POLL_SECONDS = 1.0
MAX_TOKENS = 10_000_000
MAX_CONCURRENCY = 100_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    flags.add(
        parser,
        "--engine-url",
        "--endpoint",
        type=arguments.url,
        required=True,
        help="the OpenAI-compatible server, e.g. http://127.0.0.1:8000 (or its /v1, or its /metrics)",
    )
    flags.add(
        parser,
        "--exporter",
        type=arguments.url,
        help="a kvdoctor exporter scraping that engine (default: one runs in this process on the engine's /metrics)",
    )
    model = parser.add_argument(
        "--served-model-name",
        "--model",
        metavar="NAME",
        help="the model name to request, as the server serves it (vLLM's --served-model-name; "
        "default: the first of /v1/models)",
    )
    flags.deprecate(model, "--model")  # --model is the model spec (config.json, folder, ...) in every verb
    for flag, kind, metavar, text in (
        ("--prompt-tokens", int, "N", "prompt length in tokens, calibrated on the server's count (default {})"),
        ("--max-tokens", int, "N", "tokens generated per request (ignore_eos where supported; default {})"),
        ("--start-concurrency", int, "N", "requests in flight in the first step (default 1); doubled each step"),
        ("--max-concurrency", int, "N", "the last step's concurrency if the KV cache never saturates (default {})"),
        ("--step-seconds", float, "S", "seconds per concurrency step (default {:g})"),
    ):
        default = DEFAULTS[flag.removeprefix("--").replace("-", "_")]
        parser.add_argument(flag, type=kind, default=default, metavar=metavar, help=text.format(default))
    parser.add_argument(
        "--kv-saturation",
        type=float,
        default=0.95,
        metavar="RATIO",
        help="KV usage (0..1) that counts as saturated (default 0.95); a preemption always does",
    )
    parser.add_argument(
        "--ttft-slo-ms",
        type=float,
        default=DEFAULT_TTFT_SLO_MS,
        metavar="MS",
        help="where the engine publishes no KV usage: a step whose median time to first token passes this "
        f"stops the run, as does one whose requests queue (default {DEFAULT_TTFT_SLO_MS:g})",
    )
    parser.add_argument(
        "--share-prefix",
        action="store_true",
        help="let the requests share the fixed text as a cached prefix (their tag goes last); by default each "
        "starts with its own tag, so prefix caching shares no KV between requests or runs",
    )
    parser.add_argument(
        "-o", "--output", metavar="DIR", help="report folder (default: stress-YYYYmmdd-HHMMSS in the current folder)"
    )
    parser.add_argument(
        "--timeout",
        type=arguments.timeout_seconds,
        default=10.0,
        metavar="S",
        help="seconds to wait for the exporter's answers (default 10)",
    )
    parser.add_argument("--json", action="store_true", help="print the run's summary (summary.json) on stdout")


# ---------------------------------------------------------------------------------------- progress


class Progress:
    """One redrawn line on a terminal (stderr); plain lines, one per step, anywhere else."""

    BAR = 24

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._drawn = False

    def line(self, text: str) -> None:
        """A line that stays (a step finished, a warning)."""
        if self._drawn:
            self.stream.write("\r\033[K")
            self._drawn = False
        self.stream.write(text + "\n")
        self.stream.flush()

    def update(self, fraction: float, text: str) -> None:
        if not self.tty:
            return
        width = shutil.get_terminal_size((100, 20)).columns
        filled = round(max(0.0, min(1.0, fraction)) * self.BAR)
        bar = "█" * filled + "░" * (self.BAR - filled)
        out = f"stress {bar} {text}"
        self.stream.write("\r\033[K" + out[: max(10, width - 1)])
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False


# ---------------------------------------------------------------------------------------- the run


class LiveState:
    """What the exporter said since the run started: for saturation and the progress line."""

    def __init__(self):
        self.kv_now = math.nan
        self.kv_step_max = math.nan
        self.preemptions = 0.0
        self.step_preemptions = 0.0
        self.snapshots = 0
        self.kv_known = False  # any KV usage sample since the run started
        self.step_waiting = np.empty(0)  # requests-waiting samples of the current step

    def refresh(self, signals: SignalRecorder, run_start: float, step_start: float) -> None:
        window = signals.window(since=run_start - 2)
        self.snapshots = len(window)
        sig = kv_signals(window) if len(window) else {}
        if "kv_usage" in sig:
            ts, kv = sig["kv_usage"]
            present = ~np.isnan(kv)
            self.kv_now = float(kv[present][-1]) if present.any() else math.nan
            in_step = present & (ts >= step_start)
            self.kv_step_max = float(kv[in_step].max()) if in_step.any() else math.nan
            self.kv_known = bool((present & (ts >= run_start)).any())
        if "waiting" in sig:
            ts, waiting = sig["waiting"]
            self.step_waiting = waiting[ts >= step_start]
        if "preemptions" in sig:
            ts, d = sig["preemptions"]
            self.preemptions = float(d[ts >= run_start].sum())
            self.step_preemptions = float(d[ts >= step_start].sum())


async def _run(args: argparse.Namespace, settings: S.StressSettings, progress: Progress) -> _Run:
    try:
        base = api_root(settings.endpoint)
    except EndpointError as exc:
        raise UsageError(str(exc)) from None
    schedule = S.step_schedule(settings.start_concurrency, settings.max_concurrency)
    planned = len(schedule) * settings.step_seconds

    _stop_on_sigterm()
    signals: SignalRecorder
    if settings.exporter:
        try:
            signals = ExporterSignals(settings.exporter, timeout=args.timeout)
        except SignalsError as exc:
            raise UsageError(str(exc)) from None
    else:  # no exporter given: one runs in this process on the engine's own /metrics
        signals = LocalSignals(server_root(base) + METRICS_PATH, retention_seconds=planned + 600)
    limits = httpx.Limits(
        max_connections=settings.max_concurrency + 4, max_keepalive_connections=settings.max_concurrency + 4
    )
    async with httpx.AsyncClient(limits=limits, follow_redirects=True) as client:
        try:
            if settings.exporter:  # a wrong exporter is told before any request is sent
                await _start_signals(signals)
            try:
                endpoint = await discover(base, settings.model, settings.prompt_tokens, settings.max_tokens, client)
            except EndpointError as exc:
                raise SourceUnreadable(str(exc)) from None
            if not settings.exporter:
                await _start_signals(signals)
            progress.line(
                f"kvdoctor stress: {endpoint.model} at {endpoint.url}; prompt {endpoint.prompt_tokens or '?'} "
                f"tokens, {settings.max_tokens} generated; concurrency {' '.join(map(str, schedule))}, "
                f"{settings.step_seconds:g} s each; signals: {signals.description}"
            )
            for note in endpoint.notes:
                progress.line(f"kvdoctor stress: note: {note}")
            if isinstance(signals, LocalSignals):
                up, error = signals.engine_up()
                if up is False:
                    progress.line(
                        f"kvdoctor stress: warning: no engine metrics at {signals.metrics_url} ({error}); "
                        "KV usage will be unknown: pass --exporter URL"
                    )
            return await _steps(settings, schedule, endpoint, signals, client, progress)
        finally:
            await asyncio.to_thread(signals.close)


def _stop_on_sigterm() -> None:
    """SIGTERM (``timeout``, Kubernetes and CI stop things so) stops the run as Ctrl-C does: the
    load stops and the report of what ran is written."""
    if threading.current_thread() is not threading.main_thread():
        return
    task = asyncio.current_task()
    if task is not None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)


class _Run:
    """The state of one run, shared by the step loop and the report."""

    def __init__(self, settings, schedule, endpoint, signals, runner):
        self.settings = settings
        self.schedule = schedule
        self.endpoint = endpoint
        self.signals = signals
        self.runner = runner
        self.steps: list = []
        self.live = LiveState()
        self.run_start = time.time()
        self.run_end = self.run_start
        self.saturated_at: int | None = None
        self.failed = ""
        self.interrupted = False
        self.poll_errors: list[str] = []
        self.window = None


async def _start_signals(signals: SignalRecorder) -> None:
    if isinstance(signals, LocalSignals):
        # its sources' ups and downs are in the report; log lines would tear the progress bar
        logging.getLogger("kvdoctor.exporter").setLevel(logging.CRITICAL)
    try:
        await asyncio.to_thread(signals.start)
    except SignalsError as exc:
        raise SourceUnreadable(str(exc)) from None


async def _steps(settings, schedule, endpoint, signals, client, progress: Progress) -> _Run:
    runner = LoadRunner(endpoint, settings.max_tokens, client, share_prefix=settings.share_prefix)
    run = _Run(settings, schedule, endpoint, signals, runner)
    try:
        await _step_loop(run, progress)
    except asyncio.CancelledError:  # Ctrl-C: stop the load, still write the report of what ran
        asyncio.current_task().uncancel()
        run.interrupted = True
        progress.line("kvdoctor stress: interrupted; writing the report of what ran")
    finally:
        await run.runner.stop()
        progress.close()
    run.run_end = time.time()
    for s in run.steps:
        s.ended = min(s.ended or run.run_end, run.run_end)
    await asyncio.sleep(TAIL_SECONDS)
    await _poll(run, progress)
    run.window = signals.window(since=run.run_start - 2)
    return run


async def _poll(run: _Run, progress: Progress, step_start: float | None = None) -> None:
    error = await asyncio.to_thread(run.signals.try_poll)
    if error and (not run.poll_errors or run.poll_errors[-1] != error):
        run.poll_errors.append(error)
        progress.line(f"kvdoctor stress: warning: {error}")
    run.live.refresh(run.signals, run.run_start, step_start if step_start is not None else run.run_start)


async def _step_loop(run: _Run, progress: Progress) -> None:
    settings, runner, live, schedule = run.settings, run.runner, run.live, run.schedule
    planned = len(schedule) * settings.step_seconds
    for index, concurrency in enumerate(schedule):
        step = StepRecord(index, concurrency, time.time())
        run.steps.append(step)
        runner.set_concurrency(concurrency, index)
        before = runner.counts()
        last_poll = 0.0
        while (now := time.time()) < step.started + settings.step_seconds:
            if now - last_poll >= POLL_SECONDS:
                last_poll = now
                await _poll(run, progress, step.started)
                counts = runner.counts()
                p50, _ = runner.recent_itl()
                progress.update(
                    (now - run.run_start) / planned,
                    f"step {index + 1}/{len(schedule)} ×{concurrency}  "
                    f"{now - step.started:3.0f}/{settings.step_seconds:g} s  "
                    f"KV {fmt_pct(live.kv_now, missing=MISSING)}  "
                    f"client ITL p50 {fmt_ms(p50, 0, missing=MISSING)}  preemptions {live.preemptions:.0f}  "
                    f"done {counts['ok']} failed {counts['failed']}",
                )
            await asyncio.sleep(0.2)
        step.ended = time.time()
        await _poll(run, progress, step.started)
        counts = runner.counts()
        started_here = sum(1 for r in runner.requests if r.step == index)
        failed_here = counts["failed"] - before["failed"]
        ok_here = counts["ok"] - before["ok"]
        kv_text = f"KV max {fmt_pct(live.kv_step_max)}" if not math.isnan(live.kv_step_max) else "KV unknown"
        progress.line(
            f"kvdoctor stress: step {index + 1}/{len(schedule)} ×{concurrency}: {kv_text}, "
            f"preemptions {live.step_preemptions:.0f}, completed {ok_here}, failed {failed_here}"
        )
        if started_here and failed_here >= started_here and ok_here == 0 and not _any_tokens(runner, step):
            run.failed = runner.last_error or "every request failed"
            progress.line(f"kvdoctor stress: the endpoint failed during step {index + 1}: {run.failed}")
            return
        if live.step_preemptions > 0 or (
            not math.isnan(live.kv_step_max) and live.kv_step_max >= settings.kv_saturation
        ):
            run.saturated_at = concurrency
            return
        if not live.kv_known:  # no KV signal: the queue stands in for saturation
            ttfts = [r.ttft for r in runner.requests if r.step == index and r.ttft is not None]
            ttft_p50 = float(np.median(ttfts)) if ttfts else None
            reason = S.queue_reached(live.step_waiting, ttft_p50, settings.ttft_slo_seconds)
            if reason is not None:
                why = (
                    "requests waited"
                    if reason == S.QUEUE
                    else f"time to first token {fmt_ms(ttft_p50, 0)} over {fmt_ms(settings.ttft_slo_seconds, 0)}"
                )
                progress.line(f"kvdoctor stress: no KV usage signal: stopping on the queue ({why})")
                run.saturated_at = concurrency
                return


def _any_tokens(runner, step) -> bool:
    return any(r.token_times and r.token_times[-1] >= step.started for r in runner.requests)


# The most each flag takes: more is a typo or an overflow, refused before any request.
UPPER_BOUNDS = {
    "prompt_tokens": (MAX_TOKENS, "tokens"),
    "max_tokens": (MAX_TOKENS, "tokens"),
    "start_concurrency": (MAX_CONCURRENCY, "requests"),
    "max_concurrency": (MAX_CONCURRENCY, "requests"),
    "step_seconds": (86_400, "seconds"),
    "ttft_slo_ms": (3_600_000, "ms"),
}


def _check_upper_bounds(args: argparse.Namespace) -> None:
    for dest, (most, unit) in UPPER_BOUNDS.items():
        value = getattr(args, dest)
        if value > most:
            flag = "--" + dest.replace("_", "-")
            raise UsageError(f"{flag} must be at most {most:,} {unit}, got {value:g}")


def run(args: argparse.Namespace) -> int:
    settings = S.StressSettings(
        endpoint=args.engine_url,
        model=args.served_model_name,
        prompt_tokens=args.prompt_tokens,
        max_tokens=args.max_tokens,
        start_concurrency=args.start_concurrency,
        max_concurrency=args.max_concurrency,
        step_seconds=args.step_seconds,
        kv_saturation=args.kv_saturation,
        exporter=args.exporter,
        share_prefix=args.share_prefix,
        ttft_slo_seconds=args.ttft_slo_ms / 1000.0,
    )
    try:
        settings.validate()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    _check_upper_bounds(args)
    arguments.check_timeout(args.timeout)
    probe.check_scheme(args.engine_url, "--engine-url")
    probe.check_scheme(args.exporter, "--exporter")
    out_dir = args.output or time.strftime("stress-%Y%m%d-%H%M%S")
    check_folder_writable(out_dir, "-o")  # before the load: a report that cannot be written is said first

    progress = Progress()
    try:
        result = asyncio.run(_run(args, settings, progress))
    except asyncio.CancelledError:  # SIGTERM before the first step: nothing ran, nothing to report
        print("kvdoctor stress: stopped before the load started; no report", file=sys.stderr, flush=True)
        return 143
    summary = write_report(settings, result, out_dir)
    verdict = summary["verdict"]
    sat = summary["saturation"]
    if not sat["reached"]:
        reached = "KV did not saturate"
    elif sat["reason"] in (S.QUEUE, S.TTFT):
        reached = f"stopped on the queue at concurrency ×{sat['concurrency']} (no KV usage signal)"
    else:
        reached = f"KV saturated at concurrency ×{sat['concurrency']} ({sat['reason'].replace('_', ' ')})"
    if args.json:
        print(json.dumps(summary, allow_nan=False), flush=True)
    else:
        print(f"{verdict['headline']}\n{reached}\nreport: {os.path.join(out_dir, 'report.html')}", flush=True)
    return 1 if result.failed else 0
