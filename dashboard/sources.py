"""The dashboard's data: its app's clients (``backend()``) and the pages' fetches built on them.

The clients are kvdoctor.sources' (the exporter's API, the Prometheus HTTP API), bound to the base
URLs of the app's settings when the app is created; paths are constants there and every request
value travels encoded, and redirects are not followed, so nothing from a page request can make the
dashboard fetch another URL.

Callbacks reach the clients of *their* app through ``backend()`` (Flask's ``current_app``), not
through module state, so several apps can live in one process.
"""

from __future__ import annotations

import math
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
from flask import current_app

from kvdoctor.dashboard import derive, promql
from kvdoctor.dashboard.derive import GpuSeries, LiveFrame, SourceHealth, TargetOption
from kvdoctor.dashboard.settings import DashboardSettings
from kvdoctor.rules.diagnosis import diagnose
from kvdoctor.rules.fleet import FleetRow, FleetSummary
from kvdoctor.rules.promql import record_range_seconds
from kvdoctor.rules.thresholds import DIAGNOSIS_WINDOW_SECONDS
from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.collection import SourceError
from kvdoctor.signals.window import Window, labels_of
from kvdoctor.sources.exporter_api import ExporterClient
from kvdoctor.sources.fleet import read_fleet
from kvdoctor.sources.prometheus import PrometheusClient, RangeSeries

__all__ = [
    "EXTENSION_KEY",
    "FLEET_PAGE_ROWS",
    "PARALLEL_QUERIES",
    "Backend",
    "FleetCache",
    "FleetPage",
    "LiveFetch",
    "SourceWatch",
    "backend",
    "check_sources",
    "fetch_live_from_exporter",
    "fetch_live_from_prometheus",
    "fleet_page",
    "fleet_summary",
    "now",
    "prometheus_diagnosis",
    "prometheus_frame",
]

EXTENSION_KEY = "kvdoctor_dashboard"
PROMETHEUS_TIMEOUT_SECONDS = 15.0
MAX_BODY_BYTES = 64 * 1024 * 1024  # a bigger answer is not one the dashboard can draw
PARALLEL_QUERIES = 4  # range queries in flight at once against Prometheus
FLEET_CACHE_SIZE = 32  # Fleet summaries an app keeps (a few per open Fleet page)


# ------------------------------------------------------------------------------------- backend


class FleetCache:
    """Fleet summaries kept on the server under short random tokens: a browser holds the token
    (and its filters and page), never the rows, so no callback posts the fleet back."""

    def __init__(self, size: int = FLEET_CACHE_SIZE):
        self._size = size
        self._items: OrderedDict[str, FleetSummary] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, summary: FleetSummary, token: str | None = None) -> str:
        """Keeps ``summary`` under ``token`` (a page's refresh replaces its own), else a new one."""
        token = token or secrets.token_urlsafe(9)
        with self._lock:
            self._items[token] = summary
            while len(self._items) > self._size:
                self._items.popitem(last=False)
        return token

    def get(self, token: str | None) -> FleetSummary | None:
        """The summary kept under ``token``; None when it is unknown (evicted, another process)."""
        with self._lock:
            summary = self._items.get(token or "")
            if summary is not None:
                self._items.move_to_end(token or "")
            return summary


@dataclass
class Backend:
    """One app's configured sources."""

    settings: DashboardSettings
    exporter: ExporterClient | None = None
    prometheus: PrometheusClient | None = None
    fleet: FleetCache = field(default_factory=FleetCache)  # the Fleet page's summaries, by token
    watch: SourceWatch | None = None  # the sources' problems, for every page's banner

    @classmethod
    def from_settings(cls, settings: DashboardSettings) -> Backend:
        timeout = settings.request_timeout_seconds
        return cls(
            settings,
            ExporterClient(settings.exporter_url, timeout, MAX_BODY_BYTES) if settings.exporter_url else None,
            # Range queries over a day take a real Prometheus seconds: give it longer than the exporter.
            PrometheusClient(settings.prometheus_url, max(timeout, PROMETHEUS_TIMEOUT_SECONDS), MAX_BODY_BYTES)
            if settings.prometheus_url
            else None,
            watch=SourceWatch(settings),
        )

    def source_problems(self) -> list[str]:
        """What is wrong with the sources now (checked every few seconds): one line each."""
        return self.watch.problems() if self.watch is not None else []

    def close(self) -> None:
        for client in (self.exporter, self.prometheus):
            if client is not None:
                client.close()


# ------------------------------------------------------------------------------ source checks


SOURCE_CHECK_TIMEOUT_SECONDS = 3.0  # a check at start must not hold the dashboard up for long
SOURCE_CHECK_SECONDS = 5.0  # how long a check's answer stands (every page's banner asks this often)


def check_sources(settings: DashboardSettings, timeout: float = SOURCE_CHECK_TIMEOUT_SECONDS) -> list[str]:
    """What is wrong with the configured sources, one line each naming the URL and the error:
    unreachable, not what it should be (an exporter without its window API, a server that is not
    a Prometheus), or a Prometheus holding no kvdoctor exporter's series. Empty when both read."""
    problems = []
    if settings.exporter_url:
        with ExporterClient(settings.exporter_url, timeout, MAX_BODY_BYTES) as exporter:
            try:
                exporter.window(1)
            except SourceError as exc:
                problems.append(_naming(f"the exporter {settings.exporter_url}", str(exc), settings.exporter_url))
    if settings.prometheus_url:
        with PrometheusClient(settings.prometheus_url, timeout, MAX_BODY_BYTES) as prometheus:
            try:
                found = prometheus.query(promql.instances_query())
            except SourceError as exc:
                problems.append(_naming(f"Prometheus {settings.prometheus_url}", str(exc), settings.prometheus_url))
            else:
                if not found:
                    problems.append(
                        f"Prometheus {settings.prometheus_url} holds no kvdoctor exporter's series "
                        f"({S.SOURCE_UP}): is it scraping the exporters?"
                    )
    return problems


def _naming(source: str, error: str, url: str) -> str:
    """``error`` as one line that names the source's URL (most errors already do)."""
    return error if url in error else f"{source}: {error}"


class SourceWatch:
    """The sources' problems, checked at most every ``SOURCE_CHECK_SECONDS`` (every open page asks)."""

    def __init__(self, settings: DashboardSettings) -> None:
        self._settings = settings
        self._lock = threading.Lock()
        self._checked = -math.inf
        self._problems: list[str] = []

    def problems(self) -> list[str]:
        with self._lock:
            if time.monotonic() - self._checked >= SOURCE_CHECK_SECONDS:
                self._problems = check_sources(self._settings)
                self._checked = time.monotonic()
            return list(self._problems)


def backend() -> Backend:
    """The Backend of the app serving the current request."""
    backend: Backend = current_app.extensions[EXTENSION_KEY]
    return backend


# ---------------------------------------------------------------------------------- live fetch


@dataclass
class LiveFetch:
    """One fetch for the Live page."""

    frame: LiveFrame
    targets: list[TargetOption]
    diagnosis: dict | None
    health: list[SourceHealth]
    newest: float  # timestamp of the newest point, NaN if there is none
    notes: list[str] = field(default_factory=list)


def fetch_live_from_exporter(
    client: ExporterClient, seconds: float, target: Mapping[str, str], rate_window: float, with_diagnosis: bool = True
) -> LiveFetch:
    window, status = client.window_and_sources(seconds)
    diagnosis = client.diagnosis() if with_diagnosis else None
    if status is None:
        try:
            status = client.status()
        except SourceError:
            status = {}  # the status endpoint is optional; the window already says which source is up
    return LiveFetch(
        frame=derive.live_frame(window, target, rate_window),
        targets=derive.target_options(window.series.keys()),
        diagnosis=diagnosis,
        health=derive.source_health(window, status),
        newest=window.end,
    )


def _grid(start: float, end: float, step: float) -> np.ndarray:
    return start + step * np.arange(math.floor((end - start) / step + 1e-9) + 1)


def _on_grid(grid: np.ndarray, step: float, series: RangeSeries) -> np.ndarray:
    out = np.full(len(grid), np.nan)
    if len(series.ts):
        idx = np.round((series.ts - grid[0]) / step).astype(int)
        ok = (idx >= 0) & (idx < len(grid))
        out[idx[ok]] = series.values[ok]
    return out


def prometheus_frame(
    client: PrometheusClient, labels: Mapping[str, str], start: float, end: float, step: float, rate_window: float
) -> LiveFrame:
    """A ``LiveFrame`` for one target over [start, end] from range queries."""
    grid = _grid(start, end, step)
    n = len(grid)
    arrays: dict[str, np.ndarray] = {}
    gpu_parts: dict[str, list[RangeSeries]] = {}
    queries = promql.live_queries(labels, step, rate_window)
    # Independent queries: in parallel, so a day of history costs the slowest query, not the sum.
    with ThreadPoolExecutor(max_workers=PARALLEL_QUERIES) as pool:
        results = dict(
            zip(
                queries,
                pool.map(lambda expr: client.query_range(expr, grid[0], grid[-1], step), queries.values()),
                strict=True,
            )
        )
    for key, result in results.items():
        if key.startswith("gpu_"):
            gpu_parts[key] = result
        else:
            arrays[key] = _on_grid(grid, step, result[0]) if result else np.full(n, np.nan)
    capacity = arrays.pop("kv_capacity_tokens")
    valid = capacity[~np.isnan(capacity)]
    by_gpu: dict[tuple[str, str], dict] = {}
    for key in ("gpu_dram", "gpu_sm"):
        for s in gpu_parts.get(key, []):
            slot = by_gpu.setdefault(
                (s.labels.get("pod", ""), s.labels.get("gpu", "?")), {"model": s.labels.get("model", "")}
            )
            slot[key] = _on_grid(grid, step, s)
            slot[key + "_method"] = s.labels.get("method", "")
    pods = {p for p, _ in by_gpu}
    gpus = [
        GpuSeries(
            gpu=g if len(pods) <= 1 else f"{p}/{g}",
            model=slot["model"],
            dram_method=slot.get("gpu_dram_method", ""),
            sm_method=slot.get("gpu_sm_method", ""),
            dram=slot.get("gpu_dram", np.full(n, np.nan)),
            sm=slot.get("gpu_sm", np.full(n, np.nan)),
        )
        for (p, g), slot in sorted(by_gpu.items(), key=lambda kv: (kv[0][0], derive.natural_key(kv[0][1])))
    ]
    return LiveFrame(ts=grid, kv_capacity_tokens=float(valid[-1]) if len(valid) else math.nan, gpus=gpus, **arrays)


def _window_from_range(series: list[RangeSeries], grid: np.ndarray, step: float) -> Window:
    columns = {}
    for s in series:
        name = s.labels.get("__name__")
        if not name:
            continue
        labels = {k: v for k, v in s.labels.items() if k not in ("__name__", "job", promql.TARGET_LABEL)}
        columns[(name, labels_of(labels))] = _on_grid(grid, step, s)
    return Window(grid, columns)


def fetch_live_from_prometheus(
    client: PrometheusClient,
    instance: str,
    target: Mapping[str, str],
    start: float,
    end: float,
    step: float,
    rate_window: float,
    with_diagnosis: bool = True,
) -> LiveFetch:
    """The Live page's data for one scrape target, from Prometheus."""
    labels = dict(target, **{promql.TARGET_LABEL: instance})
    # The instant queries and the diagnosis do not need the frame: they run while its range queries do.
    with ThreadPoolExecutor(max_workers=1) as side:
        around = side.submit(_target_state, client, instance, end, with_diagnosis)
        frame = prometheus_frame(client, labels, start, end, step, rate_window)
        targets, health, diagnosis, notes = around.result()
    valid = frame.ts[~np.isnan(frame.kv_usage)] if len(frame) else frame.ts
    return LiveFetch(
        frame=frame,
        targets=targets,
        diagnosis=diagnosis,
        health=health,
        newest=float(valid[-1]) if len(valid) else math.nan,
        notes=notes,
    )


def _target_state(client: PrometheusClient, instance: str, end: float, with_diagnosis: bool):
    """(target options, sources' health, diagnosis, notes) of one scrape target at ``end``."""
    listing = client.query(promql.target_listing_query(instance), at=end)
    targets = derive.target_options(
        (m.get("__name__", ""), {k: v for k, v in m.items() if k != "__name__"}) for m, _ in listing
    )
    health = []
    for m, value in client.query(S.SOURCE_UP + promql.matchers({promql.TARGET_LABEL: instance}), at=end):
        health.append(SourceHealth(m.get("source", "?"), value >= 1.0))
    for _, value in client.query("up" + promql.matchers({promql.TARGET_LABEL: instance}), at=end):
        if value < 1.0:
            health.append(SourceHealth("exporter", False, "Prometheus cannot scrape it"))
    diagnosis = None
    notes = []
    if with_diagnosis:
        diagnosis, note = prometheus_diagnosis(client, instance, end)
        if note:
            notes.append(note)
    return targets, sorted(health, key=lambda h: h.name), diagnosis, notes


def prometheus_diagnosis(client: PrometheusClient, instance: str, end: float) -> tuple[dict | None, str]:
    """(diagnosis, note) for one exporter at ``end``: the rules run on the minute before ``end``
    (with evidence) when that minute is in Prometheus, else the exporter's own verdict gauge. The
    note says when the two disagree. The window carries the SLO and the model the exporter published
    (``kvdoctor_inter_token_latency_slo_seconds``, ``kvdoctor_context_info``), so both use them."""
    gauge = next(
        (
            m.get("verdict", "")
            for m, _ in client.query(
                f"{S.DIAGNOSIS_VERDICT}{promql.matchers({promql.TARGET_LABEL: instance})} == 1", at=end
            )
        ),
        "",
    )
    start = end - DIAGNOSIS_WINDOW_SECONDS
    grid = _grid(start, end, 1.0)
    window = _window_from_range(
        client.query_range(promql.recent_window_selector(instance), grid[0], grid[-1], 1.0), grid, 1.0
    )
    if len(window.series):
        diagnosis = diagnose(window).to_json()
        note = ""
        if gauge and gauge != diagnosis.get("verdict"):
            note = (
                f"The exporter's own verdict is {gauge}: it judged its own window (its samples, its "
                "collection times, maybe other thresholds), not Prometheus' scrapes."
            )
        return diagnosis, note
    if gauge:
        return {
            "verdict": gauge,
            "confidence": None,
            "headline": f"The exporter's verdict: {gauge}.",
            "evidence": [],
            "actions": [],
            "knee": None,
        }, "evidence needs the exporter's own API"
    return None, ""


def now() -> float:
    return time.time()


# --------------------------------------------------------------------------------------- fleet

FLEET_PAGE_ROWS = 50  # rows the Fleet page shows at a time
SPARK_POINTS = 40  # points per sparkline
SPARK_FEATURES = ("itl_p95_seconds", "kv_usage")  # the recorded features a row draws


@dataclass
class FleetPage:
    """One page of a fleet summary's rows, filtered, with what only the shown rows need."""

    rows: tuple[FleetRow, ...]
    matching: int  # rows passing the filters, on every page
    page: int  # 0-based, within [0, pages)
    pages: int
    grid: np.ndarray  # the sparklines' timestamps
    sparks: dict[tuple[str, str, str], np.ndarray] = field(default_factory=dict)  # (ns, pod, feature) -> values
    instances: dict[tuple[str, str], str] = field(default_factory=dict)  # (ns, pod) -> scrape target
    notes: list[str] = field(default_factory=list)


def fleet_summary(client: PrometheusClient, at: float) -> FleetSummary:
    """Every pod, worst first, at ``at``: ``read_fleet``'s few instant queries over the whole fleet."""
    return read_fleet(client, at=at)


def fleet_page(
    client: PrometheusClient,
    summary: FleetSummary,
    *,
    namespace: str | None,
    verdicts: Iterable[str] | None,
    search: str | None,
    page: int,
    start: float,
    end: float,
    per_page: int = FLEET_PAGE_ROWS,
    points: int = SPARK_POINTS,
) -> FleetPage:
    """The ``page``-th ``per_page`` rows of ``summary`` passing the filters, with the sparklines of
    their recorded ITL p95 and KV usage over [start, end] (one range query for the shown pods) and
    their scrape targets (one instant query). Either failing leaves a note, not an error: the rows
    are what on-call came for."""
    matching = summary.select(namespace, verdicts, search)
    pages = max(1, math.ceil(len(matching) / per_page))
    page = min(max(0, int(page)), pages - 1)
    rows = matching[page * per_page : (page + 1) * per_page]
    step = promql.range_step(end - start, points)
    grid = _grid(start, end, step)
    out = FleetPage(rows, len(matching), page, pages, grid)
    if not rows:
        return out
    shown = [(r.namespace, r.pod) for r in rows]
    with ThreadPoolExecutor(max_workers=2) as pool:
        sparks = pool.submit(
            client.query_range, promql.fleet_sparkline_query(SPARK_FEATURES, shown), grid[0], grid[-1], step
        )
        targets = pool.submit(client.query, promql.fleet_instances_query(shown), end)
        try:
            out.sparks = _sparks(sparks.result(), rows, grid, step)
        except SourceError as exc:
            out.notes.append(f"no sparklines: {exc}")
        try:
            out.instances = {
                (m.get("namespace", ""), m.get("pod", "")): m[promql.TARGET_LABEL]
                for m, _ in targets.result()
                if m.get(promql.TARGET_LABEL)
            }
        except SourceError as exc:
            out.notes.append(f"no links to the Live page: {exc}")
    return out


def _sparks(
    series: list[RangeSeries], rows: Iterable[FleetRow], grid: np.ndarray, step: float
) -> dict[tuple[str, str, str], np.ndarray]:
    """(ns, pod, feature) -> values on ``grid``: ITL p95 from the record the row's number came from,
    else (and KV usage always) the record of the shortest range, as ``read_fleet`` picks them."""
    itl_record = {(r.namespace, r.pod): r.itl_record for r in rows}
    chosen: dict[tuple[str, str, str], tuple[tuple[bool, float], RangeSeries]] = {}
    for s in series:
        name = s.labels.get("__name__", "")
        feature = name.rsplit(":", 2)[1] if name.count(":") == 2 else ""
        seconds = record_range_seconds(name)
        if feature not in SPARK_FEATURES or seconds is None:
            continue
        pod = (s.labels.get("namespace", ""), s.labels.get("pod", ""))
        rank = (name != itl_record.get(pod) if feature == "itl_p95_seconds" else True, seconds)
        key = (*pod, feature)
        if key not in chosen or rank < chosen[key][0]:
            chosen[key] = (rank, s)
    return {key: _on_grid(grid, step, s) for key, (_, s) in chosen.items()}
