"""Plotly figures from the charts' data (``charts.ChartData``): data in, figure out. No Dash, no I/O.

Figures are plain dicts (``{"data": [...], "layout": {...}}``), which dcc.Graph takes as they are:
building plotly.graph_objects validates every point and costs ~100x more for the same JSON.
The unit tests check every builder's output against Plotly's schema with go.Figure(fig).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from kvdoctor.dashboard.charts import (
    BANDWIDTH,
    BANDWIDTH_BOUND_LINE,
    ITL_KV,
    KV_LATENCY,
    LATENCY_AXIS_FLOOR_MS,
    PCIE_AXIS_FLOOR,
    PREEMPTION_AXIS_FLOOR,
    SLO_HEADROOM,
    TICKS,
    TRANSFERS,
    ChartData,
    nice_top,
)

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
P50_COLOR, P95_COLOR, FLOOR_COLOR, KNEE_COLOR = "#31a354", "#e6550d", "#636363", "#d62728"
SLO_COLOR = "#7b3294"
AXIS_MARGIN = 1.05  # an axis reaches 5% above its top tick, so a line at the top stays visible
PERCENT_AXIS = {"range": [0, 100 * AXIS_MARGIN], "tickmode": "linear", "tick0": 0, "dtick": 100 / TICKS}

Figure = dict[str, Any]


def _base_layout(title: str, **kw) -> dict:
    layout = dict(
        title={"text": title, "x": 0.01, "xanchor": "left", "font": {"size": 15}},
        margin={"l": 60, "r": 60, "t": 40, "b": 50},
        height=330,
        legend={"orientation": "h", "y": -0.2, "x": 0, "yanchor": "top"},
        hovermode="x unified",
        template=TEMPLATE,
        uirevision="keep",  # keep zoom and hidden traces across updates
        shapes=[],
        annotations=[],
    )
    layout.update(kw)
    return layout


# A small template instead of "plotly_white": the named templates add ~10 KB to every figure.
TEMPLATE = {
    "layout": {
        "paper_bgcolor": "white",
        "plot_bgcolor": "white",
        "font": {"family": "system-ui, sans-serif", "size": 12, "color": "#2a3f5f"},
        "xaxis": {"gridcolor": "#ebf0f8", "linecolor": "#ebf0f8", "zerolinecolor": "#ebf0f8", "automargin": True},
        "yaxis": {"gridcolor": "#ebf0f8", "linecolor": "#ebf0f8", "zerolinecolor": "#ebf0f8", "automargin": True},
    }
}


def _time_axis() -> dict:
    return {"type": "date", "hoverformat": "%H:%M:%S UTC"}


def _right_axis(title: str) -> dict:
    """A second y axis, on the right, from zero, without a grid of its own."""
    return {"title": {"text": title}, "overlaying": "y", "side": "right", "rangemode": "tozero", "showgrid": False}


def _ticked(axis: dict, top: float) -> dict:
    """``axis`` from zero to ``top`` in ``TICKS`` equal steps (plus the margin): every axis so
    ticked puts its ticks at the same heights, so two of them share the gridlines."""
    return dict(axis, range=[0, top * AXIS_MARGIN], tickmode="linear", tick0=0, dtick=top / TICKS)


def _top(data: ChartData, axis: str, kinds: set[str], floor: float) -> float:
    """The top the chart data gives ``axis`` (``extras["axes"]``), else one from its traces."""
    given = ((data.get("extras") or {}).get("axes") or {}).get(axis)
    if given:
        return float(given)
    values = [v for t in data["traces"] if t["kind"] in kinds for v in t["y"] if v is not None]
    return nice_top(max(values, default=0.0), floor)


def _slo_line(slo_ms: float, yref: str, x_anchor: float = 0.99) -> tuple[dict, dict]:
    """The SLO as a dotted line across the plot and its label at the right end."""
    line = _hline(slo_ms, SLO_COLOR, yref)
    line["line"].update(dash="dot")
    label = {
        "xref": "paper",
        "x": x_anchor,
        "yref": yref,
        "y": slo_ms,
        "yshift": 9,
        "showarrow": False,
        "xanchor": "right",
        "font": {"size": 11, "color": SLO_COLOR},
        "bgcolor": "rgba(255,255,255,0.8)",
        "text": f"ITL SLO {slo_ms:g} ms",
    }
    return line, label


def _line(t: Mapping, **kw) -> dict:
    trace = {"type": "scatter", "x": t["x"], "y": t["y"], "name": t["name"], "mode": "lines", "connectgaps": False}
    trace.update(kw)
    return trace


def _figure(data: list[dict], layout: dict) -> Figure:
    return {"data": data, "layout": layout}


def _hline(y: float, color: str, yref: str = "y") -> dict:
    return {
        "type": "line",
        "xref": "paper",
        "x0": 0,
        "x1": 1,
        "yref": yref,
        "y0": y,
        "y1": y,
        "line": {"color": color, "dash": "dash", "width": 2},
    }


def _note(text: str, color: str = "#888", size: int = 14) -> dict:
    return {
        "xref": "paper",
        "yref": "paper",
        "x": 0.5,
        "y": 0.5,
        "showarrow": False,
        "text": text,
        "font": {"size": size, "color": color},
    }


def kv_latency_figure(data: ChartData) -> Figure:
    """KV usage (%) and ITL p50/p95 (ms) on one time axis, two y axes sharing their ticks; the SLO
    as a latency line, the only line: the knee is drawn where it is, on ITL against resident KV (a
    level of the KV axis here read as a latency threshold, and sat on the SLO's label)."""
    style = {
        "kv": dict(
            yaxis="y", line={"color": "#3182bd", "width": 1.5}, fill="tozeroy", fillcolor="rgba(158,202,225,0.35)"
        ),
        "p50": dict(yaxis="y2", line={"color": P50_COLOR, "width": 2}),
        "p95": dict(yaxis="y2", line={"color": P95_COLOR, "width": 2}),
    }
    extras = data.get("extras") or {}
    slo = extras.get("slo_ms")
    latency_top = _top(data, "y2", {"p50", "p95"}, max(LATENCY_AXIS_FLOOR_MS, (slo or 0.0) * SLO_HEADROOM))
    layout = _base_layout(
        "KV cache usage and per-token latency",
        xaxis=_time_axis(),
        yaxis=dict(PERCENT_AXIS, title={"text": "KV cache usage (%)"}),
        yaxis2=_ticked(_right_axis("inter-token latency (ms)"), latency_top),
    )
    if slo:
        line, label = _slo_line(slo, "y2", x_anchor=0.75)
        layout["shapes"].append(line)
        layout["annotations"].append(label)
    return _figure([_line(t, **style.get(t["kind"], {})) for t in data["traces"]], layout)


def bandwidth_figure(data: ChartData) -> Figure:
    """DRAM bandwidth utilisation against SM activity per GPU, with the 80% line."""
    layout = _base_layout(
        "DRAM bandwidth (solid) vs SM activity (dotted)",
        xaxis=_time_axis(),
        yaxis=dict(PERCENT_AXIS, title={"text": "% of peak"}),
    )
    layout["legend"] = dict(layout["legend"], groupclick="toggleitem")
    groups = sorted({t["group"] for t in data["traces"]}, key=lambda g: (len(g), g))
    traces = []
    for t in data["traces"]:
        color = PALETTE[groups.index(t["group"]) % len(PALETTE)]
        dram = t["kind"] == "dram"
        # Every line in the legend, a GPU's two side by side (grouped; a click hides one line).
        name = t["name"].replace(" (%)", "")
        traces.append(
            _line(
                t,
                name=name,
                line={"color": color, "dash": "solid" if dram else "dot", "width": 1.8},
                legendgroup=t["group"],
                hovertemplate="%{y:.0f}%<extra>" + name + "</extra>",
            )
        )
    line = (data.get("extras") or {}).get("line", BANDWIDTH_BOUND_LINE)
    layout["shapes"].append(_hline(line, "#444"))
    layout["annotations"].append(
        {
            "xref": "paper",
            "x": 1,
            "yref": "y",
            "y": line,
            "yshift": -9,
            "showarrow": False,
            "xanchor": "right",
            "font": {"size": 11, "color": "#444"},
            "bgcolor": "rgba(255,255,255,0.8)",
            "text": f"{line:.0f}%: bandwidth bound above this",
        }
    )
    if not traces:
        layout["annotations"].append(_note("no GPU counters from this exporter"))
    return _figure(traces, layout)


def transfers_figure(data: ChartData) -> Figure:
    """Preemptions/s (right axis) with KV transfer and PCIe bytes/s (left axis): both axes from
    zero, sharing their ticks, each with a floor (noise stays near zero)."""
    style = {
        "preemptions": dict(yaxis="y2", line={"color": "#d62728", "width": 2}),
        "kv_to_gpu": dict(line={"color": "#756bb1", "width": 2}),
        "kv_from_gpu": dict(line={"color": "#bcbddc", "width": 2}),
        "pcie_rx": dict(line={"color": "#3182bd", "dash": "dot", "width": 1.5}),
        "pcie_tx": dict(line={"color": "#9ecae1", "dash": "dot", "width": 1.5}),
    }
    byte_kinds = {"kv_to_gpu", "kv_from_gpu", "pcie_rx", "pcie_tx"}
    layout = _base_layout(
        "Preemptions, KV transfers and PCIe",
        xaxis=_time_axis(),
        yaxis=_ticked(
            {"title": {"text": "bytes/s"}, "exponentformat": "SI"}, _top(data, "y", byte_kinds, PCIE_AXIS_FLOOR)
        ),
        yaxis2=_ticked(_right_axis("preemptions/s"), _top(data, "y2", {"preemptions"}, PREEMPTION_AXIS_FLOOR)),
    )
    return _figure([_line(t, **style.get(t["kind"], {})) for t in data["traces"]], layout)


def itl_kv_figure(data: ChartData) -> Figure:
    """Mean ITL against resident KV (scatter), the ledger's decode floor and the knee."""
    extras = data.get("extras") or {}
    by_tokens = extras.get("x_unit") == "tokens"
    layout = _base_layout(
        "Per-token latency against resident KV",
        xaxis={"title": {"text": "resident KV (tokens)" if by_tokens else "KV cache usage (%)"}, "rangemode": "tozero"},
        yaxis={"title": {"text": "mean inter-token latency (ms)"}, "rangemode": "tozero"},
        hovermode="closest",
        legend={"orientation": "h", "x": 0, "y": -0.3, "yanchor": "top"},
        margin={"l": 60, "r": 60, "t": 40, "b": 70},
    )
    traces = [
        {
            "type": "scatter",
            "x": t["x"],
            "y": t["y"],
            "name": t["name"],
            "mode": "markers",
            "marker": {"size": 5, "color": P95_COLOR, "opacity": 0.6},
        }
        for t in data["traces"]
    ]
    floor = extras.get("floor")
    if floor:
        traces.append(
            {
                "type": "scatter",
                "x": floor["x"],
                "y": floor["y"],
                "name": "decode floor (ledger)",
                "mode": "lines" if floor.get("fit") else "markers",
                "line": {"color": FLOOR_COLOR, "dash": "dash", "width": 2},
                "marker": {"color": FLOOR_COLOR, "size": 8},
            }
        )
    knee = extras.get("knee")
    if knee and knee.get("x") is not None:
        what = "jump" if knee["kind"] == "jump" else "rise"
        layout["shapes"].append(
            {
                "type": "line",
                "xref": "x",
                "x0": knee["x"],
                "x1": knee["x"],
                "yref": "paper",
                "y0": 0,
                "y1": 1,
                "line": {"color": KNEE_COLOR, "dash": "dash", "width": 2},
            }
        )
        layout["annotations"].append(
            {
                "xref": "x",
                "x": knee["x"],
                "yref": "paper",
                "y": 1,
                "showarrow": False,
                "xanchor": "left",
                "text": f" knee ({what})",
                "font": {"color": KNEE_COLOR},
            }
        )
    slo = extras.get("slo_ms")
    if slo:
        line, label = _slo_line(slo, "y")
        layout["shapes"].append(line)
        layout["annotations"].append(label)
    return _figure(traces, layout)


BUILDERS = {
    KV_LATENCY: kv_latency_figure,
    BANDWIDTH: bandwidth_figure,
    TRANSFERS: transfers_figure,
    ITL_KV: itl_kv_figure,
}


def build(chart: str, data: ChartData) -> Figure:
    return BUILDERS[chart](data)


def placeholder_figure(message: str) -> Figure:
    """An empty chart that says why it is empty."""
    layout = _base_layout("", xaxis={"visible": False}, yaxis={"visible": False})
    layout["annotations"].append(_note(message))
    return _figure([], layout)


# --------------------------------------------------------------------------------------- fleet


SPARK_WIDTH, SPARK_HEIGHT = 96, 22


def sparkline_svg(
    values: Sequence[float],
    low: float,
    high: float,
    *,
    line: float | None = None,
    color: str = PALETTE[0],
    width: int = SPARK_WIDTH,
    height: int = SPARK_HEIGHT,
) -> str:
    """A sparkline as SVG text: ``values`` evenly spaced across ``width``, ``low``..``high`` from the
    bottom to the top (values beyond are clipped; the range widens to hold every value when
    ``high`` is too low), gaps where a value is NaN, and ``line`` (e.g. the SLO) as a dashed rule.
    A few hundred bytes (single quotes: nothing to escape in JSON): a page of fifty rows draws a
    hundred of them."""
    finite = [v for v in values if math.isfinite(v)]
    top = max([high, *finite, *([line] if line is not None and math.isfinite(line) else [])])
    span = (top - low) or 1.0
    n = len(values)

    def y(v: float) -> str:
        return f"{round((height - 1) - (min(max(v, low), top) - low) / span * (height - 2))}"

    path: list[str] = []  # whole pixels, and "M x y x y ..." (implied line-to): ~5 bytes a point
    pen_down = False
    for i, v in enumerate(values):
        if not math.isfinite(v):
            pen_down = False
            continue
        path.append(f"{'' if pen_down else 'M'}{round(i * (width - 1) / max(1, n - 1))} {y(v)}")
        pen_down = True
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}'>"]
    if line is not None and math.isfinite(line):
        parts.append(f"<path d='M0 {y(line)}H{width}' stroke='{FLOOR_COLOR}' stroke-dasharray='3 2' fill='none'/>")
    if path:
        parts.append(f"<path d='{' '.join(path)}' stroke='{color}' stroke-width='1.5' fill='none'/>")
    parts.append("</svg>")
    return "".join(parts)
