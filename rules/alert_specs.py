"""The alerts the rules raise: one per verdict the tree can give (the cause), one for a source that is
down, and one for an exporter that is down; ``rules/slo_alerts.py`` adds the latency SLO's burn-rate
alerts, which page and name the cause.

Each ``AlertSpec`` is the alert's name, the verdict it stands for, its severity and ``for`` (in
scrape intervals, so the export for a 1 m scrape waits as many scrapes as the one for 15 s), the
feature its ``$value`` shows and in which unit, and its words; ``rules/promql.py`` compiles the
expressions. The words are written for the person on call, wherever the notification lands: the
engine is named by its pod, else its instance, else its job (``alert_templates.engine``); values are
in milliseconds, percentages and bytes per second; no metric name appears in the prose.

The cause alerts' words make no query: Prometheus expands every pending or firing alert's templates
at every evaluation, and a query per alert costs more than the tree's records at a fleet's size
(bench/bench_fleet.py). The SLO pages (``slo_alerts``) query what the words need when they fire: the
pod's SLO, the cause, and the other causes present (``contributing``).

Severities (what the shipped Alertmanager example, deploy/alertmanager/, routes on):

- ``critical`` pages: the fast SLO burn (``KvdoctorLatencySLOFastBurn``), an exporter that is down;
- ``warning`` opens a ticket: the slow SLO burn, a source the exporter cannot read;
- ``info`` records the cause: the per-cause alerts. They are what the SLO page names; on their own
  they go to the chat channel. ``for: 12`` scrapes (3 minutes at 15 s): one window and a half of
  the rules, so a verdict that flips for one window never notifies, and the cause is settled by the
  time the fast burn pages.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import alert_templates as T
from . import links
from .actions import CATALOGUE, FIX, MITIGATE, VERDICT_ACTIONS
from .thresholds import DEFAULT_SCRAPE_INTERVAL_SECONDS
from .verdicts import ALERT_OF

# The runbooks shipped in this repository, relative to its root (docs/runbooks/<Alert>.md). An
# alert's runbook_url is absolute or absent: `kvdoctor rules export --runbook-base-url URL` (helm:
# the dashboard's ingress host, or monitoring.prometheusRule.runbookBaseUrl) gives the base, e.g.
# the dashboard's https://kvdoctor.example.com/runbooks/ (it serves every runbook there) or
# https://github.com/ORG/kvdoctor/blob/main/docs/runbooks/.
RUNBOOK_BASE_URL = links.RUNBOOKS_IN_REPOSITORY

CAUSE_FOR_SCRAPES = 12  # the per-cause alerts' for: 3m at 15 s
SOURCE_DOWN_FOR_SCRAPES = 20  # 5m at 15 s: a source failing for that long, not one failed read
EXPORTER_DOWN_FOR_SCRAPES = 4  # 1m at 15 s: four failed scrapes in a row, not a restart


def first_action(verdict: str) -> str:
    """What to do first about ``verdict``: the first mitigation, then the first fix."""
    ids = VERDICT_ACTIONS.get(verdict, ())
    by_id = {a.id: a for a in CATALOGUE}
    mitigate = next((by_id[i] for i in ids if by_id[i].group == MITIGATE), None)
    fix = next((by_id[i] for i in ids if by_id[i].group == FIX), None)
    parts = []
    if mitigate is not None:
        parts.append(f"now: {mitigate.title[0].lower()}{mitigate.title[1:]}")
    if fix is not None:
        flag = f" ({fix.flag_vllm})" if fix.flag_vllm else ""
        parts.append(f"then: {fix.title[0].lower()}{fix.title[1:]}{flag}")
    return "; ".join(parts)


@dataclass(frozen=True)
class AlertSpec:
    """An alert: which verdict it stands for, how loud, and what it says.

    ``summary``/``description`` are templates (``alert_templates``): ``{engine}``, ``{value}``
    (``$value`` in ``value_kind``'s unit), ``{model}``, ``{action}``, ``{q}``, ``{ttft}`` and
    ``{slo_default}`` are filled at compile time.
    """

    name: str
    verdict: str | None
    severity: str
    for_scrapes: int
    value_feature: str | None
    value_kind: str
    cause: str  # the cause in a few words, as the SLO page names it
    summary: str
    description: str

    def runbook_url(self, base: str | None) -> str | None:
        """``<base><Alert>.md``, or None without a base (never a relative path)."""
        if not base:
            return None
        return links.runbook_url(base, self.name)

    def for_seconds(self, scrape_interval_seconds: float = DEFAULT_SCRAPE_INTERVAL_SECONDS) -> float:
        return self.for_scrapes * scrape_interval_seconds

    @property
    def for_(self) -> str:
        """The ``for`` of the default export (15 s scrapes), as Prometheus writes it: ``3m``."""
        seconds = round(self.for_seconds())
        return f"{seconds // 60}m" if seconds % 60 == 0 else f"{seconds}s"

    @property
    def action(self) -> str:
        return first_action(self.verdict) if self.verdict else ""


_ON = "{engine}{model}"
_ITL = "ITL p{q} {value}, over its SLO"

ALERTS: tuple[AlertSpec, ...] = (
    AlertSpec(
        ALERT_OF["kv_thrashing"],
        "kv_thrashing",
        "info",
        CAUSE_FOR_SCRAPES,
        "preemptions_per_minute",
        "number",
        "KV cache thrashing: the KV-cache pool ran out, preempted requests recompute their prefix",
        "KV cache thrashing on {engine}: {value} preemptions per minute",
        _ON + " preempts {value} requests per minute (or swaps them out, or reloads KV into a full pool) "
        "while requests wait or ITL is over its SLO: the KV-cache pool ran out, so preempted "
        "requests recompute their whole prefix and queue again. First action: {action}.",
    ),
    AlertSpec(
        ALERT_OF["kv_tier_miss"],
        "kv_tier_miss",
        "info",
        CAUSE_FOR_SCRAPES,
        "kv_to_gpu_bytes_per_second",
        "bytes_rate",
        "prefix-cache hits served from a slow tier (host, disk or remote)",
        "Prefix-cache hits from a slow tier on {engine}: {value} of KV into the GPU",
        _ON + " moves {value} of KV into the GPU from host, disk or remote (or reads its prefix hits "
        "from there) while ITL or TTFT is over its SLO (TTFT {ttft}): the prefix-cache hit is "
        "served from a slow tier and the transfer is not hidden behind compute. First action: {action}.",
    ),
    AlertSpec(
        ALERT_OF["kv_capacity_pressure"],
        "kv_capacity_pressure",
        "info",
        CAUSE_FOR_SCRAPES,
        "kv_usage",
        "percent",
        "KV-cache pool full: admission is limited by KV capacity",
        "KV-cache pool full with requests delayed on {engine}: {value} used",
        _ON + " holds its KV-cache pool at {value} while requests wait (or TTFT is over {ttft}): "
        "admission is limited by KV capacity (no preemption yet; thrashing is next). "
        "First action: {action}.",
    ),
    AlertSpec(
        ALERT_OF["request_queueing"],
        "request_queueing",
        "info",
        CAUSE_FOR_SCRAPES,
        "requests_waiting",
        "number",
        "requests queue while KV has room: the sequence limit or the load is the limit",
        "Requests queue on {engine} while KV has room: {value} waiting",
        _ON + " has {value} requests waiting while its KV-cache pool has room (or does not report its "
        "usage): the engine's sequence limit (vLLM --max-num-seqs, llama.cpp --parallel, SGLang "
        "--max-running-requests) or the load is the limit. First action: {action}.",
    ),
    AlertSpec(
        ALERT_OF["memory_bandwidth_bound"],
        "memory_bandwidth_bound",
        "info",
        CAUSE_FOR_SCRAPES,
        "itl_p95_seconds",
        "duration",
        "decode is HBM-bandwidth bound: every token re-reads the weights and the batch's KV",
        "Decode is HBM-bandwidth bound on {engine}: " + _ITL,
        _ON + " has " + _ITL + ", and HBM bandwidth is the limit (DRAM bandwidth the busiest resource, "
        "or no clearer cause): every token re-reads the weights and the whole KV of the batch, so latency "
        "grows with context. A prefix-cache hit does not help here. First action: {action}.",
    ),
    AlertSpec(
        ALERT_OF["compute_bound"],
        "compute_bound",
        "info",
        CAUSE_FOR_SCRAPES,
        "itl_p95_seconds",
        "duration",
        "decode is compute bound: prefill-heavy traffic or a very large batch",
        "Decode is compute bound on {engine}: " + _ITL,
        _ON + " has " + _ITL + ", with the SMs saturated and DRAM bandwidth below them: prefill-heavy "
        "traffic or a very large batch. First action: {action}.",
    ),
    AlertSpec(
        ALERT_OF["host_overhead_bound"],
        "host_overhead_bound",
        "info",
        CAUSE_FOR_SCRAPES,
        "itl_p95_seconds",
        "duration",
        "decode is host-overhead bound: the GPUs wait on the scheduler, CPU or Python",
        "Decode is host-overhead bound on {engine}: " + _ITL,
        _ON + " has " + _ITL + ", while its GPUs are mostly idle: the time goes to the scheduler, CPU, "
        "Python, locks or queues, not to the GPU. First action: {action}.",
    ),
    AlertSpec(
        "KvdoctorSourceDown",
        None,
        "warning",
        SOURCE_DOWN_FOR_SCRAPES,
        None,
        "number",
        "a source the exporter reads is down",
        "kvdoctor cannot read {{ $labels.source }} on {engine}",
        "The kvdoctor exporter on {engine} has failed to collect from {{ $labels.source }} for {for}; "
        "the signals it provides are missing, so verdicts and alerts that need them cannot be trusted.",
    ),
    AlertSpec(
        "KvdoctorExporterDown",
        None,
        "critical",
        EXPORTER_DOWN_FOR_SCRAPES,
        None,
        "number",
        "the kvdoctor exporter is down",
        "kvdoctor exporter down on {engine}: its verdicts and alerts are unknown",
        "Prometheus has not read the kvdoctor exporter on {engine} for {for} (its target is down, or "
        "answers without kvdoctor's series). Every verdict of this engine is unknown, not healthy: its "
        "cause alerts and latency pages are held back until it is back, and nothing here resolves them. "
        "Check the exporter's container (restarts, OOM kills) and its scrape target.",
    ),
)

ALERT_BY_NAME = {a.name: a for a in ALERTS}
VERDICT_ALERT: dict[str, str] = {a.verdict: a.name for a in ALERTS if a.verdict}
VERDICT_ALERT_NAMES = tuple(VERDICT_ALERT.values())
SOURCE_DOWN_ALERT = "KvdoctorSourceDown"
EXPORTER_DOWN_ALERT = "KvdoctorExporterDown"


def fill(text: str, *, value_kind: str, slo_default_ms: float, q: float, ttft_s: float, for_: str, action: str) -> str:
    """The compile-time fields of an alert's words."""
    return (
        text.replace("{engine}", T.engine())
        .replace("{model}", "{{ with $labels.model_name }} ({{ . }}){{ end }}")
        .replace("{value}", T.value(value_kind))
        .replace("{ttft}", f"{ttft_s:g} s")
        .replace("{q}", f"{q * 100:g}")
        .replace("{for}", for_)
        .replace("{action}", action)
        .replace("{slo_default}", f"{slo_default_ms:g} ms")
    )
