"""The rule file: the groups (records, causes, the SLO burn alerts) and their YAML, with its header."""

from __future__ import annotations

from collections.abc import Mapping

import yaml

from kvdoctor.signals.vocabulary import ITL_SLO

from . import alert_templates, slo_alerts
from .alert_rules import alert_annotations, alert_rules
from .alert_specs import VERDICT_ALERT
from .promql import (
    GPU_ON,
    GROUP_NAME,
    HEADER,
    SLO_RECORD,
    Rule,
    duration,
    recording_rules,
    rule_thresholds,
)
from .thresholds import (
    DEFAULT_SCRAPE_INTERVAL_SECONDS,
    DEFAULT_SLO_SECONDS,
    Thresholds,
)
from .verdicts import verdict_code


def rule_groups(
    thresholds: Thresholds | None = None,
    slo_seconds: float = DEFAULT_SLO_SECONDS,
    runbook_base_url: str | None = None,
    scrape_interval_seconds: float = DEFAULT_SCRAPE_INTERVAL_SECONDS,
    dashboard_base_url: str | None = None,
) -> dict[str, list[Rule]]:
    """The rule file as data: ``{"groups": [...]}`` (wrap ``groups`` in a PrometheusRule's spec).
    ``thresholds`` as compiled (see ``rule_thresholds``). Two groups: the tree (records, causes) and
    the latency SLO's burn-rate alerts (``slo_alerts``), which read the tree's verdict."""
    t = thresholds or Thresholds()
    rules = recording_rules(t, slo_seconds) + alert_rules(
        t, slo_seconds, runbook_base_url, scrape_interval_seconds, dashboard_base_url
    )
    slo_rules = slo_alerts.burn_rate_rules(
        scrape_interval_seconds,
        slo_join=f"{GPU_ON} group_left() {SLO_RECORD}",
        annotate=lambda spec, summary, description: alert_annotations(
            summary, description, spec.runbook_url(runbook_base_url), dashboard_base_url
        ),
        verdict_codes={v: verdict_code(v) for v in VERDICT_ALERT},
    )
    return {"groups": [{"name": GROUP_NAME, "rules": rules}, {"name": slo_alerts.GROUP_NAME, "rules": slo_rules}]}


class _LiteralDumper(yaml.SafeDumper):
    pass


def _str_presenter(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_LiteralDumper.add_representer(str, _str_presenter)


def render_rules_yaml(
    thresholds: Thresholds | None = None,
    slo_seconds: float = DEFAULT_SLO_SECONDS,
    scrape_interval_seconds: float | None = None,
    runbook_base_url: str | None = None,
    dashboard_base_url: str | None = None,
) -> str:
    """The rule file's text, header included (what ``kvdoctor rules export`` writes): ``thresholds``
    sized for ``scrape_interval_seconds`` (default ``DEFAULT_SCRAPE_INTERVAL_SECONDS``), the alerts'
    ``for`` and the SLO's windows scaled with it. Without ``runbook_base_url`` no alert has a
    runbook_url (the header says so): a link is absolute or absent."""
    interval = DEFAULT_SCRAPE_INTERVAL_SECONDS if scrape_interval_seconds is None else scrape_interval_seconds
    t = rule_thresholds(thresholds, interval)
    body = yaml.dump(
        rule_groups(t, slo_seconds, runbook_base_url, interval, dashboard_base_url),
        Dumper=_LiteralDumper,
        sort_keys=False,
        width=120,
        default_flow_style=False,
    )
    settings = (
        f"# for a scrape interval of {duration(interval)} or less (ranges of at least {duration(interval * 4)}): "
        f"window {duration(t.window_seconds)}, state {duration(min(t.state_window_seconds, t.window_seconds))}; "
        f"ITL SLO: each pod's {ITL_SLO}, else {slo_seconds * 1000:g} ms; thresholds: rules/thresholds.py\n"
        f"# {slo_alerts.describe(interval)}\n"
    )
    if not runbook_base_url:
        settings += f"# {NO_RUNBOOK_NOTE}\n"
    return HEADER + settings + body


NO_RUNBOOK_NOTE = (
    "no runbook_url: no --runbook-base-url given (the dashboard serves the runbooks at <dashboard>/runbooks/)"
)


# ------------------------------------------------------------------ templates, for tests


def render_template(
    text: str, labels: Mapping[str, str], value: float, query: alert_templates.Query | None = None
) -> str:
    """Render an annotation as Prometheus does (for promtool's expected annotations and the checks
    that none renders empty): ``alert_templates.render``. Anything it does not know is an error."""
    return alert_templates.render(text, labels, value, query)
