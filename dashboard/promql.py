"""PromQL for the Prometheus-backed views (Live history, the Fleet page's rows): pure string building, no I/O.

The Fleet page's summary is ``kvdoctor.sources.fleet.read_fleet``'s (its queries are in
``kvdoctor.rules.fleet``); here are only the two queries for the rows a page shows.

Every label value that reaches a query goes through ``kvdoctor.rules.promql.quote`` (a PromQL
string literal), so a value taken from a page URL can only ever select series, never change the query.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping

from kvdoctor.rules.promql import MAX_POINTS_PER_SERIES, quote, record_pattern
from kvdoctor.signals import vocabulary as S

TARGET_LABEL = "instance"  # one scrape target = one exporter = one engine pod
CAPACITY_MATCH = "instance, pod, engine, dp_rank"  # the labels a KV capacity shares with its usage


def matchers(labels: Mapping[str, str]) -> str:
    """``{a="1",b="2"}`` (empty string for no labels); label names are checked, values quoted."""
    if not labels:
        return ""
    parts = []
    for name in sorted(labels):
        if not name.replace("_", "a").isalnum() or name[0].isdigit():
            raise ValueError(f"not a label name: {name!r}")
        parts.append(f"{name}={quote(labels[name])}")
    return "{" + ",".join(parts) + "}"


def selector(metric: str, labels: Mapping[str, str]) -> str:
    return metric + matchers(labels)


def range_step(seconds: float, points: int, minimum: float = 1.0) -> float:
    """Step for a range query over ``seconds`` giving about ``points`` points (whole seconds)."""
    step = max(minimum, seconds / max(1, points), seconds / MAX_POINTS_PER_SERIES)
    return float(math.ceil(step))


def rate_window(step: float, base: float) -> str:
    """A rate window for points ``step`` apart, as a PromQL duration: at least ``base`` seconds (four
    scrape intervals, for two samples in a window), and one step plus a quarter of ``base`` (a
    scrape interval) so each window shares a sample with the one before: every increase is counted
    once, and a burst is spread over one step, not four (Grafana's ``$__rate_interval``)."""
    return f"{math.ceil(max(base, step + base / 4))}s"


def live_queries(labels: Mapping[str, str], step: float, base_rate_window: float) -> dict[str, str]:
    """The Live page's arrays as PromQL, keyed like ``derive.LiveFrame``'s fields.

    ``labels`` selects the target (``instance`` plus any engine/GPU filter); GPU queries keep the
    ``gpu``, ``model``, ``method`` and ``pod`` labels so each GPU is its own series.
    """
    w = rate_window(step, base_rate_window)
    m = matchers(labels)
    # The capacity series may lack model_name (vLLM's cache_config_info): match without it.
    cap = matchers({k: v for k, v in labels.items() if k != "model_name"})
    # The decode floor is per pod: it has no engine or GPU labels to filter on.
    floor = matchers({k: v for k, v in labels.items() if k in (TARGET_LABEL, "pod")})
    itl_bucket = f"sum by (le) (rate({S.INTER_TOKEN_LATENCY}_bucket{m}[{w}]))"

    def sum_rate(series: str) -> str:
        return f"sum(rate({series}[{w}]))"

    return {
        "kv_usage": f"max({S.KV_CACHE_USAGE}{m})",
        "itl_p50": f"histogram_quantile(0.5, {itl_bucket})",
        "itl_p95": f"histogram_quantile(0.95, {itl_bucket})",
        "itl_mean": f"{sum_rate(f'{S.INTER_TOKEN_LATENCY}_sum{m}')} / {sum_rate(f'{S.INTER_TOKEN_LATENCY}_count{m}')}",
        "resident_tokens": f"sum({S.KV_CACHE_USAGE}{m} * on ({CAPACITY_MATCH}) group_left {S.KV_CACHE_CAPACITY}{cap})",
        "kv_capacity_tokens": f"sum({S.KV_CACHE_CAPACITY}{cap})",
        "preemption_rate": sum_rate(f"{S.PREEMPTIONS}{m}"),
        "kv_to_gpu_rate": sum_rate(selector(S.KV_TRANSFER_BYTES, dict(labels, direction="to_gpu"))),
        "kv_from_gpu_rate": sum_rate(selector(S.KV_TRANSFER_BYTES, dict(labels, direction="from_gpu"))),
        "pcie_rx": f"sum({S.GPU_PCIE_RX}{m})",
        "pcie_tx": f"sum({S.GPU_PCIE_TX}{m})",
        "decode_floor": f"max({S.DECODE_STEP_FLOOR}{floor})",
        "gpu_dram": f"max by (pod, gpu, model, method) ({S.GPU_DRAM_BANDWIDTH_UTILIZATION}{m})",
        "gpu_sm": f"max by (pod, gpu, model, method) ({S.GPU_SM_ACTIVE}{m})",
    }


def target_listing_query(instance: str) -> str:
    """The engine and GPU series of one exporter, for the Live target picker."""
    names = "|".join((S.KV_CACHE_USAGE, S.GPU_SM_ACTIVE, S.GPU_DRAM_BANDWIDTH_UTILIZATION))
    return (
        "group by (__name__, pod, engine, model_name, dp_rank, gpu, model) "
        f"({{__name__=~{quote(names)}, {TARGET_LABEL}={quote(instance)}}})"
    )


def instances_query() -> str:
    """Every exporter Prometheus scrapes (each reports its sources' health)."""
    return f"group by ({TARGET_LABEL}, pod) ({S.SOURCE_UP})"


def recent_window_selector(instance: str) -> str:
    """All canonical series of one exporter (for a short raw window the rules can diagnose)."""
    names = sorted({n for sig in S.SIGNALS.values() for n in sig.series_names})
    return f"{{__name__=~{quote('|'.join(names))}, {TARGET_LABEL}={quote(instance)}}}"


def _alternatives(values: Iterable[str]) -> str:
    """A regex matching exactly ``values`` (each escaped), as a quoted PromQL string."""
    return quote("|".join(re.escape(v) for v in sorted(set(values))))


def fleet_sparkline_query(features: Iterable[str], pods: Iterable[tuple[str, str]]) -> str:
    """The recorded ``features`` of the shown pods ((namespace, pod), ...), at whatever sizing the
    rule file has, one series per pod and record (its engines' highest): one range query draws every
    sparkline of a page, and reads records only, never the raw series."""
    shown = list(pods)
    names = quote("|".join(record_pattern(f) for f in sorted(set(features))))
    return (
        f"max by (__name__, namespace, pod) ({{__name__=~{names}, "
        f"namespace=~{_alternatives(ns for ns, _ in shown)}, pod=~{_alternatives(p for _, p in shown)}}})"
    )


def fleet_instances_query(pods: Iterable[tuple[str, str]]) -> str:
    """The scrape target (``instance``) of each shown pod, for its link to the Live page."""
    shown = list(pods)
    return (
        f"group by (namespace, pod, {TARGET_LABEL}) ({S.SOURCE_UP}{{namespace=~{_alternatives(ns for ns, _ in shown)}, "
        f"pod=~{_alternatives(p for _, p in shown)}}})"
    )
