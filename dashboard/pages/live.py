"""Live: the page on-call opens. Verdict banner, then the four charts of the troubleshooting guide.

Data flow:

    dcc.Interval -> gateTick (browser) -> LIVE_TICK -> fetch (server, the only I/O) -> stores
    LIVE_DATA -> routeCharts (browser): whole figures on a full frame, else extendData with a cap;
                 then LIVE_ROUTED = the tick applied, which the gate waits for
    LIVE_DIAGNOSIS -> render_banner;  LIVE_HEALTH -> render_badge

Figures and extendData payloads are made on the server (charts.py, figures.py); the two browser
functions (assets/kvdoctor.js) only gate and route. What the browser already holds (the last timestamp,
what each figure is made of) lives in the LIVE_CURSOR store, so the server keeps no state: ``update``
takes it as a ``Cursor`` and returns the next one with the outputs (an ``Update``). On a
failed fetch the charts get no points (only the tick, for the gate) and keep what they have; the
badge turns stale.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass, fields
from typing import Any

import dash
import numpy as np
from dash import ClientsideFunction, Input, Output, State, dcc, html, no_update

from kvdoctor.dashboard import charts, components, derive, downloads, figures, ids, promql
from kvdoctor.dashboard.sources import (
    Backend,
    LiveFetch,
    backend,
    fetch_live_from_exporter,
    fetch_live_from_prometheus,
    now,
    prometheus_diagnosis,
)
from kvdoctor.dashboard.wiring import each
from kvdoctor.rules.knee import detect_knee
from kvdoctor.signals.collection import SourceError

NAME = "Live"  # the nav link and the tab title
PATH = "/"
GRAPHS = (
    (charts.KV_LATENCY, ids.LIVE_GRAPH_KV_LATENCY),
    (charts.BANDWIDTH, ids.LIVE_GRAPH_BANDWIDTH),
    (charts.TRANSFERS, ids.LIVE_GRAPH_TRANSFERS),
    (charts.ITL_KV, ids.LIVE_GRAPH_ITL_KV),
)
CHART_ORDER = [chart for chart, _ in GRAPHS]  # the order of routeCharts' outputs
HISTORY_RANGES = (("last 1 h", 3600), ("last 6 h", 6 * 3600), ("last 24 h", 24 * 3600))
MAX_HISTORY_SECONDS = 31 * 24 * 3600
EXPORTER_INSTANCE = ""  # the instance picker's value for "the configured exporter's own API"
# How far behind the clock the newest point may be before the badge says stale.
STALE_AFTER_REFRESHES = 5
PROMETHEUS_STALE_SECONDS = 120


# ----------------------------------------------------------------------------------- ranges


def range_options(live_seconds: int, with_prometheus: bool) -> list[dict]:
    spans = sorted({s for s in (300, 900) if s <= live_seconds} | {live_seconds})
    options = [{"label": f"live, last {_span_text(s)}", "value": f"live:{s}"} for s in spans]
    if with_prometheus:
        options += [{"label": f"history, {label}", "value": f"hist:{s}"} for label, s in HISTORY_RANGES]
    return options


def _span_text(seconds: int) -> str:
    return (
        f"{seconds // 3600} h"
        if seconds % 3600 == 0
        else f"{seconds // 60} min"
        if seconds % 60 == 0
        else f"{seconds} s"
    )


def parse_range(value: str | None, live_seconds: int) -> tuple[bool, float]:
    """(is_history, span seconds) from a range picker value; bad values fall back to live."""
    kind, _, raw = (value or "").partition(":")
    try:
        span = float(raw)
    except ValueError:
        return False, float(live_seconds)
    if kind == "hist" and 0 < span <= MAX_HISTORY_SECONDS:
        return True, span
    if kind == "live" and 0 < span <= live_seconds:
        return False, span
    return False, float(live_seconds)


def parse_history(params: dict[str, Any]) -> dict | None:
    """``from``/``to`` (Unix seconds) from the page URL, as a fixed history range, or None."""
    try:
        start, end = float(params.get("from")), float(params.get("to"))
    except (TypeError, ValueError):
        return None
    if not (math.isfinite(start) and math.isfinite(end)) or not 0 < end - start <= MAX_HISTORY_SECONDS:
        return None
    return {"from": start, "to": end}


# ----------------------------------------------------------------------------------- layout


def layout(**params) -> html.Div:
    b = backend()
    s = b.settings
    history = parse_history(params) if b.prometheus else None
    instance_options, instance_error = [], ""
    if b.prometheus is not None:
        try:
            found = sorted(
                {m.get(promql.TARGET_LABEL, "") for m, _ in b.prometheus.query(promql.instances_query())} - {""}
            )
        except SourceError as exc:
            found, instance_error = [], str(exc)
        if b.exporter is not None:
            instance_options.append({"label": "this exporter (live API)", "value": EXPORTER_INSTANCE})
        instance_options += [{"label": f"{promql.TARGET_LABEL} {i}", "value": i} for i in found]
    wanted = str(params.get("instance") or "")
    if wanted and wanted not in {o["value"] for o in instance_options} and b.prometheus is not None:
        instance_options.append({"label": f"{promql.TARGET_LABEL} {wanted}", "value": wanted})
    instance = wanted if wanted else (instance_options[0]["value"] if instance_options else EXPORTER_INSTANCE)
    if b.exporter is None and not instance and instance_options:
        instance = instance_options[0]["value"]

    ranges = range_options(s.live_seconds, b.prometheus is not None)
    default_range = f"live:{min(900, s.live_seconds)}"  # always among the options: see range_options
    if history:
        ranges = [{"label": "from the Fleet link", "value": "fixed"}, *ranges]
        default_range = "fixed"

    controls = [
        components.picker(
            "target",
            ids.LIVE_TARGET,
            [{"label": "All engines and GPUs", "value": ""}],
            derive.format_target(derive.parse_target(params.get("target"))),
        )
    ]
    if b.prometheus is not None:
        controls.append(
            components.picker(
                "exporter",
                ids.LIVE_INSTANCE,
                instance_options,
                instance,
                wide=True,
                placeholder=instance_error or "no exporter found",
            )
        )
    else:  # exporter only: nothing to pick, but the callback reads the value
        controls.append(
            html.Div(dcc.Dropdown(id=ids.LIVE_INSTANCE, options=[], value=EXPORTER_INSTANCE), style={"display": "none"})
        )
    controls.append(components.picker("range", ids.LIVE_RANGE, ranges, default_range))
    controls.append(
        html.A(
            "download this window",
            id=ids.LIVE_DOWNLOAD,
            href=download_href(default_range, instance, history, s.live_seconds),
            download="",
            className="download-link",
            title="the window on show as a trace file: kvdoctor diagnose --replay FILE",
        )
    )

    # The verdict is what on-call came for: put it in the first paint instead of waiting for the
    # charts' first fetch (the browser is busy loading Plotly for seconds on a slow machine).
    first_diagnosis, notes = None, []
    try:
        if b.exporter is not None and not instance and not history:
            first_diagnosis = b.exporter.diagnosis()
        elif b.prometheus is not None and instance and not history:
            first_diagnosis, note = prometheus_diagnosis(b.prometheus, instance, now())
            notes = [note] if note else []
    except SourceError:
        pass
    return html.Div(
        [
            components.controls_bar(controls, ids.LIVE_BADGE, components.badge(None)),
            html.Div(components.banner(first_diagnosis, notes), id=ids.LIVE_BANNER),
            components.chart_grid([graph_id for _, graph_id in GRAPHS], config={"displaylogo": False}),
            dcc.Interval(
                id=ids.LIVE_INTERVAL, interval=int(s.refresh_seconds * 1000), n_intervals=0, disabled=bool(history)
            ),
            dcc.Store(id=ids.LIVE_TICK, data=0),
            dcc.Store(id=ids.LIVE_GATE, data={}),
            dcc.Store(id=ids.LIVE_DATA),
            dcc.Store(id=ids.LIVE_ROUTED),
            dcc.Store(id=ids.LIVE_CURSOR),
            dcc.Store(id=ids.LIVE_DIAGNOSIS),
            dcc.Store(id=ids.LIVE_HEALTH),
            dcc.Store(id=ids.LIVE_HISTORY, data=history),
        ],
        className="page page-live",
    )


# -------------------------------------------------------------------------------- callbacks


def _digest(obj: Any) -> str:
    return hashlib.sha1(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def _stale_after(settings, from_prometheus: bool) -> float:
    if from_prometheus:
        return PROMETHEUS_STALE_SECONDS
    return STALE_AFTER_REFRESHES * settings.refresh_seconds + 5.0


@dataclass(frozen=True)
class Controls:
    """The page's controls as the callback gets them (the range picker's value, the target's, ...)."""

    target: str | None = None
    range: str | None = None
    instance: str | None = None
    history: dict[str, float] | None = None  # a fixed range from a Fleet link: {"from", "to"}

    def key(self) -> list[Any]:
        """What the charts were fetched for: a change means a whole new frame."""
        return [self.target, self.range, self.instance, self.history]


@dataclass(frozen=True)
class Cursor:
    """What the browser already holds (the LIVE_CURSOR store), so the server keeps no state."""

    key: list[Any] | None = None  # Controls.key() of the frame the charts show
    last: float = -math.inf  # the newest timestamp the charts hold
    sigs: Any = None  # what each figure is made of (charts.signatures): other traces, rebuild
    tops: Any = None  # each chart's axis tops: a point above them, rebuild
    targets: str | None = None  # digest of the target options sent
    diag: str | None = None  # digest of the diagnosis payload sent
    newest: float | None = None  # the source's newest sample time (the badge)

    @classmethod
    def from_store(cls, data: dict[str, Any] | None) -> Cursor:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (data or {}).items() if k in names})

    def to_store(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Update:
    """What one fetch gives each output; None keeps what the output has."""

    data: dict[str, Any] | None = None  # LIVE_DATA: figures, extendData, or only the tick
    cursor: Cursor | None = None
    diagnosis: dict[str, Any] | None = None  # LIVE_DIAGNOSIS: the banner's payload
    health: dict[str, Any] | None = None  # LIVE_HEALTH: the badge
    options: list[dict[str, str]] | None = None  # the target picker's options
    interval_disabled: bool | None = None  # a fixed range is fetched once

    def outputs(self) -> tuple[Any, ...]:
        """The callback's outputs, in ``_register_callbacks``' order."""
        values = (
            self.data,
            None if self.cursor is None else self.cursor.to_store(),
            self.diagnosis,
            self.health,
            self.options,
            self.interval_disabled,
        )
        return tuple(no_update if v is None else v for v in values)


def fetch(tick, target_value, range_value, instance, history, cursor):
    """The Live callback: ``update`` over the stores' JSON."""
    controls = Controls(target_value, range_value, instance, history)
    return update(tick, controls, Cursor.from_store(cursor), backend(), now()).outputs()


def update(tick: int, controls: Controls, cursor: Cursor, b: Backend, clock: float) -> Update:
    """Interval tick or control change -> new points (or a full frame) for the stores.

    Depends only on its arguments: the controls, what the browser holds, the sources (the only
    I/O) and the time; what the browser should hold next comes back in ``Update.cursor``."""
    s = b.settings
    target = derive.parse_target(controls.target)
    is_history, span = parse_range(controls.range, s.live_seconds)
    history = controls.history
    if controls.range == "fixed" and history:
        is_history, span = True, history["to"] - history["from"]
    from_prometheus = bool(controls.instance) or b.exporter is None or is_history
    key = controls.key()
    full = cursor.key != key
    if is_history and not full:
        return Update(interval_disabled=True)  # a fixed range: fetched once
    instance = controls.instance

    def get(full_fetch: bool) -> LiveFetch:
        if not from_prometheus:
            assert b.exporter is not None
            seconds = (
                span if full_fetch else min(span, clock - cursor.last + s.rate_window_seconds + 3 * s.refresh_seconds)
            )
            return fetch_live_from_exporter(b.exporter, seconds, target, s.rate_window_seconds)
        if b.prometheus is None:
            raise SourceError("no_prometheus", "history and other exporters need --prometheus")
        if not instance and b.exporter is None:
            raise SourceError("no_target", f"Prometheus {s.prometheus_url} lists no kvdoctor exporter to show")
        if not instance:
            raise SourceError("no_prometheus", "history comes from Prometheus: pick one of its exporters")
        end = history["to"] if controls.range == "fixed" and history else clock
        if is_history:
            step = promql.range_step(span, s.oversampling * s.max_points)
        else:
            step = max(1.0, float(math.ceil(s.refresh_seconds)))
        start = end - span if full_fetch else cursor.last - s.rate_window_seconds - 3 * step
        start = math.floor(start / step) * step  # a stable grid, so appended points line up
        got = fetch_live_from_prometheus(b.prometheus, instance, target, start, end, step, s.rate_window_seconds)
        if is_history:
            got.notes.append(
                f"Diagnosis of the minute before {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(end))} UTC, "
                "the end of the range shown."
            )
        return got

    last = cursor.last
    try:
        got = get(full)
        chart_diagnosis = got.diagnosis
        if is_history and len(got.frame):
            # The diagnosis' knee covers its last minute; a range shows its own knee.
            chart_diagnosis = dict(got.diagnosis or {}, knee=history_knee(got.frame))
        if full:
            chart_data = charts.live_charts(got.frame, chart_diagnosis)
            sigs = charts.signatures(chart_data)
        else:
            # Only the points the browser does not have yet (the fetch reaches further back, for
            # the rate window); their figures must be made of the same traces, else rebuild.
            mask = got.frame.ts > last
            if np.any(mask):
                chart_data = charts.live_charts(derive.slice_frame(got.frame, mask), chart_diagnosis)
                sigs = charts.signatures(chart_data)
            else:  # nothing new to append, but the knee or the sources may have changed
                chart_data = None
                probe = (
                    charts.live_charts(
                        derive.slice_frame(got.frame, got.frame.ts >= got.frame.ts.max()), chart_diagnosis
                    )
                    if len(got.frame)
                    else None
                )
                sigs = charts.signatures(probe) if probe else cursor.sigs
            above = chart_data is not None and charts.exceeds(charts.axis_tops(chart_data), cursor.tops)
            if sigs != cursor.sigs or above:
                # something new to draw (a GPU, the knee, the floor) or points above an axis' top
                # (the axes are fixed, so the two of a chart share their ticks): rebuild, do not append
                full = True
                got = get(True)
                chart_diagnosis = got.diagnosis
                chart_data = charts.live_charts(got.frame, chart_diagnosis)
                sigs = charts.signatures(chart_data)
    except SourceError as exc:
        # Before the first diagnosis, the banner says why none comes instead of waiting forever.
        return Update(
            data=_no_points(tick),
            health={"ok": False, "error": str(exc), "newest": cursor.newest, "history": False},
            diagnosis=None if cursor.diag else {"diagnosis": None, "notes": [], "error": str(exc)},
        )

    if full:
        # History shares a points budget per chart (drawing speed); live charts keep every point.
        budget = s.max_chart_points if is_history else None
        data = chart_payload(
            {c: charts.downsample(d, s.max_points, budget) for c, d in chart_data.items()}, True, 0, tick
        )
    elif chart_data:
        data = chart_payload(chart_data, False, s.live_points_cap, tick)
    else:
        data = _no_points(tick)
    newest_ts = float(got.frame.ts[-1]) if len(got.frame) else last
    newest = got.newest if math.isfinite(got.newest) else cursor.newest
    options = [{"label": o.label, "value": o.value} for o in got.targets]
    if controls.target and controls.target not in {o["value"] for o in options}:
        options.append({"label": f"{controls.target} (not seen)", "value": controls.target})
    diag_payload = {"diagnosis": got.diagnosis, "notes": got.notes}
    new_cursor = Cursor(
        key=key,
        last=max(last, newest_ts) if not full else newest_ts,
        sigs=sigs,
        tops=charts.axis_tops(chart_data) if full and chart_data else cursor.tops,
        targets=_digest(options),
        diag=_digest(diag_payload),
        newest=newest,
    )
    stale = (
        newest is None
        or not math.isfinite(newest)
        or (not is_history and clock - newest > _stale_after(s, from_prometheus))
    )
    health = {
        "ok": True,
        "newest": newest,
        "history": is_history,
        "sources_down": [{"name": h.name, "error": h.error} for h in got.health if not h.up],
    }
    if stale and not is_history:
        health.update(ok=False, error="no new data from the source" if newest else "no data yet")
    return Update(
        data=data,
        cursor=new_cursor,
        diagnosis=diag_payload if full or cursor.diag != new_cursor.diag else None,
        health=health,
        options=options if full or cursor.targets != new_cursor.targets else None,
        interval_disabled=is_history,
    )


def history_knee(frame) -> dict | None:
    """The rules' knee detection on a range's (KV usage, mean ITL) pairs."""
    return detect_knee(frame.kv_usage, frame.itl_mean).to_json()


def chart_payload(chart_data: dict, full: bool, cap: int, tick: int) -> dict:
    """What the chart router in the browser applies: whole figures, or ``extendData`` per graph.

    ``tick`` goes back to the browser's gate once the charts have taken the points (LIVE_ROUTED).
    """
    if full:
        return {
            "mode": "full",
            "order": CHART_ORDER,
            "tick": tick,
            "figures": {c: figures.build(c, chart_data[c]) for c in CHART_ORDER},
        }
    return {
        "mode": "extend",
        "order": CHART_ORDER,
        "tick": tick,
        "extend": {c: charts.extension(chart_data[c], cap) for c in CHART_ORDER},
    }


def _no_points(tick: int) -> dict:
    """Nothing for the charts, but the tick must still reach the gate (see ``chart_payload``)."""
    return {"mode": "none", "order": CHART_ORDER, "tick": tick}


def download_href(range_value: str | None, instance: str | None, history: dict | None, live_seconds: int) -> str:
    """The "download this window" link for the range and exporter picked: the live window from the
    exporter's API, or (an exporter picked through Prometheus, or a history range) from Prometheus."""
    _, span = parse_range(range_value, live_seconds)
    end = None
    if range_value == "fixed" and history:
        span, end = history["to"] - history["from"], history["to"]
    return downloads.href(span, instance or "", end)


def render_download(range_value, instance, history):
    return download_href(range_value, instance, history, backend().settings.live_seconds)


def render_banner(payload):
    payload = payload or {}
    return components.banner(payload.get("diagnosis"), payload.get("notes") or [], payload.get("error"))


def render_badge(health):
    return components.badge(health)


def register(app: dash.Dash) -> None:
    app.callback(
        *each(Output, "data", ids.LIVE_DATA, ids.LIVE_CURSOR, ids.LIVE_DIAGNOSIS, ids.LIVE_HEALTH),
        Output(ids.LIVE_TARGET, "options"),
        Output(ids.LIVE_INTERVAL, "disabled"),
        Input(ids.LIVE_TICK, "data"),
        *each(Input, "value", ids.LIVE_TARGET, ids.LIVE_RANGE, ids.LIVE_INSTANCE),
        *each(State, "data", ids.LIVE_HISTORY, ids.LIVE_CURSOR),
    )(fetch)
    # The interval goes through a gate in the browser: a tick before the charts have taken the last
    # fetch's points is skipped. Without it a source slower than the refresh never shows anything:
    # each tick sends a new request and Dash drops the answer of the one before.
    app.clientside_callback(
        ClientsideFunction(namespace="kvdoctor", function_name="gateTick"),
        *each(Output, "data", ids.LIVE_TICK, ids.LIVE_GATE),
        Input(ids.LIVE_INTERVAL, "n_intervals"),
        *each(State, "data", ids.LIVE_TICK, ids.LIVE_ROUTED, ids.LIVE_GATE),
        prevent_initial_call=True,
    )
    # The charts are routed in the browser (assets/kvdoctor.js): a server round trip here could be
    # overtaken by the next update and Dash would drop the older answer, losing a rebuild.
    outputs = []
    for _, graph_id in GRAPHS:
        outputs += [Output(graph_id, "figure"), Output(graph_id, "extendData")]
    app.clientside_callback(
        ClientsideFunction(namespace="kvdoctor", function_name="routeCharts"),
        *outputs,
        Output(ids.LIVE_ROUTED, "data"),
        Input(ids.LIVE_DATA, "data"),
    )
    app.callback(Output(ids.LIVE_BANNER, "children"), Input(ids.LIVE_DIAGNOSIS, "data"))(render_banner)
    app.callback(
        Output(ids.LIVE_DOWNLOAD, "href"),
        *each(Input, "value", ids.LIVE_RANGE, ids.LIVE_INSTANCE),
        State(ids.LIVE_HISTORY, "data"),
    )(render_download)
    app.callback(Output(ids.LIVE_BADGE, "children"), Input(ids.LIVE_HEALTH, "data"))(render_badge)
