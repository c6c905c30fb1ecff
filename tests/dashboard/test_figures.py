"""Figure builders: data in, valid Plotly figures and extendData payloads out (no browser)."""

from __future__ import annotations

import json
import math

import numpy as np
import plotly.graph_objects as go
import pytest

from kvdoctor.dashboard import charts, derive, figures
from tests.support.synthetic import SCENARIOS, SyntheticEngine, diagnosis_for


@pytest.fixture(scope="module")
def frame():
    return derive.live_frame(SyntheticEngine(SCENARIOS["thrashing"], t0=1000.0, gpus=8).window(1000.0, 1600.0))


@pytest.fixture(scope="module")
def live(frame):
    """The Live charts' data of a thrashing engine with 8 GPUs."""
    return charts.live_charts(frame, diagnosis_for(SCENARIOS["thrashing"]))


@pytest.mark.parametrize(
    "values, expected",
    [
        ([0.123456, 1234567.0, -0.00098766, 0.0], [0.1235, 1235000.0, -0.0009877, 0.0]),
        ([math.nan, math.inf, 1.0], [None, None, 1.0]),
    ],
)
def test_compact_rounds_to_significant_digits_and_nulls_gaps(values, expected):
    assert charts.compact(values) == expected


def test_compact_prints_short():
    assert json.dumps(charts.compact([0.1 + 0.2, 1e-7 * 3, 123456789.0])) == "[0.3, 3e-07, 123500000.0]"


def test_live_charts_have_the_guides_traces(live):
    names = {c: [t["name"] for t in d["traces"]] for c, d in live.items()}
    assert names[charts.KV_LATENCY] == ["KV cache usage (%)", "ITL p50 (ms)", "ITL p95 (ms)"]
    assert len(names[charts.BANDWIDTH]) == 16  # DRAM and SM for each of 8 GPUs
    assert names[charts.TRANSFERS][0] == "preemptions/s"
    assert live[charts.ITL_KV]["extras"]["x_unit"] == "tokens"
    kv = live[charts.KV_LATENCY]["traces"][0]["y"]
    assert 90 <= max(kv) <= 100  # a percentage, not a ratio


@pytest.mark.parametrize("chart", charts.LIVE_CHARTS)
def test_every_figure_is_valid_plotly(live, chart):
    fig = figures.build(chart, live[chart])
    go.Figure(fig)  # raises on any property Plotly does not know
    assert len(fig["data"]) >= len(live[chart]["traces"])
    json.dumps(fig)  # what Dash sends must be plain JSON


def test_other_figures_are_valid_plotly():
    go.Figure(figures.placeholder_figure("no data"))


def test_knee_is_drawn_where_it_is_and_nothing_on_the_time_chart_looks_like_a_threshold(live):
    scatter = figures.build(charts.ITL_KV, live[charts.ITL_KV])
    assert scatter["layout"]["shapes"][0]["x0"] == pytest.approx(90_000)  # 0.9 x 100k tokens
    assert any("knee (jump)" in a["text"] for a in scatter["layout"]["annotations"])
    kv_fig = figures.build(charts.KV_LATENCY, live[charts.KV_LATENCY])
    # the time chart's one line is the SLO, on the latency axis: no KV level reading as a latency
    assert [sh["yref"] for sh in kv_fig["layout"]["shapes"]] == ["y2"]
    assert not any("knee" in a["text"] for a in kv_fig["layout"]["annotations"])


def test_decode_floor_line_is_fitted_over_the_kv_range(frame, live):
    floor = live[charts.ITL_KV]["extras"]["floor"]
    assert floor["fit"] and floor["x"] == [0.0, 100_000.0]
    # The synthetic floor is (16 GB + tokens x 128 KiB) / 3.35 TB/s.
    assert floor["y"][0] == pytest.approx(16e9 / 3.35e12 * 1000, rel=1e-2)
    assert floor["y"][1] == pytest.approx((16e9 + 1e5 * 131072) / 3.35e12 * 1000, rel=1e-2)


def test_no_floor_without_the_model_shape():
    engine = SyntheticEngine(SCENARIOS["healthy"], t0=0.0, with_floor=False)
    live = charts.live_charts(derive.live_frame(engine.window(0, 60)))
    assert live[charts.ITL_KV]["extras"]["floor"] is None
    assert len(figures.build(charts.ITL_KV, live[charts.ITL_KV])["data"]) == 1


def test_extension_appends_the_same_traces_with_a_cap(frame, live):
    part = charts.live_charts(derive.slice_frame(frame, frame.ts > frame.ts[-3]))
    payload, indices, cap = charts.extension(part[charts.BANDWIDTH], 900)
    assert indices == list(range(16)) and cap == 900
    assert len(payload["x"]) == 16 and all(len(x) == 2 for x in payload["x"])
    assert payload["x"][0] == live[charts.BANDWIDTH]["traces"][0]["x"][-2:]
    assert charts.extension({"traces": [], "extras": {}}, 10) is None


def test_signature_changes_with_what_is_drawn_not_with_new_points(frame):
    diagnosis = diagnosis_for(SCENARIOS["thrashing"])
    whole = charts.live_charts(frame, diagnosis)
    tail = charts.live_charts(derive.slice_frame(frame, frame.ts > frame.ts[-5]), diagnosis)
    for chart in charts.LIVE_CHARTS:
        assert charts.signature(whole[chart]) == charts.signature(tail[chart])
    moved = dict(diagnosis, knee={"kind": "jump", "kv_level": 0.7})
    assert charts.signature(charts.live_charts(frame, moved)[charts.ITL_KV]) != charts.signature(whole[charts.ITL_KV])
    wobble = dict(diagnosis, knee={"kind": "jump", "kv_level": 0.9049})
    assert charts.signature(charts.live_charts(frame, wobble)[charts.ITL_KV]) == charts.signature(whole[charts.ITL_KV])


def test_downsample_caps_points_and_keeps_the_extremes():
    n = 86_400
    x = list(range(0, n * 1000, 1000))
    y = np.sin(np.arange(n) / 500.0)
    y[40_000] = 25.0  # one spike
    y[50_000:50_100] = np.nan  # one gap
    data = {"traces": [{"name": "a", "kind": "p95", "group": "", "x": x, "y": charts.compact(y)}], "extras": {}}
    out = charts.downsample(data, 2000)["traces"][0]
    assert len(out["x"]) <= 2000
    assert 25.0 in out["y"] and None in out["y"]
    assert out["x"] == sorted(out["x"])


def test_traces_share_a_chart_budget():
    x = list(range(0, 10_000_000, 1000))
    traces = [
        {
            "name": str(i),
            "kind": "dram",
            "group": str(i),
            "x": x,
            "y": charts.compact(np.sin(np.arange(len(x)) / 50 + i)),
        }
        for i in range(16)
    ]
    out = charts.downsample({"traces": traces, "extras": {}}, 2000, chart_budget=8000)["traces"]
    assert all(len(t["x"]) <= 500 for t in out)  # 8,000 / 16
    few = charts.downsample({"traces": traces[:2], "extras": {}}, 2000, chart_budget=8000)["traces"]
    assert all(len(t["x"]) <= 2000 and len(t["x"]) > 1500 for t in few)
    many = charts.downsample({"traces": traces * 4, "extras": {}}, 2000, chart_budget=8000)["traces"]
    assert all(len(t["x"]) <= charts.MIN_POINTS_PER_TRACE for t in many)  # never below the floor


def test_scatters_keep_fewer_points(live):
    long = derive.live_frame(SyntheticEngine(SCENARIOS["thrashing"], t0=0.0, gpus=1).window(0.0, 1500.0))
    scatter = charts.live_charts(long)[charts.ITL_KV]
    assert len(scatter["traces"][0]["x"]) > 1400
    cut = charts.downsample(scatter, 2000)["traces"][0]
    assert 10 <= len(cut["x"]) <= charts.MAX_SCATTER_POINTS
    assert max(cut["y"]) == max(scatter["traces"][0]["y"])  # the worst latency is still drawn
    assert charts.extension(scatter, 900)[2] == charts.MAX_SCATTER_POINTS
    assert charts.extension(live[charts.KV_LATENCY], 900)[2] == 900


def test_scatter_thinning_keeps_an_outlier_an_even_sample_drops():
    rng = np.random.default_rng(7)
    x = rng.normal(50_000, 3_000, 4_000)
    y = 20 + 0.0002 * x + rng.normal(0, 1, 4_000)
    y[1_234] = 200.0  # one slow token, once
    x[2_345] = 90_000.0  # the fullest the cache got
    even = np.linspace(0, len(x) - 1, charts.MAX_SCATTER_POINTS).round().astype(int)
    assert 1_234 not in even and 2_345 not in even  # what the even sample used to lose
    keep = charts.thin_scatter(x, y)
    assert 1_234 in keep and 2_345 in keep
    assert {int(np.argmin(x)), int(np.argmin(y))} <= set(keep.tolist())
    assert len(keep) < 600 and list(keep) == sorted(keep)
    # What a cell drops lies under a kept marker: every point is within a cell of one kept.
    cell_x, cell_y = (x.max() - 0) / charts.SCATTER_GRID[0], (y.max() - 0) / charts.SCATTER_GRID[1]
    near = (np.abs(x[:, None] - x[keep][None, :]) <= cell_x) & (np.abs(y[:, None] - y[keep][None, :]) <= cell_y)
    assert near.any(axis=1).all()


def test_scatter_thinning_is_bounded_and_skips_gaps():
    rng = np.random.default_rng(3)
    x, y = rng.uniform(0, 1, 50_000), rng.uniform(0, 1, 50_000)  # a cloud that fills the plot
    keep = charts.thin_scatter(x, y, limit=400)
    assert 100 <= len(keep) <= 400
    x[:10] = np.nan
    assert not set(charts.thin_scatter(x, y).tolist()) & set(range(10))
    assert len(charts.thin_scatter(np.full(100, np.nan), np.ones(100))) == 0
    data = {
        "traces": [{"name": "s", "kind": "itl_points", "group": "", "x": [1.0, None, 2.0], "y": [3.0, 4.0, None]}],
        "extras": {},
    }
    assert charts.downsample(data, 2000)["traces"][0]["x"] == [1.0]


def test_knee_extras_ignores_an_empty_knee():
    assert charts.knee_extras({"knee": {"kind": None, "kv_level": None}}) is None
    assert charts.knee_extras({"knee": None}) is None
    assert charts.knee_extras({"knee": {"kind": "jump", "kv_level": 0.873}}) == {"kind": "jump", "kv_level": 0.88}


# ------------------------------------------------------------------- charts that read at a glance


def _ticks(axis: dict) -> list[float]:
    """Where an axis of the figure puts its ticks, as fractions of its height."""
    low, high = axis["range"]
    assert axis["tickmode"] == "linear" and axis["tick0"] == low == 0
    values = np.arange(0.0, high + 1e-9, axis["dtick"])
    return [round((v - low) / (high - low), 9) for v in values]


def _slo_shapes(fig: dict, yref: str) -> list[dict]:
    return [s for s in fig["layout"]["shapes"] if s["yref"] == yref and s["line"]["color"] == figures.SLO_COLOR]


def test_every_itl_chart_draws_the_published_slo(frame):
    diagnosis = dict(diagnosis_for(SCENARIOS["thrashing"]), context={"slo_seconds": 0.04, "slo_source": "exporter"})
    data = charts.live_charts(frame, diagnosis)
    kv = figures.build(charts.KV_LATENCY, data[charts.KV_LATENCY])
    (line,) = _slo_shapes(kv, "y2")  # on the latency axis, at the SLO
    assert line["y0"] == line["y1"] == pytest.approx(40.0) and (line["x0"], line["x1"]) == (0, 1)
    assert kv["layout"]["yaxis2"]["range"][1] >= 40.0 * charts.SLO_HEADROOM  # the line is in view
    scatter = figures.build(charts.ITL_KV, data[charts.ITL_KV])
    (line,) = _slo_shapes(scatter, "y")
    assert line["y0"] == pytest.approx(40.0)
    for fig in (kv, scatter):
        assert any(a["text"] == "ITL SLO 40 ms" for a in fig["layout"]["annotations"])
    # no published SLO (no diagnosis yet): no line rather than a made-up one
    bare = charts.live_charts(frame, None)
    assert not _slo_shapes(figures.build(charts.KV_LATENCY, bare[charts.KV_LATENCY]), "y2")
    assert not _slo_shapes(figures.build(charts.ITL_KV, bare[charts.ITL_KV]), "y")


@pytest.mark.parametrize("chart", [charts.KV_LATENCY, charts.TRANSFERS])
def test_dual_axes_share_their_ticks_at_round_values(live, chart):
    layout = figures.build(chart, live[chart])["layout"]
    left, right = _ticks(layout["yaxis"]), _ticks(layout["yaxis2"])
    assert left == right and len(left) == charts.TICKS + 1  # the same gridlines serve both axes
    for axis in (layout["yaxis"], layout["yaxis2"]):
        step = axis["dtick"] / 10 ** np.floor(np.log10(axis["dtick"]))
        assert round(step, 6) in (1.0, 2.0, 2.5, 5.0)  # round tick labels
    # every point is under its axis' top: nothing drawn is cut off
    for trace in figures.build(chart, live[chart])["data"]:
        axis = layout["yaxis2" if trace.get("yaxis") == "y2" else "yaxis"]
        assert max((v for v in trace["y"] if v is not None), default=0) <= axis["range"][1]


def test_the_pcie_axis_has_a_floor_so_noise_stays_flat(frame):
    data = charts.live_charts(frame)[charts.TRANSFERS]
    for trace in data["traces"]:  # a quiet engine: a few MB/s of PCIe noise, no preemption
        trace["y"] = [None if v is None else (5e6 if trace["kind"] != "preemptions" else 0.01) for v in trace["y"]]
    data["extras"].pop("axes")  # made from the traces themselves
    layout = figures.build(charts.TRANSFERS, data)["layout"]
    assert layout["yaxis"]["range"][1] >= charts.PCIE_AXIS_FLOOR  # 5 MB/s is 0.5% of the height, not all of it
    assert layout["yaxis2"]["range"][1] >= charts.PREEMPTION_AXIS_FLOOR
    assert charts.nice_top(5e6, charts.PCIE_AXIS_FLOOR) == charts.PCIE_AXIS_FLOOR
    assert charts.nice_top(37.0, 1.0) == 50.0 and charts.nice_top(12.0, 1.0) == 12.5 and charts.nice_top(0, 1) == 1


@pytest.mark.parametrize("chart", charts.LIVE_CHARTS)
def test_every_trace_has_a_legend_entry(live, chart):
    fig = figures.build(chart, live[chart])
    for trace in fig["data"]:
        assert trace.get("showlegend", True) and trace["name"], trace["name"]
    if chart == charts.BANDWIDTH:
        names = [t["name"] for t in fig["data"]]
        assert names[:2] == ["GPU 0 DRAM bandwidth", "GPU 0 SM activity"] and len(set(names)) == 16


def test_a_point_above_an_axis_rebuilds_the_chart(frame):
    whole = charts.live_charts(frame, diagnosis_for(SCENARIOS["thrashing"]))
    drawn = charts.axis_tops(whole)
    tail = charts.live_charts(derive.slice_frame(frame, frame.ts > frame.ts[-5]), diagnosis_for(SCENARIOS["thrashing"]))
    assert not charts.exceeds(charts.axis_tops(tail), drawn)  # new points under the tops: append
    higher = {charts.KV_LATENCY: {"y2": drawn[charts.KV_LATENCY]["y2"] * 2}}
    assert charts.exceeds(higher, drawn)  # a slower token than the axis holds: rebuild


def test_the_bandwidth_line_is_the_trees_own_threshold():
    """The chart's "bandwidth bound above this" line and the tree read one value: the threshold
    the diagnosis compared DRAM bandwidth with, else the tree's default."""
    from kvdoctor.rules.thresholds import Thresholds

    default = Thresholds().bandwidth_high_ratio * 100
    assert charts.bandwidth_line(None) == default
    custom = {"evidence": [{"feature": "dram_bandwidth_ratio", "threshold": 0.7, "value": 0.75}]}
    assert charts.bandwidth_line(custom) == pytest.approx(70)
    beside = {"evidence": [], "differential": [{"evidence": [{"feature": "dram_bandwidth_ratio", "threshold": 0.9}]}]}
    assert charts.bandwidth_line(beside) == pytest.approx(90)
    figure = figures.build(charts.BANDWIDTH, {"traces": [], "extras": {"line": charts.bandwidth_line(custom)}})
    layout = figure["layout"] if isinstance(figure, dict) else figure.layout
    texts = [a["text"] for a in layout["annotations"]]
    assert "70%: bandwidth bound above this" in texts
