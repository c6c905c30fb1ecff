"""Pure builders of page pieces: the verdict banner, the stale badge, tables, and the layout the
pages share (the controls bar and its pickers, the grid of charts).

Data in, Dash components out; no callbacks and no I/O, so they are tested without a browser.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable, Mapping
from typing import Any

from dash import dcc, html

from kvdoctor.dashboard import figures
from kvdoctor.rules import verdicts
from kvdoctor.rules.actions import FIX, GROUP_TITLES, MITIGATE, SHOWN_PER_GROUP
from kvdoctor.rules.render import feature_label


def verdict_title(verdict: str | None) -> str:
    return verdicts.title(verdict)


def verdict_class(verdict: str | None) -> str:
    """The banner's class: the catalogue's severity (rules/verdicts.py)."""
    return _SEVERITY_CLASS[verdicts.severity(verdict)] if verdict else "verdict-idle"


_SEVERITY_CLASS = {
    verdicts.CRITICAL: "verdict-bad",
    verdicts.WARNING: "verdict-warn",
    verdicts.OK: "verdict-ok",
    verdicts.QUIET: "verdict-idle",
}


def format_number(value: Any, unit: str = "") -> str:
    """Short human form: 3 significant digits, SI prefixes for big numbers."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    try:
        v = float(value)
    except (TypeError, ValueError):
        return str(value)
    if math.isnan(v):
        return "–"
    if math.isinf(v):
        return "∞"
    sep = " " if unit else ""
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= factor and unit not in ("%", "ms", "s"):
            return f"{v / factor:.3g}{sep}{prefix}{unit}"
    return f"{v:.3g}{sep}{unit}"


# A confidence as a word, never a bare percentage (it would read as a measurement beside the
# evidence's percentages): the lowest confidence each word stands for, highest first.
CONFIDENCE_WORDS = ((0.8, "high"), (0.6, "medium"), (0.0, "low"))


def format_confidence(value: Any) -> str:
    """ "high confidence", "medium confidence" or "low confidence"; empty where there is none."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return ""
    if not math.isfinite(v):
        return ""
    v = v / 100 if v > 1.0 else v
    return next(f"{word} confidence" for floor, word in CONFIDENCE_WORDS if v >= floor or floor == 0.0)


COMPARISONS = {">=": "≥", "<=": "≤", ">": ">", "<": "<", "==": "=", "!=": "≠"}


def format_with_unit(value: Any, unit: str) -> str:
    """An evidence value in the unit the rules give it: ratios as %, seconds as ms, bytes/s in SI."""
    if value is None or isinstance(value, bool):
        return format_number(value)
    try:
        v = float(value)
    except (TypeError, ValueError):
        return str(value)
    if not math.isfinite(v):
        return format_number(v)
    if unit == "ratio":
        return f"{v * 100:.3g}%"
    if unit == "seconds":  # ms under a second, else seconds: never "2e+03 ms"
        return f"{v * 1000:.3g} ms" if abs(v) < 1 else f"{v:.3g} s"
    if unit == "bytes/s":
        return format_number(v, "B/s")
    return format_number(v, unit)


def evidence_row_text(item: Mapping) -> str:
    """An evidence row in on-call words: the rules' own text, else (an older exporter) label and value."""
    text = str(item.get("text") or "")
    if text:
        return text
    feature = str(item.get("feature") or "")
    label = str(item.get("label") or (feature_label(feature) if feature else item.get("signal", "")))
    if not item.get("measured", True):
        return f"{label}: not measured"
    unit = str(item.get("unit") or "")
    comparison = COMPARISONS.get(str(item.get("comparison") or ""), "")
    threshold = item.get("threshold")
    against = (
        f" (threshold {comparison} {format_with_unit(threshold, unit)})" if threshold is not None and comparison else ""
    )
    return f"{label}: {format_with_unit(item.get('value'), unit)}{against}"


# A difference the tree compares with a margin, in words: (the left quantity, the right one, the
# cause the left one clearly above the right points at).
DIFFERENCES = {"sm_active_ratio - dram_bandwidth_ratio": ("SM activity", "DRAM bandwidth", "compute")}
_AGAINST = re.compile(r"^(?P<base>.*?) \((?:(?P<slo>SLO)|threshold [≥≤<>=≠]) (?P<against>[^()]+)\)$")


def evidence_fact(item: Mapping) -> str:
    """An evidence row as a fact with its direction: "SM activity 52 points below DRAM bandwidth:
    not compute", "preemptions over the last 15 s: 72.4/min, above the 1.0/min threshold", "ITL
    p95 over the last 15 s: 24.7 ms, below the 100 ms SLO"; a row without a value compared with a
    threshold as the rules word it."""
    text = evidence_row_text(item)
    value, threshold = item.get("value"), item.get("threshold")
    if not item.get("measured", True) or not isinstance(value, int | float) or not isinstance(threshold, int | float):
        return text
    feature = str(item.get("feature") or "")
    if feature in DIFFERENCES and str(item.get("unit")) == "ratio":
        left, right, cause = DIFFERENCES[feature]
        points, margin = abs(value) * 100, threshold * 100
        fact = (
            f"{left} {points:.0f} points {'above' if value > 0 else 'below'} {right}"
            if points >= 0.5
            else (f"{left} level with {right}")
        )
        if item.get("holds"):
            return f"{fact}: {cause} (over the {margin:.0f}-point margin)"
        return f"{fact}: not {cause}" + (f" (under the {margin:.0f}-point margin)" if value > 0 else "")
    found = _AGAINST.match(text)
    if found is None:
        return text
    side = "above" if value > threshold else "below" if value < threshold else "at"
    what = "SLO" if found.group("slo") else "threshold"
    return f"{found.group('base')}, {side} the {found.group('against')} {what}"


def evidence_table(evidence: Iterable[Mapping]) -> html.Table | None:
    """The evidence in words, one row per quantity: what decided the verdict, then what explains it."""
    rows = []
    for item in evidence:
        measured = item.get("measured", True)
        holds = item.get("holds")
        role = "explains" if item.get("context") else ("decides" if holds is not None else "")
        rows.append(
            html.Tr(
                [
                    html.Td(evidence_fact(item), className="evidence-signal", title=evidence_row_text(item)),
                    html.Td(role if measured else "not measured", className="evidence-measured"),
                ],
                className="" if measured else "not-measured",
                **({"data-holds": str(holds).lower()} if holds is not None else {}),
            )
        )
    if not rows:
        return None
    head = html.Thead(html.Tr([html.Th(h) for h in ("measured", "")]))
    return html.Table([head, html.Tbody(rows)], className="evidence")


def _action_item(action: Mapping) -> html.Li:
    flags: list[Any] = []
    for engine, key in (("vLLM", "flag_vllm"), ("SGLang", "flag_sglang"), ("llama.cpp", "flag_llamacpp")):
        if action.get(key):
            flags += [html.Span(f"{engine}: ", className="flag-engine"), html.Code(str(action[key])), " "]
    parts: list[Any] = [html.Strong(str(action.get("title", "")))]
    if action.get("premise"):
        parts += [" ", html.Em(f"({action['premise']})", className="action-premise")]
    if flags:
        parts += [html.Br(), *flags]
    if action.get("effect"):
        parts += [html.Br(), html.Span(str(action["effect"]), className="action-effect")]
    return html.Li(parts)


def action_list(actions: Iterable[Mapping]) -> html.Div | None:
    """The actions by group ("mitigate now", then "fix"), at most ``SHOWN_PER_GROUP`` of each."""
    groups: dict[str, list[html.Li]] = {}
    for action in actions:
        group = str(action.get("group") or FIX)
        items = groups.setdefault(group, [])
        if len(items) < SHOWN_PER_GROUP:
            items.append(_action_item(action))
    if not groups:
        return None
    parts: list[Any] = []
    for group in sorted(groups, key=lambda g: g != MITIGATE):
        parts += [html.H5(GROUP_TITLES.get(group, group), className="action-group"), html.Ol(groups[group])]
    return html.Div(parts, className="actions")


def also_present(differential: Iterable[Mapping]) -> str:
    """The differential in one short line: "Also present: KV capacity pressure (medium confidence);
    requests waiting, a consequence of the slowness"; empty where nothing else holds."""
    parts = []
    for entry in differential:
        verdict = str(entry.get("verdict") or "")
        if entry.get("consequence"):
            parts.append("requests waiting, a consequence of the slowness")
        elif verdict:
            sure = format_confidence(entry.get("confidence"))
            parts.append(verdict_title(verdict) + (f" ({sure})" if sure else ""))
    return "Also present: " + "; ".join(parts) if parts else ""


def source_problems(problems: Iterable[str]) -> html.Div | None:
    """Every page's banner for sources that cannot be read: one line each, naming the URL and the
    error; None when every source reads."""
    lines = [str(p) for p in problems]
    if not lines:
        return None
    return html.Div(
        [html.Div("A source cannot be read", className="verdict-title"), *(html.P(line) for line in lines)],
        className="banner verdict-bad source-problems",
        role="alert",
    )


def banner(diagnosis: Mapping | None, notes: Iterable[str] = (), error: str | None = None) -> html.Div:
    """The verdict banner: headline, confidence, evidence against thresholds, ordered actions.
    Before the first diagnosis: what it waits for, or ``error``, why none can come (the source's)."""
    if not diagnosis:
        if error:
            return html.Div(
                [html.Div("No diagnosis: the source cannot be read", className="verdict-title"), html.P(error)],
                className="banner verdict-bad",
                **{"data-verdict": "", "data-error": "true"},
            )
        return html.Div(
            [html.Div("Waiting for the first diagnosis…", className="verdict-title")],
            className="banner verdict-idle",
            **{"data-verdict": ""},
        )
    verdict = str(diagnosis.get("verdict") or "")
    head = [html.Span(verdict_title(verdict), className="verdict-title")]
    confidence = format_confidence(diagnosis.get("confidence"))
    if confidence:
        head.append(
            html.Span(confidence, className="verdict-confidence", title=f"confidence {diagnosis.get('confidence')}")
        )
    head.append(html.Code(verdict, className="verdict-code"))
    body: list[Any] = [
        html.Div(head, className="verdict-head"),
        html.P(str(diagnosis.get("headline") or ""), className="verdict-headline"),
    ]
    also = also_present(diagnosis.get("differential") or [])
    if also:
        body.append(html.P(also, className="verdict-also"))
    columns = []
    table = evidence_table(diagnosis.get("evidence") or [])
    if table is not None:
        columns.append(html.Div([html.H4("Evidence"), table], className="banner-col"))
    actions = action_list(diagnosis.get("actions") or [])
    if actions is not None:
        columns.append(html.Div([html.H4("What to do, in order"), actions], className="banner-col"))
    if columns:
        body.append(html.Div(columns, className="banner-cols"))
    missing = [str(m) for m in diagnosis.get("missing") or []]
    notes = list(notes)
    if missing or notes:
        text = []
        if missing:
            text.append("Not measured here: " + ", ".join(missing) + ".")
        text.extend(notes)
        body.append(html.P(" ".join(text), className="verdict-missing"))
    return html.Div(body, className=f"banner {verdict_class(verdict)}", **{"data-verdict": verdict})


def _clock(ts: float | None) -> str:
    if ts is None or not math.isfinite(ts):
        return "never"
    return time.strftime("%H:%M:%S", time.gmtime(ts)) + " UTC"


def badge(health: Mapping | None) -> html.Span:
    """The freshness badge: live, stale (fetch failing: last data kept) or a source down.

    ``health`` = {"ok": bool, "error": str, "last_ok": ts, "newest": ts,
    "sources_down": [{"name", "error"}], "history": bool}.
    """
    if not health:
        return html.Span("connecting…", className="badge badge-idle", **{"data-state": "connecting"})
    if health.get("history"):
        return html.Span("history (not live)", className="badge badge-idle", **{"data-state": "history"})
    down = health.get("sources_down") or []
    if not health.get("ok"):
        text = f"stale: showing data up to {_clock(health.get('newest'))}; {health.get('error') or 'fetch failed'}"
        return html.Span(text, className="badge badge-stale", title=text, **{"data-state": "stale"})
    if down:
        text = "; ".join(f"source {d['name']} down" + (f": {d['error']}" if d.get("error") else "") for d in down)
        return html.Span(text, className="badge badge-down", title=text, **{"data-state": "source-down"})
    return html.Span(
        f"live · data at {_clock(health.get('newest'))}", className="badge badge-ok", **{"data-state": "live"}
    )


def key_value_table(rows: Iterable[tuple[str, str]], class_name: str = "kv-table") -> html.Table:
    return html.Table(html.Tbody([html.Tr([html.Th(k), html.Td(v)]) for k, v in rows]), className=class_name)


def table(header: list[str], rows: list[list[Any]], class_name: str = "data-table") -> html.Table:
    return html.Table(
        [
            html.Thead(html.Tr([html.Th(h) for h in header])),
            html.Tbody([html.Tr([html.Td(c) for c in r]) for r in rows]),
        ],
        className=class_name,
    )


def link(text: str, href: str) -> dcc.Link:
    return dcc.Link(text, href=href)


# ------------------------------------------------------------------------------- shared layout


def labelled(label: str, control: Any) -> html.Label:
    """A control of the controls bar with its label above it."""
    return html.Label([label, control])


def picker(label: str, dropdown_id: str, options: list[dict], value: Any, *, wide: bool = False, **props) -> html.Label:
    """A labelled dropdown that always has a value (not clearable)."""
    class_name = "picker wide" if wide else "picker"
    return labelled(
        label,
        dcc.Dropdown(id=dropdown_id, options=options, value=value, clearable=False, className=class_name, **props),
    )


def controls_bar(controls: list, badge_id: str, badge: Any = None) -> html.Div:
    """The bar above a page's content: its controls, then the freshness badge (``badge_id``)."""
    slot = html.Div(id=badge_id, className="badge-slot")
    if badge is not None:
        slot.children = badge
    return html.Div([*controls, slot], className="controls")


def chart_grid(graph_ids: Iterable[str], **graph_props) -> html.Div:
    """The page's charts, each saying "loading…" until its first figure arrives."""
    return html.Div(
        [
            dcc.Graph(id=graph_id, figure=figures.placeholder_figure("loading…"), className="chart", **graph_props)
            for graph_id in graph_ids
        ],
        className="charts",
    )
