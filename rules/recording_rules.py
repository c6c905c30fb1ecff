"""The recording rules of the tree's group, in the order Prometheus evaluates them: whether the
exporter's window can be judged, the shared inputs, the features, the named conditions some rule
reads, the differential's branches, the verdict, and the sources that are down. The PromQL of each
comes from ``rules/promql.py``; ``rules/rule_file.py`` adds the alerts."""

from __future__ import annotations

import re
from collections.abc import Iterable

from kvdoctor.signals.vocabulary import SOURCE_UP

from . import tree
from .feature_promql import IDENTITY_KEYS
from .features import FEATURES
from .promql import (
    JUDGEABLE_RECORD,
    SOURCE_DOWN_RECORD,
    VERDICT_RECORD,
    Compiler,
    Rule,
    condition_name,
    duration,
    prom_context,
    same_expression_as,
)
from .thresholds import DEFAULT_SLO_SECONDS, MIN_WINDOW_SAMPLES, Thresholds


def recording_rules(thresholds: Thresholds, slo_seconds: float = DEFAULT_SLO_SECONDS) -> list[Rule]:
    """The shared inputs (each raw family several features read, read once), one rule per recorded feature
    (one for features with the same expression), the pods' SLO, one per named condition of the tree
    that two or more rules or the verdict read (1 where it holds; a lone branch reader has it written
    in), the verdict of every active engine, and the sources that are down."""
    ctx = prom_context(thresholds)
    recorded_elsewhere = same_expression_as(thresholds)
    features: list[Rule] = [
        {"record": ctx.record(name, f.part), "expr": f.promql(ctx, thresholds)}
        for name, f in FEATURES.items()
        if f.promql is not None and name not in recorded_elsewhere
    ]
    inputs: list[Rule] = [{"record": name, "expr": expr} for name, expr in ctx.inputs.items()]
    compiler = Compiler(thresholds, slo_seconds)
    read_once = _conditions_one_branch_reads(compiler, features)
    if read_once:
        compiler = Compiler(thresholds, slo_seconds, inline=read_once)
    verdict: Rule = {"record": VERDICT_RECORD, "expr": compiler.verdict_rule()}
    source_down: Rule = {"record": SOURCE_DOWN_RECORD, "expr": f"{SOURCE_UP} == 0"}
    judgeable: Rule = {
        "record": JUDGEABLE_RECORD,
        "expr": f"group by ({', '.join(IDENTITY_KEYS)}) "
        f"(count_over_time({SOURCE_UP}[{duration(thresholds.window_seconds)}]) >= {MIN_WINDOW_SAMPLES})",
    }
    branches = compiler.branch_rules()
    readers = _exprs([*features, *compiler.condition_rules, *branches, verdict])
    conditions = [r for r in compiler.condition_rules if _readers(str(r["record"]), readers)]
    return [judgeable, *inputs, *features, *conditions, *branches, verdict, source_down]


def _exprs(rules: Iterable[Rule]) -> list[str]:
    return [str(r["expr"]) for r in rules]


def _readers(record: str, exprs: Iterable[str]) -> int:
    """How many of ``exprs`` read ``record`` (a named condition no rule reads is not recorded)."""
    name = re.compile(rf"(?<![\w:]){re.escape(record)}(?![\w:])")
    return sum(1 for e in exprs if name.search(e))


def _conditions_one_branch_reads(compiler: Compiler, features: list[Rule]) -> frozenset[str]:
    """The named conditions (the active engines aside) that exactly one rule reads, where that rule
    is not the verdict. Such a condition is written into its reader instead: the reader computes the
    same vector either way, and a record costs one more rule evaluation each cycle and a series per
    engine where it holds, for a name nothing else asks for. The verdict keeps reading records:
    measured at 1,000 engines (docs/benchmarks.md), a condition written into its chain of ``or``
    cost it more than the condition's own record did."""
    verdict = compiler.verdict_rule()
    others = _exprs([*features, *compiler.condition_rules, *compiler.branch_rules()])
    return frozenset(
        named.name
        for named in tree.NAMED_CONDITIONS
        if named is not tree.ACTIVE
        and _readers(condition_name(named.name), others) == 1
        and not _readers(condition_name(named.name), [verdict])
    )
