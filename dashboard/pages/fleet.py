"""Fleet: every pod Prometheus knows, worst first, one page of rows at a time.

The server reads the whole fleet with ``read_fleet``'s few instant queries (recorded features and
each pod's verdict; never a range of raw samples) and keeps the summary under a short token
(``FleetCache``); the browser holds the token, its filters and its page number, never the rows.
Each answer is one page of rows: counts by verdict at the top (they are the verdict filter: a
click shows only those pods), a namespace filter, a pod search, and per row ITL p95 against the
pod's SLO and KV usage as numbers with a sparkline over the picked range (one range query of
recorded series for the shown pods).
A pod's name opens the Live page on its scrape target over that range.

The first page comes with the layout (no callback round trip before the first rows); the refresh
(every ``REFRESH_SECONDS``) reads the fleet again and answers with the page shown; a filter or a
page change answers from the kept summary. A fixed end time (an incident) is read once.
"""

from __future__ import annotations

import calendar
import hashlib
import time
from typing import Any

import dash
from dash import Input, Output, State, ctx, dcc, html, no_update

from kvdoctor.dashboard import components, fleet_view, ids
from kvdoctor.dashboard.sources import FleetPage, backend, fleet_page, fleet_summary, now
from kvdoctor.dashboard.wiring import each
from kvdoctor.rules.fleet import FleetSummary
from kvdoctor.signals.collection import SourceError

NAME = "Fleet"  # the nav link and the tab title
PATH = "/fleet"
RANGES = (("15 min", 900), ("1 h", 3600), ("6 h", 6 * 3600), ("24 h", 24 * 3600), ("7 days", 7 * 24 * 3600))
DEFAULT_RANGE = 3600
REFRESH_SECONDS = 15
END_FORMAT = "%Y-%m-%d %H:%M"
MAX_SEARCH = 200  # characters of a pod search that are used

# What re-reads the fleet; anything else (filters, paging) answers from the kept summary.
_READS = {ids.FLEET_REFRESH, ids.FLEET_RANGE, ids.FLEET_END}
_FILTERS = {ids.FLEET_NAMESPACE, ids.FLEET_VERDICT, ids.FLEET_SEARCH}


def register(app: dash.Dash) -> None:
    app.callback(
        Output(ids.FLEET_STATE, "data"),
        Output(ids.FLEET_STATUS, "children"),
        Output(ids.FLEET_VERDICT, "options"),
        *each(Output, "children", ids.FLEET_NOTES, ids.FLEET_TABLE, ids.FLEET_PAGER),
        *each(Output, "disabled", ids.FLEET_PREV, ids.FLEET_NEXT),
        Output(ids.FLEET_NAMESPACE, "options"),
        Output(ids.FLEET_REFRESH, "disabled"),
        Input(ids.FLEET_REFRESH, "n_intervals"),
        *each(Input, "value", ids.FLEET_RANGE, ids.FLEET_END, ids.FLEET_NAMESPACE, ids.FLEET_VERDICT, ids.FLEET_SEARCH),
        *each(Input, "n_clicks", ids.FLEET_PREV, ids.FLEET_NEXT),
        State(ids.FLEET_STATE, "data"),
        prevent_initial_call=True,  # the layout carries the first page
    )(update)


# ----------------------------------------------------------------------------------- parameters


def _range_param(value: Any) -> int:
    try:
        seconds = int(value)
    except (TypeError, ValueError):
        return DEFAULT_RANGE
    return seconds if seconds in {s for _, s in RANGES} else DEFAULT_RANGE


def parse_end(text: str | None) -> float | None:
    """``YYYY-MM-DD HH:MM`` (UTC) -> Unix seconds; None for empty (now); ValueError otherwise."""
    if not text or not text.strip():
        return None
    try:
        return float(calendar.timegm(time.strptime(text.strip(), END_FORMAT)))
    except ValueError:
        raise ValueError(f"end time must look like {time.strftime(END_FORMAT, time.gmtime(0))}") from None


def _end_param(value: Any) -> str:
    try:
        return value if isinstance(value, str) and parse_end(value) is not None else ""
    except ValueError:
        return ""


def _text_param(value: Any) -> str:
    return value[:MAX_SEARCH] if isinstance(value, str) else ""


def _digest(values: Any) -> str:
    return hashlib.sha1(repr(values).encode()).hexdigest()[:12]


# ------------------------------------------------------------------------------------------ view


def view(
    summary: FleetSummary | None, state: dict, namespace: str, verdict: str, search: str, start: float, end: float
) -> tuple[dict, list, FleetPage | None]:
    """(state, [verdict options with counts, notes, table, pager, prev disabled, next disabled], page)
    for ``summary``; the counts are sent only when they changed (``state["counts"]``)."""
    b = backend()
    if summary is None:
        return state, [no_update] * 6, None
    page = fleet_page(
        b.prometheus,
        summary,
        namespace=namespace or None,
        verdicts=fleet_view.verdict_filter(verdict),
        search=search[:MAX_SEARCH] if search else None,
        page=int(state.get("page") or 0),
        start=start,
        end=end,
    )
    counts = fleet_view.count_options(summary)
    digest = _digest([*sorted(summary.counts.items()), len(summary.rows), summary.slow])
    state = dict(state, page=page.page, counts=digest)
    parts = [
        counts,
        fleet_view.notes(summary, page),
        fleet_view.fleet_table(page, start, end, bool(summary.rows)),
        fleet_view.pager_text(page),
        page.page == 0,
        page.page >= page.pages - 1,
    ]
    return state, parts, page


def _read(state: dict, end: float) -> tuple[FleetSummary, str]:
    """The fleet at ``end``, kept on the server under the page's token (a new one the first time)."""
    b = backend()
    summary = fleet_summary(b.prometheus, end)
    return summary, b.fleet.put(summary, state.get("token"))


# ---------------------------------------------------------------------------------------- layout


def layout(**params) -> html.Div:
    """``?range=SECONDS&end=YYYY-MM-DD HH:MM&namespace=NS&verdict=V&pod=TEXT`` preselect the view
    (a shareable link); the first page of rows is in the layout itself."""
    b = backend()
    if b.prometheus is None:
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
    span = _range_param(params.get("range"))
    end_text = _end_param(params.get("end"))
    verdict = params.get("verdict") if fleet_view.verdict_filter(params.get("verdict")) else fleet_view.ALL
    namespace = _text_param(params.get("namespace"))
    search = _text_param(params.get("pod"))

    fixed = parse_end(end_text)
    end = fixed if fixed is not None else now()
    state: dict = {"page": 0, "end": end, "fixed": fixed is not None}
    summary = None
    try:
        summary, state["token"] = _read(state, end)
        badge = components.badge({"ok": True, "newest": end, "history": fixed is not None})
    except SourceError as exc:
        badge = components.badge({"ok": False, "error": str(exc)})
    state, parts, _ = view(summary, state, namespace, verdict, search, end - span, end)
    counts, notes, table, pager, prev_off, next_off = [None if p is no_update else p for p in parts]
    counts = counts or fleet_view.count_options(None)
    ns_options = fleet_view.namespace_options(summary)
    state["ns"] = _digest(ns_options)

    controls = [
        components.picker("range", ids.FLEET_RANGE, [{"label": f"last {t}", "value": s} for t, s in RANGES], span),
        components.labelled(
            "ending at (UTC)",
            dcc.Input(
                id=ids.FLEET_END,
                type="text",
                debounce=True,
                placeholder="now, or YYYY-MM-DD HH:MM",
                value=end_text,
                className="end-time",
                style={"width": "210px"},
            ),
        ),
        components.picker("namespace", ids.FLEET_NAMESPACE, ns_options, namespace if namespace else fleet_view.ALL),
        components.labelled(
            "pod",
            dcc.Input(
                id=ids.FLEET_SEARCH,
                type="search",
                debounce=0.4,
                placeholder="part of a pod name",
                value=search,
                className="pod-search",
                style={"width": "200px"},
            ),
        ),
    ]
    return html.Div(
        [
            components.controls_bar(controls, ids.FLEET_STATUS, badge),
            dcc.RadioItems(id=ids.FLEET_VERDICT, options=counts, value=verdict, inline=True, className="fleet-counts"),
            html.Div(notes, id=ids.FLEET_NOTES),
            html.Div(table, id=ids.FLEET_TABLE),
            html.Div(
                [
                    html.Button("← previous", id=ids.FLEET_PREV, n_clicks=0, disabled=prev_off is not False),
                    html.Span(pager, id=ids.FLEET_PAGER, className="pager-text"),
                    html.Button("next →", id=ids.FLEET_NEXT, n_clicks=0, disabled=next_off is not False),
                ],
                className="pager",
            ),
            dcc.Interval(id=ids.FLEET_REFRESH, interval=REFRESH_SECONDS * 1000, disabled=fixed is not None),
            dcc.Store(id=ids.FLEET_STATE, data=state),
        ],
        className="page page-fleet",
    )


# ------------------------------------------------------------------------------------- callbacks


def update(_tick, range_seconds, end_text, namespace, verdict, search, _prev, _next, state):
    """A refresh, a new range or end (read the fleet again), or a filter or page change (answer
    from the kept summary): the page of rows shown, and only what changed of the rest."""
    b = backend()
    state = dict(state or {})
    trigger = ctx.triggered_id
    try:
        span = float(range_seconds)
        if not 0 < span <= max(s for _, s in RANGES):
            raise ValueError("unknown range")
        fixed = parse_end(end_text)
    except (TypeError, ValueError) as exc:
        return state, components.badge({"ok": False, "error": str(exc), "newest": state.get("end")}), *[no_update] * 8
    if trigger == ids.FLEET_REFRESH and state.get("fixed") and fixed is not None:
        return (no_update,) * 10  # an incident's fixed end: nothing new to read
    if trigger in _FILTERS:
        state["page"] = 0
    elif trigger == ids.FLEET_PREV:
        state["page"] = int(state.get("page") or 0) - 1
    elif trigger == ids.FLEET_NEXT:
        state["page"] = int(state.get("page") or 0) + 1

    summary = None if trigger in _READS else b.fleet.get(state.get("token"))
    if summary is None:  # a read, or a summary this server no longer has: read the fleet
        end = fixed if fixed is not None else now()
        try:
            summary, state["token"] = _read(state, end)
        except SourceError as exc:
            badge = components.badge({"ok": False, "error": str(exc), "newest": state.get("end")})
            return state, badge, *[no_update] * 8
        state.update(end=end, fixed=fixed is not None)
    end = float(state.get("end") or summary.at)
    badge = components.badge({"ok": True, "newest": end, "history": bool(state.get("fixed"))})
    known = state.get("counts")
    state, parts, _ = view(summary, state, namespace or "", verdict or "", search or "", end - span, end)
    if state.get("counts") == known:
        parts[0] = no_update  # the browser has these counts
    ns_options = fleet_view.namespace_options(summary)
    digest = _digest(ns_options)
    options = no_update if digest == state.get("ns") else ns_options
    state["ns"] = digest
    return state, badge, *parts, options, bool(state.get("fixed"))


__all__ = ["PATH", "RANGES", "layout", "parse_end", "register", "update", "view"]
