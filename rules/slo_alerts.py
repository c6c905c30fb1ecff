"""The latency SLO's multi-window, multi-burn-rate alerts: a fast burn pages, a slow burn opens a
ticket, and each names the cause by reading kvdoctor's verdict for the engine when it fires.

The SLO is each pod's ITL SLO, the one its exporter publishes (``--slo-ms``) and counts the tokens
over (the words quote it from ``kvdoctor:itl_slo_seconds``), stated as a p95: 95% of tokens within
it. The error budget is therefore **5% of tokens over the SLO** (``ERROR_BUDGET``), and the burn
rate is the share of tokens over the SLO divided by the budget.

**The error ratio, recorded.** Each exporter counts the tokens over its SLO from the engine's ITL
histogram (``kvdoctor_tokens_over_itl_slo_total``, exporter/slo_counters.py: the bucket holding the
SLO in proportion, as ``histogram_quantile`` interpolates, so "more than a fraction f of the tokens
over the SLO" holds exactly where the histogram's (1 - f) quantile is over it). The share over the
SLO in a window is that counter's increase over the histogram's ``_count``'s: two series per engine,
where the quantile read every bucket (20 or more) over every window at every evaluation, which at
1,000 engines took 27 s per 5 s evaluation (docs/alerting.md, "What the SLO rules cost"). So:

- ``kvdoctor-slo`` (the rules' evaluation interval) records each engine's two counters
  (``kvdoctor:itl_slo_errors_total``, ``kvdoctor:itl_slo_events_total``) and the error ratio
  over the fast burn's windows: the short one (5 minutes) from the raw counters, the long one
  (1 hour) from the recorded counters. The page reads the short window from the raw counters
  itself, now and one scrape ago, so the words it fires and resolves with never wait for a record
  to come back through a remote store (vmalert).
- ``kvdoctor-slo-slow`` (every ``SLOW_GROUP_SCRAPES`` scrapes: 2 minutes at 15 s) records the ratio
  over the slow burn's windows (30 minutes, 6 hours) from the recorded counters, and holds the
  ticket.

A long window from recorded counters is the raw one to within the counters' sampling: it reads them
at each evaluation instead of each scrape (``docs/alerting.md`` gives the measured difference).

With a 5% budget no burn rate exceeds 20, so the SRE workbook's 14.4x (sized for a 99.9% SLO) would
wait until 72% of an hour's tokens were slow: 43 minutes into a total slowdown. The factors here
are sized for the p95 SLO instead:

- fast burn (page, ``critical``): 2x the budget, more than 10% of tokens over the SLO, over both
  1 hour and 5 minutes. A slowdown that makes every token slow pages after 6 minutes (10% of the
  hour); a spike shorter than that pages nobody; and the 5 minute window lets the page resolve
  5 minutes after recovery rather than an hour.
- slow burn (ticket, ``warning``): 1x, more than 5% of tokens over the SLO, over both 6 hours and
  30 minutes: the budget spent as fast as it accrues, for hours.

The windows scale with the scrape interval (they hold as many scrapes as at 15 s: 240 and 20 for the
fast pair), so a rule file exported for a 1 s scrape (tests) runs the same logic in 1/15 the time.

A TTFT SLO, where one is set (the exporter's ``--ttft-slo-ms``, published as
``kvdoctor_time_to_first_token_slo_seconds`` and recorded per pod as ``kvdoctor:ttft_slo_seconds``),
gets the same pair on its counter, ``kvdoctor_requests_over_ttft_slo_total`` (``KvdoctorTTFTSLOFastBurn``,
``KvdoctorTTFTSLOSlowBurn``, label ``slo="ttft"``): also a p95, so 5% of requests over it is the
budget. A pod without one has none.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kvdoctor.signals.vocabulary import (
    DIAGNOSIS_VERDICT,
    INTER_TOKEN_LATENCY,
    REQUESTS_OVER_TTFT_SLO,
    TIME_TO_FIRST_TOKEN,
    TOKENS_OVER_ITL_SLO,
    TTFT_SLO,
)

from . import alert_templates as T
from .alert_specs import ALERT_BY_NAME, VERDICT_ALERT, AlertSpec
from .feature_promql import ENGINE_KEYS, GPU_KEYS, prom_number
from .promql import SLO_RECORD, VERDICT_RECORD, duration
from .thresholds import DEFAULT_SCRAPE_INTERVAL_SECONDS

GROUP_NAME = "kvdoctor-slo"
SLOW_GROUP_NAME = "kvdoctor-slo-slow"
SLOW_GROUP_SCRAPES = 8  # the slow group's interval, in scrapes: 2 minutes at 15 s (a ticket, hours in the making)
ERROR_BUDGET = 0.05  # the share of tokens allowed over the ITL SLO: the SLO is a p95
REFERENCE_INTERVAL = DEFAULT_SCRAPE_INTERVAL_SECONDS  # the windows below are for this scrape interval
BURN_FOR_SCRAPES = 2  # two evaluations in a row: one odd evaluation pages nobody
_BY_ENGINE = "sum by (" + ", ".join(ENGINE_KEYS) + ")"
_ON_ENGINE = "on(" + ", ".join(ENGINE_KEYS) + ")"


@dataclass(frozen=True)
class Objective:
    """A latency SLO the burn alerts guard: the histogram it reads, the exporter's counter of the
    observations over it, the record holding each pod's SLO, what one observation is, and the
    alerts' ``slo`` label."""

    key: str  # the alerts' ``slo`` label, and the records' prefix
    title: str  # how the words name it: "ITL", "TTFT"
    histogram: str  # the canonical histogram family
    over_counter: str  # the exporter's count of observations over the SLO
    slo_record: str  # each pod's SLO, seconds
    counts: str  # what one observation is: "tokens", "requests"

    @property
    def events(self) -> str:
        """The raw count of observations: the histogram's ``_count``."""
        return self.histogram + "_count"

    @property
    def errors_record(self) -> str:
        """The over-SLO counter per engine, recorded at each evaluation: what the long windows read."""
        return f"kvdoctor:{self.key}_slo_errors_total"

    @property
    def events_record(self) -> str:
        return f"kvdoctor:{self.key}_slo_events_total"

    def ratio_record(self, window: str) -> str:
        """The share of observations over the SLO in ``window``, per engine."""
        return f"kvdoctor:{self.key}_slo_error_ratio:{window}"


ITL = Objective("itl", "ITL", INTER_TOKEN_LATENCY, TOKENS_OVER_ITL_SLO, SLO_RECORD, "tokens")
# Only for the pods whose exporter publishes a TTFT SLO (``--ttft-slo-ms``): no default, since a time
# to first token depends on the prompt lengths the service accepts, which kvdoctor cannot know.
TTFT = Objective("ttft", "TTFT", TIME_TO_FIRST_TOKEN, REQUESTS_OVER_TTFT_SLO, "kvdoctor:ttft_slo_seconds", "requests")
OBJECTIVES = (ITL, TTFT)


@dataclass(frozen=True)
class Burn:
    """One multi-window burn-rate alert: both windows over ``factor`` times the budget."""

    spec: AlertSpec
    objective: Objective
    factor: float
    long_seconds: float  # at REFERENCE_INTERVAL
    short_seconds: float
    group: str  # the rule group that holds it

    @property
    def fraction(self) -> float:
        """The share of observations over the SLO that this burn rate means."""
        return self.factor * ERROR_BUDGET

    def windows(self, interval: float) -> tuple[float, float]:
        scale = interval / REFERENCE_INTERVAL
        return self.long_seconds * scale, self.short_seconds * scale


_CAUSE = "{cause}"
_FAST_SUMMARY = (
    "{obj} SLO burning fast on {engine}: {value} of {counts} over the SLO in the last {short}. Cause: {cause_short}"
)
_FAST_DESCRIPTION = (
    "{value} of the {counts} of {engine}{model} took longer than its {obj} SLO of {slo} in the last {short}, "
    "and more than {pct} in the last {long}: the error budget, 5% of {counts} over the SLO, burns at least "
    "{factor}x faster than it accrues. Cause, kvdoctor's verdict now: " + _CAUSE
)
_SLOW_SUMMARY = (
    "{obj} SLO burning on {engine}: {value} of {counts} over the SLO in the last {short}. Cause: {cause_short}"
)
_SLOW_DESCRIPTION = (
    "{value} of the {counts} of {engine}{model} took longer than its {obj} SLO of {slo} in the last {short}, "
    "and more than {pct} in the last {long}: the error budget, 5% of {counts} over the SLO, is spent at least "
    "as fast as it accrues. Cause, kvdoctor's verdict now: " + _CAUSE
)


def _burns(objective: Objective, fast_name: str, slow_name: str) -> tuple[Burn, Burn]:
    """The objective's fast burn (a page) and slow burn (a ticket)."""

    def spec(name: str, severity: str, summary: str, description: str) -> AlertSpec:
        return AlertSpec(name, None, severity, BURN_FOR_SCRAPES, None, "percent", "", summary, description)

    fast = spec(fast_name, "critical", _FAST_SUMMARY, _FAST_DESCRIPTION)
    slow = spec(slow_name, "warning", _SLOW_SUMMARY, _SLOW_DESCRIPTION)
    return (
        Burn(fast, objective, factor=2.0, long_seconds=3600, short_seconds=300, group=GROUP_NAME),
        Burn(slow, objective, factor=1.0, long_seconds=21600, short_seconds=1800, group=SLOW_GROUP_NAME),
    )


# The ITL alerts keep the names they shipped with (routes and silences match them).
FAST, SLOW = _burns(ITL, "KvdoctorLatencySLOFastBurn", "KvdoctorLatencySLOSlowBurn")
TTFT_FAST, TTFT_SLOW = _burns(TTFT, "KvdoctorTTFTSLOFastBurn", "KvdoctorTTFTSLOSlowBurn")
BURNS = (FAST, SLOW, TTFT_FAST, TTFT_SLOW)
# What a burn alert says at its last firing evaluation, the short window back under its threshold
# (``burn_expr``): the words of its resolved notification.
RECOVERED_SUMMARY = "{obj} SLO recovered on {engine}: {value} of {counts} over the SLO in the last {short}"
RECOVERED_DESCRIPTION = (
    "The {counts} of {engine}{model} are back within its {obj} SLO of {slo} in the last {short} "
    "({value} over it, under the alert's {pct}): the alert resolves."
)
SLO_ALERTS = tuple(b.spec for b in BURNS)
SLO_ALERT_NAMES = tuple(s.name for s in SLO_ALERTS)


def slow_group_interval(interval: float) -> float:
    """The slow group's evaluation interval for rules exported for a scrape of ``interval`` seconds."""
    return SLOW_GROUP_SCRAPES * interval


def describe(interval: float) -> str:
    """One line for the rule file's header: the SLO's budget and windows at ``interval``."""
    parts = []
    for b in BURNS:
        long, short = b.windows(interval)
        parts.append(f"{b.spec.name} {b.factor:g}x over {duration(long)} and {duration(short)}")
    return (
        f"latency SLOs: error budget {ERROR_BUDGET:.0%} of tokens over each pod's ITL SLO, and of requests over "
        "its TTFT SLO where it publishes one; "
        + "; ".join(parts)
        + f"; the slow burns evaluated every {duration(slow_group_interval(interval))}"
    )


def cause(verdict_codes: Mapping[str, int], short: bool, confidence: bool = True) -> str:
    """The engine's verdict when the alert fires, in words: a query of ``kvdoctor:verdict`` for it
    (a join, not a second tree), then, with ``confidence`` (the page), whether the exporter's own
    live diagnosis agrees: a second query. Every query is made for every active alert at every
    evaluation, so the ticket asks one."""
    branches = []
    for verdict, code in verdict_codes.items():
        spec = ALERT_BY_NAME[_alert_of(verdict)]
        if short:
            text = spec.cause.split(":")[0]
        else:
            agrees = T.selector(DIAGNOSIS_VERDICT, f'verdict=\\"{verdict}\\"', " == 1")
            sure = (
                ". Confidence: {{ with " + agrees + " | query }}high, the exporter's own diagnosis agrees"
                "{{ else }}lower, the exporter's own diagnosis differs or is not published{{ end }}"
            )
            said = sure if confidence else ""
            text = f"{spec.cause}. First action: {spec.action}{said}. Details: the {spec.name} runbook."
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


def error_ratio(objective: Objective, window: str, *, recorded: bool = False, offset: str = "") -> str:
    """The share of ``objective``'s observations over the SLO in ``window``, per engine: from the raw
    counters, or from the per-engine records of them (``recorded``). No observations, no ratio."""
    at = f" offset {offset}" if offset else ""
    if recorded:
        errors = f"increase({objective.errors_record}[{window}]{at})"
        events = f"increase({objective.events_record}[{window}]{at})"
    else:
        errors = f"{_BY_ENGINE} (increase({objective.over_counter}[{window}]{at}))"
        events = f"{_BY_ENGINE} (increase({objective.events}[{window}]{at}))"
    return f"{errors}\n/ {_ON_ENGINE}\n({events} > 0)"


def burn_expr(b: Burn, interval: float) -> str:
    """Both windows over the burn's fraction; and, once burning, for as long as the short window was
    over it a scrape ago while the long one was over it at some evaluation within the short window.
    So the page holds while the last minutes still burn (also when the long window fell back first,
    as when a recovery multiplies the token rate), and resolves one evaluation after the short window
    is back under the fraction: that last firing evaluation's ``$value`` (the short window's ratio)
    is the recovered one. Prometheus and vmalert send a resolved alert with the annotations of its
    last firing evaluation, which is how the resolved notification shows the value after recovery.
    The extra evaluations read the data, not ``ALERTS``, so they do not depend on a series the rule
    engine writes back (late, through vmalert's remote write).

    The page's short window is read from the raw counters (fresh on every rule engine); the long
    windows and the slow burn's short window from the records."""
    long, short = (duration(w) for w in b.windows(interval))
    o, f = b.objective, prom_number(b.fraction)
    long_ratio = f"{o.ratio_record(long)} > {f}"
    long_lately = f"max_over_time({o.ratio_record(long)}[{short}]) > {f}"
    if b.group == GROUP_NAME:
        now = error_ratio(o, short)
        before = error_ratio(o, short, offset=duration(interval))
    else:
        now = o.ratio_record(short)
        before = f"{o.ratio_record(short)} offset {duration(slow_group_interval(interval))}"
    burning = f"(\n{now}\n) > {f}\nand {_ON_ENGINE}\n{long_ratio}"
    recovering = f"(\n{now}\n)\nand {_ON_ENGINE}\n(\n{before}\n) > {f}\nand {_ON_ENGINE}\n{long_lately}"
    return f"(\n{burning}\n)\nor {_ON_ENGINE}\n(\n{recovering}\n)"


def ttft_slo_rule(window: str) -> dict[str, object]:
    """Each pod's TTFT SLO, where its exporter publishes one: the last over ``window`` (the rules'
    window, as the ITL SLO's record reads it), so a pod is judged by its own SLO while its samples last."""
    keys = ", ".join(GPU_KEYS)
    return {"record": TTFT.slo_record, "expr": f"max by ({keys}) (last_over_time({TTFT_SLO}[{window}]))"}


def _records(group: str, interval: float) -> list[dict[str, object]]:
    """The records of ``group``: the fast one records the counters per engine and the fast burn's
    ratios, the slow one the slow burn's ratios from those records."""
    rules: list[dict[str, object]] = []
    for o in OBJECTIVES:
        if group == GROUP_NAME:
            rules.append({"record": o.errors_record, "expr": f"{_BY_ENGINE} ({o.over_counter})"})
            # the events of the engines that count errors: a TTFT histogram without a TTFT SLO is no objective
            events = f"{_BY_ENGINE} ({o.events})\nand {_ON_ENGINE}\n{o.errors_record}"
            rules.append({"record": o.events_record, "expr": events})
        for b in (b for b in BURNS if b.objective is o and b.group == group):
            long, short = (duration(w) for w in b.windows(interval))
            rules.append({"record": o.ratio_record(short), "expr": error_ratio(o, short, recorded=group != GROUP_NAME)})
            rules.append({"record": o.ratio_record(long), "expr": error_ratio(o, long, recorded=True)})
    return rules


def _alert(b: Burn, interval: float, annotate: Annotate, verdict_codes: Mapping[str, int]) -> dict[str, object]:
    long_s, short_s = b.windows(interval)
    fraction = prom_number(b.fraction)
    words = {
        "{engine}": T.engine(),
        "{model}": "{{ with $labels.model_name }} ({{ . }}){{ end }}",
        "{value}": T.value("percent"),
        "{slo}": T.slo(b.objective.slo_record),
        "{obj}": b.objective.title,
        "{counts}": b.objective.counts,
        "{pct}": f"{b.fraction:.0%}",
        "{factor}": f"{b.factor:g}",
        "{long}": T.prose_duration(long_s),
        "{short}": T.prose_duration(short_s),
        "{cause_short}": cause(verdict_codes, short=True),
        "{cause}": cause(verdict_codes, short=False, confidence=b.spec.severity == "critical"),
    }

    def when(burning: str, recovered: str) -> str:
        return "{{ if gt $value " + fraction + " }}" + burning + "{{ else }}" + recovered + "{{ end }}"

    summary = when(b.spec.summary, RECOVERED_SUMMARY)
    description = when(b.spec.description, RECOVERED_DESCRIPTION)
    for key, text in words.items():
        summary, description = summary.replace(key, text), description.replace(key, text)
    return {
        "alert": b.spec.name,
        "expr": burn_expr(b, interval),
        "for": duration(b.spec.for_seconds(interval)),
        "labels": {"severity": b.spec.severity, "slo": b.objective.key},
        "annotations": annotate(b.spec, summary, description),
    }


def burn_rate_groups(
    interval: float, *, window_seconds: float, annotate: Annotate, verdict_codes: Mapping[str, int]
) -> list[dict[str, object]]:
    """The SLO's two groups for rules exported for ``interval``: ``kvdoctor-slo`` (the TTFT SLO's
    record, the ITL SLO's being the tree's; the counters and the fast burn's ratios; the pages) at the
    rules' evaluation interval, and ``kvdoctor-slo-slow`` (the slow burn's ratios; the tickets) every
    ``SLOW_GROUP_SCRAPES`` scrapes."""
    groups = []
    for name in (GROUP_NAME, SLOW_GROUP_NAME):
        rules = [ttft_slo_rule(duration(window_seconds))] if name == GROUP_NAME else []
        rules += _records(name, interval)
        rules += [_alert(b, interval, annotate, verdict_codes) for b in BURNS if b.group == name]
        group: dict[str, object] = {"name": name}
        if name == SLOW_GROUP_NAME:
            group["interval"] = duration(slow_group_interval(interval))
        group["rules"] = rules
        groups.append(group)
    return groups
