"""kvdoctor demo: the whole pipeline on a built-in simulated engine and GPU, no GPU needed."""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
import numpy as np
from pydantic import ValidationError

from kvdoctor import arguments
from kvdoctor.commands.dashboard import load_dashboard_app
from kvdoctor.errors import UsageError
from kvdoctor.exporter.app import create_app
from kvdoctor.exporter.assembly import ConfigError, build_exporter
from kvdoctor.exporter.server import ServerError, serve_in_thread
from kvdoctor.exporter.settings import DEFAULT_PORT, error_line, load_settings
from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.stats import histogram_quantile
from kvdoctor.simulator import gpu as simulated_gpu
from kvdoctor.simulator.deployment import EngineConfig
from kvdoctor.simulator.engine_server import EngineServer
from kvdoctor.simulator.physics import Simulation
from kvdoctor.simulator.scenarios import CYCLE_PERIOD_SECONDS, QUEUE_CHOICES, SCENARIO_CHOICES

NAME = "demo"
HELP = "run the exporter and dashboard against a built-in simulated vLLM engine and GPU"
DESCRIPTION = """\
Starts a simulated vLLM engine on a free loopback port (it serves vLLM-format /metrics, so the
exporter goes through the same HTTP scrape and vLLM adapter as in production), a simulated GPU
(the nvml collector's signals, method="gpm"), the exporter, and the dashboard (the [dashboard]
extra; --no-dashboard without it). Then prints a one-line status every few seconds until Ctrl-C.

The simulated deployment is Llama-2-7B (32 KV heads: 512 KiB of KV per token) on one H100 with
vLLM's defaults; its numbers come from the ledger's arithmetic (ledger/arithmetic.py). --gpus N splits
it tensor parallel over N H100s as `kvdoctor ledger --tp N` does (each its share of the weights and
KV heads, its own KV pool; N divides the 32 attention heads), each GPU with its own UUID, memory
and DRAM/SM/PCIe readings (the scenarios' loads are sized for one GPU: N of them have more room).
Scenarios:

  healthy            modest chat load: ITL ~8 ms
  bandwidth_bound    long contexts: every step re-reads ~50 GB; DRAM bandwidth ~85%, SM ~35%
  kv_thrashing       KV demand ~4x the pool: preemptions, KV pinned near 100%, multi-second stalls
  tier_miss          prefix hits served from CPU memory over PCIe (~20 GB/s), not hidden
  capacity_pressure  long prompts arriving faster than they finish: KV >= 90%, queue growing
  host_overhead      ~110 ms of CPU work per engine step: requests running, GPU idle
  compute_bound      prefill-heavy traffic: SM ~95%, DRAM bandwidth ~20%, ITL ~0.1-0.2 s
  cycle              each of the above in turn (--cycle-period seconds each)

Switch while it runs:  curl -X POST ENGINE_URL/scenario -d '{"scenario": "kv_thrashing"}'

--queue steady|growing puts a queue behind every scenario, as a real incident has: a tenth more
clients than the engine runs at once (steady), and 1 more client joining every second (growing).
Switch it too: curl -X POST ENGINE_URL/scenario -d '{"scenario": "bandwidth_bound", "queue": "growing"}'

The latency SLO defaults to 15 ms (--slo-ms): on this hardware even a fully bandwidth-bound
decode stays near 20 ms per token, under the exporter's general-purpose 100 ms default.

The engine also answers OpenAI completions (streaming, with usage), so `kvdoctor stress` runs
against it: pass the engine URL the demo prints as --engine-url.

--check starts the same, waits until the exporter has a verdict and the dashboard's three pages
(Live, Ledger, Fleet) answer, says how long each took, and stops (for CI: `make demo-check`). Its
ports are any free ones unless --port / --dashboard-port say otherwise.

exit status: 0 stopped (Ctrl-C or SIGTERM), or with --check everything came up; 1 with --check,
something did not come up within --check-timeout (named); 2 a usage error (a flag, a port in use,
the [dashboard] extra missing); 3 an internal error.

examples:
  kvdoctor demo
  kvdoctor demo --scenario kv_thrashing --port 0 --dashboard-port 0
  kvdoctor demo --no-dashboard --scenario cycle --cycle-period 120
  kvdoctor demo --scenario bandwidth_bound --queue growing
  kvdoctor demo --check                     # start, wait for a verdict and the three pages, stop
"""

DEFAULT_SLO_MS = 15.0
DEFAULT_STATUS_EVERY = 5.0
DEFAULT_DASHBOARD_PORT = 8050
DEFAULT_CHECK_TIMEOUT = 120.0
PAGES = (("Live", "/"), ("Ledger", "/ledger"), ("Fleet", "/fleet"))


def _positive_float(text: str) -> float:
    return arguments.checked(text, float, "a number", lambda v: v > 0 and not math.isinf(v), "> 0")


def _port(text: str) -> int:
    return arguments.checked(text, int, "a port number", lambda v: 0 <= v <= 65535, "between 0 and 65535")


def _gpus(text: str) -> int:
    return arguments.checked(text, int, "a whole number of GPUs", lambda v: v >= 1, "at least 1")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--scenario", default="healthy", choices=SCENARIO_CHOICES, help="the simulated workload (default: healthy)"
    )
    parser.add_argument("--queue", default="none", choices=QUEUE_CHOICES, help="a queue behind it (default: none)")
    parser.add_argument(
        "--port",
        type=_port,
        metavar="PORT",
        help=f"the exporter's port (default: {DEFAULT_PORT}, with --check any free one; 0: any free port)",
    )
    parser.add_argument(
        "--dashboard-port",
        type=_port,
        metavar="PORT",
        help=f"the dashboard's port (default: {DEFAULT_DASHBOARD_PORT}, with --check any free one; 0: any free port)",
    )
    parser.add_argument("--no-dashboard", action="store_true", help="do not start the dashboard")
    parser.add_argument(
        "--seed",
        type=arguments.ranged(int, 0, 2**32 - 1, low_open=False),
        default=0,
        metavar="N",
        help="the simulation's random seed (default: 0)",
    )
    parser.add_argument(
        "--interval",
        type=_positive_float,
        default=1.0,
        metavar="S",
        help="seconds between the exporter's collections (default: 1)",
    )
    parser.add_argument(
        "--slo-ms",
        type=_positive_float,
        default=DEFAULT_SLO_MS,
        metavar="MS",
        help=f"inter-token latency SLO the diagnosis compares with (default: {DEFAULT_SLO_MS:g} ms)",
    )
    parser.add_argument(
        "--gpus",
        type=_gpus,
        default=1,
        metavar="N",
        help="simulated GPUs the model is split over, tensor parallel (default: 1; N divides 32)",
    )
    parser.add_argument(
        "--cycle-period",
        type=_positive_float,
        default=CYCLE_PERIOD_SECONDS,
        metavar="S",
        help=f"seconds per scenario with --scenario cycle (default: {CYCLE_PERIOD_SECONDS:g}; the "
        "diagnosis reads the last 60 s, so shorter phases mostly show the previous verdict)",
    )
    parser.add_argument(
        "--status-every",
        type=arguments.ranged(float, 0, 86400, "seconds", low_open=False),
        default=DEFAULT_STATUS_EVERY,
        metavar="S",
        help=f"seconds between status lines (default: {DEFAULT_STATUS_EVERY:g}; 0: none)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="start everything, wait for the exporter's first verdict and the three dashboard pages, then stop: "
        "exit 0, or 1 naming what did not come up",
    )
    parser.add_argument(
        "--check-timeout",
        type=arguments.ranged(float, 0, 3600, "seconds"),
        default=DEFAULT_CHECK_TIMEOUT,
        metavar="S",
        help=f"with --check: how long to wait for everything (default: {DEFAULT_CHECK_TIMEOUT:g})",
    )


# ------------------------------------------------------------------------------------ status line


def _latest(window, name: str) -> float:
    """The newest value of series ``name``, the highest one if there are several (NaN if absent)."""
    newest = [values[~np.isnan(values)][-1] for values in window.select(name).values() if (~np.isnan(values)).any()]
    return float(max(newest)) if newest else math.nan


def _counter_rate(window, name: str) -> float:
    """Per-second increase of the sum of counters ``name`` over the window (resets skipped)."""
    total, seconds = 0.0, 0.0
    for values in window.select(name).values():
        ok = ~np.isnan(values)
        if ok.sum() < 2:
            continue
        v, ts = values[ok], window.timestamps[ok]
        d = np.diff(v)
        total += float(np.where(d < 0, v[1:], d).sum())
        seconds = max(seconds, float(ts[-1] - ts[0]))
    return total / seconds if seconds > 0 else math.nan


def _itl_quantiles(window, qs=(0.5, 0.95)) -> list[float]:
    bounds, counts = [], []
    for labels, values in window.select(S.INTER_TOKEN_LATENCY + "_bucket").items():
        ok = ~np.isnan(values)
        if ok.sum() < 2:
            continue
        v = values[ok]
        d = np.diff(v)
        le = dict(labels).get("le", "")
        bounds.append(math.inf if le == "+Inf" else float(le))
        counts.append(float(np.where(d < 0, v[1:], d).sum()))
    if not bounds:
        return [math.nan for _ in qs]
    return [histogram_quantile(q, np.array(bounds), np.array(counts)) for q in qs]


def status_line(window, diagnosis: dict | None, now: float | None = None) -> str:
    """One line: KV %, ITL p50/p95, DRAM BW %, SM %, preemptions/s and the verdict."""

    def pct(v: float) -> str:
        return "  --" if math.isnan(v) else f"{v * 100:3.0f}%"

    def ms(v: float) -> str:
        return "--" if math.isnan(v) else (f"{v * 1e3:.1f}" if v < 1 else f"{v * 1e3:,.0f}")

    p50, p95 = _itl_quantiles(window)
    preempt = _counter_rate(window, S.PREEMPTIONS)
    verdict = "--"
    if diagnosis:
        verdict = f"{diagnosis.get('verdict', '--')} ({float(diagnosis.get('confidence') or 0):.2f})"
    clock = time.strftime("%H:%M:%S", time.localtime(now if now is not None else time.time()))
    return (
        f"[{clock}] KV {pct(_latest(window, S.KV_CACHE_USAGE))} | ITL p50 {ms(p50)} ms p95 {ms(p95)} ms | "
        f"DRAM BW {pct(_latest(window, S.GPU_DRAM_BANDWIDTH_UTILIZATION))} | "
        f"SM {pct(_latest(window, S.GPU_SM_ACTIVE))} | "
        f"preemptions {'--' if math.isnan(preempt) else f'{preempt:.1f}'}/s | verdict {verdict}"
    )


# ------------------------------------------------------------------------------------ wiring


class Check:
    """``--check``: what must come up (the exporter's verdict, the dashboard's pages), polled until
    all did or the time is up; each one's time after the start is kept for the summary."""

    def __init__(self, exporter_url: str, dashboard_url: str | None, started: float) -> None:
        self.started = started
        self.pending: dict[str, str] = {"the exporter's verdict": f"{exporter_url}/api/v1/diagnosis"}
        if dashboard_url:
            root = dashboard_url.rstrip("/")
            for name, path in PAGES:
                self.pending[f"the {name} page"] = root + path
            self.pending["the dashboard's layout"] = root + "/_dash-layout"
        self.why: dict[str, str] = {}
        self.came_up: list[str] = []

    def poll(self, client: httpx.Client) -> None:
        for what, url in list(self.pending.items()):
            try:
                answer = client.get(url)
            except httpx.HTTPError as exc:
                self.why[what] = f"{url}: {type(exc).__name__}"
                continue
            detail = self._looks_right(what, answer)
            if detail is None:
                self.why[what] = f"{url}: HTTP {answer.status_code}"
                continue
            del self.pending[what]
            self.why.pop(what, None)
            line = f"{what} after {time.monotonic() - self.started:.1f} s: {detail}"
            self.came_up.append(line)
            print(f"kvdoctor demo --check: {line}", flush=True)

    @staticmethod
    def _looks_right(what: str, answer: httpx.Response) -> str | None:
        if answer.status_code != 200:
            return None
        if what == "the exporter's verdict":
            payload = answer.json() if "json" in answer.headers.get("content-type", "") else None
            verdict = payload.get("verdict") if isinstance(payload, dict) else None
            if not verdict:
                return None
            return f"{verdict} (confidence {float(payload.get('confidence') or 0):.2f})"
        if what == "the dashboard's layout":
            return "served" if "json" in answer.headers.get("content-type", "") else None
        name = what.split()[1]
        return f"{answer.url} answered" if f"kvdoctor · {name}" in answer.text else None

    def wait(self, stop: threading.Event, timeout: float) -> int:
        deadline = self.started + timeout
        with httpx.Client(timeout=5.0, follow_redirects=False) as client:
            while self.pending and not stop.is_set():
                self.poll(client)
                if not self.pending or time.monotonic() >= deadline:
                    break
                stop.wait(0.5)
        if not self.pending:
            print(f"kvdoctor demo --check: everything came up in {time.monotonic() - self.started:.1f} s", flush=True)
            return 0
        missing = "; ".join(f"{what} ({self.why.get(what, 'not asked yet')})" for what in self.pending)
        when = "stopped" if stop.is_set() else f"within {timeout:g} s"
        print(f"kvdoctor demo: error: did not come up {when}: {missing}", file=sys.stderr, flush=True)
        return 1


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    free = 0 if args.check else None
    if args.port is None:
        args.port = free if free is not None else DEFAULT_PORT
    if args.dashboard_port is None:
        args.dashboard_port = free if free is not None else DEFAULT_DASHBOARD_PORT
    dashboard_app = None if args.no_dashboard else load_dashboard_app(" (or run the demo with --no-dashboard)")
    stop = threading.Event()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, lambda *_: stop.set())

    with ExitStack() as stack:
        for signum, handler in previous.items():
            stack.callback(signal.signal, signum, handler)

        try:
            config = EngineConfig(tensor_parallel=args.gpus)
        except ValueError as exc:  # the ledger's check: N must split the model's heads
            raise UsageError(f"--gpus {args.gpus}: {str(exc).replace('--tp ', '')}") from None
        sim = Simulation(args.scenario, seed=args.seed, cycle_period=args.cycle_period, config=config, queue=args.queue)
        engine = EngineServer(sim).start()
        stack.callback(engine.stop)

        # The served model's config.json, as an operator would pass it: it gives the exporter the
        # model shape for kvdoctor_decode_step_floor_seconds.
        model_config = None
        if sim.config.model_config is not None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kvdoctor-demo-")))
            model_config = workdir / "config.json"
            model_config.write_text(json.dumps(dict(sim.config.model_config)))
        try:
            settings = load_settings(
                engine_url=engine.metrics_url,
                engine="vllm",
                collectors={"nvml": False},  # the simulated GPU stands in for it
                interval=args.interval,
                host="127.0.0.1",
                port=args.port,
                model_config_path=str(model_config) if model_config else None,
                gpu_peak_bandwidth=sim.config.gpu.peak_bandwidth,
                slo_ms=args.slo_ms,
            )
        except ValidationError as exc:
            raise UsageError(error_line(exc)) from None
        try:
            exporter = build_exporter(
                settings,
                extra_collectors=[simulated_gpu.for_engine_url(engine.metrics_url, settings.scrape_timeout or 2.0)],
            )
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
        stack.callback(exporter.stop)

        try:
            exporter_http = serve_in_thread(create_app(exporter), settings.host, settings.port)
        except ServerError as exc:
            raise UsageError(f"exporter: {exc}") from None
        stack.callback(exporter_http.stop)

        dashboard_url = None
        if dashboard_app is not None:
            try:
                dashboard = dashboard_app.create_app(exporter_url=exporter_http.url)
            except ValueError as exc:  # e.g. a malformed KVDOCTOR_DASHBOARD_USERS
                raise UsageError(f"dashboard: {exc}") from None
            try:
                dashboard_http = dashboard_app.serve_in_thread(dashboard, "127.0.0.1", args.dashboard_port)
            except OSError as exc:
                raise UsageError(
                    f"{exc.strerror or exc} (choose another with --dashboard-port, or --no-dashboard)"
                ) from None
            stack.callback(dashboard_http.stop)
            dashboard_url = dashboard_http.url

        exporter.start()
        cfg = sim.config
        gpus = f"a simulated {cfg.gpu_name}"
        if cfg.tensor_parallel > 1:
            gpus = f"{cfg.tensor_parallel} simulated {cfg.gpu_name} (tensor parallel)"
        print(
            f"kvdoctor demo: simulated vLLM engine serving {cfg.model_name} on {gpus}; "
            f"scenario {args.scenario}; ITL SLO {args.slo_ms:g} ms",
            flush=True,
        )
        if dashboard_url:
            print(f"  dashboard   {dashboard_url}", flush=True)
        print(f"  metrics     {exporter_http.url}/metrics", flush=True)
        print(f"  diagnosis   {exporter_http.url}/api/v1/diagnosis", flush=True)
        print(
            f"  engine      {engine.metrics_url}   (switch: curl -X POST {engine.url}/scenario "
            f'-d \'{{"scenario": "kv_thrashing"}}\')',
            flush=True,
        )
        if args.check:
            return Check(exporter_http.url, dashboard_url, started).wait(stop, args.check_timeout)
        print("Ctrl-C to stop.", flush=True)

        every = args.status_every
        while not stop.wait(every if every > 0 else 3600):
            if every > 0:
                window = exporter.store.window(max(10.0, 3 * args.interval))
                print(status_line(window, exporter.diagnosis()), flush=True)
        print("kvdoctor demo: stopping", flush=True)
    return 0
