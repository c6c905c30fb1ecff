"""The fleet benchmark's rig: the floor rule group, the SLO records' backfill, a watcher sampling the
rule engine (Prometheus, or vmalert over VictoriaMetrics), the Fleet page held open in headless
Chromium, the CLI timed in a new interpreter, the alerts judged against the fleet's plan.
bench/bench_fleet.py runs them and prints the figures."""

from __future__ import annotations

import json
import random
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from kvdoctor.rules.alert_specs import VERDICT_ALERT_NAMES
from kvdoctor.rules.slo_alerts import SLO_ALERT_NAMES
from kvdoctor.signals.vocabulary import Kind, signal_for_series
from tests.support import tools
from tests.support.browser import Page, chromium_browser
from tests.support.fleet_server import FleetEngine
from tests.support.processes import Process
from tests.support.prometheus import PrometheusServer
from tests.support.victoria import VictoriaStack

SAMPLE_EVERY_S = 5.0  # what the watcher asks costs Prometheus too: once a scrape interval
DASH_CALLBACK = "_dash-update-component"
RANGE_READ = re.compile(r"(kvdoctor_[a-zA-Z0-9_]+)\s*(?:\{[^}]*\})?\s*\[(\d+)(ms|s|m|h)\]")
UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


# ------------------------------------------------------------------------------------ the floor


def _is_counter(name: str) -> bool:
    signal = signal_for_series(name)
    if signal is not None and signal.kind in (Kind.COUNTER, Kind.HISTOGRAM):
        return True
    return name.endswith(("_total", "_bucket", "_sum", "_count"))


def ranges_read(rules_text: str) -> dict[str, float]:
    """Raw family -> the longest range (seconds) the rule file reads it over."""
    out: dict[str, float] = {}
    for name, number, unit in RANGE_READ.findall(rules_text):
        out[name] = max(out.get(name, 0.0), float(number) * UNIT_SECONDS[unit])
    return out


def floor_rules(families: list[str], rules_text: str, scrape_interval: float) -> dict[str, Any]:
    """The floor group: each raw ``kvdoctor_*`` family read once, per pod, over the range the rules
    read it with (four scrapes for a family they do not read over a range)."""
    ranges = ranges_read(rules_text)
    rules = []
    for name in sorted(n for n in families if n.startswith("kvdoctor_")):
        seconds = ranges.get(name, 4 * scrape_interval)
        function = "rate" if _is_counter(name) else "avg_over_time"
        rules.append({"record": f"floor:{name}", "expr": f"sum by (namespace, pod) ({function}({name}[{seconds:g}s]))"})
    return {"groups": [{"name": "floor", "rules": rules}]}


# ---------------------------------------------------------------------------- watching Prometheus


# ------------------------------------------------------------------------- the SLO records' past


def backfill_text(counts: list[dict[str, Any]], start: float, end: float, step: float, openmetrics: bool) -> str:
    """The SLO groups' per-engine counter records (``slo_alerts``: what their long windows read) held
    at each engine's first value from ``start`` to ``end`` every ``step`` seconds: the hours before
    the run, so the 6-hour window reads as many samples as at steady state. OpenMetrics (seconds, for
    ``promtool tsdb create-blocks-from openmetrics``) or the Prometheus text format (milliseconds,
    VictoriaMetrics' ``/api/v1/import/prometheus``)."""
    lines = []
    stamps = [start + i * step for i in range(int((end - start) // step) + 1)]
    for c in counts:
        labels = ",".join(f'{k}="{v}"' for k, v in sorted(c["labels"].items()))
        series = f"{c['record']}{{{labels}}}"
        value = f"{c['value']:g}"
        for t in stamps:
            lines.append(f"{series} {value} {t:.3f}" if openmetrics else f"{series} {value} {int(t * 1000)}")
    return "\n".join(lines) + ("\n# EOF\n" if openmetrics else "\n")


def backfill_blocks(text: str, work: Path) -> Path:
    """``text`` (OpenMetrics) as TSDB blocks, made by promtool, for Prometheus' data folder."""
    source, blocks = work / "backfill.om", work / "backfill-blocks"
    source.write_text(text)
    binary = tools.promtool()
    if binary is None:
        raise SystemExit(tools.missing_reason("promtool"))
    done = subprocess.run(
        [binary, "tsdb", "create-blocks-from", "openmetrics", str(source), str(blocks)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode != 0:
        raise SystemExit(f"promtool could not make the backfill's blocks: {(done.stderr or done.stdout)[-500:]}")
    source.unlink()
    return blocks


# ---------------------------------------------------------------------------- watching the rules


@dataclass
class Sample:
    t: float
    phase: str
    rss: float
    evaluations: dict[str, tuple[str, float]]  # group -> (its evaluation's id, its seconds)
    alerting: dict[str, float]  # group -> seconds its alerting rules took in that evaluation
    missed: dict[str, float]  # group -> iterations missed so far
    active: set[tuple[str, str, str]]  # (namespace, pod, alertname), pending or firing
    head_series: float
    intervals: dict[str, float] = field(default_factory=dict)  # group -> its evaluation interval, seconds
    rules: dict[str, float] = field(default_factory=dict)  # "group/rule" -> seconds (Prometheus)


def _rss_bytes(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return float(line.split()[1]) * 1024
    return float("nan")


_MISSED = re.compile(r'^prometheus_rule_group_iterations_missed_total\{rule_group="[^"]*;([^"]+)"\} (\S+)$', re.M)
_HEAD = re.compile(r"^prometheus_tsdb_head_series (\S+)$", re.M)
_VM_ITERATION = re.compile(r'^vmalert_iteration_duration_seconds_(sum|count)\{group="([^"]+)"[^}]*\} (\S+)$', re.M)
_VM_MISSED = re.compile(r'^vmalert_iteration_missed_total\{group="([^"]+)"[^}]*\} (\S+)$', re.M)


class Watcher:
    """Samples the rule engine every SAMPLE_EVERY_S from a thread, tagging each sample with the phase:
    Prometheus (its rules API gives each group's last evaluation and time), or vmalert (each group's
    iterations and their summed seconds from its metrics: a sample's evaluation time is the mean of
    the iterations since the last sample)."""

    def __init__(self, store: PrometheusServer | VictoriaStack):
        self.store = store
        self.http = httpx.Client(timeout=30)
        self.phase = "warm-up"
        self.samples: list[Sample] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="watcher", daemon=True)
        self._iterations: dict[str, tuple[float, float]] = {}  # vmalert: group -> (count, sum) last seen

    def start(self) -> Watcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        self.http.close()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY_S):
            try:
                self.samples.append(self.sample())
            except (httpx.HTTPError, OSError, ValueError, KeyError) as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")

    def sample(self) -> Sample:
        if isinstance(self.store, VictoriaStack):
            return self._sample_vmalert(self.store)
        return self._sample_prometheus(self.store)

    def _sample_prometheus(self, prom: PrometheusServer) -> Sample:
        assert prom.process is not None
        # one read gives each group's time, its alerting rules' share and their active alerts
        groups = self.http.get(prom.url + "/api/v1/rules").json()["data"]["groups"]
        evaluations = {g["name"]: (g["lastEvaluation"], float(g["evaluationTime"])) for g in groups}
        intervals = {g["name"]: float(g["interval"]) for g in groups}
        alerting_rules = {g["name"]: [r for r in g["rules"] if r["type"] == "alerting"] for g in groups}
        alerting = {name: sum(float(r["evaluationTime"]) for r in rules) for name, rules in alerting_rules.items()}
        own = self.http.get(prom.url + "/metrics").text
        missed = {group: float(value) for group, value in _MISSED.findall(own)}
        head = _HEAD.search(own)
        active = {
            (a["labels"].get("namespace", ""), a["labels"].get("pod", ""), a["labels"]["alertname"])
            for rules in alerting_rules.values()
            for r in rules
            for a in r["alerts"]
            if a["state"] in ("pending", "firing")
        }
        rss = _rss_bytes(prom.process.pid)
        head_series = float(head.group(1)) if head else 0.0
        rules = {f"{g['name']}/{r['name']}": float(r["evaluationTime"]) for g in groups for r in g["rules"]}
        return Sample(
            time.time(), self.phase, rss, evaluations, alerting, missed, active, head_series, intervals, rules
        )

    def _sample_vmalert(self, stack: VictoriaStack) -> Sample:
        alerter = stack.alerter
        assert alerter.process is not None and stack.db.process is not None
        groups = self.http.get(alerter.url + "/api/v1/rules").json()["data"]["groups"]
        intervals = {g["name"]: float(g["interval"]) for g in groups}
        own = self.http.get(alerter.url + "/metrics").text
        totals: dict[str, dict[str, float]] = {}
        for part, group, value in _VM_ITERATION.findall(own):
            totals.setdefault(group, {})[part] = totals.get(group, {}).get(part, 0.0) + float(value)
        evaluations = {}
        for group, figures in totals.items():
            count, seconds = figures.get("count", 0.0), figures.get("sum", 0.0)
            last_count, last_seconds = self._iterations.get(group, (0.0, 0.0))
            if count > last_count:
                evaluations[group] = (f"{count:g}", (seconds - last_seconds) / (count - last_count))
            self._iterations[group] = (count, seconds)
        missed: dict[str, float] = {}
        for group, value in _VM_MISSED.findall(own):
            missed[group] = missed.get(group, 0.0) + float(value)
        active = {
            (a["labels"].get("namespace", ""), a["labels"].get("pod", ""), a["labels"]["alertname"])
            for a in alerter.alerts() or []
            if a.get("state") in ("pending", "firing")
        }
        rss = _rss_bytes(stack.db.process.pid) + _rss_bytes(alerter.process.pid)
        return Sample(time.time(), self.phase, rss, evaluations, {}, missed, active, 0.0, intervals)

    def dump(self, path: Path) -> None:
        """Every sample as JSON (what the figures were made of)."""
        rows = [dict(vars(s), active=len(s.active)) for s in self.samples]
        path.write_text(json.dumps({"samples": rows, "errors": self.errors}, indent=1))

    def of(self, phase: str) -> list[Sample]:
        return [s for s in self.samples if s.phase == phase]


def _per_evaluation(samples: list[Sample], group: str, value: Callable[[Sample], float]) -> list[float]:
    """``value`` of each distinct evaluation of ``group`` seen in ``samples`` (the latest sample of it)."""
    seen: dict[str, float] = {}
    for s in samples:
        if group in s.evaluations:
            seen[s.evaluations[group][0]] = value(s)
    return list(seen.values())


def evaluation_times(samples: list[Sample], group: str) -> list[float]:
    """Each distinct evaluation of ``group`` seen in ``samples``: its duration in seconds."""
    return _per_evaluation(samples, group, lambda s: s.evaluations[group][1])


def ratio_interval(
    ours: list[float], floor: list[float], level: float = 0.9, resamples: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """A bootstrap ``level`` interval of median(ours) / median(floor): each group's evaluations
    resampled on their own (their evaluations are not paired: the groups run at different offsets).
    Single evaluations swing 1.5x in slow spells, so a ratio near the target needs its spread."""
    if not ours or not floor:
        return float("nan"), float("nan")
    rng = random.Random(seed)
    ratios = sorted(
        statistics.median(rng.choices(ours, k=len(ours))) / statistics.median(rng.choices(floor, k=len(floor)))
        for _ in range(resamples)
    )
    tail = (1.0 - level) / 2
    return ratios[int(tail * (resamples - 1))], ratios[int((1.0 - tail) * (resamples - 1))]


def costliest_rules(samples: list[Sample], group: str, top: int = 4) -> list[tuple[str, float]]:
    """The ``top`` rules of ``group`` by their median seconds per evaluation (Prometheus only)."""
    names = {key.split("/", 1)[1] for s in samples for key in s.rules if key.split("/", 1)[0] == group}
    medians = {
        name: statistics.median(_per_evaluation(samples, group, lambda s, n=name: s.rules.get(f"{group}/{n}", 0.0)))
        for name in names
    }
    return sorted(medians.items(), key=lambda item: -item[1])[:top]


def alerting_times(samples: list[Sample], group: str) -> list[float]:
    """Per distinct evaluation of ``group`` in ``samples``: the seconds its alerting rules took."""
    return _per_evaluation(samples, group, lambda s: s.alerting.get(group, 0.0))


def missed_during(samples: list[Sample], group: str) -> float:
    values = [s.missed.get(group, 0.0) for s in samples]
    return values[-1] - values[0] if len(values) > 1 else 0.0


# ------------------------------------------------------------------------------------- the page


FIRST_ROWS_OPENS = 3  # cold opens (each its own browser context: no cache); the figure is their median


@dataclass
class PageFigures:
    first_rows_s: float = float("nan")  # the median of the opens below
    first_rows_each_s: list[float] = field(default_factory=list)
    first_load_bytes: int = 0  # the page route's answer: the layout with the first rows
    refreshes: list[int] = field(default_factory=list)  # bytes of each answer of the fleet callback
    requests: list[int] = field(default_factory=list)  # bytes each of those posted
    server_ms: list[float] = field(default_factory=list)
    rows: int = 0
    errors: list[str] = field(default_factory=list)


def hold_fleet_page(base_url: str, seconds: float, watcher: Watcher) -> PageFigures:
    """/fleet in headless Chromium for ``seconds``: first rows (the median of ``FIRST_ROWS_OPENS`` cold
    opens), then its refreshes, a page turn, a verdict filter and a search on the way; every callback
    answer measured."""
    figures = PageFigures()
    chromium = tools.find("chromium")
    if chromium is None:
        figures.errors.append("no chromium: " + tools.missing_reason("chromium"))
        return figures

    def answered(response) -> None:
        if DASH_CALLBACK not in response.url:
            return
        try:
            body = response.body()
        except Exception as exc:  # the page went away
            figures.errors.append(str(exc))
            return
        posted = response.request.post_data or ""
        if '"_pages_content' in posted[:200]:
            figures.first_load_bytes = len(body)
        elif "fleet-state" in posted[:200]:
            figures.refreshes.append(len(body))
            figures.requests.append(len(posted))
            timing = response.request.timing
            if timing.get("responseEnd", -1) >= 0 and timing.get("requestStart", -1) >= 0:
                figures.server_ms.append(timing["responseEnd"] - timing["requestStart"])

    def open_fleet() -> Page:
        page = Page(browser, base_url)
        page.page.on("response", answered)
        opened = time.monotonic()
        page.goto("/fleet")
        page.page.wait_for_selector("table.fleet tbody tr", timeout=120_000)
        figures.first_rows_each_s.append(time.monotonic() - opened)
        return page

    with chromium_browser(chromium) as browser:
        watcher.phase = "page"
        started = time.monotonic()
        for _ in range(FIRST_ROWS_OPENS - 1):
            earlier = open_fleet()
            figures.errors += earlier.errors
            earlier.close()
        page = open_fleet()  # the one held open
        figures.first_rows_s = statistics.median(figures.first_rows_each_s)
        figures.rows = page.page.locator("table.fleet tbody tr").count()
        end = started + seconds
        steps = [
            lambda: page.page.click("#fleet-next") if page.page.locator("#fleet-next").is_enabled() else None,
            lambda: page.page.locator("#fleet-verdict [data-verdict='slow']").click(),
            lambda: page.page.fill("#fleet-search", "chat"),
            lambda: page.page.fill("#fleet-search", ""),
            lambda: page.page.locator("#fleet-verdict [data-verdict='']").click(),
        ]
        for step in steps:  # spread over the first half; the refresh goes on meanwhile
            page.page.wait_for_timeout(seconds * 1000 / 2 / len(steps))
            step()
        page.page.wait_for_timeout(max(0.0, end - time.monotonic()) * 1000)
        figures.errors += page.errors
        page.close()
    return figures


# ----------------------------------------------------------------------------------- diagnosis


def timed_cli(*args: str, repeat: int = 3) -> tuple[float, int, str]:
    """``kvdoctor ARGS`` in a new interpreter, as on-call runs it: (median seconds, exit status, output)."""
    times, rc, output = [], 0, ""
    for _ in range(repeat):
        started = time.monotonic()
        proc = Process([sys.executable, "-m", "kvdoctor", *args], name=f"kvdoctor {args[0]}").start()
        rc = proc.wait(timeout=300)
        times.append(time.monotonic() - started)
        output = proc.output
    return statistics.median(times), rc, output


def alert_errors(samples: list[Sample], plan: list[FleetEngine]) -> tuple[set, set]:
    """(engines whose expected cause alert was not active in some sample, (engine, cause alert) active
    unexpected). The SLO's burn alerts follow each engine's latency, not its verdict: counted apart
    (``slo_alerts_active``)."""
    expected = {(e.namespace, e.pod, e.alert) for e in plan if e.alert}
    missed: set = set()
    extra: set = set()
    for s in samples:
        missed |= expected - s.active
        extra |= {a for a in s.active - expected if a[2] in VERDICT_ALERT_NAMES or a[2] not in SLO_ALERT_NAMES}
    return missed, extra


def slo_alerts_active(samples: list[Sample]) -> float:
    """The median number of burn-rate alerts pending or firing."""
    return statistics.median([sum(1 for a in s.active if a[2] in SLO_ALERT_NAMES) for s in samples] or [0])


def group_cost(samples: list[Sample], groups: list[str]) -> tuple[float, dict[str, tuple[list[float], float]]]:
    """Seconds of rule evaluation per second of the ``groups`` together (each group's median evaluation
    over its interval), and each group's (evaluation times, interval): a group evaluated every minute
    costs a quarter of one as slow every 15 s."""
    per_group = {}
    for group in groups:
        times = evaluation_times(samples, group)
        interval = next((s.intervals[group] for s in reversed(samples) if group in s.intervals), float("nan"))
        per_group[group] = (times, interval)
    total = sum(statistics.median(t) / i for t, i in per_group.values() if t and i == i)
    return total, per_group


def cost_interval(
    ours: dict[str, tuple[list[float], float]],
    floor: tuple[list[float], float],
    level: float = 0.9,
    resamples: int = 2000,
) -> tuple[float, float]:
    """A bootstrap ``level`` interval of ``group_cost``'s total over the floor's: each group's
    evaluations resampled on their own, as ``ratio_interval`` does for one group."""
    floor_times, floor_interval = floor
    if not floor_times or not any(t for t, _ in ours.values()):
        return float("nan"), float("nan")
    rng = random.Random(0)
    ratios = []
    for _ in range(resamples):
        total = sum(statistics.median(rng.choices(t, k=len(t))) / i for t, i in ours.values() if t)
        ratios.append(total / (statistics.median(rng.choices(floor_times, k=len(floor_times))) / floor_interval))
    ratios.sort()
    tail = (1.0 - level) / 2
    return ratios[int(tail * (resamples - 1))], ratios[int((1.0 - tail) * (resamples - 1))]
