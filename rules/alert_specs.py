"""The alerts the rules raise: one per verdict the tree can give, and one for a source that is down.

Each ``AlertSpec`` is the alert's name, the verdict it stands for, its severity and ``for``, the
feature its ``$value`` shows, and its words; ``rules/promql.py`` compiles the expressions.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import links
from .verdicts import ALERT_OF

# The runbooks shipped in this repository, relative to its root (docs/runbooks/<Alert>.md): the one
# address that is real wherever the repository is cloned, mirrored or vendored. Give
# `kvdoctor rules export --runbook-base-url` (helm: monitoring.prometheusRule.runbookBaseUrl)
# where your copy is browsable, e.g. https://github.com/ORG/kvdoctor/blob/main/docs/runbooks/.
RUNBOOK_BASE_URL = links.DEFAULT_RUNBOOK_BASE


@dataclass(frozen=True)
class AlertSpec:
    """An alert: which verdict it stands for, how loud, and what it says.

    ``summary``/``description`` are Prometheus templates; they may use ``{{ $labels.<name> }}``,
    ``{{ $value | humanize }}`` and ``{{ $value | humanizePercentage }}`` (``render_template``
    renders exactly these, for tests), plus ``{slo}`` and ``{q}``, filled at compile time.
    """

    name: str
    verdict: str | None
    severity: str
    for_: str
    value_feature: str | None
    summary: str
    description: str

    def runbook_url(self, base: str = RUNBOOK_BASE_URL) -> str:
        return links.runbook_url(base, self.name)


_WHERE = "{{ $labels.model_name }} on {{ $labels.pod }}"
_SLO = "its SLO (the pod's kvdoctor_inter_token_latency_slo_seconds; {slo} where it publishes none)"

ALERTS: tuple[AlertSpec, ...] = (
    AlertSpec(
        ALERT_OF["kv_thrashing"],
        "kv_thrashing",
        "critical",
        "5m",
        "preemptions_per_minute",
        "KV cache thrashing on {{ $labels.pod }}",
        _WHERE + " preempts {{ $value | humanize }} requests per minute (or swaps them out, or reloads KV into a "
        "full pool) while requests wait or ITL is over " + _SLO + ": the KV-cache pool ran out, so preempted "
        "requests recompute their whole prefix and queue again.",
    ),
    AlertSpec(
        ALERT_OF["kv_tier_miss"],
        "kv_tier_miss",
        "warning",
        "10m",
        "kv_to_gpu_bytes_per_second",
        "Prefix-cache hits served from a slow tier on {{ $labels.pod }}",
        _WHERE + " moves {{ $value | humanize }}B/s of KV into the GPU from host/disk/remote (or reads its "
        "prefix hits from there) while ITL is over " + _SLO + " or TTFT over {ttft}: the prefix-cache 'hit' "
        "is served from a slow tier and the transfer is not hidden behind compute.",
    ),
    AlertSpec(
        ALERT_OF["kv_capacity_pressure"],
        "kv_capacity_pressure",
        "warning",
        "10m",
        "kv_usage",
        "KV-cache pool full with requests delayed on {{ $labels.pod }}",
        _WHERE + " holds its KV-cache pool at {{ $value | humanizePercentage }} while requests wait (or TTFT "
        "is over {ttft}): admission is limited by KV capacity (no preemption yet; thrashing is next).",
    ),
    AlertSpec(
        ALERT_OF["request_queueing"],
        "request_queueing",
        "warning",
        "10m",
        "requests_waiting",
        "Requests queue on {{ $labels.pod }} while KV has room",
        _WHERE + " has {{ $value | humanize }} requests waiting while its KV-cache pool has room (or does "
        "not report its usage): the engine's sequence limit (vLLM --max-num-seqs, llama.cpp --parallel, "
        "SGLang --max-running-requests) or the load is the limit.",
    ),
    AlertSpec(
        ALERT_OF["memory_bandwidth_bound"],
        "memory_bandwidth_bound",
        "warning",
        "10m",
        "itl_p95_seconds",
        "Decode is HBM-bandwidth bound on {{ $labels.pod }}",
        _WHERE + " has ITL p{q} {{ $value | humanize }}s, over " + _SLO + ", and HBM bandwidth is the limit "
        "(DRAM bandwidth the busiest resource, or no clearer cause): every token re-reads the weights and the "
        "whole KV of the batch, so latency grows with context. A prefix-cache hit does not help here.",
    ),
    AlertSpec(
        ALERT_OF["compute_bound"],
        "compute_bound",
        "warning",
        "10m",
        "itl_p95_seconds",
        "Decode is compute bound on {{ $labels.pod }}",
        _WHERE + " has ITL p{q} {{ $value | humanize }}s, over " + _SLO + ", with the SMs saturated and DRAM "
        "bandwidth below them: prefill-heavy traffic or a very large batch.",
    ),
    AlertSpec(
        ALERT_OF["host_overhead_bound"],
        "host_overhead_bound",
        "warning",
        "10m",
        "itl_p95_seconds",
        "Decode is host-overhead bound on {{ $labels.pod }}",
        _WHERE + " has ITL p{q} {{ $value | humanize }}s, over " + _SLO + ", while its GPUs are mostly idle: "
        "the time goes to the scheduler, CPU, Python, locks or queues, not to the GPU.",
    ),
    AlertSpec(
        "KvdoctorSourceDown",
        None,
        "warning",
        "5m",
        None,
        "kvdoctor cannot read source {{ $labels.source }} on {{ $labels.pod }}",
        "The kvdoctor exporter on {{ $labels.pod }} failed to collect from {{ $labels.source }} for 5 minutes; "
        "the signals it provides are missing, so verdicts and alerts that need them cannot be trusted.",
    ),
)

ALERT_BY_NAME = {a.name: a for a in ALERTS}
VERDICT_ALERT: dict[str, str] = {a.verdict: a.name for a in ALERTS if a.verdict}
VERDICT_ALERT_NAMES = tuple(VERDICT_ALERT.values())
