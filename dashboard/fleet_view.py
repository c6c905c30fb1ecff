"""The Fleet page's pieces: the counts by verdict, one page of rows with their sparklines, the pager.

Data in (a ``FleetSummary``, a ``FleetPage``), Dash components out; no callbacks and no I/O. A row
is a pod, named by its pod name; its link opens the Live page on that pod's scrape target over the
range the Fleet page shows.
"""

from __future__ import annotations

import math
from urllib.parse import quote, urlencode

from dash import dcc, html

from kvdoctor.dashboard import components, figures
from kvdoctor.dashboard.sources import FLEET_PAGE_ROWS, FleetPage
from kvdoctor.rules.actions import ACTION_BY_ID
from kvdoctor.rules.fleet import FLEET_VERDICTS, FleetRow, FleetSummary
from kvdoctor.rules.verdicts import SLOW_VERDICTS
from kvdoctor.signals.units import MISSING, fmt_ms, fmt_pct

ALL = ""  # the verdict filter's "every verdict"
SLOW = "slow"  # the verdict filter's "every slow verdict"
HEADER = ("pod", "namespace", "verdict", "ITL p95 / SLO", "KV usage", "waiting", "first action", "engine · model")
OVER_SLO_COLOR = "#c92a2a"
NO_POD = "(no pod label)"  # exporters started without --pod / KVDOCTOR_POD share this row


def verdict_filter(value: str | None) -> tuple[str, ...] | None:
    """The verdicts a filter value keeps (None: every row); an unknown value keeps every row."""
    if value == SLOW:
        return tuple(SLOW_VERDICTS)
    if value in FLEET_VERDICTS:
        return (value,)
    return None


def namespace_options(summary: FleetSummary | None) -> list[dict]:
    names = summary.namespaces if summary is not None else ()
    return [{"label": "every namespace", "value": ALL}, *({"label": n, "value": n} for n in names)]


def _count(label: str, count: int, class_name: str, verdict: str) -> dict:
    text = html.Span(
        [label, html.B(f"{count:,}")],
        className=f"count {class_name}" + ("" if count else " zero"),
        **{"data-verdict": verdict, "data-count": str(count)},
    )
    return {"label": text, "value": verdict}


def count_options(summary: FleetSummary | None) -> list[dict]:
    """The verdict filter's choices, each with its count: every pod, the slow ones, each verdict.
    The counts are the filter: a click on one shows only its pods."""
    if summary is None:
        return [{"label": "every pod", "value": ALL}]
    return [
        _count("all pods", len(summary.rows), "count-all", ALL),
        _count("slow", summary.slow, "verdict-bad" if summary.slow else "verdict-ok", SLOW),
        *(
            _count(components.verdict_title(v), summary.counts.get(v, 0), components.verdict_class(v), v)
            for v in FLEET_VERDICTS
        ),
    ]


def live_href(instance: str, start: float, end: float) -> str:
    """The Live page on one scrape target over [start, end] (its Prometheus-backed history)."""
    return "/?" + urlencode({"instance": instance, "from": f"{start:.0f}", "to": f"{end:.0f}"})


def _sparkline(values, low: float, high: float, line: float | None, color: str) -> html.Img:
    svg = figures.sparkline_svg(list(values), low, high, line=line, color=color)
    return html.Img(src="data:image/svg+xml," + quote(svg, safe=" =:/'-.,"), className="spark")


def _action_title(action_id: str | None) -> str:
    action = ACTION_BY_ID.get(action_id or "")
    return action.title if action is not None else MISSING


def _row(row: FleetRow, page: FleetPage, start: float, end: float) -> html.Tr:
    """One pod. Few components per row: a page of fifty is what every refresh sends."""
    key = (row.namespace, row.pod)
    instance = page.instances.get(key) if row.pod else None  # no pod label: no one target to open
    label = row.pod or NO_POD
    name = dcc.Link(label, href=live_href(instance, start, end)) if instance else label
    over = math.isfinite(row.slo_ratio) and row.slo_ratio > 1.0
    itl_text = fmt_ms(row.itl_p95_seconds, missing=MISSING)
    itl: list = [html.B(itl_text) if over else itl_text, f" / {fmt_ms(row.slo_applied, trim=True)}"]
    kv: list = [fmt_pct(row.kv_usage, missing=MISSING)]
    itl_values = page.sparks.get((*key, "itl_p95_seconds"))
    if itl_values is not None:
        color = OVER_SLO_COLOR if over else figures.PALETTE[0]
        itl.append(_sparkline(itl_values, 0.0, row.slo_applied, row.slo_applied, color))
    kv_values = page.sparks.get((*key, "kv_usage"))
    if kv_values is not None:
        kv.append(_sparkline(kv_values, 0.0, 1.0, None, figures.PALETTE[1]))
    pill = f"pill {components.verdict_class(row.verdict)}"
    verdict = html.Span(components.verdict_title(row.verdict), className=pill)
    return html.Tr(
        [
            html.Td(name),
            html.Td(row.namespace or MISSING),
            html.Td(verdict),
            html.Td(itl, className="itl"),
            html.Td(kv, className="kv"),
            html.Td(f"{row.waiting:,.0f}" if math.isfinite(row.waiting) else MISSING),
            html.Td(_action_title(row.first_action)),
            html.Td(" · ".join(x for x in (row.engine, row.model_name) if x) or MISSING),
        ],
        **{"data-pod": row.pod, "data-verdict": row.verdict},
    )


def fleet_table(page: FleetPage, start: float, end: float, any_rows: bool) -> html.Table | html.P:
    """The page's rows, worst first; ``any_rows``: whether the fleet has pods (else the filters hide them all)."""
    if not page.rows:
        text = "No pod matches these filters." if any_rows else "Prometheus has no kvdoctor exporter at this time."
        return html.P(text, className="empty")
    return html.Table(
        [
            html.Thead(html.Tr([html.Th(h) for h in HEADER])),
            html.Tbody([_row(r, page, start, end) for r in page.rows]),
        ],
        className="data-table fleet",
    )


def pager_text(page: FleetPage, per_page: int = FLEET_PAGE_ROWS) -> str:
    if not page.matching:
        return "no pod"
    first = page.page * per_page + 1
    last = min(page.matching, first + per_page - 1)
    return f"pods {first:,}–{last:,} of {page.matching:,} · page {page.page + 1} of {page.pages}"


def notes(summary: FleetSummary | None, page: FleetPage | None) -> list[html.P]:
    lines = list(summary.notes if summary is not None else ()) + list(page.notes if page is not None else ())
    return [html.P(line, className="verdict-missing") for line in lines]
