"""Plotly figures from the charts' data (``charts.ChartData``): data in, figure out. No Dash, no I/O.

Figures are plain dicts (``{"data": [...], "layout": {...}}``), which dcc.Graph takes as they are:
building plotly.graph_objects validates every point and costs ~100x more for the same JSON.
The unit tests check every builder's output against Plotly's schema with go.Figure(fig).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvdoctor.dashboard.charts import BANDWIDTH, BANDWIDTH_BOUND_LINE, ITL_KV, KV_LATENCY, TRANSFERS, ChartData

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
P50_COLOR, P95_COLOR, FLOOR_COLOR, KNEE_COLOR = "#31a354", "#e6550d", "#636363", "#d62728"

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
    """KV usage (%) and ITL p50/p95 (ms) on one time axis, two y axes; the knee as a KV line."""
    style = {
        "kv": dict(
            yaxis="y", line={"color": "#3182bd", "width": 1.5}, fill="tozeroy", fillcolor="rgba(158,202,225,0.35)"
        ),
        "p50": dict(yaxis="y2", line={"color": P50_COLOR, "width": 2}),
        "p95": dict(yaxis="y2", line={"color": P95_COLOR, "width": 2}),
    }
    layout = _base_layout(
        "KV cache usage and per-token latency",
        xaxis=_time_axis(),
        yaxis={"title": {"text": "KV cache usage (%)"}, "range": [0, 105]},
        yaxis2=_right_axis("inter-token latency (ms)"),
    )
    knee = (data.get("extras") or {}).get("knee")
    if knee:
        level = knee["kv_level"] * 100.0
        what = "latency jumps" if knee["kind"] == "jump" else "latency rises with KV"
        layout["shapes"].append(_hline(level, KNEE_COLOR))
        layout["annotations"].append(
            {
                "xref": "paper",
                "x": 0.99,
                "yref": "y",
                "y": level,
                "yshift": -12,
                "showarrow": False,
                "xanchor": "right",
                "font": {"color": KNEE_COLOR},
                "bgcolor": "rgba(255,255,255,0.8)",
                "text": f"knee: {what} at {level:.0f}% KV",
            }
        )
    return _figure([_line(t, **style.get(t["kind"], {})) for t in data["traces"]], layout)


def bandwidth_figure(data: ChartData) -> Figure:
    """DRAM bandwidth utilisation against SM activity per GPU, with the 80% line."""
    layout = _base_layout(
        "DRAM bandwidth (solid) vs SM activity (dotted)",
        xaxis=_time_axis(),
        yaxis={"title": {"text": "% of peak"}, "range": [0, 105]},
    )
    groups = sorted({t["group"] for t in data["traces"]}, key=lambda g: (len(g), g))
    traces = []
    for t in data["traces"]:
        color = PALETTE[groups.index(t["group"]) % len(PALETTE)]
        dram = t["kind"] == "dram"
        # One legend entry per GPU (its DRAM line); clicking it hides both of the GPU's lines.
        traces.append(
            _line(
                t,
                line={"color": color, "dash": "solid" if dram else "dot", "width": 1.8},
                legendgroup=t["group"],
                showlegend=dram,
                hovertemplate="%{y:.0f}%<extra>" + t["name"].replace(" (%)", "") + "</extra>",
            )
        )
        if dram:
            traces[-1]["name"] = f"GPU {t['group']}"
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
    """Preemptions/s (right axis) with KV transfer and PCIe bytes/s (left axis)."""
    style = {
        "preemptions": dict(yaxis="y2", line={"color": "#d62728", "width": 2}),
        "kv_to_gpu": dict(line={"color": "#756bb1", "width": 2}),
        "kv_from_gpu": dict(line={"color": "#bcbddc", "width": 2}),
        "pcie_rx": dict(line={"color": "#3182bd", "dash": "dot", "width": 1.5}),
        "pcie_tx": dict(line={"color": "#9ecae1", "dash": "dot", "width": 1.5}),
    }
    layout = _base_layout(
        "Preemptions, KV transfers and PCIe",
        xaxis=_time_axis(),
        yaxis={"title": {"text": "bytes/s"}, "rangemode": "tozero", "exponentformat": "SI"},
        yaxis2=_right_axis("preemptions/s"),
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


def fleet_history_figure(
    title: str, unit: str, series: list[dict], x_range: tuple[float, float] | None = None
) -> Figure:
    """One line per target over the picked range: ``series`` = [{"name", "x" (ms), "y"}];
    ``x_range`` (Unix seconds) shows the whole picked range even where there is no data."""
    xaxis = _time_axis()
    if x_range:
        xaxis["range"] = [x_range[0] * 1000.0, x_range[1] * 1000.0]
    layout = _base_layout(title, xaxis=xaxis, yaxis={"title": {"text": unit}, "rangemode": "tozero"})
    traces = [_line(s, line={"color": PALETTE[i % len(PALETTE)], "width": 1.6}) for i, s in enumerate(series)]
    if not series:
        layout["annotations"].append(_note("no data in this range"))
    return _figure(traces, layout)
