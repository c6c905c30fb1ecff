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
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kvdoctor.signals.vocabulary import DIAGNOSIS_VERDICT, INTER_TOKEN_LATENCY

from . import alert_templates as T
from .alert_specs import ALERT_BY_NAME, VERDICT_ALERT, AlertSpec
from .feature_promql import ENGINE_KEYS, prom_number
from .promql import SLO_RECORD, VERDICT_RECORD
from .thresholds import DEFAULT_SCRAPE_INTERVAL_SECONDS

GROUP_NAME = "kvdoctor-slo"
ERROR_BUDGET = 0.05  # the share of tokens allowed over the ITL SLO: the SLO is a p95
REFERENCE_INTERVAL = DEFAULT_SCRAPE_INTERVAL_SECONDS  # the windows below are for this scrape interval
BURN_FOR_SCRAPES = 2  # two evaluations in a row: one odd evaluation pages nobody


@dataclass(frozen=True)
class Burn:
    """One multi-window burn-rate alert: both windows over ``factor`` times the budget."""

    spec: AlertSpec
    factor: float
    long_seconds: float  # at REFERENCE_INTERVAL
    short_seconds: float

    @property
    def fraction(self) -> float:
        """The share of tokens over the SLO that this burn rate means."""
        return self.factor * ERROR_BUDGET

    @property
    def quantile(self) -> float:
        return round(1 - self.fraction, 6)

    def windows(self, interval: float) -> tuple[float, float]:
        scale = interval / REFERENCE_INTERVAL
        return self.long_seconds * scale, self.short_seconds * scale


_CAUSE = "{cause}"
FAST = Burn(
    AlertSpec(
        "KvdoctorLatencySLOFastBurn",
        None,
        "critical",
        BURN_FOR_SCRAPES,
        None,
        "duration",
        "",
        "ITL SLO burning fast on {engine}: ITL p{pq} {value} over {short}, SLO {slo}. Cause: {cause_short}",
        "More than {pct} of the tokens of {engine}{model} took longer than its ITL SLO of {slo}, over the last "
        "{long} and the last {short} (ITL p{pq} {value} over {short}): the error budget, 5% of tokens over the "
        "SLO, burns {factor}x faster than it accrues. Cause, kvdoctor's verdict now: " + _CAUSE,
    ),
    factor=2.0,
    long_seconds=3600,
    short_seconds=300,
)
SLOW = Burn(
    AlertSpec(
        "KvdoctorLatencySLOSlowBurn",
        None,
        "warning",
        BURN_FOR_SCRAPES,
        None,
        "duration",
        "",
        "ITL SLO burning on {engine}: ITL p{pq} {value} over {short}, SLO {slo}. Cause: {cause_short}",
        "More than {pct} of the tokens of {engine}{model} took longer than its ITL SLO of {slo}, over the last "
        "{long} and the last {short} (ITL p{pq} {value} over {short}): the error budget, 5% of tokens over the "
        "SLO, is spent as fast as it accrues. Cause, kvdoctor's verdict now: " + _CAUSE,
    ),
    factor=1.0,
    long_seconds=21600,
    short_seconds=1800,
)
BURNS = (FAST, SLOW)
# What a burn alert says at its last firing evaluation, the short window back under the SLO
# (``burn_expr``): the words of its resolved notification.
RECOVERED_SUMMARY = "ITL SLO recovered on {engine}: ITL p{pq} {value} over {short}, SLO {slo}"
RECOVERED_DESCRIPTION = (
    "The tokens of {engine}{model} are back within its ITL SLO of {slo} over the last {short} "
    "(ITL p{pq} {value}): the alert resolves."
)
SLO_ALERTS = tuple(b.spec for b in BURNS)
SLO_ALERT_NAMES = tuple(s.name for s in SLO_ALERTS)


def _duration(seconds: float) -> str:
    ms = round(seconds * 1000)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def describe(interval: float) -> str:
    """One line for the rule file's header: the SLO's budget and windows at ``interval``."""
    parts = []
    for b in BURNS:
        long, short = b.windows(interval)
        parts.append(f"{b.spec.name} {b.factor:g}x over {_duration(long)} and {_duration(short)}")
    return f"latency SLO: error budget {ERROR_BUDGET:.0%} of tokens over each pod's ITL SLO; " + "; ".join(parts)


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


def quantile_over(window: str, q: float, offset: str = "") -> str:
    keys = ", ".join(ENGINE_KEYS)
    bucket = f"{INTER_TOKEN_LATENCY}_bucket[{window}]" + (f" offset {offset}" if offset else "")
    return f"max by ({keys}) (histogram_quantile({prom_number(q)}, increase({bucket})))"


def _against_slo(test: str, text: str) -> str:
    """``text`` where ``$value`` compares to the pod's SLO as ``test`` (``gt``: still burning; ``le``:
    the evaluation that recovered, see ``burn_expr``)."""
    return (
        "{{ with "
        + T.selector(SLO_RECORD)
        + " | query }}{{ if "
        + test
        + " $value (. | first | value) }}"
        + text
        + "{{ end }}{{ end }}"
    )


def burn_expr(b: Burn, interval: float, slo_join: str) -> str:
    """Both windows over the SLO; and, once the alert fires, for as long as the short window was
    over the SLO at the previous evaluation. So it resolves one evaluation after the short window is
    back under the SLO, and that last firing evaluation's ``$value`` (the short window's quantile) is
    the recovered one: Prometheus and vmalert send a resolved alert with the annotations of its last
    firing evaluation, which is how the resolved notification shows the value after recovery. (A
    long window back under first, as when a slowdown also cut the token rate, keeps the page while
    the last minutes still burn.)"""
    on = "on(" + ", ".join(ENGINE_KEYS) + ")"
    long, short = (_duration(w) for w in b.windows(interval))
    burning = (
        f"{quantile_over(short, b.quantile)} > {slo_join}\nand {on}\n{quantile_over(long, b.quantile)} > {slo_join}"
    )
    recovering = (
        f"{quantile_over(short, b.quantile)}\n"
        f"and {on}\n{quantile_over(short, b.quantile, _duration(interval))} > {slo_join}\n"
        f'and {on}\nALERTS{{alertname="{b.spec.name}", alertstate="firing"}}'
    )
    return f"(\n{burning}\n)\nor {on}\n(\n{recovering}\n)"


def burn_rate_rules(
    interval: float, *, slo_join: str, annotate: Annotate, verdict_codes: Mapping[str, int]
) -> list[dict[str, object]]:
    """The burn-rate alerts for rules exported for ``interval``: ``slo_join`` compares with each
    pod's SLO (``on(<pod>) group_left() kvdoctor:itl_slo_seconds``)."""
    rules: list[dict[str, object]] = []
    for b in BURNS:
        long_s, short_s = b.windows(interval)
        expr = burn_expr(b, interval, slo_join)
        words = {
            "{engine}": T.engine(),
            "{model}": "{{ with $labels.model_name }} ({{ . }}){{ end }}",
            "{value}": T.value("duration"),
            "{slo}": T.slo(SLO_RECORD),
            "{pq}": f"{b.quantile * 100:g}",
            "{pct}": f"{b.fraction:.0%}",
            "{factor}": f"{b.factor:g}",
            "{long}": T.prose_duration(long_s),
            "{short}": T.prose_duration(short_s),
            "{cause_short}": cause(verdict_codes, short=True),
            "{cause}": cause(verdict_codes, short=False),
        }
        summary, description = b.spec.summary, b.spec.description
        summary = _against_slo("gt", summary) + _against_slo("le", RECOVERED_SUMMARY)
        description = _against_slo("gt", description) + _against_slo("le", RECOVERED_DESCRIPTION)
        for key, text in words.items():
            summary, description = summary.replace(key, text), description.replace(key, text)
        rules.append(
            {
                "alert": b.spec.name,
                "expr": expr,
                "for": _duration(b.spec.for_seconds(interval)),
                "labels": {"severity": b.spec.severity, "slo": "itl"},
                "annotations": annotate(b.spec, summary, description),
            }
        )
    return rules
