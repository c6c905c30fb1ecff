"""The fleet at a glance: a few instant queries over every pod, and the summary they make.

Pure: ``fleet_queries`` writes the PromQL, ``summarize`` turns the answers into a ``FleetSummary``;
``kvdoctor.sources.fleet.read_fleet`` runs one against a Prometheus-compatible API. Three instant
queries, whatever the fleet's size, and none reads a range of raw samples:

- ``pods``: the pods the selector matches, one row each (``namespace``, ``pod``), from the series
  every exporter publishes (its SLO gauge and verdict state set) and every engine's running-requests
  gauge, so a matcher on an engine label (``model_name``) selects pods too;
- ``verdicts``: each pod's verdict, from its exporter's ``kvdoctor_diagnosis_verdict`` state set;
- ``features``: the recorded features a row shows (``FLEET_FEATURES``, read at whatever
  scrape-interval sizing the store's rule file has: the shortest range with a number wins) and the
  SLO each pod publishes.

Matchers on ``namespace`` and ``pod`` (on every series involved) narrow each query directly; any
other matcher (``job``, ``instance``, ``model_name``, ...) narrows them through the ``pods`` query
(``and on(namespace, pod)``). Worst first is defined once, by ``worst_first_key``: slow verdicts
before the rest, then by ITL p95 over the pod's SLO.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from kvdoctor.signals.records import attributes
from kvdoctor.signals.vocabulary import DIAGNOSIS_VERDICT, ITL_SLO, REQUESTS_RUNNING

from .action_checks import LedgerFacts
from .actions import FIX, MITIGATE, plan_actions
from .promql import record_pattern, record_range_seconds
from .thresholds import DEFAULT_SLO_SECONDS
from .verdicts import SLOW_VERDICTS, UNKNOWN, VERDICTS
from .verdicts import rank as verdict_rank

# a fleet row is a pod (the rules' records also carry the target's instance: rows group it away)
POD_KEYS = ("namespace", "pod")
# The order counts are listed in; ``unknown`` is also the verdict of a pod whose exporter publishes none.
FLEET_VERDICTS = VERDICTS

# The recorded features a row shows, and how a pod's several engines combine into one number.
FLEET_FEATURES: dict[str, str] = {
    "itl_p95_seconds": "max",
    "kv_usage": "max",
    "requests_waiting": "sum",
    "requests_running": "sum",
}
# Labels every series the queries read carries, so a matcher on them narrows each query directly.
_DIRECT_LABELS = frozenset(POD_KEYS)
_BY_POD = ", ".join(POD_KEYS)

Matcher = tuple[str, str, str]  # (label, operator, a PromQL string literal, quotes included: promql.quote)
Sample = tuple[Mapping[str, str], float]  # one series of an instant answer: its labels and value


def render_matchers(matchers: Iterable[Matcher]) -> str:
    return ",".join(f"{label}{op}{literal}" for label, op, literal in matchers)


@dataclass(frozen=True)
class FleetQueries:
    """The instant queries of one fleet read (PromQL text, evaluated at one time)."""

    pods: str
    verdicts: str
    features: str

    def items(self) -> tuple[tuple[str, str], ...]:
        return (("pods", self.pods), ("verdicts", self.verdicts), ("features", self.features))


def fleet_queries(matchers: Sequence[Matcher] = ()) -> FleetQueries:
    """The queries for the pods ``matchers`` select (none: every pod)."""
    direct = [m for m in matchers if m[0] in _DIRECT_LABELS]
    indirect = len(direct) < len(matchers)

    def selector(names: Iterable[str], only: Sequence[Matcher]) -> str:
        return "{" + ",".join((f'__name__=~"{"|".join(names)}"', *(render_matchers([m]) for m in only))) + "}"

    pods = f"group by ({_BY_POD}) ({selector((ITL_SLO, DIAGNOSIS_VERDICT, REQUESTS_RUNNING), matchers)})"
    within = f" and on({_BY_POD}) {pods}" if indirect else ""
    verdict_selector = DIAGNOSIS_VERDICT + ("{" + render_matchers(direct) + "}" if direct else "")
    features = [record_pattern(f) for f in FLEET_FEATURES] + [ITL_SLO]
    return FleetQueries(
        pods=pods,
        verdicts=f"max by ({_BY_POD}, verdict) ({verdict_selector}) == 1" + within,
        features=selector(features, direct) + within,
    )


# ------------------------------------------------------------------------------------ summary


@dataclass(frozen=True)
class FleetRow:
    """One pod: its exporter's verdict, the recorded features that explain it, and what to do first.

    Numbers are NaN where the pod does not have them (no recording rules, an idle engine, no
    histogram). ``slo_seconds`` is the SLO the pod publishes (NaN: none, ``DEFAULT_SLO_SECONDS``
    then applies, as in the alert rules). ``first_action`` / ``first_fix``: the ids
    (``rules.actions.ACTION_BY_ID``) of the verdict's first "mitigate now" and first "fix" action,
    checked against the row's facts; None for a verdict with none.
    """

    namespace: str
    pod: str
    verdict: str = UNKNOWN
    itl_p95_seconds: float = math.nan
    slo_seconds: float = math.nan
    kv_usage: float = math.nan
    waiting: float = math.nan
    running: float = math.nan
    model_name: str = ""  # the engines' model names, comma-separated
    engine: str = ""
    first_action: str | None = None
    first_fix: str | None = None
    itl_record: str = ""  # the recording rule ITL p95 was read from (for a history query of the row)

    @property
    def slow(self) -> bool:
        return self.verdict in SLOW_VERDICTS

    @property
    def slo_applied(self) -> float:
        """The SLO the row is judged against: the pod's, else the default (as the alert rules do)."""
        return self.slo_seconds if math.isfinite(self.slo_seconds) else DEFAULT_SLO_SECONDS

    @property
    def slo_ratio(self) -> float:
        """ITL p95 over the SLO (1.0: at the SLO); NaN where ITL p95 is not measured."""
        return self.itl_p95_seconds / self.slo_applied

    def to_json(self) -> dict[str, object]:
        return {
            **attributes(self, "namespace pod verdict slow"),
            "itl_p95_seconds": _finite(self.itl_p95_seconds),
            "slo_seconds": _finite(self.slo_seconds),
            "slo_ratio": _finite(self.slo_ratio),
            "kv_usage": _finite(self.kv_usage),
            "requests_waiting": _finite(self.waiting),
            "requests_running": _finite(self.running),
            **attributes(self, "model_name engine first_action first_fix"),
        }


def worst_first_key(row: FleetRow) -> tuple[int, float, str, str]:
    """THE fleet order: slow verdicts first, then ITL p95 / SLO, highest first (unmeasured last),
    then namespace and pod."""
    ratio = row.slo_ratio
    return (0 if row.slow else 1, -ratio if math.isfinite(ratio) else math.inf, row.namespace, row.pod)


@dataclass(frozen=True)
class FleetSummary:
    """Every pod a selector matches at one time, worst first, and the count of each verdict.

    ``rows`` are ordered by ``worst_first_key``; ``counts`` has every verdict of ``FLEET_VERDICTS``
    (zeros included) over all rows; ``notes`` say what the numbers lack (no recording rules, pods
    without a verdict).
    """

    rows: tuple[FleetRow, ...]
    at: float
    selector: str = ""
    notes: tuple[str, ...] = ()
    counts: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        counts = dict.fromkeys(FLEET_VERDICTS, 0)
        for row in self.rows:
            counts[row.verdict] = counts.get(row.verdict, 0) + 1
        object.__setattr__(self, "counts", counts)

    @property
    def slow(self) -> int:
        """How many pods have a slow verdict."""
        return sum(1 for row in self.rows if row.slow)

    @property
    def namespaces(self) -> tuple[str, ...]:
        return tuple(sorted({row.namespace for row in self.rows}))

    def select(
        self, namespace: str | None = None, verdicts: Iterable[str] | None = None, search: str | None = None
    ) -> tuple[FleetRow, ...]:
        """The rows in ``namespace``, with one of ``verdicts``, whose pod contains ``search``
        (case-insensitive); None means any. Still worst first."""
        wanted = None if verdicts is None else set(verdicts)
        needle = (search or "").strip().lower()
        return tuple(
            row
            for row in self.rows
            if (namespace is None or row.namespace == namespace)
            and (wanted is None or row.verdict in wanted)
            and needle in row.pod.lower()
        )

    def to_json(self, limit: int | None = None) -> dict[str, object]:
        rows = self.rows if limit is None else self.rows[: max(0, limit)]
        return {
            "at": self.at,
            "selector": self.selector,
            "pods": len(self.rows),
            "slow": self.slow,
            "counts": dict(self.counts),
            "notes": list(self.notes),
            "rows": [row.to_json() for row in rows],
        }


def summarize(
    pods: Iterable[Sample],
    verdicts: Iterable[Sample],
    features: Iterable[Sample],
    at: float,
    selector: str = "",
) -> FleetSummary:
    """The summary from the answers to ``fleet_queries`` (each a list of (labels, value))."""
    rows: dict[tuple[str, str], FleetRow] = {}
    for labels, _ in pods:
        key = _pod_key(labels)
        rows.setdefault(key, FleetRow(*key))
    for labels, _ in verdicts:
        key, verdict = _pod_key(labels), labels.get("verdict", "")
        known = rows[key].verdict != UNKNOWN if key in rows else False
        if key in rows and verdict and (not known or verdict_rank(verdict) < verdict_rank(rows[key].verdict)):
            rows[key] = replace(rows[key], verdict=verdict)  # two at once (a restart): the slower one

    # (pod, feature) -> range in seconds -> (the record's name, its values: one per engine)
    recorded_at: dict[tuple[tuple[str, str], str], dict[float, tuple[str, list[float]]]] = {}
    names: dict[tuple[str, str], dict[str, set[str]]] = {}
    slo: dict[tuple[str, str], float] = {}
    recorded = False
    for labels, value in features:
        key, name = _pod_key(labels), labels.get("__name__", "")
        if key not in rows:
            continue
        if name == ITL_SLO:
            slo[key] = max(slo.get(key, -math.inf), value)
            continue
        feature, seconds = _feature_of(name)
        if feature is None or seconds is None:
            continue
        recorded = True
        recorded_at.setdefault((key, feature), {}).setdefault(seconds, (name, []))[1].append(value)
        for label in ("model_name", "engine"):
            if labels.get(label):
                names.setdefault(key, {}).setdefault(label, set()).add(labels[label])

    out = []
    for key, row in rows.items():
        values: dict[str, float] = {}
        itl_record = ""
        for feature, how in FLEET_FEATURES.items():
            values[feature] = math.nan
            ranges = recorded_at.get((key, feature), {})
            for seconds in sorted(ranges):  # the shortest range with a number
                name, found = ranges[seconds]
                combined = _combine(found, how)
                if not math.isnan(combined):
                    values[feature] = combined
                    itl_record = name if feature == "itl_p95_seconds" else itl_record
                    break
        labelled = names.get(key, {})
        row = replace(
            row,
            itl_p95_seconds=values["itl_p95_seconds"],
            slo_seconds=slo.get(key, math.nan),
            kv_usage=values["kv_usage"],
            waiting=values["requests_waiting"],
            running=values["requests_running"],
            model_name=",".join(sorted(labelled.get("model_name", ()))),
            engine=",".join(sorted(labelled.get("engine", ()))),
            itl_record=itl_record,
        )
        out.append(_with_actions(row))
    out.sort(key=worst_first_key)
    notes = []
    if out and not recorded:
        notes.append(
            "no kvdoctor recording rules answer here: load kvdoctor's rule file (kvdoctor rules export) "
            "for ITL p95, KV usage and the queue"
        )
    unknown = sum(1 for row in out if row.verdict == UNKNOWN)
    if unknown:
        notes.append(f"{unknown} of {len(out)} pods publish no verdict (kvdoctor_diagnosis_verdict): just started?")
    return FleetSummary(tuple(out), at, selector, tuple(notes))


def _with_actions(row: FleetRow) -> FleetRow:
    facts = LedgerFacts(kv_usage=_known(row.kv_usage), requests_running=_known(row.running))
    actions = plan_actions(row.verdict, facts) if row.verdict in VERDICTS else []
    first = {group: next((a.id for a in actions if a.group == group), None) for group in (MITIGATE, FIX)}
    return replace(row, first_action=actions[0].id if actions else None, first_fix=first[FIX])


def _feature_of(name: str) -> tuple[str | None, float | None]:
    prefix = name.rsplit(":", 1)[0]
    feature = prefix.split(":", 1)[-1] if prefix.startswith("kvdoctor:") else None
    if feature not in FLEET_FEATURES:
        return None, None
    return feature, record_range_seconds(name)


def _combine(values: list[float], how: str) -> float:
    numbers = [v for v in values if not math.isnan(v)]
    if not numbers:
        return math.nan
    return max(numbers) if how == "max" else math.fsum(numbers)


def _pod_key(labels: Mapping[str, str]) -> tuple[str, str]:
    return labels.get("namespace", ""), labels.get("pod", "")


def _known(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


__all__ = [
    "FLEET_FEATURES",
    "FLEET_VERDICTS",
    "FleetQueries",
    "FleetRow",
    "FleetSummary",
    "Matcher",
    "fleet_queries",
    "render_matchers",
    "summarize",
    "worst_first_key",
]
