"""The decision tree compiled to Prometheus recording rules, and the names and durations they use.

``rules/recording_rules.py`` puts the records in the group's order (and writes a condition one
branch reads into that branch), ``rules/alert_rules.py`` adds the alerting rules (one per verdict,
a source down, the exporter down), ``rules/rule_file.py`` assembles the groups and writes the file.

Everything is generated from ``rules/tree.py`` (its features and conditions) and ``rules/thresholds.py``,
as one group evaluated in order, each rule reading what the ones before it recorded:

- the shared inputs: a raw family several features read is read once, by its own rule (the GPU
  ratios per pod and method; the prefix-hit counters), so every raw series the rules need is read
  by exactly one rule;
- each recorded ``Feature`` becomes ``kvdoctor:<feature>:<range>`` (``<range>``: the range it reads, e.g.
  ``kv_usage`` over the state sub-window), per engine (``namespace, pod, model_name, engine``) or
  per pod's GPUs (``namespace, pod``), with ``rate``/``increase``/``quantile_over_time``/
  ``histogram_quantile`` over the same ranges the Python evaluator uses (the ITL trend's medians
  are Python only: no condition reads them, and each would cost another pass over every bucket);
- ``kvdoctor:itl_slo_seconds`` is the SLO each pod is judged by: the one it publishes, else the
  export-time SLO (for every pod with a feature compared with the SLO), so one rule file serves
  deployments with different SLOs and a comparison with the SLO is one join;
- each named sub-condition of the tree (``engine_active``, ``itl_slow``, ...) becomes
  ``kvdoctor:<name>``, 1 where it holds;
- ``kvdoctor:verdict`` is the tree's answer for each active engine, its value the verdict's
  ``verdict_code`` and its ``verdict`` label the verdict's name: each branch once, the first that
  holds wins (the tree's precedence); the branches the differential lists are also recorded
  (``kvdoctor:branch``), the others read inline;
- GPU conditions join the engine on ``pod`` (and ``namespace``).

Every range holds at least ``MIN_SAMPLES_PER_RANGE`` scrapes: the thresholds are sized for the
scrape interval (``sized_for_interval``; the default file for 15 s, whose ranges still hold two
samples at 30 s). ``kvdoctor rules export`` writes the result; the committed copy is
``rules/alerts.yaml``. The same file runs in vmalert (VictoriaMetrics), where recorded series come
back through the store late: README, "Past one Prometheus".
"""

from __future__ import annotations

import functools
import math
import re

from kvdoctor.signals.vocabulary import ITL_SLO, SOURCE_UP

from . import tree
from .conditions import All, Any, Cmp, CmpFeatures, Condition, Named, Not, Param, Present, atoms, features_of
from .feature_promql import ENGINE_KEYS, GPU_KEYS, IDENTITY_KEYS, PromContext, prom_number
from .features import ENGINE, FEATURES, GPU
from .thresholds import (
    DEFAULT_SCRAPE_INTERVAL_SECONDS,
    Thresholds,
    sized_for_interval,
)
from .verdicts import verdict_code
from .view import Part

SLO_RECORD = "kvdoctor:itl_slo_seconds"  # the SLO each pod is judged by: its own, else the default
VERDICT_RECORD = "kvdoctor:verdict"  # the tree's answer for each active engine: verdict_code, verdict label
BRANCH_RECORD = "kvdoctor:branch"  # 1 per engine and branch whose own condition holds (the differential)
QUEUE_CONSEQUENCE_BRANCH = "queue_consequence"  # the queue beside a slow verdict, in BRANCH_RECORD
SOURCE_DOWN_RECORD = "kvdoctor:source_down"  # the sources whose last collection failed

# Prometheus refuses a range query with more points per series than this.
MAX_POINTS_PER_SERIES = 11_000


def quote(value: str) -> str:
    """``value`` as a PromQL double-quoted string literal, quotes included: every label value that
    reaches a query goes through here, so it can only select series, never change the query."""
    escaped = str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


ENGINE_ON = "on(" + ", ".join(ENGINE_KEYS) + ")"
GPU_ON = "on(" + ", ".join(GPU_KEYS) + ")"
IDENTITY_ON = "on(" + ", ".join(IDENTITY_KEYS) + ")"
# The exporters whose window holds enough scrapes to judge (diagnosis.MIN_WINDOW_SAMPLES): a window of
# one or two has no verdict (Python's ``unknown``), never a guess.
JUDGEABLE_RECORD = "kvdoctor:judgeable"

Rule = dict[str, object]  # one entry of a rule group, as written to YAML


# ------------------------------------------------------------------------------ durations


def duration(seconds: float) -> str:
    """A PromQL duration: whole seconds as ``60s``, otherwise milliseconds."""
    ms = round(seconds * 1000)
    if ms <= 0:
        raise ValueError(f"duration must be positive, got {seconds}")
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, "y": 31536000.0}
_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")


def parse_duration(text: str) -> float:
    """A Prometheus duration (``15s``, ``1m``, ``1m30s``, ``500ms``) or plain seconds, in seconds."""
    value = str(text).strip()
    try:
        seconds = float(value)
    except ValueError:
        parts = _DURATION.findall(value)
        if not parts or "".join(n + u for n, u in parts) != value:
            raise ValueError(f"not a duration: {text!r} (e.g. 15s, 30s, 1m, 1m30s)") from None
        seconds = sum(int(n) * _DURATION_UNITS[u] for n, u in parts)
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"not a positive duration: {text!r}")
    return seconds


def prom_context(thresholds: Thresholds) -> PromContext:
    w = thresholds.window_seconds
    return PromContext(
        window=duration(w),
        third=duration(w / 3),
        recent=duration(min(thresholds.state_window_seconds, w)),
    )


def record_name(feature: str, thresholds: Thresholds) -> str:
    """The recording rule of ``feature``, named after the range it reads: ``kvdoctor:kv_usage:15s``;
    where its expression at these thresholds is an earlier feature's, that feature's rule."""
    if not FEATURES[feature].recorded:
        raise ValueError(f"{feature} is computed in Python only: no rule records it")
    ctx = prom_context(thresholds)
    return ctx.record(*same_expression_as(thresholds).get(feature, (feature, FEATURES[feature].part)))


@functools.lru_cache(maxsize=32)
def same_expression_as(thresholds: Thresholds) -> dict[str, tuple[str, Part]]:
    """Recorded features whose expression at these thresholds is an earlier feature's, each with that
    feature and its part: the window's last third is as short as the state sub-window at slow scrapes,
    and one rule then records both (a second would read the same series again for the same numbers)."""
    ctx = prom_context(thresholds)
    first: dict[str, tuple[str, Part]] = {}
    out: dict[str, tuple[str, Part]] = {}
    for name, f in FEATURES.items():
        if f.promql is None:
            continue
        earlier = first.setdefault(f.promql(ctx, thresholds), (name, f.part))
        if earlier[0] != name:
            out[name] = earlier
    return out


# Any range ``duration`` writes (``60s``, ``1500ms``): the suffix of a recorded feature's name.
RANGE_SUFFIX_PATTERN = "[0-9]+m?s"


def record_pattern(feature: str) -> str:
    """A regex matching ``feature``'s recording rule at any scrape-interval sizing
    (``kvdoctor:kv_usage:[0-9]+m?s``): for readers that do not know which rule file a store loaded."""
    prefix = record_name(feature, Thresholds()).rsplit(":", 1)[0]
    return f"{re.escape(prefix)}:{RANGE_SUFFIX_PATTERN}"


def record_range_seconds(name: str) -> float | None:
    """The range a recorded feature's name says it reads (``kvdoctor:kv_usage:60s`` -> 60.0), else None."""
    suffix = name.rsplit(":", 1)[-1]
    if not re.fullmatch(RANGE_SUFFIX_PATTERN, suffix):
        return None
    return parse_duration(suffix)


def condition_name(name: str) -> str:
    """The recording rule of a named condition of the tree (1 where it holds)."""
    return f"kvdoctor:{name}"


def rule_thresholds(thresholds: Thresholds | None, scrape_interval_seconds: float | None) -> Thresholds:
    """The thresholds a rule file is compiled with: ``thresholds`` sized for the scrape interval
    (default ``DEFAULT_SCRAPE_INTERVAL_SECONDS``)."""
    interval = DEFAULT_SCRAPE_INTERVAL_SECONDS if scrape_interval_seconds is None else scrape_interval_seconds
    return sized_for_interval(thresholds or Thresholds(), interval)


# ------------------------------------------------------------------------------- compiler


class Compiler:
    """Turns tree conditions into PromQL vectors over the recorded features.

    ``vector(cond, ENGINE)`` has one sample per engine where ``cond`` holds; GPU conditions are
    built per pod (``vector(cond, GPU)``) and joined to the engine with ``and/unless on(pod)``.
    """

    def __init__(self, thresholds: Thresholds, slo_seconds: float, inline: frozenset[str] = frozenset()):
        """``inline``: named conditions written into the rules that read them instead of recorded."""
        self.thresholds = thresholds
        self.params = tree.parameters(thresholds, slo_seconds)
        self._universe: str | None = None
        self._recorded: set[str] = set()
        self.condition_rules: list[Rule] = [{"record": SLO_RECORD, "expr": self.slo_rule()}]
        if tree.ACTIVE.name in inline:
            raise ValueError("the active engines are every verdict's universe: they stay recorded")
        for named in tree.NAMED_CONDITIONS:
            if named.name in inline:
                continue
            expr = self.vector(named.condition, self.scope(named))
            # recorded as 1 where the condition holds
            self.condition_rules.append({"record": condition_name(named.name), "expr": f"({expr}) * 0 + 1"})
            self._recorded.add(named.name)
            if named is tree.ACTIVE:
                self._universe = condition_name(named.name)

    def slo_rule(self) -> str:
        """Each pod's ITL SLO: the one it publishes, else the export-time one wherever a feature
        compared with the SLO has a sample (so the comparison needs no fallback of its own)."""
        keys = ", ".join(GPU_KEYS)
        # the last published over the window, as every feature reads its window: a pod whose
        # exporter stops is judged by its own SLO until its features run out, not the default
        window = prom_context(self.thresholds).window
        published = f"max by ({keys}) (last_over_time({ITL_SLO}[{window}]))"
        judged = _compared_with_slo()
        if not judged:
            return published
        measured = " or ".join(self.feature(f) for f in judged)
        return f"{published} or {GPU_ON} group by ({keys}) ({measured}) * {prom_number(self.params['slo_seconds'])}"

    @property
    def universe(self) -> str:
        """Engines the verdict alerts consider: the active ones (the tree's first branch negated)."""
        if self._universe is None:
            raise ValueError("the activity condition cannot itself need the set of active engines")
        return self._universe

    def feature(self, name: str) -> str:
        return record_name(name, self.thresholds)

    def named(self, name: str) -> str:
        return condition_name(name)

    def scope(self, cond: Condition) -> str:
        scopes = {FEATURES[n].scope for n in features_of(cond)}
        return GPU if scopes == {GPU} else ENGINE

    def atom(self, cond: Condition, left: str | None = None) -> str:
        """One comparison (``left``: the value compared, where not the feature's record)."""
        if isinstance(cond, Cmp):
            left = left or self.feature(cond.feature)
            threshold = prom_number(cond.threshold.value(self.params))
            if _reads_slo(cond.threshold):
                # the SLO the pod publishes, else the export-time one
                factor = cond.threshold.value(self.params) / self.params["slo_seconds"]
                per_pod = SLO_RECORD if factor == 1 else f"{SLO_RECORD} * {prom_number(factor)}"
                return f"{left} {cond.op} {GPU_ON} group_left() ({per_pod})"
            return f"{left} {cond.op} {threshold}"
        if isinstance(cond, CmpFeatures):
            if FEATURES[cond.left].scope != FEATURES[cond.right].scope:
                raise ValueError(f"cannot compare features of different scopes: {cond}")
            right = self.feature(cond.right)
            if cond.scale is not None:
                right = f"{right} * {prom_number(cond.scale.value(self.params))}"
            if cond.offset is not None:
                right = f"{right} + {prom_number(cond.offset.value(self.params))}"
            on = GPU_ON if FEATURES[cond.left].scope == GPU else ENGINE_ON
            return f"{self.feature(cond.left)} {cond.op} {on} ({right})"
        if isinstance(cond, Present):
            # present means a number: NaN fails every comparison, and <= +Inf holds for every other
            # value (one selection, where `f == f` takes two)
            return f"{self.feature(cond.feature)} <= +Inf"
        raise TypeError(f"not an atom: {cond!r}")

    def vector(self, cond: Condition, scope: str) -> str:
        """``cond`` as a vector keyed by ``scope`` (ENGINE or GPU) with a sample where it holds."""
        if isinstance(cond, Named):
            if cond.name not in self._recorded:
                return self.vector(cond.condition, scope)
            if self.scope(cond) == scope:
                return self.named(cond.name)
            if scope == GPU:
                raise ValueError(f"an engine condition cannot be keyed by pod: {cond.name}")
            return f"{self.universe} and {GPU_ON} {self.named(cond.name)}"
        if isinstance(cond, (Cmp, CmpFeatures, Present)):
            own = self.scope(cond)
            if own == scope:
                return self.atom(cond)
            if scope == GPU:
                raise ValueError(f"an engine condition cannot be keyed by pod: {cond}")
            return f"({self.universe}) and {GPU_ON} ({self.atom(cond)})"
        if isinstance(cond, Any):
            if not cond.terms:
                raise ValueError("an empty Any never holds")
            fallback = _compared_with_fallback(cond)
            if fallback is not None and self.scope(fallback[0]) == scope:
                first, second = fallback
                on = GPU_ON if scope == GPU else ENGINE_ON
                # `<= +Inf` drops a NaN sample (no number: not present, as in Present) so the fallback applies
                left = f"({self.feature(first.feature)} <= +Inf or {on} {self.feature(second)})"
                return self.atom(first, left)
            return " or ".join(f"({v})" for v in _absorbed(tuple(self.vector(t, scope) for t in cond.terms)))
        if isinstance(cond, Not):
            return self.conjunction((cond,), scope)
        if isinstance(cond, All):
            return self.conjunction(cond.terms, scope)
        raise TypeError(f"not a condition: {cond!r}")

    def conjunction(self, terms: tuple[Condition, ...], scope: str) -> str:
        """``A and B unless C``: positive terms filter, negated ones subtract."""
        flat: list[Condition] = []
        for term in terms:
            flat.extend(term.terms if isinstance(term, All) else (term,))
        positives = [t for t in flat if not isinstance(t, Not)]
        negatives = [t.term for t in flat if isinstance(t, Not)]
        base = next((t for t in positives if self.scope(t) == scope), None)
        if base is not None:
            positives.remove(base)
            text = f"({self.vector(base, scope)})"
        elif scope == ENGINE:
            text = f"({self.universe})"
        else:
            raise ValueError("a pod-keyed conjunction needs a positive GPU term")
        text += "".join(self._join("and", t, scope) for t in positives)
        text += "".join(self._join("unless", t, scope) for t in negatives)
        return text

    def _join(self, op: str, term: Condition, scope: str) -> str:
        if isinstance(term, Named) and term.name in self._recorded:
            on = GPU_ON if self.scope(term) == GPU else ENGINE_ON
            return f"\n  {op} {on} {self.named(term.name)}"
        if scope == ENGINE and self.scope(term) == GPU:
            try:
                return f"\n  {op} {GPU_ON} ({self.vector(term, GPU)})"
            except ValueError:
                pass  # e.g. a lone negation: build it per engine instead
        on = GPU_ON if scope == GPU else ENGINE_ON
        return f"\n  {op} {on} ({self.vector(term, scope)})"

    def verdict_condition(self, verdict: str) -> str:
        """Where ``verdict`` is the tree's answer: its branches, each and-not the earlier ones
        (the whole tree in one expression; the rule file reads ``verdict_rule``'s record instead)."""
        parts = [
            self.vector(tree.precedence_condition(i), ENGINE)
            for i, b in enumerate(tree.BRANCHES)
            if b.verdict == verdict
        ]
        if not parts:
            raise ValueError(f"no branch gives {verdict!r}")
        return parts[0] if len(parts) == 1 else "\nor\n".join(f"(\n{p}\n)" for p in parts)

    def branch_rules(self) -> list[Rule]:
        """One record per branch the differential lists (``kvdoctor:branch{branch, verdict}``, 1 per
        engine where the branch's own condition holds: ``tree.DIFFERENTIAL_BRANCHES``), and the queue
        a slow decode builds. The verdict chains them with the other branches, which it reads inline:
        a fallback or the queue's own verdict is never listed, so a record of them would cost a rule
        and a series per engine for nothing."""
        first = tree.BRANCHES[0]
        if first.condition != Not(tree.ACTIVE):
            raise ValueError("the tree's first branch must be the inactive engines")
        keys = ", ".join(ENGINE_KEYS)
        out: list[Rule] = [
            {
                "record": BRANCH_RECORD,
                "expr": f"group by ({keys}) (\n{self.vector(branch.condition, ENGINE)}\n)",
                "labels": {"branch": branch.id, "verdict": branch.verdict},
            }
            for branch in tree.DIFFERENTIAL_BRANCHES
        ]
        queue = self.vector(tree.QUEUE_CONSEQUENCE, ENGINE)
        out.append(
            {
                "record": BRANCH_RECORD,
                "expr": f"group by ({keys}) (\n{queue}\n)",
                "labels": {"branch": QUEUE_CONSEQUENCE_BRANCH, "verdict": "request_queueing"},
            }
        )
        return out

    def verdict_rule(self) -> str:
        """The tree's answer for every active engine as its ``verdict_code``, its name in the
        ``verdict`` label: the branches in order (a differential branch read from its record, any
        other inline), each named and times its verdict's code, joined by ``or on(<engine>)``, which
        keeps the first branch holding for an engine (first match wins); the last branch is every
        active engine, so the branches just before it that give its verdict are left out (they change
        no answer, and their conditions need no record)."""
        *rest, last = tree.BRANCHES[1:]
        while rest and rest[-1].verdict == last.verdict:
            rest.pop()
        recorded = {b.id for b in tree.DIFFERENTIAL_BRANCHES}
        chain = [
            _named_verdict(
                f'{BRANCH_RECORD}{{branch="{b.id}"}}' if b.id in recorded else self.vector(b.condition, ENGINE),
                b.verdict,
            )
            for b in rest
        ]
        chain.append(_named_verdict(self.universe, last.verdict))
        joined = f"\nor {ENGINE_ON} ".join(chain)
        # ... and only while the exporter is scraped: its records over a window outlive its last
        # scrape, and an engine with some of them gone must read as no verdict, never as healthy
        # (its own kvdoctor_source_up, present now: read as it is, since a record copying it cost a
        # series per source written every cycle, more than the read; docs/benchmarks.md)
        # ... whose window holds enough scrapes to judge (fewer: no verdict, as Python's unknown)
        among = f"and {ENGINE_ON} {self.universe}\n" + "\n".join(
            f"and {IDENTITY_ON} {series}" for series in (SOURCE_UP, JUDGEABLE_RECORD)
        )
        return f"(\n{joined}\n)\n{among}"


def _named_verdict(vector: str, verdict: str) -> str:
    """One engine per series of ``vector``, labelled ``verdict`` and valued its ``verdict_code``: an
    alert reads its verdict's engines through the index (``kvdoctor:verdict{verdict="..."}``), not
    the whole fleet's verdicts (docs/benchmarks.md)."""
    keys = ", ".join(ENGINE_KEYS)
    return f'label_replace(group by ({keys}) ({vector}), "verdict", "{verdict}", "", "") * {verdict_code(verdict)}'


def _compared_with_fallback(cond: Any) -> tuple[Cmp, str] | None:
    """``a op T or (b op T unless a is present)`` as (``a op T``, ``b``): a value compared where it
    is measured, else its fallback (the ITL p95, else the mean time per token), which PromQL writes
    as ``(a or b) op T`` (a NaN ``a`` left out), reading each once."""
    if len(cond.terms) != 2 or not isinstance(cond.terms[0], Cmp) or not isinstance(cond.terms[1], All):
        return None
    first, rest = cond.terms[0], cond.terms[1].terms
    second = next((t for t in rest if isinstance(t, Cmp)), None)
    if (
        len(rest) != 2
        or second is None
        or Not(Present(first.feature)) not in rest
        or (second.op, second.threshold) != (first.op, first.threshold)
        or FEATURES[second.feature].scope != FEATURES[first.feature].scope
    ):
        return None
    return first, second.feature


def _reads_slo(param: Param) -> bool:
    return "slo_seconds" in (param.name, param.times)


def _compared_with_slo() -> list[str]:
    """The features the tree compares with the ITL SLO, in order."""
    conditions = [*(b.condition for b in tree.BRANCHES), *(n.condition for n in tree.NAMED_CONDITIONS)]
    out: list[str] = []
    for cond in conditions:
        for a in atoms(cond):
            if isinstance(a, Cmp) and _reads_slo(a.threshold) and a.feature not in out:
                out.append(a.feature)
    return out


def _absorbed(terms: tuple[str, ...]) -> tuple[str, ...]:
    """The terms of an ``or`` less those that are another term narrowed (``(A) and B``, ``(A) unless
    C``): ``A or (A and B)`` is ``A``. It arises where two features compile to one record (the late
    preemption rate at 5 s scrapes and slower is the preemption rate)."""
    narrowed = {
        j
        for j, term in enumerate(terms)
        for i, other in enumerate(terms)
        if i != j and term.startswith((f"({other})\n  and ", f"({other})\n  unless "))
    }
    return tuple(t for j, t in enumerate(terms) if j not in narrowed)
