"""The generated Grafana dashboard: the committed copy is current, the JSON is the SDK's model (it
decodes into grafana-foundation-sdk's classes and back unchanged), and what it shows comes from the
rules: the verdicts of the tree, the alerts of the rule file, its recorded series and thresholds."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest
import yaml
from grafana_foundation_sdk.cog import runtime as cogruntime
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm

from kvdoctor.grafana import builder, queries
from kvdoctor.rules import alert_specs, promql, rule_file, verdicts
from kvdoctor.rules.thresholds import DEFAULT_SLO_SECONDS, Thresholds
from kvdoctor.rules.verdicts import VERDICTS
from kvdoctor.signals import vocabulary as S
from tests.grafana import board as B
from tests.support.tools import ROOT

RULES_FILE = ROOT / "rules" / "alerts.yaml"
# The thresholds the committed rule file is compiled with (sized for the default scrape interval).
RULE_THRESHOLDS = promql.rule_thresholds(None, None)


@pytest.fixture(scope="module", autouse=True)
def sdk_plugins() -> None:
    """The SDK decodes panel options and queries into typed models only with its plugins registered."""
    register_default_plugins()


def round_trip(data: dict[str, Any]) -> dict[str, Any]:
    decoded: dict[str, Any] = json.loads(json.dumps(dm.Dashboard.from_json(data), cls=JSONEncoder))
    return decoded


def by_title(board: dict[str, Any], title: str) -> dict[str, Any]:
    (panel,) = [p for p in B.panels(board) if p["title"] == title]
    return panel


# ------------------------------------------------------------------------- the committed copy


def test_committed_dashboard_is_regenerated_unchanged():
    assert B.COMMITTED.read_text() == builder.render_dashboard(), (
        "grafana/kvdoctor-dashboard.json is stale: run `kvdoctor grafana export -o grafana/kvdoctor-dashboard.json`"
    )


def test_the_chart_ships_the_committed_copy_through_a_symlink():
    assert B.CHART_COPY.is_symlink(), "the chart must not hold a copy of the dashboard"
    assert B.CHART_COPY.resolve() == B.COMMITTED.resolve()


# ---------------------------------------------------------------------------- the SDK's model


def test_the_dashboard_decodes_into_the_sdk_model_and_back_unchanged():
    board = B.load()
    assert round_trip(board) == board


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda b: b.update(pannels=b.pop("panels")),
        lambda b: B.panels(b)[0].update(gridPosition={"x": 0}),
        lambda b: B.panels(b)[3]["options"]["legend"].update(placement_="bottom"),
        lambda b: B.panels(b)[3]["targets"][0].update(expression="up"),
        lambda b: B.panels(b)[3]["fieldConfig"]["defaults"]["custom"].update(lineWdth=1),
    ],
    ids=["dashboard key", "panel key", "option", "query field", "field config"],
)
def test_the_round_trip_loses_what_the_model_does_not_know(corrupt):
    board = B.load()
    corrupt(board)
    assert round_trip(board) != board


def test_every_panel_and_query_decodes_into_its_typed_model():
    model = dm.Dashboard.from_json(B.load())
    shown = [p for p in model.panels or [] if isinstance(p, dm.Panel)]
    assert {p.type_val for p in shown} == {"table", "state-timeline", "timeseries"}
    for panel in shown:
        assert not isinstance(panel.options, dict), f"{panel.title}: options not of the {panel.type_val} model"
        assert panel.targets and all(isinstance(t, pm.Dataquery) for t in panel.targets), panel.title
        assert panel.datasource is not None and panel.datasource.uid == "${datasource}", panel.title
        custom = panel.field_config.defaults.custom if panel.field_config and panel.field_config.defaults else None
        if panel.type_val != "table":
            assert custom is not None and not isinstance(custom, dict), f"{panel.title}: field config not typed"


def _custom_field_model(panel_type: str) -> Any:
    config = cogruntime.panelcfg_config(panel_type)
    if config is not None and config.field_config_from_json_hook is not None:
        return config.field_config_from_json_hook
    assert panel_type == "table"
    return common.TableFieldOptions.from_json


def contains(decoded: Any, given: Any) -> bool:
    """``given`` is in ``decoded``: the model may add its defaults, never drop or change a value."""
    if isinstance(given, dict):
        return isinstance(decoded, dict) and all(k in decoded and contains(decoded[k], v) for k, v in given.items())
    if isinstance(given, list):
        return isinstance(decoded, list) and len(decoded) == len(given) and all(map(contains, decoded, given))
    return bool(decoded == given)


def test_every_override_sets_a_field_option_the_model_knows():
    """Overrides are untyped in the model: each property is checked against the panel's field model."""
    for panel in B.panels(B.load()):
        custom_from_json = _custom_field_model(panel["type"])
        refs = {t["refId"] for t in panel["targets"]}
        for override in panel["fieldConfig"]["overrides"]:
            matcher = override["matcher"]
            assert matcher["id"] in ("byFrameRefID", "byName"), matcher
            if matcher["id"] == "byFrameRefID":
                assert matcher["options"] in refs, f"{panel['title']}: override for a query it lacks: {matcher}"
            for prop in override["properties"]:
                key, value = prop["id"], prop["value"]
                if key.startswith("custom."):
                    field = {key.removeprefix("custom."): value}
                    decoded = json.loads(json.dumps(custom_from_json(field), cls=JSONEncoder))
                else:
                    field = {key: value}
                    decoded = json.loads(json.dumps(dm.FieldConfig.from_json(field), cls=JSONEncoder))
                assert contains(decoded, field), f"{panel['title']}: {key}={value!r} is not a field option"


def test_panels_tile_the_grid_without_overlapping():
    board = B.load()
    cells: dict[tuple[int, int], str] = {}
    for panel in board["panels"]:
        g = panel["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, panel["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]
    ids = [p["id"] for p in board["panels"]]
    assert len(set(ids)) == len(ids)


# ------------------------------------------------------------------- variables and selectors


def test_datasource_namespace_and_pod_variables():
    variables = B.variables(B.load())
    assert list(variables) == ["datasource", "namespace", "pod"]
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name in ("namespace", "pod"):
        v = variables[name]
        assert v["type"] == "query" and v["multi"] and v["includeAll"] and v["allValue"] == ".*"
        assert v["datasource"]["uid"] == "${datasource}"
        series, label = B.label_values_query(v["query"])
        assert label == name and series.startswith(queries.INVENTORY_SIGNAL)
    assert '$namespace"' in variables["pod"]["query"], "the pod list follows the namespaces chosen"


def test_every_query_is_scoped_to_the_chosen_namespaces_and_pods():
    for t in B.targets(B.load()):
        selectors = re.findall(r"\b(ALERTS|kvdoctor[:_][a-z0-9_:]+)\{([^}]*)\}", t.expr)
        assert selectors, f"{t.panel}/{t.ref}: no selector in {t.expr!r}"
        for name, matchers in selectors:
            assert 'namespace=~"$namespace"' in matchers and 'pod=~"$pod"' in matchers, (t.panel, name)


# ------------------------------------------------------------------- made from the rules


def test_the_panels():
    titles = [p["title"] for p in B.panels(B.load())]
    assert titles == [
        "Verdict now",
        "Verdict over time",
        "Firing kvdoctor alerts",
        "KV-cache usage and ITL p95 vs the SLO",
        "DRAM bandwidth vs SM activity",
        "Preemptions and PCIe",
        "Queue: running and waiting",
        "Prefix-cache hits by tier",
    ]


def test_every_recorded_series_a_panel_reads_is_recorded_by_the_rule_file():
    recorded = {
        r["record"] for g in yaml.safe_load(RULES_FILE.read_text())["groups"] for r in g["rules"] if "record" in r
    }
    used = _recorded_names(B.load())
    assert len(used) >= 10
    assert used <= recorded, f"panels read series the rules do not record: {sorted(used - recorded)}"


def test_the_verdict_timeline_maps_every_verdict_of_the_tree():
    panel = by_title(B.load(), "Verdict over time")
    (mapping,) = panel["fieldConfig"]["defaults"]["mappings"]
    assert {int(code): m["text"] for code, m in mapping["options"].items()} == {
        verdicts.verdict_code(v): verdicts.title(v) for v in VERDICTS
    }
    expr = panel["targets"][0]["expr"]
    for verdict in VERDICTS:
        assert f'verdict="{verdict}"}} == 1) * 0 + {verdicts.verdict_code(verdict)}' in expr
    assert mapping["options"][str(verdicts.verdict_code("healthy"))]["color"] == "green"
    assert mapping["options"][str(verdicts.verdict_code("kv_thrashing"))]["color"] == "red"


def test_the_alerts_table_lists_every_kvdoctor_alert():
    panel = by_title(B.load(), "Firing kvdoctor alerts")
    expr = panel["targets"][0]["expr"]
    names = re.search(r'alertname=~"([^"]+)"', expr).group(1).split("|")
    rule_alerts = [
        r["alert"] for g in yaml.safe_load(RULES_FILE.read_text())["groups"] for r in g["rules"] if "alert" in r
    ]
    assert sorted(names) == sorted(rule_alerts)
    assert 'alertstate="firing"' in expr and panel["targets"][0]["instant"]


def test_runbook_links_where_the_runbooks_are_browsable():
    def links(board):
        panel = by_title(board, "Firing kvdoctor alerts")
        found = [o for o in panel["fieldConfig"]["overrides"] if o["matcher"]["options"] == "alertname"]
        return found[0]["properties"][0]["value"] if found else None, board.get("links") or []

    # the default base is a path in the repository: no link a browser could follow from Grafana
    assert links(B.load()) == (None, [])
    assert alert_specs.RUNBOOK_BASE_URL + "<alert>.md" in by_title(B.load(), "Firing kvdoctor alerts")["description"]
    base = "https://git.example.com/kvdoctor/docs/runbooks/"
    row, board = links(builder.dashboard_dict(runbook_base_url=base))
    assert row == [{"targetBlank": True, "title": "Runbook", "url": base + "${__value.raw}.md"}]
    assert [link["url"] for link in board] == [base]


def _override(panel: dict[str, Any], ref: str, key: str) -> Any:
    for o in panel["fieldConfig"]["overrides"]:
        if o["matcher"] == {"id": "byFrameRefID", "options": ref}:
            for prop in o["properties"]:
                if prop["id"] == key:
                    return prop["value"]
    return None


def _threshold(panel: dict[str, Any], ref: str) -> float | None:
    steps = (_override(panel, ref, "thresholds") or {}).get("steps", [])
    return steps[-1]["value"] if steps else None


def test_kv_usage_and_itl_share_a_panel_with_the_slo_line():
    panel = by_title(B.load(), "KV-cache usage and ITL p95 vs the SLO")
    kv, itl, slo = panel["targets"]
    assert kv["expr"].startswith(promql.record_name("kv_usage", RULE_THRESHOLDS) + "{")
    assert itl["expr"].startswith(promql.record_name("itl_p95_seconds", RULE_THRESHOLDS) + "{")
    assert slo["expr"] == (
        f'min({S.ITL_SLO}{{namespace=~"$namespace", pod=~"$pod"}}) or vector({DEFAULT_SLO_SECONDS!r})'
    )
    defaults = panel["fieldConfig"]["defaults"]
    assert (defaults["unit"], defaults["min"], defaults["max"]) == ("percentunit", 0, 1)
    for ref in (itl["refId"], slo["refId"]):
        assert _override(panel, ref, "custom.axisPlacement") == "right" and _override(panel, ref, "unit") == "s"
    assert _threshold(panel, kv["refId"]) == Thresholds().kv_ceiling_ratio
    assert _override(panel, slo["refId"], "custom.lineStyle")["fill"] == "dash"


def test_thresholds_are_the_trees_and_axes_start_at_zero():
    t = RULE_THRESHOLDS
    board = B.load()
    expected = {
        ("DRAM bandwidth vs SM activity", "A"): t.bandwidth_high_ratio,
        ("DRAM bandwidth vs SM activity", "B"): t.sm_high_ratio,
        ("Preemptions and PCIe", "A"): t.preemptions_per_minute,
        ("Preemptions and PCIe", "B"): t.pcie_receive_bytes_per_second_min,
        ("Preemptions and PCIe", "C"): t.kv_to_gpu_bytes_per_second_min,
        ("Queue: running and waiting", "B"): t.queue_waiting_min,
        ("Prefix-cache hits by tier", "B"): t.slow_tier_hit_fraction_min,
    }
    for (title, ref), value in expected.items():
        assert _threshold(by_title(board, title), ref) == value, (title, ref)
    for panel in B.panels(board):
        if panel["type"] == "timeseries":
            assert panel["fieldConfig"]["defaults"]["min"] == 0, panel["title"]
    pcie = by_title(board, "Preemptions and PCIe")
    assert _override(pcie, "B", "unit") == "Bps"
    # the PCIe axis reaches at least the larger threshold: noise far below it stays small
    assert _override(pcie, "B", "custom.axisSoftMax") == max(
        t.pcie_receive_bytes_per_second_min, t.kv_to_gpu_bytes_per_second_min
    )


def _recorded_names(board: dict[str, Any]) -> set[str]:
    return {name for t in B.targets(board) for name in re.findall(r"\bkvdoctor:[a-z0-9_]+:[a-z0-9]+", t.expr)}


def test_other_thresholds_interval_and_slo_follow_into_the_dashboard():
    """The dashboard reads what a rule file made with the same arguments records (the rules name a
    recorded series after the range it reads, sized for the scrape interval)."""
    t = Thresholds(window_seconds=120, kv_ceiling_ratio=0.95)
    board = B.load(builder.render_dashboard(t, slo_seconds=0.05, scrape_interval_seconds=5))
    rules = yaml.safe_load(rule_file.render_rules_yaml(t, 0.05, scrape_interval_seconds=5))
    recorded = {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}
    assert _recorded_names(board) <= recorded
    assert _recorded_names(board).isdisjoint(_recorded_names(B.load())), "the ranges did not change"
    exprs = " ".join(x.expr for x in B.targets(board))
    assert "or vector(0.05)" in exprs
    panel = by_title(board, "KV-cache usage and ITL p95 vs the SLO")
    assert _threshold(panel, "A") == 0.95
    assert "window 120s" in board["description"] and "default ITL SLO 50 ms" in board["description"]


def test_a_feature_the_rules_do_not_record_is_refused():
    with pytest.raises(KeyError, match="record no feature"):
        queries.recorded("no_such_feature", Thresholds())


def test_an_slo_that_is_not_a_positive_number_is_refused():
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="positive"):
            queries.itl_slo(bad)


def test_axes_with_different_units_are_refused():
    t = RULE_THRESHOLDS
    with pytest.raises(ValueError, match="share a unit"):
        builder.series_panel("mixed", "", [queries.kv_usage(t), queries.itl(t)])


def test_the_build_does_not_change_the_model_between_calls():
    first = builder.dashboard_dict()
    again = builder.dashboard_dict()
    assert first == again and copy.deepcopy(first) == B.load()
