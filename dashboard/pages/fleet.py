"""Fleet: every exporter Prometheus scrapes, worst first; a click opens Live for that target.

A range picker (and an optional end time) sets the incident window: the table shows each target
at the end of it (and the worst verdict during it), the charts show ITL p95 and KV usage per
target over it, from range queries whose step is sized to the range and downsampled on the server.
"""

from __future__ import annotations

import calendar
import math
import time
from urllib.parse import urlencode

import dash
from dash import Input, Output, State, dcc, html, no_update

from kvdoctor.dashboard import components, figures, ids
from kvdoctor.dashboard.derive import FleetRow
from kvdoctor.dashboard.sources import SourceError, backend, fetch_fleet, now
from kvdoctor.rules.units import MISSING, fmt_ms, fmt_pct

PATH = "/fleet"
RANGES = (("15 min", 900), ("1 h", 3600), ("6 h", 6 * 3600), ("24 h", 24 * 3600), ("7 days", 7 * 24 * 3600))
REFRESH_SECONDS = 15
END_FORMAT = "%Y-%m-%d %H:%M"
FLEET_DATA = "fleet-data"
FLEET_END = "fleet-end"


def register(app: dash.Dash) -> None:
    dash.register_page(__name__, path=PATH, name="Fleet", order=2, title="kvdoctor · Fleet", layout=layout)
    app.callback(
        Output(FLEET_DATA, "data"),
        Output(ids.FLEET_STATUS, "children"),
        Input(ids.FLEET_REFRESH, "n_intervals"),
        Input(ids.FLEET_RANGE, "value"),
        Input(FLEET_END, "value"),
        State(FLEET_DATA, "data"),
    )(fetch)
    app.callback(
        Output(ids.FLEET_TABLE, "children"),
        Output(ids.FLEET_GRAPH_ITL, "figure"),
        Output(ids.FLEET_GRAPH_KV, "figure"),
        Input(FLEET_DATA, "data"),
    )(render)


def layout(**params) -> html.Div:
    """``?range=SECONDS&end=YYYY-MM-DD HH:MM`` preselect the incident window (a shareable link)."""
    if backend().prometheus is None:
        return html.Div(
            [
                html.H3("Fleet needs Prometheus"),
                html.P(
                    [
                        "This dashboard reads one exporter. Start it with ",
                        html.Code("--prometheus URL"),
                        " (a Prometheus that scrapes the kvdoctor exporters) to see every engine here.",
                    ]
                ),
            ],
            className="page page-fleet",
        )
    controls = [
        components.picker(
            "range",
            ids.FLEET_RANGE,
            [{"label": f"last {t}", "value": s} for t, s in RANGES],
            _range_param(params.get("range")),
        ),
        components.labelled(
            "ending at (UTC)",
            dcc.Input(
                id=FLEET_END,
                type="text",
                debounce=True,
                placeholder="now, or YYYY-MM-DD HH:MM",
                value=_end_param(params.get("end")),
                className="end-time",
                style={"width": "210px"},
            ),
        ),
    ]
    return html.Div(
        [
            components.controls_bar(controls, ids.FLEET_STATUS),
            html.Div(id=ids.FLEET_TABLE),
            components.chart_grid([ids.FLEET_GRAPH_ITL, ids.FLEET_GRAPH_KV]),
            dcc.Interval(id=ids.FLEET_REFRESH, interval=REFRESH_SECONDS * 1000),
            dcc.Store(id=FLEET_DATA),
        ],
        className="page page-fleet",
    )


DEFAULT_RANGE = 3600


def _range_param(value) -> int:
    try:
        seconds = int(value)
    except (TypeError, ValueError):
        return DEFAULT_RANGE
    return seconds if seconds in {s for _, s in RANGES} else DEFAULT_RANGE


def _end_param(value) -> str:
    try:
        return value if value and parse_end(value) is not None else ""
    except ValueError:
        return ""


def parse_end(text: str | None) -> float | None:
    """``YYYY-MM-DD HH:MM`` (UTC) -> Unix seconds; None for empty (now); ValueError otherwise."""
    if not text or not text.strip():
        return None
    try:
        return float(calendar.timegm(time.strptime(text.strip(), END_FORMAT)))
    except ValueError:
        raise ValueError(f"end time must look like {time.strftime(END_FORMAT, time.gmtime(0))}") from None


def fetch(_n, range_seconds, end_text, previous):
    b = backend()
    try:
        span = float(range_seconds)
        if not 0 < span <= max(s for _, s in RANGES):
            raise ValueError("unknown range")
        fixed_end = parse_end(end_text)
    except (TypeError, ValueError) as exc:
        return no_update, components.badge({"ok": False, "error": str(exc)})
    end = fixed_end if fixed_end is not None else now()
    try:
        got = fetch_fleet(
            b.prometheus, end, span, b.settings.max_points, b.settings.rate_window_seconds, b.settings.oversampling
        )
    except SourceError as exc:
        newest = (previous or {}).get("end")
        return no_update, components.badge({"ok": False, "error": str(exc), "newest": newest})
    data = {
        "end": end,
        "span": span,
        "fixed": fixed_end is not None,
        "rows": [
            {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in vars(r).items()}
            for r in got.rows
        ],
        "history": got.history,
    }
    state = {"ok": True, "newest": end, "history": fixed_end is not None}
    return data, components.badge(state)


def live_href(row: FleetRow, start: float | None = None, end: float | None = None) -> str:
    params = {"instance": row.instance}
    if start is not None and end is not None:
        params.update({"from": f"{start:.0f}", "to": f"{end:.0f}"})
    return "/?" + urlencode(params)


def fleet_table(rows: list[FleetRow], start: float, end: float, fixed: bool):
    if not rows:
        return html.P("Prometheus has no kvdoctor exporter in this range.", className="empty")
    body = []
    for r in rows:
        links = [
            dcc.Link(r.instance, href=live_href(r, start, end) if fixed else live_href(r), className="target-link")
        ]
        if not fixed:
            links += [" ", dcc.Link("(review range)", href=live_href(r, start, end), className="review-link")]
        body.append(
            html.Tr(
                [
                    html.Td(links),
                    html.Td(r.pod or "–"),
                    html.Td(" · ".join(x for x in (r.engine, r.model_name) if x) or "–"),
                    html.Td(
                        html.Span(
                            components.verdict_title(r.verdict or None),
                            className=f"pill {components.verdict_class(r.verdict or None)}",
                        ),
                        **{"data-verdict": r.verdict},
                    ),
                    html.Td(components.verdict_title(r.worst_verdict or None) if r.worst_verdict else "–"),
                    html.Td(fmt_pct(r.kv_usage, missing=MISSING)),
                    html.Td(fmt_ms(r.itl_p95, missing=MISSING)),
                    html.Td("–" if not math.isfinite(r.preemption_rate) else f"{r.preemption_rate:.2f}/s"),
                ],
                className="fleet-row",
            )
        )
    head = ["target", "pod", "engine · model", "verdict", "worst in range", "KV usage", "ITL p95", "preemptions"]
    return html.Table([html.Thead(html.Tr([html.Th(h) for h in head])), html.Tbody(body)], className="data-table fleet")


def render(data):
    if not data:
        return no_update, no_update, no_update
    rows = [FleetRow(**{k: (math.nan if v is None else v) for k, v in r.items()}) for r in data["rows"]]
    start, end = data["end"] - data["span"], data["end"]
    return (
        fleet_table(rows, start, end, data["fixed"]),
        figures.fleet_history_figure("ITL p95 per target", "ms", data["history"].get("itl_p95", []), (start, end)),
        figures.fleet_history_figure(
            "KV cache usage per target", "%", data["history"].get("kv_usage", []), (start, end)
        ),
    )
