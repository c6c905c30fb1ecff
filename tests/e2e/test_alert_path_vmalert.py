"""The alert walk of test_alert_path.py on VictoriaMetrics: vmagent scraping one demo engine per
slow scenario (no Kubernetes labels) into a single-node VictoriaMetrics, vmalert evaluating the
same exported rules (for a 1 s scrape) and writing its records back, and the same real Alertmanager
with the shipped config (alert_path.py), the page route's group_wait long enough for vmalert's
records (``GROUP_WAIT``). Prints the onset-to-notification times (docs/alerting.md).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest

from kvdoctor.rules import promql
from tests.e2e.alert_path import AlertingSide, alert_path_fixture
from tests.support import tools
from tests.support.victoria import VictoriaStack

pytestmark = [pytest.mark.slow, tools.needs("victoria-metrics", "alertmanager")]

# vmalert writes each record back through VictoriaMetrics and reads it on its next evaluation, one
# -search.latencyOffset behind: kvdoctor:verdict, records of records, follows the raw series by
# several evaluations (13 s behind the page's first firing, measured at 1 s; Prometheus has none).
# The page reads the verdict each time it is evaluated, and Alertmanager sends the annotations it
# holds when group_wait ends: the page route's group_wait must cover that lag (the shipped 30 s,
# scaled here as 1 s is to 15 s, would not; 30 s leaves room on a busy machine), or the page reads
# "Cause: none found" (docs/alerting.md, "On VictoriaMetrics").
GROUP_WAIT = "30s"


class VmalertBackend:
    """The walk's view of the stack: queries to VictoriaMetrics, alerts from vmalert."""

    def __init__(self, victoria: VictoriaStack):
        self.victoria = victoria

    def query(self, expr: str) -> list[dict[str, Any]]:
        return self.victoria.query(expr)

    def alerts(self) -> list[dict[str, Any]]:
        return self.victoria.alerter.alerts()


def start_vmalert(
    binary: str, stack: contextlib.ExitStack, work: Path, targets: list[str], side: AlertingSide
) -> VmalertBackend:
    """vmagent, VictoriaMetrics and vmalert over ``targets``, vmalert sending to the side's Alertmanager."""
    victoria = VictoriaStack(binary, work / "victoria", targets=targets, rule_files=[side.rules])
    victoria.alerter.notifier = side.alertmanager.url  # the real Alertmanager, not the stack's stand-in
    stack.callback(victoria.stop)
    victoria.start()
    victoria.wait_for(promql.VERDICT_RECORD, lambda r: len(r) == len(targets), timeout=120)
    return VmalertBackend(victoria)


alert_path = alert_path_fixture("victoria-metrics", start_vmalert, page_group_wait=GROUP_WAIT)


def test_every_slow_scenario_pages_once_naming_its_cause_and_resolves_on_vmalert(alert_path):
    timings = alert_path.walk()
    print("\n" + timings.report("vmalert 1.79 + Alertmanager 0.25"))
