"""The alerting rules: one alert per verdict (its headline feature where ``kvdoctor:verdict`` names
it, so exactly one verdict alert fires for an engine at a time, and no alert computes a rate or
quantile itself), a source down, the exporter down; and the ``contributing`` annotation the SLO
pages carry (``rule_file`` adds it to ``slo_alerts``' rules).

The cause alerts' templates make no query: Prometheus expands every pending or firing alert's
templates at every evaluation, so a query in them is made once per engine with the cause every
cycle, which at a fleet's size costs more than the tree's records (bench/bench_fleet.py).
"""

from __future__ import annotations

from kvdoctor.signals.vocabulary import BUILD_INFO

from . import alert_templates
from .alert_specs import ALERTS, EXPORTER_DOWN_ALERT, SOURCE_DOWN_ALERT, AlertSpec, fill
from .feature_promql import ENGINE_KEYS, IDENTITY_KEYS
from .promql import BRANCH_RECORD, ENGINE_ON, SOURCE_DOWN_RECORD, VERDICT_RECORD, Rule, duration, record_name
from .thresholds import DEFAULT_SCRAPE_INTERVAL_SECONDS, DEFAULT_SLO_SECONDS, Thresholds


def contributing_annotation() -> str:
    """The ``contributing`` annotation of an engine's SLO page: the causes whose own branch holds for
    the engine (the differential: the branch records) other than its verdict (``kvdoctor:verdict``'s
    ``verdict`` label), and the queue as the slowness's consequence. One query, made when the page
    fires; the cause alerts carry none (their templates are expanded at every evaluation, for every
    engine with the cause)."""
    matchers = ",".join(f"{k}=%q" for k in ENGINE_KEYS)
    values = " ".join(alert_templates.label(k) for k in ENGINE_KEYS)
    query = (
        f'printf "group by (verdict) ({BRANCH_RECORD}{{%s}} unless on(verdict) {VERDICT_RECORD}{{%s}})" $engine $engine'
    )
    who = alert_templates.engine()
    return (
        f'{{{{ $engine := printf "{matchers}" {values} }}}}'
        f'{{{{ with {query} | query | sortByLabel "verdict" }}}}Also present on {who}: '
        f"{{{{ range $i, $c := . }}}}{{{{ if $i }}}}, {{{{ end }}}}"
        f'{{{{ if eq $c.Labels.verdict "request_queueing" }}}}{_QUEUE_WORDS}'
        "{{ else }}{{ $c.Labels.verdict }}{{ end }}{{ end }}"
        f"{{{{ else }}}}Nothing else found on {who}{{{{ end }}}}"
    )


_QUEUE_WORDS = "requests waiting (a consequence of the slowness)"


def _words(spec: AlertSpec, text: str, thresholds: Thresholds, slo_seconds: float, interval: float) -> str:
    return fill(
        text,
        value_kind=spec.value_kind,
        slo_default_ms=slo_seconds * 1000,
        q=thresholds.itl_quantile,
        ttft_s=thresholds.ttft_slow_seconds,
        for_=alert_templates.prose_duration(spec.for_seconds(interval)),
        action=spec.action,
    )


def alert_annotations(
    summary: str, description: str, runbook_url: str | None, dashboard_base_url: str | None = None
) -> dict[str, str]:
    """An alert's annotations: no ``runbook_url`` without an absolute one, a ``dashboard`` link to the
    engine's Live page where the dashboard's address is known."""
    out = {"summary": summary, "description": description}
    if runbook_url:
        out["runbook_url"] = runbook_url
    if dashboard_base_url:
        out["dashboard"] = dashboard_link(dashboard_base_url)
    return out


def dashboard_link(base: str) -> str:
    """The engine's page on the dashboard at ``base`` (its pod, else its instance)."""
    return base.rstrip("/") + "/?pod={{ or $labels.pod $labels.instance }}"


def exporter_down_expr(interval: float) -> str:
    """The exporter's target down, or up but without the exporter's own series, where the exporter
    was seen within the last 20 scrapes, or where this alert already holds (so it lasts as long as
    the target is down, not 20 scrapes): the series it published name the engine (its pod)."""
    seen = duration(interval * 20)
    keys = ", ".join(IDENTITY_KEYS)
    held = f'ALERTS{{alertname="{EXPORTER_DOWN_ALERT}"}}'
    # any sample will do (build info is always 1), and the last is the cheapest to read
    known = f"max by ({keys}, job) (last_over_time({BUILD_INFO}[{seen}]) or {held})"
    # a target without the exporter's series now: down (0; a failed scrape makes its series stale),
    # or up (1) but answering without them; ``up`` read once
    gone = f"(up unless on(instance, job) {BUILD_INFO})"
    return f"{gone}\n* on(instance, job) group_left(namespace, pod) {known}"


def alert_rules(
    thresholds: Thresholds,
    slo_seconds: float = DEFAULT_SLO_SECONDS,
    runbook_base_url: str | None = None,
    scrape_interval_seconds: float = DEFAULT_SCRAPE_INTERVAL_SECONDS,
    dashboard_base_url: str | None = None,
) -> list[Rule]:
    """The cause alerts (one per verdict), a source down, the exporter down. ``runbook_base_url``:
    an absolute base (None: no runbook_url at all); ``for`` is the spec's scrapes of the interval."""
    rules: list[Rule] = []
    for spec in ALERTS:
        if spec.name == SOURCE_DOWN_ALERT:
            expr = SOURCE_DOWN_RECORD
        elif spec.name == EXPORTER_DOWN_ALERT:
            expr = exporter_down_expr(scrape_interval_seconds)
        elif spec.value_feature is None or spec.verdict is None:
            raise ValueError(f"alert {spec.name} stands for a verdict but names no value feature")
        else:
            value = record_name(spec.value_feature, thresholds)
            # $value is the alert's headline number, NaN where the engine does not export it. The
            # verdict is read by its label: the index gives the few engines with it, not the fleet
            is_verdict = f'{VERDICT_RECORD}{{verdict="{spec.verdict}"}}'
            expr = (
                f"(\n  {value}\n  and {ENGINE_ON} {is_verdict}\n)\n"
                f"or {ENGINE_ON} group without (verdict) ({is_verdict}) * NaN"
            )
        words = {
            k: _words(spec, text, thresholds, slo_seconds, scrape_interval_seconds)
            for k, text in (("summary", spec.summary), ("description", spec.description))
        }
        rules.append(
            {
                "alert": spec.name,
                "expr": expr,
                "for": duration(spec.for_seconds(scrape_interval_seconds)),
                "labels": {"severity": spec.severity},
                "annotations": {
                    **alert_annotations(
                        words["summary"], words["description"], spec.runbook_url(runbook_base_url), dashboard_base_url
                    ),
                },
            }
        )
    return rules
