"""The processes bench/bench_exporter_resources.py measures, and the simulated GPUs both exporter
benchmarks collect from.

Run as ``python -m bench.exporter_processes ours|floor --engine-url URL [--gpus N]``: each prints
``PORT n`` once it serves ``/metrics``, then serves until SIGTERM. This module imports only what
the measured process needs (each child its own, inside its function), so nothing of the
benchmark's own harness counts in the RSS measured.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time


class SimulatedGpus:
    """Every canonical GPU signal for ``n`` GPUs, values moving each call (no NVML involved)."""

    name = "gpu"

    def __init__(self, n: int = 8):
        from kvdoctor.signals import vocabulary as S
        from kvdoctor.signals.window import labels_of

        self.n = n
        self.step = 0
        self._rows = []
        self._health: list[dict] = []  # per GPU: the health series that hold still (errors, link, maxima)
        self._moving: list[tuple] = []  # per GPU: temperature, power draw and SM clock keys
        for i in range(n):
            base = labels_of(gpu=str(i), uuid=f"GPU-{i:08x}-bench", model="NVIDIA H100 80GB HBM3")
            gpm = labels_of(dict(base), method="gpm")
            ident = dict(base)
            health = {
                (S.GPU_POWER_LIMIT, base): 700.0,
                (S.GPU_CLOCK, labels_of(ident, clock=S.CLOCK_MEMORY)): 2619e6,
                (S.GPU_MAX_CLOCK, labels_of(ident, clock=S.CLOCK_MEMORY)): 2619e6,
                (S.GPU_MAX_CLOCK, labels_of(ident, clock=S.CLOCK_SM)): 1980e6,
                (S.GPU_XID_ERRORS, base): 0.0,
                (S.GPU_LAST_XID, base): 0.0,
                (S.GPU_ROW_REMAP_PENDING, base): 0.0,
                (S.GPU_ROW_REMAP_FAILURE, base): 0.0,
                (S.GPU_PCIE_LINK_GENERATION, base): 5.0,
                (S.GPU_PCIE_LINK_MAX_GENERATION, base): 5.0,
                (S.GPU_PCIE_LINK_WIDTH, base): 16.0,
                (S.GPU_PCIE_LINK_MAX_WIDTH, base): 16.0,
                (S.GPU_PCIE_REPLAYS, base): 0.0,
            }
            for _, reason in S.CLOCK_THROTTLE_REASONS:
                health[(S.GPU_CLOCK_THROTTLE_REASON, labels_of(ident, reason=reason))] = 0.0
            for error in (S.ERROR_CORRECTED, S.ERROR_UNCORRECTED):
                health[(S.GPU_REMAPPED_ROWS, labels_of(ident, error=error))] = 0.0
                for scope in (S.SCOPE_VOLATILE, S.SCOPE_AGGREGATE):
                    health[(S.GPU_ECC_ERRORS, labels_of(ident, error=error, scope=scope))] = 0.0
            self._health.append(health)
            self._moving.append(
                ((S.GPU_TEMPERATURE, base), (S.GPU_POWER_DRAW, base), (S.GPU_CLOCK, labels_of(ident, clock=S.CLOCK_SM)))
            )
            self._rows.append(
                (
                    (S.GPU_DRAM_BANDWIDTH_UTILIZATION, gpm),
                    (S.GPU_SM_ACTIVE, gpm),
                    (S.GPU_MEMORY_USED, base),
                    (S.GPU_MEMORY_TOTAL, base),
                    (S.GPU_PCIE_RX, base),
                    (S.GPU_PCIE_TX, base),
                    (S.GPU_DRAM_PEAK_BANDWIDTH, base),
                )
            )

    def collect(self):
        from kvdoctor.signals.collection import Collected

        self.step += 1
        out = Collected()
        for i, (bw, sm, used, total, rx, tx, peak) in enumerate(self._rows):
            phase = (self.step + i) % 10 / 10
            out.samples[bw] = 0.6 + 0.3 * phase
            out.samples[sm] = 0.3 + 0.1 * phase
            out.samples[used] = 70e9 + 1e6 * self.step
            out.samples[total] = 80e9
            out.samples[rx] = 2e8 * phase
            out.samples[tx] = 1e8 * phase
            out.samples[peak] = 3.35e12
            out.samples.update(self._health[i])
            temperature, power, sm_clock = self._moving[i]
            out.samples[temperature] = 50.0 + 10 * phase
            out.samples[power] = 400.0 + 200 * phase
            out.samples[sm_clock] = 1980e6 - 15e6 * (self.step % 3)
        return out

    def close(self) -> None:
        pass


def child_ours(engine_url: str, gpus: int) -> int:
    """The exporter, as ``kvdoctor exporter`` builds it, plus ``gpus`` simulated GPUs."""
    import logging

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("child", choices=("ours", "floor"))
    parser.add_argument("--engine-url", required=True)
    parser.add_argument("--gpus", type=int, default=8)
    args = parser.parse_args(argv)
    return (child_ours if args.child == "ours" else child_floor)(args.engine_url, args.gpus)


if __name__ == "__main__":
    sys.exit(main())
