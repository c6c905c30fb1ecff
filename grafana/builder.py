"""The Grafana dashboard, built with grafana-foundation-sdk from the queries of ``grafana/queries.py``.

``render_dashboard`` is the JSON ``kvdoctor grafana export`` writes, for the rule file ``kvdoctor
rules export`` makes from the same arguments (thresholds, SLO, scrape interval); the committed copy
is ``grafana/kvdoctor-dashboard.json`` (the Helm chart ships it as a ConfigMap for the Grafana
sidecar). Layout, top to bottom: the verdict (now, over time, firing alerts); KV usage and ITL
against the SLO; DRAM bandwidth against SM activity, preemptions and PCIe; the queue and the
prefix-cache hits by tier.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, ParamSpec, TypeVar

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus as pb
from grafana_foundation_sdk.builders import statetimeline, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm

from kvdoctor.rules import verdicts as catalogue
from kvdoctor.rules.alert_specs import RUNBOOK_BASE_URL
from kvdoctor.rules.links import browsable, runbook_url
from kvdoctor.rules.promql import duration, rule_thresholds
from kvdoctor.rules.thresholds import DEFAULT_SLO_SECONDS, Thresholds
from kvdoctor.rules.verdicts import VERDICTS
from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.units import RATIO

from . import queries as q
from .queries import Query

P = ParamSpec("P")
R = TypeVar("R")

UID = "kvdoctor"
TITLE = "kvdoctor: KV cache and decode latency"
DATASOURCE_VARIABLE = "datasource"
DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid=f"${{{DATASOURCE_VARIABLE}}}")
REF_IDS = "ABCDEFGH"

THRESHOLD_COLOUR = "red"


def verdict_colour(verdict: str) -> str:
    """A verdict's colour on the verdict panels: the catalogue's (rules/verdicts.py)."""
    return catalogue.verdict(verdict).colour


def _value_map(entries: dict[str, tuple[str, str]]) -> dm.ValueMap:
    """Grafana value mappings: raw value -> (text shown, colour)."""
    return dm.ValueMap(
        options={
            value: dm.ValueMappingResult(text=text, color=colour, index=i)
            for i, (value, (text, colour)) in enumerate(entries.items())
        }
    )


def _target(query: Query, ref: str, *, instant: bool = False) -> pb.Dataquery:
    target = pb.Dataquery().expr(query.expr).legend_format(query.legend).ref_id(ref).datasource(DATASOURCE)
    if instant:
        return target.instant().format(pm.PromQueryFormat.TABLE)
    return target.range()


def _threshold_line(value: float) -> list[dm.DynamicConfigValue]:
    """A dashed line at the tree's threshold, drawn on the axis of the query it is set on."""
    steps = [dm.Threshold(color="transparent", value=None), dm.Threshold(color=THRESHOLD_COLOUR, value=value)]
    return [
        dm.DynamicConfigValue("thresholds", dm.ThresholdsConfig(mode=dm.ThresholdsMode.ABSOLUTE, steps=steps)),
        dm.DynamicConfigValue("custom.thresholdsStyle", {"mode": common.GraphTresholdsStyleMode.DASHED.value}),
    ]


def _axis(unit: str, side: Sequence[Query]) -> dict[str, Any]:
    """Unit and range of one y axis: ratios 0..100%; other units from 0, at least up to the
    largest threshold drawn on it (so noise well under a threshold does not fill the panel)."""
    units = {query.unit for query in side}
    if len(units) != 1:
        raise ValueError(f"queries on one axis must share a unit, got {sorted(units)}")
    axis: dict[str, Any] = {"unit": q.grafana_unit(unit), "min": 0}
    if unit == RATIO:
        axis["max"] = 1
    else:
        limits = [query.threshold for query in side if query.threshold is not None]
        if limits:
            axis["custom.axisSoftMax"] = max(limits)
    return axis


def series_panel(
    title: str,
    description: str,
    left: Sequence[Query],
    right: Sequence[Query] = (),
    *,
    left_label: str = "",
    right_label: str = "",
    stacked: bool = False,
    slo: Query | None = None,
    width: int = 12,
    height: int = 9,
) -> timeseries.Panel:
    """A time series panel: ``left`` queries on the left axis, ``right`` (and the SLO line) on the
    right one; a dashed line at each query's threshold; ``stacked`` stacks the left queries."""
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .span(width)
        .height(height)
        .line_width(1)
        .fill_opacity(10 if not stacked else 40)
        .show_points(common.VisibilityMode.NEVER)
        .span_nulls(False)
        .legend(
            cb.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.TABLE)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs(["lastNotNull", "max"])
            .sort_by("Max")
            .sort_desc(True)
        )
        .tooltip(cb.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI).sort(common.SortOrder.DESCENDING))
    )
    left_axis = _axis(left[0].unit, left)
    panel.unit(left_axis["unit"]).min(left_axis["min"])
    if "max" in left_axis:
        panel.max(left_axis["max"])
    if "custom.axisSoftMax" in left_axis:
        panel.axis_soft_max(left_axis["custom.axisSoftMax"])
    if left_label:
        panel.axis_label(left_label)
    if stacked:
        panel.stacking(cb.StackingConfig().mode(common.StackingMode.NORMAL).group("A"))

    on_right = [*right, *([slo] if slo else [])]
    right_axis = _axis(on_right[0].unit, on_right) if on_right else {}
    shown = [*left, *on_right]
    if len(shown) > len(REF_IDS):
        raise ValueError(f"at most {len(REF_IDS)} queries in a panel, got {len(shown)}")
    for index, (ref, query) in enumerate(zip(REF_IDS, shown, strict=False)):
        panel.with_target(_target(query, ref))
        properties: list[dm.DynamicConfigValue] = []
        if index >= len(left):
            properties += [dm.DynamicConfigValue("custom.axisPlacement", common.AxisPlacement.RIGHT.value)]
            properties += [dm.DynamicConfigValue(key, value) for key, value in right_axis.items()]
            properties += [dm.DynamicConfigValue("custom.axisLabel", right_label)] if right_label else []
            if stacked:
                properties += [dm.DynamicConfigValue("custom.stacking", {"mode": "none", "group": "A"})]
        if slo is not None and index == len(shown) - 1:
            properties += [
                dm.DynamicConfigValue("color", {"mode": "fixed", "fixedColor": THRESHOLD_COLOUR}),
                dm.DynamicConfigValue("custom.lineStyle", {"fill": "dash", "dash": [10, 10]}),
                dm.DynamicConfigValue("custom.lineWidth", 2),
                dm.DynamicConfigValue("custom.fillOpacity", 0),
            ]
        if query.threshold is not None:
            properties += _threshold_line(query.threshold)
        if properties:
            panel.override_by_query(ref, properties)
    return panel


# ------------------------------------------------------------------------------------ panels


def verdict_now_panel() -> table.Panel:
    verdicts = _value_map({v: (catalogue.title(v), verdict_colour(v)) for v in VERDICTS})
    return (
        table.Panel()
        .show_header(True)
        .title("Verdict now")
        .description(f"The verdict each pod's kvdoctor exporter diagnoses now ({S.DIAGNOSIS_VERDICT}).")
        .datasource(DATASOURCE)
        .span(8)
        .height(8)
        .with_target(_target(q.verdict_now(), "A", instant=True))
        .with_transformation(
            dm.DataTransformerConfig(
                id_val="filterFieldsByName", options={"include": {"names": ["namespace", "pod", "verdict"]}}
            )
        )
        .sort_by([cb.TableSortByFieldState().display_name("pod")])
        .no_value("no kvdoctor exporter in the selection")
        .override_by_name(
            "verdict",
            [
                dm.DynamicConfigValue("mappings", [verdicts]),
                dm.DynamicConfigValue("custom.cellOptions", {"type": "color-background"}),
            ],
        )
    )


def verdict_history_panel() -> statetimeline.Panel:
    codes = _value_map({str(catalogue.verdict_code(v)): (catalogue.title(v), verdict_colour(v)) for v in VERDICTS})
    return (
        statetimeline.Panel()
        .title("Verdict over time")
        .description("Each pod's verdict over time; the tree's first matching branch wins.")
        .datasource(DATASOURCE)
        .span(16)
        .height(8)
        .with_target(_target(q.verdict_history(), "A"))
        .mappings([codes])
        .color_scheme(db.FieldColor().mode(dm.FieldColorModeId.THRESHOLDS))
        .thresholds(db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps([dm.Threshold(color="text")]))
        .show_value(common.VisibilityMode.AUTO)
        .merge_values(True)
        .fill_opacity(80)
        .legend(cb.VizLegendOptions().show_legend(False).display_mode(common.LegendDisplayMode.HIDDEN))
    )


def firing_alerts_panel(runbook_base_url: str | None = None) -> table.Panel:
    alert_severities = (catalogue.CRITICAL, catalogue.WARNING, catalogue.INFO)
    severities = _value_map({s: (s, catalogue.SEVERITY_COLOURS[s]) for s in alert_severities})
    columns = ["alertname", "severity", "namespace", "pod", "model_name", "source"]
    where = runbook_url(runbook_base_url or RUNBOOK_BASE_URL, "<alert>")
    panel = (
        table.Panel()
        .show_header(True)
        .title("Firing kvdoctor alerts")
        .description(
            f"kvdoctor's alerts firing now (the PrometheusRule compiled from the same tree). Runbooks: {where}."
        )
        .datasource(DATASOURCE)
        .span(24)
        .height(6)
        .with_target(_target(q.firing_alerts(), "A", instant=True))
        .with_transformation(
            dm.DataTransformerConfig(id_val="filterFieldsByName", options={"include": {"names": columns}})
        )
        .no_value("no kvdoctor alert firing")
        .override_by_name(
            "severity",
            [
                dm.DynamicConfigValue("mappings", [severities]),
                dm.DynamicConfigValue("custom.cellOptions", {"type": "color-text"}),
            ],
        )
    )
    if runbook_base_url and browsable(runbook_base_url):
        runbook = {"title": "Runbook", "url": runbook_url(runbook_base_url, "${__value.raw}"), "targetBlank": True}
        panel.override_by_name("alertname", [dm.DynamicConfigValue("links", [runbook])])
    return panel


def build_dashboard(
    thresholds: Thresholds | None = None,
    slo_seconds: float = DEFAULT_SLO_SECONDS,
    scrape_interval_seconds: float | None = None,
    runbook_base_url: str | None = None,
) -> dm.Dashboard:
    """The dashboard as the SDK's model, for the rule file ``kvdoctor rules export`` makes from the
    same arguments: ``thresholds`` sized for the scrape interval as the rules are (their recorded
    series), ``slo_seconds`` where a pod publishes no SLO; runbook links where the base is a URL."""
    t = rule_thresholds(thresholds, scrape_interval_seconds)
    itl = q.itl_legend(t)
    window = duration(t.window_seconds)
    recent = duration(min(t.state_window_seconds, t.window_seconds))
    every = dm.VariableOption(selected=True, text=["All"], value=["$__all"])

    def picker(label: str) -> db.QueryVariable:
        return (
            db.QueryVariable(label)
            .label(label.capitalize())
            .datasource(DATASOURCE)
            .query(q.template_query(label))
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(dm.VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(".*")
            .current(every)
        )

    board = (
        db.Dashboard(TITLE)
        .uid(UID)
        .description(
            f"Generated by `kvdoctor grafana export` from kvdoctor's rules (window {window}, "
            f"default ITL SLO {slo_seconds * 1000:g} ms); do not edit. Needs the kvdoctor PrometheusRule "
            "(its recorded features) and the exporters' series."
        )
        .tags(["kvdoctor", "llm-serving", "kv-cache"])
        .time("now-1h", "now")
        .refresh("30s")
        .timezone("browser")
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .with_variable(db.DatasourceVariable(DATASOURCE_VARIABLE).label("Data source").type("prometheus"))
        .with_variable(picker(q.NAMESPACE))
        .with_variable(picker(q.POD))
    )
    if runbook_base_url and browsable(runbook_base_url):
        board.link(
            db.DashboardLink("Runbooks").type(dm.DashboardLinkType.LINK).url(runbook_base_url).target_blank(True)
        )
    board.with_row(db.Row("Verdict"))
    board.with_panel(verdict_now_panel()).with_panel(verdict_history_panel())
    board.with_panel(firing_alerts_panel(runbook_base_url))

    board.with_row(db.Row("KV cache and decode latency"))
    board.with_panel(
        series_panel(
            f"KV-cache usage and {itl} vs the SLO",
            f"KV-cache usage (p{t.kv_usage_quantile * 100:g} over the last {recent}; dashed: the ceiling "
            f"{t.kv_ceiling_ratio:.0%}) on the left; {itl} on the right against the SLO the exporter "
            f"publishes ({S.ITL_SLO}), else the rules' default.",
            [q.kv_usage(t)],
            [q.itl(t)],
            left_label="KV usage",
            right_label=itl,
            slo=q.itl_slo(slo_seconds),
            width=24,
        )
    )

    board.with_row(db.Row("GPU"))
    board.with_panel(
        series_panel(
            "DRAM bandwidth vs SM activity",
            f"Median over the last {recent}, busiest GPU of the pod; GPM or DCGM counters only (NVML's duty "
            "cycles are not bandwidth). Bandwidth high and SM not clearly above it: memory-bandwidth bound.",
            [q.dram_bandwidth(t), q.sm_active(t)],
        )
    )
    board.with_panel(
        series_panel(
            "Preemptions and PCIe",
            f"Preemptions per minute over {window} (left); PCIe receive (median, busiest GPU) and KV moved "
            "into the GPU from another tier (right). Dashed: the thresholds of KVCacheThrashing and KVCacheTierMiss.",
            [q.preemptions(t)],
            [q.pcie_receive(t), q.kv_into_gpu(t)],
            left_label="preemptions / min",
        )
    )

    board.with_row(db.Row("Queue and prefix cache"))
    board.with_panel(
        series_panel(
            "Queue: running and waiting",
            f"Requests in the running batch and waiting (medians over the last {recent}).",
            [q.requests_running(t), q.requests_waiting(t)],
            left_label="requests",
        )
    )
    board.with_panel(
        series_panel(
            "Prefix-cache hits by tier",
            f"Prefix-cache hit tokens per second by the tier that served them (stacked); the share served off "
            f"the GPU over {window} on the right.",
            [q.prefix_hits_by_tier()],
            [q.slow_tier_share(t)],
            left_label="tokens / s",
            stacked=True,
        )
    )
    model = board.build()
    for number, panel in enumerate(model.panels or [], start=1):
        panel.id_val = number
    return model


def _of_the_built(
    build: Callable[P, dm.Dashboard],
) -> Callable[[Callable[[dm.Dashboard], R]], Callable[P, R]]:
    """A conversion of the dashboard as a function of ``build``'s arguments: built, then converted."""

    def decorate(convert: Callable[[dm.Dashboard], R]) -> Callable[P, R]:
        def converted(*args: P.args, **kwargs: P.kwargs) -> R:
            return convert(build(*args, **kwargs))

        converted.__name__ = converted.__qualname__ = convert.__name__
        converted.__doc__ = convert.__doc__
        return converted

    return decorate


@_of_the_built(build_dashboard)
def dashboard_dict(model: dm.Dashboard) -> dict[str, Any]:
    """The dashboard as plain JSON data (takes the arguments of ``build_dashboard``)."""
    return _plain(model)


def _plain(model: dm.Dashboard) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(json.dumps(model, cls=JSONEncoder))
    return data


@_of_the_built(build_dashboard)
def render_dashboard(model: dm.Dashboard) -> str:
    """The dashboard's JSON text, as ``kvdoctor grafana export`` writes it (stable: keys sorted); takes
    the arguments of ``build_dashboard``."""
    return json.dumps(_plain(model), indent=2, sort_keys=True) + "\n"
