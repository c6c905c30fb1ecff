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
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
from flask import current_app

from kvdoctor.dashboard import charts, derive, promql
from kvdoctor.dashboard.derive import GpuSeries, LiveFrame, SourceHealth, TargetOption
from kvdoctor.dashboard.settings import DashboardSettings
from kvdoctor.rules import signals as S
from kvdoctor.rules.diagnosis import diagnose
from kvdoctor.rules.thresholds import DIAGNOSIS_WINDOW_SECONDS
from kvdoctor.rules.window import Window, labels_of
from kvdoctor.sources.exporter_api import ExporterClient
from kvdoctor.sources.http import SourceError
from kvdoctor.sources.prometheus import PrometheusClient, RangeSeries

__all__ = [
    "EXTENSION_KEY",
    "PARALLEL_QUERIES",
    "Backend",
    "FleetFetch",
    "LiveFetch",
    "SourceError",
    "backend",
    "fetch_fleet",
    "fetch_live_from_exporter",
    "fetch_live_from_prometheus",
    "now",
    "prometheus_diagnosis",
    "prometheus_frame",
]

EXTENSION_KEY = "kvdoctor_dashboard"
PROMETHEUS_TIMEOUT_SECONDS = 15.0
MAX_BODY_BYTES = 64 * 1024 * 1024  # a bigger answer is not one the dashboard can draw
PARALLEL_QUERIES = 4  # range queries in flight at once against Prometheus


# ------------------------------------------------------------------------------------- backend


@dataclass
class Backend:
    """One app's configured sources."""

    settings: DashboardSettings
    exporter: ExporterClient | None = None
    prometheus: PrometheusClient | None = None

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
        )

    def close(self) -> None:
        for client in (self.exporter, self.prometheus):
            if client is not None:
                client.close()


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


@dataclass
class FleetFetch:
    rows: list[derive.FleetRow]
    history: dict[str, list[dict]]  # chart key -> [{"name", "x" (ms), "y"}], downsampled


def fetch_fleet(
    client: PrometheusClient,
    end: float,
    range_seconds: float,
    max_points: int,
    rate_window: float,
    oversampling: int = 1,
) -> FleetFetch:
    """Every exporter target with its verdict, KV usage, ITL p95 and preemption rate at ``end``,
    worst first, and ITL p95 / KV usage per target over [end - range, end]."""
    queries = promql.fleet_queries(f"{int(range_seconds)}s")
    rows: dict[str, derive.FleetRow] = {}

    def row(metric: dict) -> derive.FleetRow | None:
        instance = metric.get(promql.TARGET_LABEL)
        if not instance:
            return None
        return rows.setdefault(instance, derive.FleetRow(instance))

    for m, _ in client.query(queries["info"], at=end):
        r = row(m)
        if r:
            r.pod, r.engine, r.model_name = (
                m.get("pod", r.pod),
                m.get("engine", r.engine),
                m.get("model_name", r.model_name),
            )
    for m, _ in client.query(queries["verdict"], at=end):
        r = row(m)
        if r:
            r.verdict = m.get("verdict", "")
            r.pod = r.pod or m.get("pod", "")
    for m, _ in client.query(queries["worst"], at=end):
        r, verdict = row(m), m.get("verdict", "")
        if r and (not r.worst_verdict or derive.severity(verdict) > derive.severity(r.worst_verdict)):
            r.worst_verdict = verdict
    for key in ("kv_usage", "itl_p95", "preemption_rate"):
        for m, value in client.query(queries[key], at=end):
            r = row(m)
            if r:
                setattr(r, key, value)

    start = end - range_seconds
    step = promql.range_step(range_seconds, oversampling * max_points)
    history: dict[str, list[dict]] = {}
    for key, expr in promql.fleet_history_queries(step, rate_window).items():
        scale = 1000.0 if key == "itl_p95" else 100.0
        traces = []
        for s in sorted(
            client.query_range(expr, start, end, step), key=lambda s: s.labels.get(promql.TARGET_LABEL, "")
        ):
            name = s.labels.get(promql.TARGET_LABEL, "?")
            traces.append(
                {
                    "name": name,
                    "kind": key,
                    "group": name,
                    "x": charts.epoch_ms(s.ts),
                    "y": charts.compact(s.values * scale),
                }
            )
        history[key] = charts.downsample({"traces": traces, "extras": {}}, max_points)["traces"]
    return FleetFetch(derive.rank_fleet(rows.values()), history)
