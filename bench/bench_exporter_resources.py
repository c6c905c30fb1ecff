"""Exporter resources at 1 Hz: CPU (% of one core) and RSS of the exporter as its own process.

    .venv/bin/python -m bench.bench_exporter_resources            # ~2.5 minutes
    .venv/bin/python -m bench.bench_exporter_resources --quick    # ~50 s

bench/bench_exporter.py times the exporter's parts inside the benchmark's own process; this one
measures what an operator sees in ``top``: the exporter running alone in a process, collecting
every second from the real vLLM exposition (tests/fixtures/vllm-0.32-cpu, served over HTTP by a
third process) plus 8 simulated GPUs (bench_exporter's ``SimulatedGpus``), diagnosing every cycle
and answering one Prometheus-like scrape of /metrics a second.

Floor, measured in the same run, side by side (same machine load): the simplest Python exporter
of the same data with prometheus_client -- every second it fetches the same page, parses it with
prometheus_client's parser and serves it again, plus the same 8 GPUs' series, with
``start_http_server`` (``generate_latest`` per scrape). It keeps no window and diagnoses nothing.
A third process holding only the exporter's imports shows how much of the RSS is code.

CPU is the process's user + system time over the measured span, after a warm-up long enough to
fill the diagnosis's 60 s window (quick: shorter, noted). Targets (issue 7): CPU <= 0.5 % of one
core, RSS <= 80 MB (10^6 bytes; dcgm-exporter reports range from 71 to 254 MB).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.table import Row, print_table, write_json

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests/fixtures/vllm-0.32-cpu/fill-sequence/08.txt"
CPU_TARGET = 0.005  # of one core
RSS_TARGET = 80e6
BENCH = "exporter@1Hz"
IMPORTS_ONLY = (
    "import kvdoctor.exporter.app, kvdoctor.exporter.runtime, kvdoctor.exporter.assembly, "
    "kvdoctor.exporter.collectors, kvdoctor.rules.diagnosis, kvdoctor.exporter.server, "
    "bench.bench_exporter, sys; print('PORT 0', flush=True); sys.stdin.read()"
)


# ------------------------------------------------------------------------------ measured processes


def child_ours(engine_url: str, gpus: int) -> int:
    """The exporter, as ``kvdoctor exporter`` builds it, plus ``gpus`` simulated GPUs."""
    import logging

    from bench.bench_exporter import SimulatedGpus
    from kvdoctor.exporter.app import create_app
    from kvdoctor.exporter.assembly import build_exporter
    from kvdoctor.exporter.server import bind_socket, serve
    from kvdoctor.exporter.settings import ExporterSettings

    logging.basicConfig(level=logging.WARNING)
    settings = ExporterSettings(engine_url=engine_url, interval=1.0, nvml=False, host="127.0.0.1", port=0)
    exporter = build_exporter(settings, extra_collectors=[SimulatedGpus(gpus)])
    sock = bind_socket("127.0.0.1", 0)

    def started(handle) -> None:
        exporter.start()
        print(f"PORT {handle.port}", flush=True)

    try:
        return serve(create_app(exporter), "127.0.0.1", 0, on_started=started, sock=sock)
    finally:
        exporter.stop()


def child_floor(engine_url: str, gpus: int) -> int:
    """prometheus_client re-exposing the engine page and the GPUs' series, refreshed every second."""
    import http.client
    from urllib.parse import urlsplit

    from prometheus_client import CollectorRegistry, start_http_server
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.parser import text_string_to_metric_families

    parts = urlsplit(engine_url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=2)
    state = {"families": [], "step": 0}

    def refresh() -> None:
        conn.request("GET", parts.path)
        text = conn.getresponse().read().decode()
        families = list(text_string_to_metric_families(text))
        state["step"] += 1
        for name in (
            "gpu_dram_bandwidth_utilization_ratio",
            "gpu_sm_active_ratio",
            "gpu_memory_used_bytes",
            "gpu_memory_total_bytes",
            "gpu_pcie_receive_bytes_per_second",
            "gpu_pcie_transmit_bytes_per_second",
            "gpu_dram_peak_bandwidth_bytes_per_second",
        ):
            family = GaugeMetricFamily(f"floor_{name}", name, labels=["gpu", "uuid", "model"])
            for i in range(gpus):
                labels = [str(i), f"GPU-{i:08x}-bench", "NVIDIA H100 80GB HBM3"]
                family.add_metric(labels, (state["step"] + i) % 10 / 10)
            families.append(family)
        state["families"] = families

    class Same:
        def collect(self):
            return state["families"]

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Same())
    refresh()
    server, _ = start_http_server(0, addr="127.0.0.1", registry=registry)
    print(f"PORT {server.server_port}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    next_tick = time.monotonic()
    while not stop.is_set():
        refresh()
        next_tick += 1.0
        stop.wait(max(0.0, next_tick - time.monotonic()))
    server.shutdown()
    return 0


# ------------------------------------------------------------------------------------ measuring


class Measured:
    def __init__(self, name: str, argv: list[str]):
        import psutil

        self.name = name
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True, cwd=ROOT)
        line = self.proc.stdout.readline().strip()
        if not line.startswith("PORT "):
            self.proc.kill()
            raise RuntimeError(f"{name}: did not start (printed {line!r})")
        self.port = int(line.split()[1])
        self.ps = psutil.Process(self.proc.pid)
        self.rss: list[float] = []
        self.cpu0 = self.wall0 = 0.0

    def cpu_seconds(self) -> float:
        t = self.ps.cpu_times()
        return t.user + t.system

    def start_span(self) -> None:
        self.cpu0, self.wall0, self.rss = self.cpu_seconds(), time.monotonic(), []

    def sample(self) -> None:
        self.rss.append(float(self.ps.memory_info().rss))

    def cpu_fraction(self) -> float:
        return (self.cpu_seconds() - self.cpu0) / (time.monotonic() - self.wall0)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def measure(quick: bool = False, gpus: int = 8, warmup: float | None = None, span: float | None = None) -> list[Row]:
    import httpx

    from bench.bench_exporter import start_engine_process

    warmup = warmup if warmup is not None else (15.0 if quick else 70.0)
    span = span if span is not None else (20.0 if quick else 60.0)
    engine_proc, url = start_engine_process(FIXTURE)
    me = [sys.executable, "-m", "bench.bench_exporter_resources"]
    procs: list[Measured] = []
    try:
        ours = Measured("ours", me + ["--child", "ours", "--engine-url", url, "--gpus", str(gpus)])
        procs.append(ours)
        floor = Measured("floor", me + ["--child", "floor", "--engine-url", url, "--gpus", str(gpus)])
        procs.append(floor)
        imports = Measured("imports", [sys.executable, "-c", IMPORTS_ONLY])
        procs.append(imports)
        client = httpx.Client(timeout=5)
        page_bytes = {}

        def scrape() -> None:
            for m in (ours, floor):
                r = client.get(f"http://127.0.0.1:{m.port}/metrics")
                r.raise_for_status()
                page_bytes[m.name] = len(r.content)

        deadline = time.monotonic() + warmup
        while time.monotonic() < deadline:
            scrape()
            time.sleep(1.0)
        for m in procs:
            m.start_span()
        next_tick = time.monotonic()
        end = next_tick + span
        while next_tick < end:
            scrape()
            for m in procs:
                m.sample()
            next_tick += 1.0
            time.sleep(max(0.0, next_tick - time.monotonic()))
        cpu = {m.name: m.cpu_fraction() for m in procs}
        client.close()
    finally:
        for m in procs:
            m.stop()
        engine_proc.terminate()
        engine_proc.wait(10)

    def pct(f: float) -> str:
        return f"{f * 100:.2f} % of a core"

    rss_ours, rss_floor = statistics.median(ours.rss), statistics.median(floor.rss)
    load1 = os.getloadavg()[0]
    short = " (quick: the diagnosis window is not yet full)" if warmup < 60 else ""
    return [
        Row(
            BENCH,
            f"CPU, vLLM fixture + {gpus} simulated GPUs, 1 scrape/s",
            pct(cpu["ours"]),
            pct(cpu["floor"]),
            f"{cpu['ours'] / cpu['floor']:.2f}x floor",
            "<= 0.50 %",
            cpu["ours"] <= CPU_TARGET,
            f"measured over {span:.0f} s after {warmup:.0f} s of warm-up{short}; load average {load1:.1f} on "
            f"{os.cpu_count()} CPUs; floor = prometheus_client parser + start_http_server re-exposing the same page",
        ),
        Row(
            BENCH,
            "RSS (median over the span)",
            f"{rss_ours / 1e6:.1f} MB",
            f"{rss_floor / 1e6:.1f} MB",
            f"{rss_ours / rss_floor:.2f}x floor",
            "<= 80 MB",
            rss_ours <= RSS_TARGET,
            f"max {max(ours.rss) / 1e6:.1f} MB; the exporter's imports alone (no collection) hold "
            f"{statistics.median(imports.rss) / 1e6:.1f} MB",
        ),
        Row(
            BENCH,
            "  /metrics page served",
            f"{page_bytes.get('ours', 0) / 1e3:.1f} KB",
            f"{page_bytes.get('floor', 0) / 1e3:.1f} KB",
            "",
            "",
            None,
            "ours: canonical series only; floor: the whole engine page again",
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter warm-up and span")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--warmup", type=float, help="seconds before measuring (default 70; quick 15)")
    parser.add_argument("--span", type=float, help="seconds measured (default 60; quick 20)")
    parser.add_argument("--json-out", metavar="PATH", help="also write the rows as JSON (for python -m bench)")
    parser.add_argument("--child", choices=("ours", "floor"), help=argparse.SUPPRESS)
    parser.add_argument("--engine-url", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child == "ours":
        return child_ours(args.engine_url, args.gpus)
    if args.child == "floor":
        return child_floor(args.engine_url, args.gpus)
    rows = measure(args.quick, args.gpus, args.warmup, args.span)
    print_table(rows)
    if args.json_out:
        write_json(rows, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
