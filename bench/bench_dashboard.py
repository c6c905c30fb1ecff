"""Dashboard benchmark: server time and payload per live update, initial page load, 24 h of history.

    .venv/bin/python bench/bench_dashboard.py [--gpus 8] [--minutes 15] [--updates 20] [--history-hours 24]

Set-up (not timed): a fake exporter (tests/support/synthetic.py, its own process, real HTTP) holding
``--minutes`` of 1 Hz samples for ``--gpus`` GPUs and one engine; a real Prometheus holding
``--history-hours`` of the same samples at 1 Hz, backfilled with ``promtool tsdb create-blocks-from
openmetrics`` into 18 h blocks (what a Prometheus running a day compacts into; about a minute on two
cores, printed), or the fake Prometheus of synthetic.py when prometheus/promtool are not installed
(said in the output); and the dashboard served by ``serve_in_thread``. Everything is driven through
the dashboard's own HTTP endpoints, exactly as the browser calls them.

Figures, each with a floor measured in the same run (so the ratio is meaningful on any machine):

- live update: the fetch callback (one tick) plus the badge callback it triggers. Floor: a Dash
  round trip that does nothing (the badge callback alone) and the raw exporter window fetch the
  update needs anyway. Targets: <= 50 KB and <= 50 ms per update.
- initial page load: index, layout, dependencies, the page route (with the first verdict), the
  first (full) fetch and the banner/badge. Floor: fetching and parsing the raw window it shows.
- history: a 24 h range from Prometheus, downsampled for the charts, and its render in headless
  Chromium when there is one. Floors: the same raw range queries alone, on the same server, as many
  at a time as the dashboard sends them; the same charts with one point per trace. Target: <= 1 s.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from kvdoctor.dashboard import promql
from kvdoctor.dashboard.app import create_app, serve_in_thread
from kvdoctor.dashboard.sources import PARALLEL_QUERIES
from kvdoctor.sources.exporter_api import ExporterClient
from kvdoctor.sources.prometheus import PrometheusClient
from tests.support import tools
from tests.support.browser import Page, chromium_browser
from tests.support.processes import Process
from tests.support.prometheus import PrometheusServer
from tests.support.synthetic import SCENARIOS, SyntheticEngine, backfill

LIVE_TARGET_BYTES = 50_000
LIVE_TARGET_SECONDS = 0.050
HISTORY_TARGET_SECONDS = 1.0
HISTORY_SCENARIO = "bandwidth"
INSTANCE = "10.0.0.1:9745"


class DashClient:
    """Calls a served dashboard's callbacks over HTTP the way dash-renderer does."""

    def __init__(self, base_url: str):
        self.http = httpx.Client(base_url=base_url, timeout=60)
        self.deps = {}

    def load(self) -> list[tuple[str, float, int]]:
        """The page's first requests: [(what, seconds, bytes)]."""
        out = []
        for path in ("/", "/_dash-layout", "/_dash-dependencies"):
            t = time.perf_counter()
            r = self.http.get(path)
            r.raise_for_status()
            out.append((path, time.perf_counter() - t, len(r.content)))
        self.deps = {d["output"]: d for d in r.json()}
        return out

    def callback(self, output_prefix: str, values: dict, changed: list[str]) -> tuple[dict, float, int]:
        """POST one callback; ``values`` maps "id.property" -> value for its inputs and state."""
        dep = next(d for o, d in self.deps.items() if o.startswith(output_prefix))
        outputs = [
            {"id": part.rsplit(".", 1)[0], "property": part.rsplit(".", 1)[1]}
            for part in dep["output"].strip(".").split("...")
        ]
        body = {
            "output": dep["output"],
            "outputs": outputs if dep["output"].startswith("..") else outputs[0],
            "inputs": [dict(i, value=values.get(f"{i['id']}.{i['property']}")) for i in dep["inputs"]],
            "state": [dict(s, value=values.get(f"{s['id']}.{s['property']}")) for s in dep["state"]],
            "changedPropIds": changed,
        }
        t = time.perf_counter()
        r = self.http.post("/_dash-update-component", json=body)
        elapsed = time.perf_counter() - t
        r.raise_for_status()
        return (r.json()["response"] if r.content else {}), elapsed, len(r.content)


def _kb(n: float) -> str:
    return f"{n / 1000:,.1f} KB"


def _ms(s: float) -> str:
    return f"{s * 1000:,.1f} ms"


def _timed(fn, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


class FakeProcess(Process):
    """A fake exporter / Prometheus (tests/support/synthetic.py) in its own process, so its work does
    not share our GIL; started, at ``url``."""

    def __init__(self, *args: str):
        super().__init__([sys.executable, "-m", "tests.support.synthetic", *args], name=f"fake {args[0]}")
        self.start()
        self.url = self.wait_for_line(r"^(http://\S+)", timeout=120).group(1)


class RealPrometheus:
    """A real prometheus (tests/support/tools.py finds it) on blocks backfilled from a SyntheticEngine."""

    def __init__(self, prometheus: str, promtool: str, scenario: str, hours: float, gpus: int, end: float):
        self.workdir = Path(tempfile.mkdtemp(prefix="kvdoctor-bench-prometheus-"))
        self.server: PrometheusServer | None = None
        try:
            t = time.perf_counter()
            # The same engine (and t0) as the fake Prometheus would serve.
            engine = SyntheticEngine(SCENARIOS[scenario], t0=end - hours * 3600 - 600, gpus=gpus)
            self.samples = backfill(
                engine,
                engine.t0,
                end,
                self.workdir / "data",
                promtool,
                {"instance": INSTANCE, "job": "kvdoctor"},
                workdir=self.workdir,
            )
            self.backfill_seconds = time.perf_counter() - t
            t = time.perf_counter()
            # Nothing to scrape: the blocks are the data, used where they were made.
            config = self.workdir / "prometheus.yml"
            config.write_text("global:\n  scrape_interval: 15s\n")
            self.server = PrometheusServer(prometheus, self.workdir, config, data_dir=self.workdir / "data").start()
            self.url = self.server.url
            self.start_seconds = time.perf_counter() - t
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


def history_prometheus(args, end: float):
    """(server with .url and .stop(), what it is, in words): a real Prometheus when installed."""
    prometheus, promtool = tools.prometheus(), tools.promtool()
    if prometheus and promtool and not args.fake_prometheus:
        print(
            f"  set-up: backfilling {args.history_hours} h x 1 Hz into a real Prometheus "
            f"(promtool tsdb create-blocks-from openmetrics)…",
            flush=True,
        )
        real = RealPrometheus(prometheus, promtool, HISTORY_SCENARIO, args.history_hours, args.gpus, end)
        print(
            f"  set-up: {real.samples / 1e6:.1f} M samples backfilled in {real.backfill_seconds:.0f} s, "
            f"prometheus ready in {real.start_seconds:.1f} s (not timed)"
        )
        return real, "a real Prometheus"
    why = (
        "--fake-prometheus"
        if args.fake_prometheus
        else f"no {' or '.join(n for n, p in (('prometheus', prometheus), ('promtool', promtool)) if not p)} installed"
    )
    print(
        f"  NOTE: the fake Prometheus of tests/support/synthetic.py ({why}; install: {tools.TOOLS['prometheus'][2]}). "
        "Its answers are cached and it does no PromQL: server time and floor are not a real Prometheus'.",
        flush=True,
    )
    return FakeProcess(
        "prometheus",
        "--scenario",
        HISTORY_SCENARIO,
        "--hours",
        str(args.history_hours),
        "--gpus",
        str(args.gpus),
        "--instance",
        INSTANCE,
        "--end",
        str(end),
    ), "the fake Prometheus"


def bench_live(args) -> bool:
    exporter = FakeProcess("exporter", "--minutes", str(args.minutes), "--gpus", str(args.gpus))
    handle = serve_in_thread(
        create_app(exporter_url=exporter.url, live_seconds=args.minutes * 60, environ={}), "127.0.0.1", 0
    )
    try:
        dash = DashClient(handle.url)
        span = args.minutes * 60
        values = {
            "live-tick.data": 0,
            "live-target.value": "",
            "live-range.value": f"live:{span}",
            "live-instance.value": "",
            "live-history.data": None,
            "live-cursor.data": None,
        }
        # Warm-up: one whole page load and one update (imports, connection pools, first-request setup).
        dash.load()
        dash.callback("..live-data.data", values, ["live-tick.data"])

        # -- initial page load (median of 3 loads, stage by stage)
        loads = []
        for _ in range(3):
            steps = dash.load()
            _, t_route, b_route = dash.callback(
                ".._pages_content",
                {"_pages_location.pathname": "/", "_pages_location.search": ""},
                ["_pages_location.pathname"],
            )
            steps.append(("page route (+ first verdict)", t_route, b_route))
            full, t_full, b_full = dash.callback("..live-data.data", values, ["live-tick.data"])
            steps.append((f"first fetch ({args.minutes} min, full figures)", t_full, b_full))
            for name, prop in (("live-banner", "live-diagnosis.data"), ("live-badge", "live-health.data")):
                key = prop.split(".")[0]
                _, t, b = dash.callback(name, {prop: full[key]["data"]}, [prop])
                steps.append((f"{name} callback", t, b))
            loads.append(steps)
        steps = [
            (stage[0][0], statistics.median(s[1] for s in stage), stage[0][2]) for stage in zip(*loads, strict=True)
        ]
        static = sum(
            len(httpx.get(handle.url.rstrip("/") + src).content) for src in _script_sources(dash.http.get("/").text)
        )
        load_time, load_bytes = sum(s[1] for s in steps), sum(s[2] for s in steps)
        client = ExporterClient(exporter.url, timeout=30)
        floor_load = _timed(lambda: client.window(span), repeat=3)  # median of 3
        print(f"\ninitial page load ({args.minutes} min x 1 Hz, {args.gpus} GPUs, 1 engine)")
        for name, t, b in steps:
            print(f"  {name:<40} {_ms(t):>10} {_kb(b):>12}")
        print(
            f"  {'total':<40} {_ms(load_time):>10} {_kb(load_bytes):>12}   (+ {static / 1e6:.1f} MB of "
            f"static JavaScript, cached by the browser)"
        )
        print(f"  floor: fetch + parse of the raw {span} s window: {_ms(floor_load)} -> {load_time / floor_load:.1f}x")

        # -- live updates
        cursor = full["live-cursor"]["data"]
        times, sizes, ticks = [], [], 0
        for n in range(1, args.updates + 1):
            time.sleep(1.0)  # one new sample a second, like the exporter
            values.update({"live-tick.data": n, "live-cursor.data": cursor})
            response, t_fetch, b_fetch = dash.callback("..live-data.data", values, ["live-tick.data"])
            _, t_badge, b_badge = dash.callback(
                "live-badge", {"live-health.data": response["live-health"]["data"]}, ["live-health.data"]
            )
            extra_t, extra_b = 0.0, 0
            if "live-diagnosis" in response:
                _, extra_t, extra_b = dash.callback(
                    "live-banner", {"live-diagnosis.data": response["live-diagnosis"]["data"]}, ["live-diagnosis.data"]
                )
            if "live-cursor" in response:
                cursor = response["live-cursor"]["data"]
            if response.get("live-data", {}).get("data", {}).get("mode") == "extend":
                ticks += 1
            times.append(t_fetch + t_badge + extra_t)
            sizes.append(b_fetch + b_badge + extra_b)
        floor_rt = _timed(lambda: dash.callback("live-badge", {"live-health.data": None}, ["live-health.data"]), 20)
        floor_window = _timed(lambda: client.window(15), 20)
        med_t, p95_t = statistics.median(times), sorted(times)[int(0.95 * (len(times) - 1))]
        med_b, max_b = statistics.median(sizes), max(sizes)
        ok = med_t <= LIVE_TARGET_SECONDS and max_b <= LIVE_TARGET_BYTES
        print(f"\nlive update ({args.updates} ticks, {ticks} appended points with extendData)")
        print(f"  server time median {_ms(med_t)}, p95 {_ms(p95_t)}; payload median {_kb(med_b)}, max {_kb(max_b)}")
        print(
            f"  floor: a no-op Dash round trip {_ms(floor_rt)} -> {med_t / floor_rt:.1f}x; "
            f"the raw 15 s window fetch {_ms(floor_window)} -> {med_t / floor_window:.1f}x"
        )
        print(f"  target <= {_kb(LIVE_TARGET_BYTES)} and <= {_ms(LIVE_TARGET_SECONDS)}: {'OK' if ok else 'MISSED'}")
        return ok
    finally:
        handle.stop()
        exporter.stop()


def _script_sources(html: str) -> list[str]:
    return [s for s in re.findall(r'<script src="([^"]+)"', html) if s.startswith("/")]


def bench_history(args) -> bool:
    end = float(int(time.time()))
    span = args.history_hours * 3600
    print(f"\nhistory ({args.history_hours} h x 1 Hz from Prometheus, {args.gpus} GPUs, 1 engine)", flush=True)
    prometheus, which = history_prometheus(args, end)
    app = create_app(prometheus_url=prometheus.url, environ={})
    handle = serve_in_thread(app, "127.0.0.1", 0)
    try:
        dash = DashClient(handle.url)
        dash.load()
        history = {"from": end - span, "to": end}
        values = {
            "live-tick.data": 0,
            "live-target.value": "",
            "live-range.value": "fixed",
            "live-instance.value": INSTANCE,
            "live-history.data": history,
            "live-cursor.data": None,
        }
        dash.callback("..live-data.data", values, ["live-tick.data"])  # warm-up (page cache, connections)
        runs = []
        for _ in range(3):
            response, t, b = dash.callback("..live-data.data", values, ["live-tick.data"])
            runs.append((t, b))
        t_server, b_payload = statistics.median(r[0] for r in runs), runs[0][1]
        figures = response["live-data"]["data"]["figures"]
        longest = max(len(tr["x"]) for f in figures.values() for tr in f["data"])
        traces = sum(len(f["data"]) for f in figures.values())
        points = sum(len(tr["x"]) for f in figures.values() for tr in f["data"])
        markers = sum(len(tr["x"]) for f in figures.values() for tr in f["data"] if tr.get("mode") == "markers")

        client = PrometheusClient(prometheus.url, timeout=60)
        settings = app.server.extensions["kvdoctor_dashboard"].settings
        step = promql.range_step(span, settings.oversampling * settings.max_points)
        queries = list(
            promql.live_queries({promql.TARGET_LABEL: INSTANCE}, step, settings.rate_window_seconds).values()
        )
        start = (end - span) // step * step
        with ThreadPoolExecutor(max_workers=PARALLEL_QUERIES) as pool:  # as many at a time as the dashboard
            floor = _timed(lambda: list(pool.map(lambda q: client.query_range(q, start, end, step), queries)), repeat=3)
        serial = _timed(lambda: [client.query_range(q, start, end, step) for q in queries], repeat=3)

        rendered = _browser_render(handle.url, history) if not args.no_browser else None
        render, render_floor = rendered if rendered else (None, None)
        total = t_server + (render or 0.0)
        ok = total <= HISTORY_TARGET_SECONDS
        print(
            f"  {traces} traces, {points:,} points ({markers} of them scatter markers), at most {longest} in one "
            f"(range-query step {step:g} s, then MinMaxLTTB)"
        )
        print(f"  server time {_ms(t_server)} (median of 3), payload {_kb(b_payload)}; from {which}")
        print(
            f"  floor: the {len(queries)} raw range queries alone {_ms(floor)} -> {t_server / floor:.1f}x "
            f"({PARALLEL_QUERIES} at a time, as the dashboard sends them; one at a time {_ms(serial)})"
        )
        if render is not None:
            print(
                f"  browser render of the four charts (headless Chromium, Plotly.newPlot): {_ms(render)}; "
                f"floor: the same charts with one point per trace {_ms(render_floor)} -> {render / render_floor:.1f}x"
            )
        else:
            print("  browser render: skipped (no Chromium or --no-browser)")
        print(f"  server + render {_ms(total)}; target <= {_ms(HISTORY_TARGET_SECONDS)}: {'OK' if ok else 'MISSED'}")
        return ok
    finally:
        handle.stop()
        prometheus.stop()


def _browser_render(base_url: str, history: dict) -> float | None:
    executable = tools.chromium()
    if not executable:
        return None
    with chromium_browser(executable) as browser:
        page = Page(browser, base_url)
        page.goto(f"/?instance={INSTANCE}&from={history['from']:.0f}&to={history['to']:.0f}")
        deadline = time.time() + 120
        while time.time() < deadline:
            points = page.chart_points()
            if len(points) == 4 and all(points) and all(c and c[0] > 0 for c in points):
                break
            time.sleep(0.5)
        else:
            return None
        # Re-render the figures the page holds, timing Plotly alone (no network, no Dash); the floor
        # is the same four charts with one point per trace.
        times = page.page.evaluate("""async () => {
            const graphs = Array.from(document.querySelectorAll('.js-plotly-plot'));
            const full = graphs.map(gd => [gd.data.map(t => Object.assign({}, t)), gd.layout]);
            const tiny = full.map(([data, layout]) => [data.map(t => Object.assign({}, t, {
                x: (t.x || []).slice(0, 1), y: (t.y || []).slice(0, 1)})), layout]);
            const time = async (figs) => {
                const out = [];
                for (let i = 0; i < 3; i++) {
                    const t = performance.now();
                    for (let g = 0; g < graphs.length; g++) await Plotly.newPlot(graphs[g], figs[g][0], figs[g][1]);
                    out.push(performance.now() - t);
                }
                return out.sort((a, b) => a - b)[1];
            };
            return [await time(full), await time(tiny)];
        }""")
        page.close()
        return times[0] / 1000.0, times[1] / 1000.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag, default in (("--gpus", 8), ("--minutes", 15), ("--updates", 20), ("--history-hours", 24)):
        parser.add_argument(flag, type=int, default=default)
    for flag, text in (
        ("--no-browser", "skip the Chromium render timing"),
        ("--fake-prometheus", "history from the fake Prometheus even when a real one is installed"),
        ("--history-only", "skip the live-update and page-load figures"),
    ):
        parser.add_argument(flag, action="store_true", help=text)
    args = parser.parse_args()
    live_ok = None if args.history_only else bench_live(args)
    history_ok = bench_history(args)
    live = "skipped" if live_ok is None else "OK" if live_ok else "MISSED"
    print(f"\nresult: live update {live}, history {'OK' if history_ok else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
