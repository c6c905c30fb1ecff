"""The PromQL behind every panel of the Grafana dashboard, written from the rules' own definitions.

Where the alert rules record a feature (``rules/promql.py``), a panel reads the recorded series, so
it shows the number the alert compares with its threshold (and follows the rules when they change);
the threshold itself comes from ``rules/thresholds.py``. Raw signals (``signals/vocabulary.py``) fill in
what no feature records: the verdict, the prefix-cache hits by tier, the published SLO.

Every selector is scoped by the dashboard's ``$namespace`` and ``$pod`` variables (regexes; ``.*``
selects all); counters are read over Grafana's ``$__rate_interval``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from kvdoctor.rules.alert_specs import ALERTS
from kvdoctor.rules.features import FEATURES
from kvdoctor.rules.promql import record_name
from kvdoctor.rules.slo_alerts import SLO_ALERTS
from kvdoctor.rules.thresholds import DEFAULT_SLO_SECONDS, Thresholds
from kvdoctor.rules.verdicts import VERDICTS, verdict_code
from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.units import BYTES_PER_SECOND, PER_MINUTE, RATIO, REQUESTS, SECONDS, TOKENS_PER_SECOND

NAMESPACE = "namespace"
POD = "pod"
SCOPE_LABELS = (NAMESPACE, POD)
RATE_INTERVAL = "$__rate_interval"
# The series the namespace and pod pickers list: every exporter publishes it, every cycle.
INVENTORY_SIGNAL = S.SOURCE_UP
BY_POD = "{{pod}}"


@dataclass(frozen=True)
class Query:
    """One query of a panel: its PromQL, its legend, the unit of its values (a ``signals/units.py``
    feature unit) and the tree's threshold it is compared with (drawn as a line), if any."""

    expr: str
    legend: str
    unit: str
    threshold: float | None = None


def selector(name: str, *matchers: tuple[str, str, str]) -> str:
    """``name`` limited to the dashboard's namespaces and pods, plus ``(label, op, value)`` matchers."""
    parts = [(label, "=~", f"${label}") for label in SCOPE_LABELS] + list(matchers)
    inner = ", ".join(f'{label}{op}"{value}"' for label, op, value in parts)
    return f"{name}{{{inner}}}"


def recorded(feature: str, thresholds: Thresholds) -> str:
    """The recording rule of ``feature`` (``rules/promql.py``), scoped to the selected pods."""
    if feature not in FEATURES:
        raise KeyError(f"the rules record no feature {feature!r}")
    return selector(record_name(feature, thresholds))


def feature_query(feature: str, legend: str, thresholds: Thresholds, threshold: float | None = None) -> Query:
    return Query(recorded(feature, thresholds), legend, FEATURES[feature].unit, threshold)


def per_pod(feature: str, legend: str, thresholds: Thresholds, threshold: float | None = None) -> Query:
    """``feature_query`` with one line per pod: ``legend`` after the pod's name."""
    return feature_query(feature, f"{BY_POD} {legend}", thresholds, threshold)


# ---------------------------------------------------------------------------------- verdicts


def verdict_now() -> Query:
    """One row per pod: the verdict its exporter diagnoses now (the state set's member at 1)."""
    return Query(f"{selector(S.DIAGNOSIS_VERDICT)} == 1", "{{pod}} {{verdict}}", "")


def verdict_history() -> Query:
    """Each pod's verdict over time as its ``verdict_code`` (Grafana maps the codes back to names)."""
    terms = [
        f"({selector(S.DIAGNOSIS_VERDICT, ('verdict', '=', verdict))} == 1) * 0 + {verdict_code(verdict)}"
        for verdict in VERDICTS
    ]
    return Query(f"max by ({', '.join(SCOPE_LABELS)}) (\n  " + "\n  or ".join(terms) + "\n)", BY_POD, "")


def firing_alerts() -> Query:
    """kvdoctor's alerts firing now (every alert ``rules/alert_rules.py`` defines)."""
    names = "|".join(re.escape(alert.name) for alert in (*ALERTS, *SLO_ALERTS))
    expr = selector("ALERTS", ("alertname", "=~", names), ("alertstate", "=", "firing"))
    return Query(expr, "{{alertname}} {{pod}}", "")


# --------------------------------------------------------------------------- KV and latency


def itl_legend(thresholds: Thresholds) -> str:
    return f"ITL p{thresholds.itl_quantile * 100:g}"


def kv_usage(thresholds: Thresholds) -> Query:
    return per_pod("kv_usage", "KV usage", thresholds, thresholds.kv_ceiling_ratio)


def itl(thresholds: Thresholds) -> Query:
    return per_pod("itl_p95_seconds", itl_legend(thresholds), thresholds)


def itl_slo(slo_seconds: float = DEFAULT_SLO_SECONDS) -> Query:
    """The strictest SLO the selected exporters publish, else the default the rules were made with."""
    if not (slo_seconds > 0 and math.isfinite(slo_seconds)):
        raise ValueError(f"the SLO must be a positive number of seconds, got {slo_seconds!r}")
    return Query(f"min({selector(S.ITL_SLO)}) or vector({slo_seconds!r})", "ITL SLO", SECONDS)


# ------------------------------------------------------------------------------------- GPU


def dram_bandwidth(thresholds: Thresholds) -> Query:
    return per_pod("dram_bandwidth_ratio", "DRAM bandwidth", thresholds, thresholds.bandwidth_high_ratio)


def sm_active(thresholds: Thresholds) -> Query:
    return per_pod("sm_active_ratio", "SM active", thresholds, thresholds.sm_high_ratio)


def preemptions(thresholds: Thresholds) -> Query:
    return per_pod("preemptions_per_minute", "preemptions", thresholds, thresholds.preemptions_per_minute)


def pcie_receive(thresholds: Thresholds) -> Query:
    return per_pod(
        "pcie_receive_bytes_per_second", "PCIe receive", thresholds, thresholds.pcie_receive_bytes_per_second_min
    )


def kv_into_gpu(thresholds: Thresholds) -> Query:
    return per_pod("kv_to_gpu_bytes_per_second", "KV into GPU", thresholds, thresholds.kv_to_gpu_bytes_per_second_min)


# ------------------------------------------------------------------------- queue and cache


def requests_running(thresholds: Thresholds) -> Query:
    return per_pod("requests_running", "running", thresholds)


def requests_waiting(thresholds: Thresholds) -> Query:
    return per_pod("requests_waiting", "waiting", thresholds, thresholds.queue_waiting_min)


def prefix_hits_by_tier() -> Query:
    labels = ", ".join((*SCOPE_LABELS, "tier"))
    expr = f"sum by ({labels}) (rate({selector(S.PREFIX_CACHE_HITS_BY_TIER)}[{RATE_INTERVAL}]))"
    return Query(expr, f"{BY_POD} {{{{tier}}}}", TOKENS_PER_SECOND)


def slow_tier_share(thresholds: Thresholds) -> Query:
    return per_pod("slow_tier_hit_fraction", "hits off GPU", thresholds, thresholds.slow_tier_hit_fraction_min)


# The feature units the panels show, in Grafana's unit ids.
GRAFANA_UNITS = {
    RATIO: "percentunit",
    SECONDS: "s",
    BYTES_PER_SECOND: "Bps",
    TOKENS_PER_SECOND: "short",
    PER_MINUTE: "short",
    REQUESTS: "short",
    "": "short",
}


def grafana_unit(unit: str) -> str:
    """A ``signals/units.py`` feature unit as Grafana's unit id (``ratio`` -> ``percentunit``)."""
    if unit not in GRAFANA_UNITS:
        raise KeyError(f"no Grafana unit for {unit!r}: add it to GRAFANA_UNITS")
    return GRAFANA_UNITS[unit]


def template_query(label: str) -> str:
    """The ``label_values`` query listing ``label`` (a pod's list narrowed by the namespaces chosen)."""
    if label == NAMESPACE:
        return f"label_values({INVENTORY_SIGNAL}, {NAMESPACE})"
    return f'label_values({INVENTORY_SIGNAL}{{{NAMESPACE}=~"${NAMESPACE}"}}, {label})'
