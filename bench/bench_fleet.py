"""Fleet benchmark: one rule engine, N engines x 8 GPUs, every exported rule group, the Fleet page, `diagnose`.

    make bench-fleet ENGINES=1000                   # = .venv/bin/python -m bench.bench_fleet --engines 1000
    make bench-fleet ENGINES=1000 BENCH_ARGS="--store victoriametrics --page-seconds 0"   # vmalert
    .venv/bin/python -m bench.bench_fleet --quick   # 30 engines, 45 s a phase (python -m bench --quick)

Set-up (not timed): the fake fleet (tests/support/fleet_server.py: one process, one port, each
engine a copy of the real exporter's exposition, rendered by the exporter's own renderer, with its
own scenario of the scenario suite, advancing counters, a TTFT SLO, and its verdict and alert known
in advance), and a rule engine scraping every engine as its own target every ``--scrape-interval``
(5 s): a real Prometheus (``--store prometheus``), or VictoriaMetrics scraped by vmagent with vmalert
evaluating the rules (``--store victoriametrics``). Every group of the exported rule file
(``kvdoctor rules export --scrape-interval 5s``: the tree, ``kvdoctor-slo``, ``kvdoctor-slo-slow``
at its own interval) runs beside the floor, every ``--eval-interval`` (15 s) unless the group sets
its own:

- ``floor``: one recording rule per raw ``kvdoctor_*`` family the fleet serves, reading each of its
  series once (``rate`` for counters and histograms, ``avg_over_time`` for gauges, summed per pod,
  over the longest range the exported rules read that family with, else four scrapes): the least
  any rule file that looks at every series must cost.

The SLO groups' long windows (up to 6 h at 15 s scrapes, 2 h at 5 s) read per-engine records, not
raw series: those records are backfilled over the longest window before the rule engine starts
(``promtool tsdb create-blocks-from openmetrics`` into Prometheus' data folder, VictoriaMetrics'
``/api/v1/import/prometheus``), each held at its engine's first value, so every window reads as many
samples from the first evaluation on as at steady state; the raw ranges fill during the warm-up.

Then, after a warm-up (the raw ranges and the alerts' conditions filled):

1. scraping only (``--scrape-seconds``): the rule engine's RSS, each group's evaluation time and its
   interval (Prometheus' ``/api/v1/rules``; vmalert's iteration summary, the mean of the iterations
   between samples), the alerting rules' share (Prometheus), missed iterations per group
   (``prometheus_rule_group_iterations_missed_total``, ``vmalert_iteration_missed_total``), and the
   alerts every few seconds;
2. the Fleet page open (``--page-seconds``, 0 for none): ``kvdoctor dashboard`` (its own process)
   and headless Chromium holding /fleet open (its refresh every 15 s, and a page turn, a verdict
   filter and a search on the way): time to the first rows (the median of 3 cold opens), the bytes
   of every callback answer, and the same figures as in 1;
3. fleet diagnosis: ``kvdoctor diagnose --prometheus URL`` over the whole fleet (a subprocess, so
   the interpreter's start is counted), and a refusal (a selector matching no pod).

Targets: each group's median evaluation at most half its interval; no iteration missed; and the
kvdoctor groups together, each group's median over its interval summed (seconds of evaluation per
second), at most the floor's. Cause alerts are compared with each engine's scenario at every sample
after the warm-up: missed = an engine whose expected alert is not pending or firing, extra = a cause
alert an engine should not have (the burn alerts follow latency, not the verdict: counted apart).
Figures are printed in bench/table.py's format with ratios against the floor measured in the same
run, each with its 90% bootstrap interval (single evaluations swing 1.5x in slow spells: a ratio
within a few percent of the target needs a longer ``--scrape-seconds`` to be decided);
``--markdown-row`` prints docs/benchmarks.md's one-line summary.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench.fleet_rig import (
    PageFigures,
    Sample,
    Watcher,
    alert_errors,
    alerting_times,
    backfill_blocks,
    backfill_text,
    cost_interval,
    costliest_rules,
    evaluation_times,
    floor_rules,
    group_cost,
    hold_fleet_page,
    missed_during,
    ranges_read,
    slo_alerts_active,
    timed_cli,
)
from bench.table import Row, add_json_out, report
from kvdoctor.rules import slo_alerts
from kvdoctor.rules.rule_file import GROUP_NAME, render_rules_yaml
from kvdoctor.sources.fleet import read_fleet
from kvdoctor.sources.prometheus import PrometheusClient
from tests.support import tools
from tests.support.fleet_server import FleetEngine, fleet_plan, plan_json, scrape_config
from tests.support.processes import Process
from tests.support.prometheus import PrometheusServer, as_yaml
from tests.support.victoria import VictoriaStack

BENCH = "fleet"
KB = 1024
# Targets (issue 18, at 1,000 engines x 8 GPUs on two cores)
FIRST_ROWS_TARGET_S = 3.0
PAYLOAD_TARGET_KB = 200.0
RSS_RATIO_TARGET = 1.3
RULES_RATIO_TARGET = 1.0
GROUP_SHARE_TARGET = 0.5  # each group's median evaluation at most half its interval
DIAGNOSE_TARGET_S = 10.0
REFUSAL_TARGET_S = 1.0

# ---------------------------------------------------------------------------------------- main


def prometheus_args(engines: int) -> list[str]:
    """Prometheus' flags for this fleet (see the README's fleet benchmark for why each)."""
    return []


def start_fleet(args: argparse.Namespace) -> tuple[Process, str, list[FleetEngine], dict[str, Any]]:
    fleet = Process(
        [
            sys.executable,
            "-m",
            "tests.support.fleet_server",
            "--engines",
            str(args.engines),
            "--gpus",
            str(args.gpus),
            "--interval",
            f"{args.scrape_interval:g}",
        ],
        name="fleet",
    ).start()
    url = fleet.wait_for_line(r"^(http://\S+)", timeout=600).group(1)
    plan = fleet_plan(args.engines)
    served = httpx.get(url + "/plan", timeout=60).json()
    if served != plan_json(plan):
        raise SystemExit("the fleet serves another plan than fleet_plan() makes")
    families = httpx.get(url + "/families", timeout=60).json()
    return fleet, url, plan, families


def run(args: argparse.Namespace) -> list[Row]:
    victoria = args.store == "victoriametrics"
    binary = tools.victoria_metrics() if victoria else tools.prometheus()
    if binary is None:
        raise SystemExit(tools.missing_reason("victoria-metrics" if victoria else "prometheus"))
    work = Path(tempfile.mkdtemp(prefix="kvdoctor-bench-fleet-"))
    print(f"fleet: {args.engines} engines x {args.gpus} GPUs on {args.store}; work folder {work}", flush=True)
    fleet, fleet_url, plan, families = start_fleet(args)
    target = fleet_url.removeprefix("http://").rstrip("/")
    rules_text = render_rules_yaml(scrape_interval_seconds=args.scrape_interval)
    floor = floor_rules(families["names"], rules_text, args.scrape_interval)
    scrape = scrape_config(target, plan, args.scrape_interval)
    backfill = past_of_slo_records(fleet_url, args)
    store: PrometheusServer | VictoriaStack
    if victoria:
        store = VictoriaStack(
            binary,
            work,
            rule_files=[_write(work / "kvdoctor.yml", rules_text), _write(work / "floor.yml", as_yaml(floor))],
            scrape_interval=f"{args.scrape_interval:g}s",
            evaluation_interval=f"{args.eval_interval:g}s",
        )
        store.agent.config_path.write_text(
            as_yaml({"global": {"scrape_interval": f"{args.scrape_interval:g}s"}, "scrape_configs": [scrape]})
        )
    else:
        config = {
            "global": {
                "scrape_interval": f"{args.scrape_interval:g}s",
                "evaluation_interval": f"{args.eval_interval:g}s",
            },
            "scrape_configs": [scrape],
        }
        store = PrometheusServer.configured(
            binary,
            work,
            config,
            rule_files={"kvdoctor.yml": rules_text, "floor.yml": floor},
            tsdb_blocks=backfill_blocks(backfill(True), work),
            extra_args=prometheus_args(args.engines),
        )
    dashboard: Process | None = None
    watcher: Watcher | None = None
    page: PageFigures | None = None
    try:
        if isinstance(store, VictoriaStack):
            store.db.start()
            import_text(store.db.url, backfill(False))
            store.agent.remote_write = store.db.write_url
            store.agent.start()
            store.alerter.datasource = store.alerter.remote_write = store.db.url
            store.alerter.start()
        else:
            store.start()
        started = time.monotonic()
        wait_for_targets(store, len(plan))
        print(f"every target up after {time.monotonic() - started:.0f} s", flush=True)
        warm = max(ranges_read(rules_text).values()) + 3 * args.eval_interval
        watcher = Watcher(store).start()
        dash_url = ""
        if args.page_seconds > 0:
            # The dashboard starts now, idle until the page opens: its start is not in either phase.
            dashboard = Process(
                [sys.executable, "-m", "kvdoctor", "dashboard", "--prometheus", store.url, "--port", "0"],
                name="dashboard",
            ).start()
            dash_url = dashboard.wait_for_line(r"kvdoctor dashboard: (\S+)", timeout=120).group(1)
        time.sleep(warm)
        watcher.phase = "scraping"
        print(f"warm ({warm:.0f} s); scraping only for {args.scrape_seconds:.0f} s", flush=True)
        time.sleep(args.scrape_seconds)
        if dashboard is not None:
            print(f"the Fleet page open for {args.page_seconds:.0f} s", flush=True)
            page = hold_fleet_page(dash_url, args.page_seconds, watcher)
        watcher.phase = "diagnosis"

        in_process = read_times(store.url)
        fleet_s, fleet_rc, fleet_out = timed_cli("diagnose", "--prometheus", store.url, "--json")
        refusal_s, refusal_rc, _ = timed_cli("diagnose", "--prometheus", store.url, "--selector", '{pod="no-such-pod"}')
        start_s, _, _ = timed_cli("version")
        watcher.stop()
        watcher.dump(work / "samples.json")
        print(f"samples: {work / 'samples.json'}", flush=True)
    finally:
        if watcher is not None:
            watcher.stop()
        if dashboard is not None:
            dashboard.stop()
        store.stop()
        fleet.stop()
    return rows(
        args,
        plan,
        families,
        watcher,
        page,
        start_s,
        (fleet_s, fleet_rc, fleet_out),
        (refusal_s, refusal_rc),
        in_process,
    )


def past_of_slo_records(fleet_url: str, args: argparse.Namespace) -> Callable[[bool], str]:
    """The backfill of the SLO groups' per-engine counter records over their longest window (the slow
    burn's 6 hours at 15 s scrapes, 2 hours at 5 s) at the rules' evaluation interval, ending before
    the run: so the long windows read as many samples from the first evaluation on as at steady state
    (each engine's records held at its first value, so no burn is made up). Returns a maker of its
    text: OpenMetrics (True) or the Prometheus text format."""
    counts = httpx.get(fleet_url + "/slo-counts", timeout=120).json()
    longest = max(b.windows(args.scrape_interval)[0] for b in slo_alerts.BURNS)
    end = time.time() - 2 * args.eval_interval
    start = end - longest - 4 * args.eval_interval
    print(
        f"backfill: {len(counts):,} SLO records over the {longest / 3600:g} h before the run, "
        f"every {args.eval_interval:g} s",
        flush=True,
    )

    def text(openmetrics: bool) -> str:
        return backfill_text(counts, start, end, args.eval_interval, openmetrics)

    return text


def import_text(db_url: str, text: str, lines_per_request: int = 200_000) -> None:
    """``text`` (Prometheus text format with timestamps) into VictoriaMetrics, in parts."""
    lines = text.splitlines()
    for i in range(0, len(lines), lines_per_request):
        body = "\n".join(lines[i : i + lines_per_request]) + "\n"
        httpx.post(db_url + "/api/v1/import/prometheus", content=body.encode(), timeout=600).raise_for_status()


def wait_for_targets(store: PrometheusServer | VictoriaStack, targets: int, timeout: float = 600) -> None:
    """Until every target is scraped: Prometheus' targets up, or as many ``up`` series in VictoriaMetrics."""
    if isinstance(store, PrometheusServer):
        store.wait_for_targets_up(timeout=timeout)
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if len(store.query('up{job="kvdoctor"} == 1')) >= targets:
                return
        except (httpx.HTTPError, OSError, ValueError):
            pass
        time.sleep(2)
    raise SystemExit(f"not every one of the {targets} targets was up in VictoriaMetrics after {timeout:g} s")


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _recording_rules_row(samples: list[Sample], floor: float) -> Row:
    """The kvdoctor group less its alerting rules, next to the floor (which has no alerts): what the
    recorded features, conditions and verdict cost, and, in the note, what the alerts add: each cause
    alert reads the verdict and its value record for every engine (about 60% of their time at 1,000
    engines), and Prometheus expands every label and annotation template of every pending or firing
    alert at every evaluation (the other 40%, growing with the alerts active)."""
    totals, alerting = evaluation_times(samples, "kvdoctor"), alerting_times(samples, "kvdoctor")
    records = _median([t - a for t, a in zip(totals, alerting, strict=True)])
    ratio = records / floor if floor else float("nan")
    active = _median([float(len(s.active)) for s in samples])
    return Row(
        BENCH,
        "rule evaluation per cycle, recording rules only (scraping)",
        f"{records * 1000:,.0f} ms",
        f"{floor * 1000:,.0f} ms (floor group)",
        f"{ratio:.2f}x floor",
        note=f"the group less its alerting rules; those took a median {_median(alerting) * 1000:,.0f} ms "
        f"per cycle with {active:,.0f} alerts pending or firing",
    )


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _mb(value: float) -> str:
    return f"{value / 1e6:,.0f} MB"


def read_times(url: str) -> tuple[float, float]:
    """(seconds of read_fleet over the whole fleet, of one matching no pod), in this process: the
    fleet's queries without the interpreter's start."""
    with PrometheusClient(url, timeout=60) as client:
        started = time.perf_counter()
        read_fleet(client)
        whole = time.perf_counter() - started
        started = time.perf_counter()
        read_fleet(client, '{pod="no-such-pod"}')
        return whole, time.perf_counter() - started


def rows(args, plan, families, watcher, page, cli_start_s, fleet_diag, refusal, in_process) -> list[Row]:
    n = args.engines
    scraping, opened = watcher.of("scraping"), watcher.of("page")
    judged = scraping + opened
    missed, extra = alert_errors(judged, plan)
    series = families["per_engine"]
    context = (
        f"{n:,} engines x {args.gpus} GPUs ({min(series.values())}-{max(series.values())} series each), "
        f"{max((s.head_series for s in judged), default=0):,.0f} head series; scrape {args.scrape_interval:g} s, "
        f"rules every {args.eval_interval:g} s ({args.store}); the SLO records' longest window backfilled "
        f"(steady state from the first evaluation); load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    out = [Row(BENCH, "set-up", context)]
    alerting = sum(1 for e in plan if e.alert)
    out.append(
        Row(
            BENCH,
            "alerts missed / extra",
            f"{len(missed)} / {len(extra)}",
            target="0 / 0",
            ok=not missed and not extra,
            note=f"{alerting} of {n} engines must alert; checked at {len(judged)} samples after the warm-up; "
            f"SLO burn alerts pending or firing (median) {slo_alerts_active(judged):g}"
            + (f"; missed e.g. {sorted(missed)[:3]}" if missed else "")
            + (f"; extra e.g. {sorted(extra)[:3]}" if extra else ""),
        )
    )
    phases = [("scraping only", scraping)] + ([("Fleet page open", opened)] if page is not None else [])
    groups = [g for g in _groups(judged) if g != "floor"]
    for label, samples in phases:
        ours, per_group = group_cost(samples, groups)
        floor, floor_group = group_cost(samples, ["floor"])
        ratio = ours / floor if floor else float("nan")
        low, high = cost_interval(per_group, floor_group["floor"])
        out.append(
            Row(
                BENCH,
                f"rule evaluation per second, every kvdoctor group, {label}",
                f"{ours * 1000:,.0f} ms/s",
                f"{floor * 1000:,.0f} ms/s (floor group)",
                f"{ratio:.2f}x floor",
                f"<= {RULES_RATIO_TARGET:g}x floor",
                ratio <= RULES_RATIO_TARGET,
                note=f"each group's median evaluation over its interval, summed ({', '.join(groups)}); "
                f"the ratio's 90% bootstrap interval {low:.2f}-{high:.2f}x",
            )
        )
        for group, (times, interval) in per_group.items():
            median = statistics.median(times) if times else float("nan")
            out.append(
                Row(
                    BENCH,
                    f"group {group}: median evaluation, {label}",
                    f"{median * 1000:,.0f} ms",
                    f"{interval:g} s (its interval)",
                    f"{median / interval:.2f}x interval",
                    f"<= {GROUP_SHARE_TARGET:g}x interval",
                    median <= GROUP_SHARE_TARGET * interval,
                    note=f"{len(times)} evaluations, max {max(times or [float('nan')]) * 1000:,.0f} ms"
                    + "".join(f"; {rule} {t * 1000:,.0f} ms" for rule, t in costliest_rules(samples, group)),
                )
            )
        if label == "scraping only" and GROUP_NAME in per_group and args.store == "prometheus":  # vmalert: no split
            out.append(_recording_rules_row(samples, _median(floor_group["floor"][0])))
        by_group = {group: missed_during(samples, group) for group in [*groups, "floor"]}
        skipped = sum(by_group.values())
        out.append(
            Row(
                BENCH,
                f"rule-group iterations missed, {label}",
                f"{skipped:g}",
                target="0",
                ok=skipped == 0,
                note=", ".join(f"{g} {v:g}" for g, v in by_group.items())
                + (f", over {samples[-1].t - samples[0].t:.0f} s" if len(samples) > 1 else ""),
            )
        )
    if page is not None:
        out += _page_rows(scraping, opened, page)
    fleet_s, fleet_rc, fleet_out = fleet_diag
    pods = _pods_in(fleet_out)
    start = f"{cli_start_s:.2f} s (kvdoctor version)"
    out.append(
        Row(
            BENCH,
            "kvdoctor diagnose --prometheus, whole fleet",
            f"{fleet_s:.2f} s",
            start,
            f"{fleet_s / cli_start_s:.1f}x",
            target=f"<= {DIAGNOSE_TARGET_S:g} s",
            ok=fleet_s <= DIAGNOSE_TARGET_S and pods == n,
            note=f"exit {fleet_rc}, {pods} pods in its JSON; median of 3 runs, the interpreter's start included; "
            f"read_fleet alone (in process) {in_process[0] * 1000:,.0f} ms",
        )
    )
    refusal_s, refusal_rc = refusal
    out.append(
        Row(
            BENCH,
            "kvdoctor diagnose --prometheus, a refusal (no pod matches)",
            f"{refusal_s:.2f} s",
            start,
            f"{refusal_s / cli_start_s:.1f}x",
            target=f"< {REFUSAL_TARGET_S:g} s",
            ok=refusal_s < REFUSAL_TARGET_S,
            note=f"exit {refusal_rc}; medians of 3 runs, each a new interpreter: the floor is the CLI's own start; "
            f"read_fleet alone (in process) {in_process[1] * 1000:,.0f} ms",
        )
    )
    if watcher.errors:
        out.append(Row(BENCH, "watcher errors", str(len(watcher.errors)), note=watcher.errors[0]))
    return out


def _groups(samples: list[Sample]) -> list[str]:
    """The rule groups seen, in the order the rule engine lists them."""
    seen: dict[str, None] = {}
    for s in samples:
        seen.update(dict.fromkeys(s.intervals))
    return list(seen)


def _page_rows(scraping: list[Sample], opened: list[Sample], page: PageFigures) -> list[Row]:
    rss_scraping, rss_open = _median([s.rss for s in scraping]), _median([s.rss for s in opened])
    biggest = max(page.refreshes or [0]) / KB
    return [
        Row(
            BENCH,
            "Prometheus RSS, Fleet page open vs scraping only",
            _mb(rss_open),
            f"{_mb(rss_scraping)} (scraping only)",
            f"{rss_open / rss_scraping:.2f}x",
            f"<= {RSS_RATIO_TARGET:g}x",
            rss_open / rss_scraping <= RSS_RATIO_TARGET,
            note=f"medians; max {_mb(max(s.rss for s in opened))} open, {_mb(max(s.rss for s in scraping))} scraping",
        ),
        Row(
            BENCH,
            "Fleet page: first rows (headless Chromium)",
            f"{page.first_rows_s:.2f} s",
            target=f"<= {FIRST_ROWS_TARGET_S:g} s",
            ok=page.first_rows_s <= FIRST_ROWS_TARGET_S,
            note=f"median of {len(page.first_rows_each_s)} cold opens "
            f"({', '.join(f'{t:.2f}' for t in page.first_rows_each_s)} s); {page.rows} rows shown; "
            f"the first page comes with the layout ({page.first_load_bytes / KB:,.0f} KB)"
            + (f"; page errors: {page.errors[:2]}" if page.errors else ""),
        ),
        Row(
            BENCH,
            "Fleet page: answer per refresh or filter (max)",
            f"{biggest:,.0f} KB",
            target=f"<= {PAYLOAD_TARGET_KB:g} KB",
            ok=bool(page.refreshes) and biggest <= PAYLOAD_TARGET_KB,
            note=f"{len(page.refreshes)} answers, median {_median(page.refreshes) / KB:,.0f} KB; each posted "
            f"at most {max(page.requests or [0]) / KB:,.1f} KB; server time median {_median(page.server_ms):,.0f} ms",
        ),
    ]


def _pods_in(output: str) -> int:
    start = output.find("{")
    try:
        return int(json.loads(output[start:]).get("pods", -1))
    except ValueError:
        return -1


def markdown_row(rows: list[Row], engines: int) -> str:
    by = {r.measure: r for r in rows}
    rules = by["rule evaluation per second, every kvdoctor group, scraping only"]
    groups = [r for r in rows if r.measure.startswith("group ") and r.measure.endswith(", scraping only")]
    cells = [
        f"{engines:,}",
        by["alerts missed / extra"].ours,
        f"{rules.ours} vs {rules.floor.split(' (')[0]} ({rules.ratio})",
        "; ".join(
            f"{r.measure.split(':')[0].removeprefix('group ')} {r.ours} / {r.floor.split(' (')[0]}" for r in groups
        ),
        by["rule-group iterations missed, scraping only"].ours,
    ]
    if "Fleet page: first rows (headless Chromium)" in by:
        rss = by["Prometheus RSS, Fleet page open vs scraping only"]
        cells += [
            f"{rss.floor.split(' (')[0]} / {rss.ours} ({rss.ratio})",
            by["rule-group iterations missed, Fleet page open"].ours,
            by["Fleet page: first rows (headless Chromium)"].ours,
            by["Fleet page: answer per refresh or filter (max)"].ours,
        ]
    cells += [
        by["kvdoctor diagnose --prometheus, whole fleet"].ours,
        by["kvdoctor diagnose --prometheus, a refusal (no pod matches)"].ours,
    ]
    return "| " + " | ".join(cells) + " |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_fleet", description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", type=int, default=100)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--scrape-interval", type=float, default=5.0, help="seconds (default 5)")
    parser.add_argument("--eval-interval", type=float, default=15.0, help="seconds between rule evaluations")
    parser.add_argument("--scrape-seconds", type=float, default=180.0, help="the scraping-only phase")
    parser.add_argument("--page-seconds", type=float, default=180.0, help="the Fleet page phase (0: none)")
    parser.add_argument(
        "--store",
        choices=("prometheus", "victoriametrics"),
        default="prometheus",
        help="the rule engine: Prometheus, or vmalert over VictoriaMetrics (scraped by vmagent)",
    )
    parser.add_argument("--quick", action="store_true", help="30 engines, 45 s phases (about 3.5 minutes)")
    parser.add_argument("--markdown-row", action="store_true", help="also print the README's summary row")
    add_json_out(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.engines, args.scrape_seconds, args.page_seconds = 30, 45.0, 45.0
    if args.engines < 1:
        parser.error("--engines must be at least 1")
    result = run(args)
    code = report(result, args.json_out)
    if args.markdown_row:
        print(markdown_row(result, args.engines))
    return code


if __name__ == "__main__":
    sys.exit(main())
