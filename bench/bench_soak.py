"""Soak: the demo at 10 Hz collection with concurrent scrapers; RSS, open fds and threads stay flat.

    .venv/bin/python -m bench.bench_soak                  # 30 minutes, --scenario cycle
    .venv/bin/python -m bench.bench_soak --quick          # 3 minutes (the CI figure), kv_thrashing
    .venv/bin/python -m bench.bench_soak --minutes 10

Runs the real ``kvdoctor demo --interval 0.1`` (simulated engine over HTTP, simulated GPU,
exporter, diagnosis every cycle) in its own process, and from this one, concurrently:
``--scrapers`` threads scraping ``/metrics`` as fast as every 0.1 s (half on kept-alive
connections, half opening a new connection per request, so a leaked socket shows up as an fd),
plus one client reading ``/api/v1/window?seconds=10``, ``/api/v1/diagnosis`` and
``/api/v1/status`` every second like the dashboard. The load starts once the exporter is ready
(its first diagnosis done), so any failed request counts. Every ``--sample-every`` seconds the demo
process's RSS, open file descriptors and threads are sampled.

Flat, the definition: after the warm-up (the ring store filling up: ``max_snapshots`` x the
interval, plus 10 %, plus 10 s), the median of the last third of the samples is within 5 MB (RSS)
and 0 (fds, threads) of the median of the first third. The floor column is the first third, ours
the last. Every request must succeed.

``--max-snapshots N`` sets ``KVDOCTOR_MAX_SNAPSHOTS`` for the demo (the ring's count bound), so
a short soak can reach the store's steady state; the default keeps the exporter's own default
(3,600 snapshots: 6 minutes at 10 Hz).
"""

from __future__ import annotations

import argparse
import http.client
import random
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field

import httpx
import psutil

from bench.table import Row, add_json_out, report
from tests.support.demo import DemoProcess
from tests.support.processes import http_ok
from tests.support.tools import wait_until

BENCH = "soak"
RSS_FLAT_BYTES = 5e6
DEFAULT_MAX_SNAPSHOTS = 3600  # the exporter's default (exporter/settings.py)


@dataclass
class Sample:
    t: float
    rss: float
    fds: int
    threads: int


@dataclass
class SoakResult:
    minutes: float
    interval: float
    warmup: float
    samples: list[Sample]
    requests: int
    errors: list[str]
    cycles: int
    scenario: str
    max_snapshots: int
    extra: dict = field(default_factory=dict)

    def steady(self) -> list[Sample]:
        return [s for s in self.samples if s.t >= self.warmup]

    def thirds(self) -> tuple[list[Sample], list[Sample]]:
        steady = self.steady()
        k = max(1, len(steady) // 3)
        return steady[:k], steady[-k:]

    def growth(self, attr: str) -> tuple[float, float]:
        """(median of the first third, median of the last third) of ``attr`` after the warm-up."""
        first, last = self.thirds()
        return statistics.median(getattr(s, attr) for s in first), statistics.median(getattr(s, attr) for s in last)

    def flat(self) -> dict[str, bool]:
        rss0, rss1 = self.growth("rss")
        fd0, fd1 = self.growth("fds")
        th0, th1 = self.growth("threads")
        return {"rss": rss1 - rss0 <= RSS_FLAT_BYTES, "fds": fd1 - fd0 <= 0, "threads": th1 - th0 <= 0}

    def rss_slope_mb_per_hour(self) -> float:
        """Least-squares slope of RSS over the steady part, MB per hour."""
        steady = self.steady()
        if len(steady) < 3:
            return float("nan")
        ts = [s.t for s in steady]
        ys = [s.rss / 1e6 for s in steady]
        mt, my = statistics.fmean(ts), statistics.fmean(ys)
        var = sum((t - mt) ** 2 for t in ts)
        return sum((t - mt) * (y - my) for t, y in zip(ts, ys, strict=True)) / var * 3600 if var else float("nan")


class Scrapers:
    """Threads hammering the exporter until stopped; counts requests and keeps the first errors."""

    def __init__(self, host: str, port: int, n: int, period: float = 0.1):
        self.host, self.port, self.period = host, port, period
        self.requests = 0
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._metrics, args=(i % 2 == 0,), daemon=True) for i in range(n)]
        self._threads.append(threading.Thread(target=self._api, daemon=True))

    def start(self) -> Scrapers:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(10)

    def _get(self, conn: http.client.HTTPConnection | None, path: str, keep: bool) -> http.client.HTTPConnection | None:
        try:
            if conn is None:
                conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
            conn.request("GET", path, headers={} if keep else {"Connection": "close"})
            response = conn.getresponse()
            body = response.read()
            ok = response.status == 200 and (body or path == "/healthz")
            with self._lock:
                self.requests += 1
                if not ok and len(self.errors) < 20:
                    self.errors.append(f"GET {path}: HTTP {response.status}")
        except (OSError, http.client.HTTPException) as exc:
            with self._lock:
                self.requests += 1
                if len(self.errors) < 20:
                    self.errors.append(f"GET {path}: {type(exc).__name__}: {exc}")
            if conn is not None:
                conn.close()
            return None
        if not keep:
            conn.close()
            return None
        return conn

    def _metrics(self, keep: bool) -> None:
        conn = None
        rng = random.Random()
        while not self._stop.is_set():
            conn = self._get(conn, "/metrics", keep)
            self._stop.wait(self.period * rng.uniform(0.5, 1.5))
        if conn is not None:
            conn.close()

    def _api(self) -> None:
        conn = None
        while not self._stop.is_set():
            for path in ("/api/v1/window?seconds=10", "/api/v1/diagnosis", "/api/v1/status", "/healthz"):
                conn = self._get(conn, path, True)
            self._stop.wait(1.0)
        if conn is not None:
            conn.close()


def wait_ready(base_url: str, timeout: float = 60.0) -> None:
    """Until the exporter has completed a cycle and diagnosed once."""
    ready, diagnosed = http_ok(base_url + "/readyz", timeout=5), http_ok(base_url + "/api/v1/diagnosis", timeout=5)
    wait_until(lambda: ready() and diagnosed(), timeout=timeout, interval=0.2, what=f"the exporter at {base_url} ready")


def soak(
    minutes: float,
    interval: float = 0.1,
    scrapers: int = 8,
    scenario: str = "cycle",
    max_snapshots: int | None = None,
    sample_every: float = 2.0,
    progress=None,
) -> SoakResult:
    """Run the soak; ``progress(text)`` gets a line now and then (None: quiet)."""
    env = {"KVDOCTOR_MAX_SNAPSHOTS": str(max_snapshots)} if max_snapshots else {}
    ring = (max_snapshots or DEFAULT_MAX_SNAPSHOTS) * interval
    warmup = ring * 1.1 + 10.0
    total = minutes * 60.0
    if warmup > total * 0.6:
        raise ValueError(
            f"a {minutes:g} min soak is too short: the ring store takes {ring:.0f} s to fill at "
            f"{interval:g} s per cycle (lower --max-snapshots)"
        )
    samples: list[Sample] = []
    with DemoProcess(scenario, interval=interval, env=env) as demo:
        ps = psutil.Process(demo.pid)
        host, port = demo.exporter_url.removeprefix("http://").rsplit(":", 1)
        wait_ready(demo.exporter_url)  # before: /readyz and /api/v1/diagnosis answer 503 by design
        load = Scrapers(host, int(port), scrapers).start()
        t0 = time.monotonic()
        next_sample = t0
        next_report = t0 + 60
        try:
            while (now := time.monotonic()) - t0 < total:
                if not demo.process.running:
                    raise RuntimeError(f"kvdoctor demo exited with {demo.process.returncode} during the soak")
                samples.append(Sample(now - t0, float(ps.memory_info().rss), ps.num_fds(), ps.num_threads()))
                if progress and now >= next_report:
                    s = samples[-1]
                    progress(
                        f"  soak {s.t / 60:4.1f} min: RSS {s.rss / 1e6:.1f} MB, {s.fds} fds, {s.threads} threads, "
                        f"{load.requests} requests, {len(load.errors)} errors"
                    )
                    next_report += 60
                next_sample += sample_every
                time.sleep(max(0.0, next_sample - time.monotonic()))
        finally:
            load.stop()
        status = httpx.get(demo.exporter_url + "/api/v1/status", timeout=10).json()
    return SoakResult(
        minutes,
        interval,
        warmup,
        samples,
        load.requests,
        load.errors,
        int(status.get("cycles", 0)),
        scenario,
        max_snapshots or DEFAULT_MAX_SNAPSHOTS,
    )


def rows_for(result: SoakResult) -> list[Row]:
    flat = result.flat()
    rss0, rss1 = result.growth("rss")
    fd0, fd1 = result.growth("fds")
    th0, th1 = result.growth("threads")
    steady = result.steady()
    expected_cycles = result.minutes * 60 / result.interval
    label = f"{result.minutes:g} min at {1 / result.interval:g} Hz, {result.scenario}"
    return [
        Row(
            BENCH,
            f"RSS, {label}",
            f"{rss1 / 1e6:.1f} MB",
            f"{rss0 / 1e6:.1f} MB",
            f"{(rss1 - rss0) / 1e6:+.1f} MB",
            "<= +5 MB",
            flat["rss"],
            f"last third vs first third after {result.warmup:.0f} s of warm-up ({len(steady)} samples; ring of "
            f"{result.max_snapshots} snapshots); max {max(s.rss for s in result.samples) / 1e6:.1f} MB; "
            f"trend {result.rss_slope_mb_per_hour():+.1f} MB/hour",
        ),
        Row(BENCH, "open file descriptors", f"{fd1:g}", f"{fd0:g}", f"{fd1 - fd0:+g}", "+0", flat["fds"]),
        Row(BENCH, "threads", f"{th1:g}", f"{th0:g}", f"{th1 - th0:+g}", "+0", flat["threads"]),
        Row(
            BENCH,
            "requests served / failed",
            f"{result.requests:,} / {len(result.errors)}",
            "",
            "",
            "0 failed",
            not result.errors,
            "; ".join(result.errors[:3]),
        ),
        Row(
            BENCH,
            "collection cycles",
            f"{result.cycles:,}",
            f"{expected_cycles:,.0f} at 10 Hz",
            f"{result.cycles / expected_cycles:.2f}x",
            note="fewer than 10 Hz means cycles overran their 0.1 s tick (the runtime skips missed ticks)",
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 minutes, kv_thrashing, a 300-snapshot ring (CI size)")
    parser.add_argument("--minutes", type=float, help="default 30 (quick: 3)")
    parser.add_argument("--scenario", help="the demo's scenario (default cycle; quick: kv_thrashing)")
    parser.add_argument("--scrapers", type=int, default=8, help="concurrent /metrics scrapers (default 8)")
    parser.add_argument("--max-snapshots", type=int, help="KVDOCTOR_MAX_SNAPSHOTS for the demo (quick: 300)")
    add_json_out(parser)
    args = parser.parse_args(argv)
    minutes = args.minutes or (3.0 if args.quick else 30.0)
    scenario = args.scenario or ("kv_thrashing" if args.quick else "cycle")
    max_snapshots = args.max_snapshots or (300 if args.quick else None)
    result = soak(
        minutes,
        scrapers=args.scrapers,
        scenario=scenario,
        max_snapshots=max_snapshots,
        progress=lambda line: print(line, flush=True),
    )
    rows = rows_for(result)
    return report(rows, args.json_out)


if __name__ == "__main__":
    sys.exit(main())
