"""The Fleet page's pieces without a browser (its view of a fleet summary, the sparklines, the
PromQL of a page's rows, the server-side cache), and `kvdoctor dashboard`.

The page in Chromium against a real Prometheus is tests/dashboard/test_fleet_page.py."""

from __future__ import annotations

import math
import re
import socket
from urllib.parse import unquote

import numpy as np
import pytest

from kvdoctor.dashboard import components, figures, fleet_view, ids, promql
from kvdoctor.dashboard.app import create_app
from kvdoctor.dashboard.pages import fleet
from kvdoctor.dashboard.sources import FleetCache, FleetPage
from kvdoctor.rules import promql as rules_promql
from kvdoctor.rules.fleet import FLEET_VERDICTS, summarize
from kvdoctor.rules.verdicts import SLOW_VERDICTS
from kvdoctor.signals import vocabulary as S
from tests.support.processes import kvdoctor
from tests.support.servers import refusing_url

ITL = "kvdoctor:itl_p95_seconds:60s"
KV = "kvdoctor:kv_usage:60s"


def _summary(pods: dict[tuple[str, str], tuple[str, float, float]]):
    """A fleet summary as read_fleet makes it, from (namespace, pod) -> (verdict, ITL p95 s, KV usage)."""
    engine = {"model_name": "llama", "engine": "vllm"}
    return summarize(
        [({"namespace": ns, "pod": pod}, 1.0) for ns, pod in pods],
        [({"namespace": ns, "pod": pod, "verdict": v}, 1.0) for (ns, pod), (v, _, _) in pods.items()],
        [({"__name__": ITL, "namespace": ns, "pod": pod, **engine}, itl) for (ns, pod), (_, itl, _) in pods.items()]
        + [({"__name__": KV, "namespace": ns, "pod": pod, **engine}, kv) for (ns, pod), (_, _, kv) in pods.items()],
        at=1000.0,
    )


@pytest.fixture
def summary():
    return _summary(
        {
            ("chat", "chat-0"): ("healthy", 0.02, 0.4),
            ("chat", "chat-1"): ("kv_thrashing", 0.15, 0.97),
            ("search", "search-0"): ("memory_bandwidth_bound", 0.12, 0.5),
            ("search", "search-1"): ("idle", math.nan, 0.1),
        }
    )


def _page(summary, rows=None, sparks=None, instances=None) -> FleetPage:
    rows = summary.rows if rows is None else rows
    grid = np.arange(0.0, 400.0, 10.0)
    return FleetPage(tuple(rows), len(rows), 0, 1, grid, sparks or {}, instances or {})


def test_counts_are_the_verdict_filter_with_every_verdict(summary):
    options = fleet_view.count_options(summary)
    assert [o["value"] for o in options] == [fleet_view.ALL, fleet_view.SLOW, *FLEET_VERDICTS]
    counts = {o["value"]: int(o["label"].to_plotly_json()["props"]["data-count"]) for o in options}
    assert counts[fleet_view.ALL] == 4 and counts[fleet_view.SLOW] == 2
    assert counts["kv_thrashing"] == 1 and counts["request_queueing"] == 0
    assert fleet_view.verdict_filter(fleet_view.SLOW) == tuple(SLOW_VERDICTS)
    assert fleet_view.verdict_filter("kv_thrashing") == ("kv_thrashing",)
    assert fleet_view.verdict_filter("") is None and fleet_view.verdict_filter("<script>") is None


def test_rows_are_named_by_pod_and_link_to_their_target_over_the_range(summary):
    thrashing = summary.rows[0]
    assert thrashing.pod == "chat-1"  # worst first
    grid_values = np.linspace(0.05, 0.15, 40)
    page = _page(
        summary,
        sparks={("chat", "chat-1", "itl_p95_seconds"): grid_values, ("chat", "chat-1", "kv_usage"): grid_values},
        instances={("chat", "chat-1"): "10.0.0.2:9745"},
    )
    table = fleet_view.fleet_table(page, 100.0, 1000.0, True)
    text = str(table)
    assert "/?instance=10.0.0.2%3A9745&from=100&to=1000" in text
    assert text.count("data:image/svg+xml,") == 2  # only the row with sparklines draws them
    first = table.children[1].children[0]
    assert first.to_plotly_json()["props"]["data-pod"] == "chat-1"
    cells = first.children
    link = cells[0].children
    assert link.children == "chat-1" and link.href.startswith("/?instance=")  # named by pod, a link to its target
    assert "150.0 ms" in str(cells[3]) and "/ 100 ms" in str(cells[3])
    # A pod without a known target is still a row, named, just not a link.
    plain = fleet_view.fleet_table(_page(summary), 100.0, 1000.0, True).children[1].children[0].children[0]
    assert plain.children == "chat-1" and "/?instance" not in str(plain)
    # Exporters without a pod label share one row: it says so, and opens no one target.
    nameless = _summary({("", ""): ("healthy", 0.02, 0.4)})
    page = _page(nameless, instances={("", ""): "10.0.0.9:9745"})
    cell = fleet_view.fleet_table(page, 0.0, 1.0, True).children[1].children[0].children[0]
    assert cell.children == fleet_view.NO_POD and "/?instance" not in str(cell)


def test_empty_pages_say_why(summary):
    empty = _page(summary, rows=())
    assert "No pod matches" in str(fleet_view.fleet_table(empty, 0.0, 1.0, True))
    assert "no kvdoctor exporter" in str(fleet_view.fleet_table(empty, 0.0, 1.0, False))
    assert fleet_view.pager_text(empty) == "no pod"
    assert fleet_view.pager_text(FleetPage((), 120, 1, 3, np.array([0.0]))) == "pods 51–100 of 120 · page 2 of 3"


def test_sparkline_is_a_small_svg_with_gaps_and_the_slo_line():
    svg = figures.sparkline_svg([0.01, 0.02, math.nan, 0.05, 0.3], 0.0, 0.1, line=0.1)
    assert svg.startswith("<svg") and svg.endswith("</svg>") and '"' not in svg
    paths = re.findall(r"d='([^']*)'", svg)
    assert len(paths) == 2  # the SLO rule and the line
    assert paths[1].count("M") == 2  # the NaN breaks the line
    # 0.3 is above the top given: the range widens so the top point is at the top, not clipped away
    assert paths[1].endswith(" 1")
    assert len(figures.sparkline_svg(list(np.linspace(0, 1, 40)), 0.0, 1.0)) < 400
    src = fleet_view._sparkline([0.1, 0.2], 0.0, 1.0, None, "#1f77b4").src
    assert "#" not in src.removeprefix("data:image/svg+xml,") and unquote(src).endswith("</svg>")


def test_sparkline_query_reads_records_of_the_shown_pods_only():
    query = promql.fleet_sparkline_query(["kv_usage", "itl_p95_seconds"], [("chat", "a.b"), ("ns-2", 'x"y')])
    assert query.startswith("max by (__name__, namespace, pod) (")
    assert 'kvdoctor:itl_p95_seconds:[0-9]+m?s|kvdoctor:kv_usage:[0-9]+m?s"' in query
    assert r'pod=~"a\\.b|x\"y"' in query  # escaped for the regex, then for the PromQL string
    assert "kvdoctor_" not in query  # never a raw series
    instances = promql.fleet_instances_query([("chat", "a")])
    assert instances == f'group by (namespace, pod, instance) ({S.SOURCE_UP}{{namespace=~"chat", pod=~"a"}})'


def test_the_cache_keeps_summaries_under_tokens_and_forgets_the_oldest(summary):
    cache = FleetCache(size=2)
    first = cache.put(summary)
    assert cache.get(first) is summary and len(first) == 12
    assert cache.put(summary, first) == first  # a refresh replaces its own entry
    cache.put(summary)
    cache.put(summary)
    assert cache.get(first) is None and cache.get(None) is None and cache.get("made-up") is None


def test_fleet_end_time_and_its_errors():
    assert fleet.parse_end("2026-01-02 03:04") == 1767323040.0
    assert fleet.parse_end("  ") is None
    with pytest.raises(ValueError, match="end time must look like"):
        fleet.parse_end("yesterday")


def _find(component, component_id):
    """The component with ``component_id`` in a layout tree, or None."""
    if getattr(component, "id", None) == component_id:
        return component
    children = getattr(component, "children", None)
    for child in children if isinstance(children, list) else [children]:
        if child is not None and not isinstance(child, (str, int, float)):
            found = _find(child, component_id)
            if found is not None:
                return found
    return None


def test_fleet_link_parameters_preselect_the_view_and_junk_is_ignored():
    app = create_app(prometheus_url=refusing_url(), environ={})
    with app.server.test_request_context("/fleet"):
        page = fleet.layout(range="900", end="2026-01-02 03:04", verdict="slow", namespace="chat", pod="vllm")
        assert _find(page, ids.FLEET_RANGE).value == 900
        assert _find(page, ids.FLEET_END).value == "2026-01-02 03:04"
        assert _find(page, ids.FLEET_VERDICT).value == fleet_view.SLOW
        assert _find(page, ids.FLEET_SEARCH).value == "vllm"
        assert _find(page, ids.FLEET_REFRESH).disabled  # a fixed end is read once
        junk = fleet.layout(range="12345", end="<script>", verdict="<script>", pod=["a"])
        assert _find(junk, ids.FLEET_RANGE).value == 3600 and _find(junk, ids.FLEET_END).value == ""
        assert _find(junk, ids.FLEET_VERDICT).value == fleet_view.ALL and _find(junk, ids.FLEET_SEARCH).value == ""
        # Prometheus is down: the page says so in its badge, with no row and no traceback.
        assert "connection refused" in str(_find(page, ids.FLEET_STATUS))
        assert _find(page, ids.FLEET_STATE).data["page"] == 0


def test_fleet_without_prometheus_says_what_it_needs():
    app = create_app(exporter_url="http://127.0.0.1:9", environ={})
    with app.server.test_request_context("/fleet"):
        assert "Fleet needs Prometheus" in str(fleet.layout())


@pytest.mark.parametrize(
    "value, literal",
    [
        ("plain", '"plain"'),
        ('a"b', '"a\\"b"'),
        ("back\\slash", '"back\\\\slash"'),
        ("new\nline", '"new\\nline"'),
    ],
)
def test_promql_quoting(value, literal):
    assert rules_promql.quote(value) == literal


def test_promql_matchers_refuse_odd_label_names():
    assert promql.matchers({"instance": "x", "gpu": "0"}) == '{gpu="0",instance="x"}'
    with pytest.raises(ValueError):
        promql.matchers({'a"}': "x"})


def test_range_step_is_sized_to_the_range():
    assert promql.range_step(900, 8000) == 1.0
    assert promql.range_step(86400, 8000) == 11.0
    assert promql.range_step(7 * 86400, 8000) == 76.0
    assert promql.rate_window(1.0, 10.0) == "10s"  # live: the trailing window the exporter's charts use
    assert promql.rate_window(44.0, 10.0) == "47s"  # a day in 2,000 points: each window one step and a sample


def test_live_queries_use_the_canonical_names():
    queries = promql.live_queries({"instance": "i"}, 1.0, 10.0)
    assert S.INTER_TOKEN_LATENCY + "_bucket" in queries["itl_p95"]
    assert all("kvdoctor_" in q for q in queries.values())


def test_verdict_classes_cover_every_verdict():
    from kvdoctor.rules.verdicts import VERDICTS

    for verdict in VERDICTS:
        assert components.verdict_class(verdict) in ("verdict-ok", "verdict-warn", "verdict-bad", "verdict-idle")
        assert components.verdict_title(verdict) != verdict


# ------------------------------------------------------------------------------------- command


def _kvdoctor(capsys, *args):
    """`kvdoctor dashboard ARGS` in this process (a new interpreter costs seconds): (rc, stderr)."""
    from kvdoctor.cli import main

    try:
        rc = main(["dashboard", *args])
    except SystemExit as exc:  # refused while parsing, as argparse does
        rc = exc.code
    return rc, capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message",
    [
        ((), "give --exporter URL and/or --prometheus URL"),
        (("--exporter", "ftp://x"), "--exporter: needs an http(s) URL"),
        (("--prometheus", "prometheus:9090"), "(did you mean 'http://prometheus:9090'?)"),
        (("--exporter", "http://127.0.0.1:1", "--port", "70000"), "--port: must be a port between 0 and 65535"),
    ],
)
def test_command_usage_errors_are_one_line(capsys, monkeypatch, args, message):
    monkeypatch.delenv("KVDOCTOR_DASHBOARD_EXPORTER_URL", raising=False)
    monkeypatch.delenv("KVDOCTOR_DASHBOARD_PROMETHEUS_URL", raising=False)
    rc, err = _kvdoctor(capsys, *args)
    assert rc == 2
    assert err.strip().count("\n") == 0 and message in err and "Traceback" not in err


def test_command_refuses_a_port_in_use(capsys):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        rc, err = _kvdoctor(capsys, "--exporter", "http://127.0.0.1:1", "--port", str(port))
    assert rc == 2
    assert (
        err.strip()
        == f"kvdoctor dashboard: error: cannot serve the dashboard on 127.0.0.1:{port}: Address already in use"
    )


@pytest.mark.slow
def test_command_serves_on_loopback_and_prints_its_url(spawn):
    import httpx

    dashboard = spawn(kvdoctor("dashboard", "--exporter", "http://127.0.0.1:1", "--port", "0", merge_stderr=False))
    url = dashboard.wait_for_line(r"^kvdoctor dashboard: (http://127\.0\.0\.1:\S+)").group(1)
    assert httpx.get(url, timeout=10).status_code == 200
