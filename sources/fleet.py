"""The fleet read from a Prometheus-compatible query API: every pod a selector matches, worst first.

``read_fleet(client, selector, namespace=None, at=None) -> FleetSummary`` is the contract the
CLI (``kvdoctor diagnose --prometheus``) and the dashboard's Fleet page share:

- ``selector``: label matchers as ``diagnose --selector`` takes them (``{job="vllm"}``,
  ``pod=~"vllm-.*",model_name="x"``; empty or None: every pod); ``namespace``: one more matcher,
  ``namespace="<it>"``. Any label of the exporters' series (target labels, ``pod``) or of the
  engine series (``model_name``, ``engine``) may be matched.
- It asks three instant queries at ``at`` (default: now), whatever the fleet's size
  (``kvdoctor.rules.fleet.fleet_queries``): the pods, each pod's verdict (its exporter's
  ``kvdoctor_diagnosis_verdict``) and the recorded features (ITL p95, KV usage, requests waiting
  and running, at whichever scrape-interval sizing the store's rule file has) with the SLO each
  pod publishes. It never reads a range.
- It returns a ``kvdoctor.rules.fleet.FleetSummary``: ``rows`` (one ``FleetRow`` per pod:
  namespace, pod, verdict, itl_p95_seconds, slo_seconds, kv_usage, waiting, running,
  first_action, first_fix; worst first by ``worst_first_key``), ``counts`` (pods per verdict,
  every verdict listed), ``slow``, ``notes``, ``select(namespace, verdicts, search)`` and
  ``to_json(limit)``. No pod matching is an empty summary, not an error: the caller says so.
- It raises ``BadSelector`` (a ``QueryRejected``: the caller's input) for a selector that is not
  label matchers, before any request, or one the store rejects; ``SourceError`` with one line when
  the store cannot be read (unreachable, too slow, an error, not a Prometheus API).
"""

from __future__ import annotations

import time

from kvdoctor.rules.fleet import FleetSummary, Matcher, fleet_queries, render_matchers, summarize
from kvdoctor.rules.promql import quote
from kvdoctor.sources.http import one_line
from kvdoctor.sources.prometheus import BadSelector, PrometheusClient, QueryRejected, parse_matchers

__all__ = ["fleet_matchers", "read_fleet"]


def fleet_matchers(selector: str | None, namespace: str | None = None) -> list[Matcher]:
    """The matchers of ``selector`` plus ``namespace="<namespace>"``; BadSelector if it is not label matchers."""
    try:
        matchers = parse_matchers(selector)
    except ValueError as exc:
        raise BadSelector(str(exc), str(exc)) from None
    if namespace is not None:
        if not namespace.strip():
            raise BadSelector("the namespace is empty", "the namespace is empty")
        matchers.append(("namespace", "=", quote(namespace.strip())))
    return matchers


def read_fleet(
    client: PrometheusClient, selector: str | None = None, namespace: str | None = None, at: float | None = None
) -> FleetSummary:
    """Every pod matching ``selector`` (and ``namespace``) at ``at`` (default now), worst first."""
    matchers = fleet_matchers(selector, namespace)
    shown = "{" + render_matchers(matchers) + "}"
    when = time.time() if at is None else float(at)
    answers: dict[str, list[tuple[dict[str, str], float]]] = {}
    for name, expr in fleet_queries(matchers).items():
        try:
            answers[name] = client.query(expr, when)
        except QueryRejected as exc:
            message = one_line(f"{client.url} rejected the query for selector {shown}: {exc.detail}")
            raise BadSelector(message, exc.detail) from None
        if name == "pods" and not answers[name]:
            return summarize([], [], [], when, shown)  # nothing matches: no more questions
    return summarize(answers["pods"], answers["verdicts"], answers["features"], when, shown)
