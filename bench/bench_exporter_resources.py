"""Exporter resources at 1 Hz: CPU (% of one core) and RSS of the exporter as its own process.

    .venv/bin/python -m bench.bench_exporter_resources            # ~2.5 minutes
    .venv/bin/python -m bench.bench_exporter_resources --quick    # ~50 s

bench/bench_exporter.py times the exporter's parts inside the benchmark's own process; this one
measures what an operator sees in ``top``: the exporter running alone in a process, collecting
every second from the real vLLM exposition (tests/fixtures/vllm-0.32-cpu, served over HTTP by a
third process) plus 8 simulated GPUs (bench/exporter_processes.py), diagnosing every cycle
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
import statistics
import sys
import time

import httpx
import psutil

from bench.bench_exporter import FIXTURE, start_engine_process
from bench.table import Row, add_json_out, report
from tests.support.processes import Process

CPU_TARGET = 0.005  # of one core
RSS_TARGET = 80e6
BENCH = "exporter@1Hz"
IMPORTS_ONLY = (
    "import kvdoctor.exporter.app, kvdoctor.exporter.runtime, kvdoctor.exporter.assembly, "
    "kvdoctor.exporter.collectors, kvdoctor.rules.diagnosis, kvdoctor.exporter.server, "
    "bench.exporter_processes, signal; print('PORT 0', flush=True); signal.pause()"
)


# ------------------------------------------------------------------------------------ measuring


class Measured:
    """A process printing ``PORT n`` once it serves, measured with psutil."""

    def __init__(self, name: str, argv: list[str]):
        self.name = name
        self.process = Process(argv, name=name).start()
        self.port = int(self.process.wait_for_line(r"^PORT (\d+)", timeout=120).group(1))
        self.ps = psutil.Process(self.process.pid)
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
        self.process.stop()


def measure(quick: bool = False, gpus: int = 8, warmup: float | None = None, span: float | None = None) -> list[Row]:
    warmup = warmup if warmup is not None else (15.0 if quick else 70.0)
    span = span if span is not None else (20.0 if quick else 60.0)
    engine_proc, url = start_engine_process(FIXTURE)
    child = [sys.executable, "-m", "bench.exporter_processes"]
    procs: list[Measured] = []
    try:
        ours = Measured("ours", [*child, "ours", "--engine-url", url, "--gpus", str(gpus)])
        procs.append(ours)
        floor = Measured("floor", [*child, "floor", "--engine-url", url, "--gpus", str(gpus)])
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
        engine_proc.stop()

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
            note="ours: canonical series only; floor: the whole engine page again",
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter warm-up and span")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--warmup", type=float, help="seconds before measuring (default 70; quick 15)")
    parser.add_argument("--span", type=float, help="seconds measured (default 60; quick 20)")
    add_json_out(parser)
    args = parser.parse_args(argv)
    rows = measure(args.quick, args.gpus, args.warmup, args.span)
    return report(rows, args.json_out)


if __name__ == "__main__":
    sys.exit(main())
