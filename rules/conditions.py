"""The tree's small predicates: comparisons of features with thresholds, and their combinations.

A condition is data (frozen dataclasses), so the same condition is evaluated in Python
(``evaluate``) and compiled to PromQL (``rules/promql.py``). A feature with no value is NaN; a
comparison on it is false, as PromQL drops the sample.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeAlias


@dataclass(frozen=True)
class Param:
    """A threshold: ``Thresholds.<name>`` (or ``slo_seconds``), optionally times another one."""

    name: str
    times: str | None = None

    def value(self, params: Mapping[str, float]) -> float:
        v = float(params[self.name])
        return v * float(params[self.times]) if self.times else v

    def describe(self) -> str:
        return f"{self.name} x {self.times}" if self.times else self.name


@dataclass(frozen=True)
class Cmp:
    """``feature <op> threshold``."""

    feature: str
    op: str
    threshold: Param


@dataclass(frozen=True)
class CmpFeatures:
    """``left <op> right x scale + offset``: two features of one scope compared."""

    left: str
    op: str
    right: str
    scale: Param | None = None
    offset: Param | None = None


@dataclass(frozen=True)
class Present:
    """The feature has a value in the window."""

    feature: str


@dataclass(frozen=True)
class All:
    terms: tuple[Condition, ...] = ()


@dataclass(frozen=True)
class Any:
    terms: tuple[Condition, ...] = ()


@dataclass(frozen=True)
class Not:
    term: Condition


@dataclass(frozen=True)
class Named:
    """A sub-condition with a name: the PromQL half records it (``kvdoctor:<name>:<window>``) and
    refers to it by that name, which keeps the alert expressions readable."""

    name: str
    condition: Condition


Condition: TypeAlias = Cmp | CmpFeatures | Present | All | Any | Not | Named
Atom: TypeAlias = Cmp | CmpFeatures | Present

TRUE = All(())


def any_of(name: str, *terms: Condition) -> Named:
    """The condition ``name`` that holds where any of ``terms`` does."""
    return Named(name, Any(terms))


def at_least_min(feature: str) -> Cmp:
    """``feature`` at or above its threshold ``<feature>_min``."""
    return Cmp(feature, ">=", Param(f"{feature}_min"))


OPS: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}


def right_side(c: CmpFeatures, values: Mapping[str, float], params: Mapping[str, float]) -> float:
    v = values.get(c.right, math.nan)
    if c.scale is not None:
        v = v * c.scale.value(params)
    if c.offset is not None:
        v = v + c.offset.value(params)
    return v


def evaluate(cond: Condition, values: Mapping[str, float], params: Mapping[str, float]) -> bool:
    """The condition on computed feature values; missing (NaN) features make comparisons false."""
    if isinstance(cond, Cmp):
        v = values.get(cond.feature, math.nan)
        return not math.isnan(v) and OPS[cond.op](v, cond.threshold.value(params))
    if isinstance(cond, CmpFeatures):
        left = values.get(cond.left, math.nan)
        right = right_side(cond, values, params)
        return not (math.isnan(left) or math.isnan(right)) and OPS[cond.op](left, right)
    if isinstance(cond, Present):
        return not math.isnan(values.get(cond.feature, math.nan))
    if isinstance(cond, All):
        return all(evaluate(t, values, params) for t in cond.terms)
    if isinstance(cond, Any):
        return any(evaluate(t, values, params) for t in cond.terms)
    if isinstance(cond, Not):
        return not evaluate(cond.term, values, params)
    if isinstance(cond, Named):
        return evaluate(cond.condition, values, params)
    raise TypeError(f"not a condition: {cond!r}")


def _missing(atom: Atom, values: Mapping[str, float]) -> bool:
    names = (atom.left, atom.right) if isinstance(atom, CmpFeatures) else (atom.feature,)
    return any(math.isnan(values.get(n, math.nan)) for n in names)


def could_hold(cond: Condition, values: Mapping[str, float], params: Mapping[str, float]) -> bool:
    """Whether some measurement of the missing features could make ``cond`` hold (each comparison
    on a missing feature taken as free)."""
    return _holds(cond, values, params, must=False)


def must_hold(cond: Condition, values: Mapping[str, float], params: Mapping[str, float]) -> bool:
    """Whether ``cond`` holds whatever the missing features would measure."""
    return _holds(cond, values, params, must=True)


def _holds(cond: Condition, values: Mapping[str, float], params: Mapping[str, float], must: bool) -> bool:
    """``must_hold`` (``must``) or ``could_hold``: each is the other under a ``Not``."""
    if isinstance(cond, (Cmp, CmpFeatures, Present)):
        if _missing(cond, values):
            return not must
        return evaluate(cond, values, params)
    if isinstance(cond, All):
        return all(_holds(t, values, params, must) for t in cond.terms)
    if isinstance(cond, Any):
        return any(_holds(t, values, params, must) for t in cond.terms)
    if isinstance(cond, Not):
        return not _holds(cond.term, values, params, not must)
    if isinstance(cond, Named):
        return _holds(cond.condition, values, params, must)
    raise TypeError(f"not a condition: {cond!r}")


def signed_atoms(cond: Condition, negated: bool = False) -> Iterator[tuple[Atom, bool]]:
    """The comparisons a condition reads, in order, each with whether it sits under an odd number
    of ``Not`` (the condition then holds where the comparison fails)."""
    if isinstance(cond, (Cmp, CmpFeatures, Present)):
        yield cond, negated
    elif isinstance(cond, (All, Any)):
        for term in cond.terms:
            yield from signed_atoms(term, negated)
    elif isinstance(cond, Not):
        yield from signed_atoms(cond.term, not negated)
    elif isinstance(cond, Named):
        yield from signed_atoms(cond.condition, negated)


def atoms(cond: Condition) -> Iterator[Atom]:
    """The comparisons a condition reads, in order."""
    return (atom for atom, _ in signed_atoms(cond))


def features_of(cond: Condition) -> list[str]:
    """The features a condition reads, in order, once each."""
    out: list[str] = []
    for a in atoms(cond):
        for name in (a.left, a.right) if isinstance(a, CmpFeatures) else (a.feature,):
            if name not in out:
                out.append(name)
    return out
