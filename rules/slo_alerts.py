"""The latency SLO's multi-window, multi-burn-rate alerts: a fast burn pages, a slow burn opens a
ticket, and each names the cause by reading kvdoctor's verdict for the engine when it fires.

The SLO is each pod's ITL SLO (``kvdoctor:itl_slo_seconds``: the one it publishes, else the export's
``--slo-ms``), stated as a p95: 95% of tokens within it. The error budget is therefore **5% of tokens
over the SLO** (``ERROR_BUDGET``). The burn rate is the fraction of tokens over the SLO divided by
the budget; it is read from the ITL histogram without any new series: "more than a fraction f of
the tokens in a window took longer than the SLO" is "the histogram's (1 - f) quantile over that
window is over the SLO" (the histogram interpolated as everywhere else in the rules).

With a 5% budget no burn rate exceeds 20, so the SRE workbook's 14.4x (sized for a 99.9% SLO) would
wait until 72% of an hour's tokens were slow: 43 minutes into a total slowdown. The factors here
are sized for the p95 SLO instead:

- fast burn (page, ``critical``): 2x the budget, more than 10% of tokens over the SLO, over both
  1 hour and 5 minutes. A slowdown that makes every token slow pages after 6 minutes (10% of the
  hour); a spike shorter than that pages nobody; and the 5 minute window lets the page resolve
  5 minutes after recovery rather than an hour.
- slow burn (ticket, ``warning``): 1x, more than 5% of tokens over the SLO (the p95 over it), over
  both 6 hours and 30 minutes: the budget spent as fast as it accrues, for hours.

The windows scale with the scrape interval (they hold as many scrapes as at 15 s: 240 and 20 for the
fast pair), so a rule file exported for a 1 s scrape (tests) runs the same logic in 1/15 the time.

A TTFT SLO, where one is set (the exporter's ``--ttft-slo-ms``, published as
``kvdoctor_time_to_first_token_slo_seconds`` and recorded per pod as ``kvdoctor:ttft_slo_seconds``),
gets the same pair on the TTFT histogram (``KvdoctorTTFTSLOFastBurn``, ``KvdoctorTTFTSLOSlowBurn``,
label ``slo="ttft"``): also a p95, so 5% of requests over it is the budget. A pod without one has none.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kvdoctor.signals.vocabulary import DIAGNOSIS_VERDICT, INTER_TOKEN_LATENCY, TIME_TO_FIRST_TOKEN, TTFT_SLO

from . import alert_templates as T
from .alert_specs import ALERT_BY_NAME, VERDICT_ALERT, AlertSpec
from .feature_promql import ENGINE_KEYS, GPU_KEYS, prom_number
from .promql import GPU_ON, SLO_RECORD, VERDICT_RECORD, duration
from .thresholds import DEFAULT_SCRAPE_INTERVAL_SECONDS

GROUP_NAME = "kvdoctor-slo"
ERROR_BUDGET = 0.05  # the share of tokens allowed over the ITL SLO: the SLO is a p95
REFERENCE_INTERVAL = DEFAULT_SCRAPE_INTERVAL_SECONDS  # the windows below are for this scrape interval
BURN_FOR_SCRAPES = 2  # two evaluations in a row: one odd evaluation pages nobody


@dataclass(frozen=True)
class Objective:
    """A latency SLO the burn alerts guard: the histogram it reads, the record holding each pod's
    SLO, what the histogram counts, and the alerts' ``slo`` label."""

    key: str  # the alerts' ``slo`` label
    title: str  # how the words name it: "ITL", "TTFT"
    histogram: str  # the canonical histogram family
    slo_record: str  # each pod's SLO, seconds
    counts: str  # what one observation is: "tokens", "requests"


ITL = Objective("itl", "ITL", INTER_TOKEN_LATENCY, SLO_RECORD, "tokens")
# Only for the pods whose exporter publishes a TTFT SLO (``--ttft-slo-ms``): no default, since a time
# to first token depends on the prompt lengths the service accepts, which kvdoctor cannot know.
TTFT = Objective("ttft", "TTFT", TIME_TO_FIRST_TOKEN, "kvdoctor:ttft_slo_seconds", "requests")
OBJECTIVES = (ITL, TTFT)


@dataclass(frozen=True)
class Burn:
    """One multi-window burn-rate alert: both windows over ``factor`` times the budget."""

    spec: AlertSpec
    objective: Objective
    factor: float
    long_seconds: float  # at REFERENCE_INTERVAL
    short_seconds: float

    @property
    def fraction(self) -> float:
        """The share of observations over the SLO that this burn rate means."""
        return self.factor * ERROR_BUDGET

    @property
    def quantile(self) -> float:
        return round(1 - self.fraction, 6)

    def windows(self, interval: float) -> tuple[float, float]:
        scale = interval / REFERENCE_INTERVAL
        return self.long_seconds * scale, self.short_seconds * scale


_CAUSE = "{cause}"
_FAST_SUMMARY = "{obj} SLO burning fast on {engine}: {obj} p{pq} {value} over {short}, SLO {slo}. Cause: {cause_short}"
_FAST_DESCRIPTION = (
    "More than {pct} of the {counts} of {engine}{model} took longer than its {obj} SLO of {slo}, over the last "
    "{long} and the last {short} ({obj} p{pq} {value} over {short}): the error budget, 5% of {counts} over the "
    "SLO, burns {factor}x faster than it accrues. Cause, kvdoctor's verdict now: " + _CAUSE
)
_SLOW_SUMMARY = "{obj} SLO burning on {engine}: {obj} p{pq} {value} over {short}, SLO {slo}. Cause: {cause_short}"
_SLOW_DESCRIPTION = (
    "More than {pct} of the {counts} of {engine}{model} took longer than its {obj} SLO of {slo}, over the last "
    "{long} and the last {short} ({obj} p{pq} {value} over {short}): the error budget, 5% of {counts} over the "
    "SLO, is spent as fast as it accrues. Cause, kvdoctor's verdict now: " + _CAUSE
)


def _burns(objective: Objective, fast_name: str, slow_name: str) -> tuple[Burn, Burn]:
    """The objective's fast burn (a page) and slow burn (a ticket)."""

    def spec(name: str, severity: str, summary: str, description: str) -> AlertSpec:
        return AlertSpec(name, None, severity, BURN_FOR_SCRAPES, None, "duration", "", summary, description)

    fast = spec(fast_name, "critical", _FAST_SUMMARY, _FAST_DESCRIPTION)
    slow = spec(slow_name, "warning", _SLOW_SUMMARY, _SLOW_DESCRIPTION)
    return (
        Burn(fast, objective, factor=2.0, long_seconds=3600, short_seconds=300),
        Burn(slow, objective, factor=1.0, long_seconds=21600, short_seconds=1800),
    )


# The ITL alerts keep the names they shipped with (routes and silences match them).
FAST, SLOW = _burns(ITL, "KvdoctorLatencySLOFastBurn", "KvdoctorLatencySLOSlowBurn")
TTFT_FAST, TTFT_SLOW = _burns(TTFT, "KvdoctorTTFTSLOFastBurn", "KvdoctorTTFTSLOSlowBurn")
BURNS = (FAST, SLOW, TTFT_FAST, TTFT_SLOW)
# What a burn alert says at its last firing evaluation, the short window back under the SLO
# (``burn_expr``): the words of its resolved notification.
RECOVERED_SUMMARY = "{obj} SLO recovered on {engine}: {obj} p{pq} {value} over {short}, SLO {slo}"
RECOVERED_DESCRIPTION = (
    "The {counts} of {engine}{model} are back within its {obj} SLO of {slo} over the last {short} "
    "({obj} p{pq} {value}): the alert resolves."
)
SLO_ALERTS = tuple(b.spec for b in BURNS)
SLO_ALERT_NAMES = tuple(s.name for s in SLO_ALERTS)


def describe(interval: float) -> str:
    """One line for the rule file's header: the SLO's budget and windows at ``interval``."""
    parts = []
    for b in BURNS:
        long, short = b.windows(interval)
        parts.append(f"{b.spec.name} {b.factor:g}x over {duration(long)} and {duration(short)}")
    return (
        f"latency SLOs: error budget {ERROR_BUDGET:.0%} of tokens over each pod's ITL SLO, and of requests over "
        "its TTFT SLO where it publishes one; " + "; ".join(parts)
    )


def cause(verdict_codes: Mapping[str, int], short: bool) -> str:
    """The engine's verdict when the alert fires, in words: a query of ``kvdoctor:verdict`` for it
    (a join, not a second tree), then whether the exporter's own live diagnosis agrees."""
    branches = []
    for verdict, code in verdict_codes.items():
        spec = ALERT_BY_NAME[_alert_of(verdict)]
        if short:
            text = spec.cause.split(":")[0]
        else:
            agrees = T.selector(DIAGNOSIS_VERDICT, f'verdict=\\"{verdict}\\"', " == 1")
            text = (
                f"{spec.cause}. First action: {spec.action}. Confidence: "
                "{{ with " + agrees + " | query }}high, the exporter's own diagnosis agrees"
                "{{ else }}lower, the exporter's own diagnosis differs or is not published{{ end }}"
                f". Details: the {spec.name} runbook."
            )
        branches.append((float(code), text))
    chain = "".join(
        ("{{ if " if i == 0 else "{{ else if ") + f"eq $v {code:.1f} }}}}{text}"
        for i, (code, text) in enumerate(branches)
    )
    none_slow = (
        "none, the engine reads healthy over the rules' window (a latency spike, or a cause kvdoctor cannot see)"
    )
    unknown = "unknown, no verdict for this engine now (its exporter down, or too few samples)"
    if short:
        none_slow, unknown = "none found", "unknown"
    return (
        "{{ with "
        + T.selector(VERDICT_RECORD)
        + " | query }}{{ $v := . | first | value }}"
        + chain
        + "{{ else }}"
        + none_slow
        + "{{ end }}{{ else }}"
        + unknown
        + "{{ end }}"
    )


def _alert_of(verdict: str) -> str:
    return VERDICT_ALERT[verdict]


Annotate = Callable[[AlertSpec, str, str], dict[str, str]]


def quantile_over(histogram: str, window: str, q: float, offset: str = "") -> str:
    keys = ", ".join(ENGINE_KEYS)
    bucket = f"{histogram}_bucket[{window}]" + (f" offset {offset}" if offset else "")
    return f"max by ({keys}) (histogram_quantile({prom_number(q)}, increase({bucket})))"


def _against_slo(record: str, test: str, text: str) -> str:
    """``text`` where ``$value`` compares to the pod's SLO (``record``) as ``test`` (``gt``: still
    burning; ``le``: the evaluation that recovered, see ``burn_expr``)."""
    return (
        "{{ with "
        + T.selector(record)
        + " | query }}{{ if "
        + test
        + " $value (. | first | value) }}"
        + text
        + "{{ end }}{{ end }}"
    )


def burn_expr(b: Burn, interval: float) -> str:
    """Both windows over the pod's SLO; and, once the alert fires, for as long as the short window was
    over the SLO at the previous evaluation. So it resolves one evaluation after the short window is
    back under the SLO, and that last firing evaluation's ``$value`` (the short window's quantile) is
    the recovered one: Prometheus and vmalert send a resolved alert with the annotations of its last
    firing evaluation, which is how the resolved notification shows the value after recovery. (A
    long window back under first, as when a slowdown also cut the token rate, keeps the page while
    the last minutes still burn.) A pod without the objective's SLO record has no alert."""
    on = "on(" + ", ".join(ENGINE_KEYS) + ")"
    slo = f"{GPU_ON} group_left() {b.objective.slo_record}"
    long, short = (duration(w) for w in b.windows(interval))
    h = b.objective.histogram
    burning = f"{quantile_over(h, short, b.quantile)} > {slo}\nand {on}\n{quantile_over(h, long, b.quantile)} > {slo}"
    recovering = (
        f"{quantile_over(h, short, b.quantile)}\n"
        f"and {on}\n{quantile_over(h, short, b.quantile, duration(interval))} > {slo}\n"
        f'and {on}\nALERTS{{alertname="{b.spec.name}", alertstate="firing"}}'
    )
    return f"(\n{burning}\n)\nor {on}\n(\n{recovering}\n)"


def ttft_slo_rule(window: str) -> dict[str, object]:
    """Each pod's TTFT SLO, where its exporter publishes one: the last over ``window`` (the rules'
    window, as the ITL SLO's record reads it), so a pod is judged by its own SLO while its samples last."""
    keys = ", ".join(GPU_KEYS)
    return {"record": TTFT.slo_record, "expr": f"max by ({keys}) (last_over_time({TTFT_SLO}[{window}]))"}


def burn_rate_rules(
    interval: float, *, window_seconds: float, annotate: Annotate, verdict_codes: Mapping[str, int]
) -> list[dict[str, object]]:
    """The SLO group for rules exported for ``interval``: the TTFT SLO's record (the ITL SLO's is the
    tree's), then the burn-rate alerts, each comparing with its pod's own SLO."""
    rules: list[dict[str, object]] = [ttft_slo_rule(duration(window_seconds))]
    for b in BURNS:
        long_s, short_s = b.windows(interval)
        record = b.objective.slo_record
        words = {
            "{engine}": T.engine(),
            "{model}": "{{ with $labels.model_name }} ({{ . }}){{ end }}",
            "{value}": T.value("duration"),
            "{slo}": T.slo(record),
            "{obj}": b.objective.title,
            "{counts}": b.objective.counts,
            "{pq}": f"{b.quantile * 100:g}",
            "{pct}": f"{b.fraction:.0%}",
            "{factor}": f"{b.factor:g}",
            "{long}": T.prose_duration(long_s),
            "{short}": T.prose_duration(short_s),
            "{cause_short}": cause(verdict_codes, short=True),
            "{cause}": cause(verdict_codes, short=False),
        }
        summary, description = b.spec.summary, b.spec.description
        summary = _against_slo(record, "gt", summary) + _against_slo(record, "le", RECOVERED_SUMMARY)
        description = _against_slo(record, "gt", description) + _against_slo(record, "le", RECOVERED_DESCRIPTION)
        for key, text in words.items():
            summary, description = summary.replace(key, text), description.replace(key, text)
        rules.append(
            {
                "alert": b.spec.name,
                "expr": burn_expr(b, interval),
                "for": duration(b.spec.for_seconds(interval)),
                "labels": {"severity": b.spec.severity, "slo": b.objective.key},
                "annotations": annotate(b.spec, summary, description),
            }
        )
    return rules
