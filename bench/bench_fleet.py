"""Fleet benchmark: one Prometheus, N engines x 8 GPUs, the exported rules, the Fleet page, `diagnose`.

    make bench-fleet ENGINES=1000                   # = .venv/bin/python -m bench.bench_fleet --engines 1000
    .venv/bin/python -m bench.bench_fleet --quick   # 30 engines, 45 s a phase (python -m bench --quick)

Set-up (not timed): the fake fleet (tests/support/fleet_server.py: one process, one port, each
engine a copy of the real exporter's exposition, rendered by the exporter's own renderer, with its
own scenario of the scenario suite, advancing counters, and its verdict and alert known in
advance), and a real Prometheus (.tools/prometheus) scraping every engine as its own target every
``--scrape-interval`` (5 s) with two rule groups evaluated every ``--eval-interval`` (15 s):

- ``kvdoctor``: the exported rules (``kvdoctor rules export --scrape-interval 5s``);
- ``floor``: the floor, one recording rule per raw ``kvdoctor_*`` family the fleet serves, reading
  each of its series once (``rate`` for counters and histograms, ``avg_over_time`` for gauges,
  summed per pod, over the longest range the exported rules read that family with, else four
  scrapes): the least any rule file that looks at every series must cost.

Then, after a warm-up (the rules' ranges and the alerts' conditions filled):

1. scraping only (``--scrape-seconds``): Prometheus' RSS, each group's evaluation time per cycle
   and its alerting rules' share (``/api/v1/rules``), missed iterations
   (``prometheus_rule_group_iterations_missed_total``), and the alerts every few seconds;
2. the Fleet page open (``--page-seconds``): ``kvdoctor dashboard`` (its own process) and headless
   Chromium holding /fleet open (its refresh every 15 s, and a page turn, a verdict filter and a
   search on the way): time to the first rows (the median of 3 cold opens), the bytes of every
   callback answer, and the same Prometheus figures as in 1;
3. fleet diagnosis: ``kvdoctor diagnose --prometheus URL`` over the whole fleet (a subprocess, so
   the interpreter's start is counted), and a refusal (a selector matching no pod).

Alerts are compared with each engine's scenario at every sample after the warm-up: missed = an
engine whose expected alert is not pending or firing, extra = an alert an engine should not have.
Figures are printed in bench/table.py's format with ratios against the floor measured in the same
run, each rule-evaluation ratio with its 90% bootstrap interval (single evaluations swing 1.5x in
slow spells: a ratio within a few percent of the target needs a longer ``--scrape-seconds`` to be
decided); ``--markdown-row`` prints the README's one-line summary.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.fleet_rig import (
    Sample,
    Watcher,
    alert_errors,
    alerting_times,
    evaluation_times,
    floor_rules,
    hold_fleet_page,
    missed_during,
    ranges_read,
    ratio_interval,
    timed_cli,
)
from bench.table import Row, add_json_out, report
from kvdoctor.rules.rule_file import GROUP_NAME, render_rules_yaml
from kvdoctor.sources.fleet import read_fleet
from kvdoctor.sources.prometheus import PrometheusClient
from tests.support import tools
from tests.support.fleet_server import FleetEngine, fleet_plan, plan_json, scrape_config
from tests.support.processes import Process
from tests.support.prometheus import PrometheusServer

BENCH = "fleet"
KB = 1024
# Targets (issue 18, at 1,000 engines x 8 GPUs on two cores)
FIRST_ROWS_TARGET_S = 3.0
PAYLOAD_TARGET_KB = 200.0
RSS_RATIO_TARGET = 1.3
RULES_RATIO_TARGET = 1.0
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
    binary = tools.prometheus()
    if binary is None:
        raise SystemExit(tools.missing_reason("prometheus"))
    work = Path(tempfile.mkdtemp(prefix="kvdoctor-bench-fleet-"))
    print(f"fleet: {args.engines} engines x {args.gpus} GPUs; work folder {work}", flush=True)
    fleet, fleet_url, plan, families = start_fleet(args)
    target = fleet_url.removeprefix("http://").rstrip("/")
    rules_text = tree_group(render_rules_yaml(scrape_interval_seconds=args.scrape_interval))
    floor = floor_rules(families["names"], rules_text, args.scrape_interval)
    config = {
        "global": {
            "scrape_interval": f"{args.scrape_interval:g}s",
            "evaluation_interval": f"{args.eval_interval:g}s",
        },
        "scrape_configs": [scrape_config(target, plan, args.scrape_interval)],
    }
    prom = PrometheusServer.configured(
        binary,
        work,
        config,
        rule_files={"kvdoctor.yml": rules_text, "floor.yml": floor},
        extra_args=prometheus_args(args.engines),
    )
    dashboard: Process | None = None
    watcher: Watcher | None = None
    try:
        prom.start()
        started = time.monotonic()
        prom.wait_for_targets_up(timeout=300)
        print(f"every target up after {time.monotonic() - started:.0f} s", flush=True)
        warm = max(ranges_read(rules_text).values()) + 3 * args.eval_interval
        watcher = Watcher(prom).start()
        # The dashboard starts now, idle until the page opens: its start is not in either phase.
        dashboard = Process(
            [sys.executable, "-m", "kvdoctor", "dashboard", "--prometheus", prom.url, "--port", "0"],
            name="dashboard",
        ).start()
        dash_url = dashboard.wait_for_line(r"kvdoctor dashboard: (\S+)", timeout=120).group(1)
        time.sleep(warm)
        watcher.phase = "scraping"
        print(f"warm ({warm:.0f} s); scraping only for {args.scrape_seconds:.0f} s", flush=True)
        time.sleep(args.scrape_seconds)
        print(f"the Fleet page open for {args.page_seconds:.0f} s", flush=True)
        page = hold_fleet_page(dash_url, args.page_seconds, watcher)
        watcher.phase = "diagnosis"

        in_process = read_times(prom.url)
        fleet_s, fleet_rc, fleet_out = timed_cli("diagnose", "--prometheus", prom.url, "--json")
        refusal_s, refusal_rc, _ = timed_cli("diagnose", "--prometheus", prom.url, "--selector", '{pod="no-such-pod"}')
        start_s, _, _ = timed_cli("version")
        watcher.stop()
        watcher.dump(work / "samples.json")
        print(f"samples: {work / 'samples.json'}", flush=True)
    finally:
        if watcher is not None:
            watcher.stop()
        if dashboard is not None:
            dashboard.stop()
        prom.stop()
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


def tree_group(rules_text: str) -> str:
    """The rule file less its SLO burn-rate group: the tree's group is what the floor stands against,
    and the burn rates read ranges of up to 6 h, which no run of minutes can warm up (they read the
    ITL histogram once per window, as the floor would; docs/alerting.md)."""
    doc = yaml.safe_load(rules_text)
    doc["groups"] = [g for g in doc["groups"] if g["name"] == GROUP_NAME]
    return yaml.safe_dump(doc, sort_keys=False)


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
        f"rules every {args.eval_interval:g} s; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
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
            note=f"{alerting} of {n} engines must alert; checked at {len(judged)} samples after the warm-up"
            + (f"; missed e.g. {sorted(missed)[:3]}" if missed else "")
            + (f"; extra e.g. {sorted(extra)[:3]}" if extra else ""),
        )
    )
    for label, samples in (("scraping only", scraping), ("Fleet page open", opened)):
        ours_times, floor_times = evaluation_times(samples, "kvdoctor"), evaluation_times(samples, "floor")
        ours, floor = _median(ours_times), _median(floor_times)
        ratio = ours / floor if floor else float("nan")
        low, high = ratio_interval(ours_times, floor_times)
        out.append(
            Row(
                BENCH,
                f"rule evaluation per cycle, {label}",
                f"{ours * 1000:,.0f} ms",
                f"{floor * 1000:,.0f} ms (floor group)",
                f"{ratio:.2f}x floor",
                f"<= {RULES_RATIO_TARGET:g}x floor",
                ratio <= RULES_RATIO_TARGET,
                note=f"medians of {len(ours_times)} and {len(floor_times)} evaluations; the ratio's 90% "
                f"bootstrap interval {low:.2f}-{high:.2f}x; max {max(ours_times or [float('nan')]) * 1000:,.0f} ms "
                f"vs floor max {max(floor_times or [float('nan')]) * 1000:,.0f} ms",
            )
        )
        if label == "scraping only":
            out.append(_recording_rules_row(samples, floor))
        by_group = {group: missed_during(samples, group) for group in ("kvdoctor", "floor")}
        skipped = sum(by_group.values())
        out.append(
            Row(
                BENCH,
                f"rule-group iterations missed, {label}",
                f"{skipped:g}",
                target="0",
                ok=skipped == 0,
                note=f"kvdoctor {by_group['kvdoctor']:g}, floor {by_group['floor']:g}, over "
                f"{samples[-1].t - samples[0].t:.0f} s at a {args.eval_interval:g} s interval"
                if len(samples) > 1
                else "",
            )
        )
    rss_scraping, rss_open = _median([s.rss for s in scraping]), _median([s.rss for s in opened])
    out.append(
        Row(
            BENCH,
            "Prometheus RSS, Fleet page open vs scraping only",
            _mb(rss_open),
            f"{_mb(rss_scraping)} (scraping only)",
            f"{rss_open / rss_scraping:.2f}x",
            f"<= {RSS_RATIO_TARGET:g}x",
            rss_open / rss_scraping <= RSS_RATIO_TARGET,
            note=f"medians; max {_mb(max(s.rss for s in opened))} open, {_mb(max(s.rss for s in scraping))} scraping",
        )
    )
    out.append(
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
        )
    )
    biggest = max(page.refreshes or [0]) / KB
    out.append(
        Row(
            BENCH,
            "Fleet page: answer per refresh or filter (max)",
            f"{biggest:,.0f} KB",
            target=f"<= {PAYLOAD_TARGET_KB:g} KB",
            ok=bool(page.refreshes) and biggest <= PAYLOAD_TARGET_KB,
            note=f"{len(page.refreshes)} answers, median {_median(page.refreshes) / KB:,.0f} KB; each posted "
            f"at most {max(page.requests or [0]) / KB:,.1f} KB; server time median {_median(page.server_ms):,.0f} ms",
        )
    )
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


def _pods_in(output: str) -> int:
    start = output.find("{")
    try:
        return int(json.loads(output[start:]).get("pods", -1))
    except ValueError:
        return -1


def markdown_row(rows: list[Row], engines: int) -> str:
    by = {r.measure: r for r in rows}
    rules = by["rule evaluation per cycle, scraping only"]
    cells = [
        f"{engines:,}",
        by["alerts missed / extra"].ours,
        f"{rules.ours} vs {rules.floor.split(' ')[0]} ms ({rules.ratio})",
        by["rule-group iterations missed, scraping only"].ours,
        f"{by['Prometheus RSS, Fleet page open vs scraping only'].floor.split(' (')[0]} / "
        f"{by['Prometheus RSS, Fleet page open vs scraping only'].ours} "
        f"({by['Prometheus RSS, Fleet page open vs scraping only'].ratio})",
        by["rule-group iterations missed, Fleet page open"].ours,
        by["Fleet page: first rows (headless Chromium)"].ours,
        by["Fleet page: answer per refresh or filter (max)"].ours,
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
    parser.add_argument("--page-seconds", type=float, default=180.0, help="the Fleet page phase")
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
