"""How sure a verdict is: its branch's base confidence, capped by every verdict the missing signals
could not rule out.

A branch that fires cleanly has a base (``BASE``), lowered where the measurement behind it is
thinner (no token counter, no GPU counters, a mean instead of a p95). It then loses
``UNCERTAIN_PENALTY`` where it holds only for want of a signal (KV usage unknown, no SM counter)
and where a value within 5% of a threshold decides it, and it is capped below every *competitor*:
an earlier branch of another verdict that could have held had its missing signals been measured,
and -- where the branch rests on an absence -- what the tree says once that absence is filled in
(each candidate value of the missing features it reads, recursively; a competitor's own absences,
such as the GPU counters a verdict made without them needs, stay missing). A missing ITL quantile is
filled in only up to what the measured mean time per token allows (``itl_quantile_bound``): on an
engine without an ITL histogram whose decode is far under the SLO on its mean (llama.cpp), slow
decode is ruled out, and what stays unresolved is what the missing signals really leave open
(a full KV pool, where KV usage is not reported). So a signal fewer does
not make a verdict more confident (tests/rules/test_rules_properties.py checks it on simulated
windows; on contrived feature values, such as a p95 of 0 beside a mean of 1 s, the search, which
stops at a competitor already on its stack, can still be 0.05 off).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterator, Mapping

from . import tree
from .conditions import Cmp, CmpFeatures, Present, could_hold, evaluate, must_hold, right_side, signed_atoms
from .knee import JUMP, RISES_WITH_KV
from .tree import Branch

# How sure each branch is when it fires cleanly: its verdict's (rules/verdicts.py) unless the branch
# says otherwise (a fallback, a thinner measurement of the same verdict).
BASE = {b.id: b.base for b in tree.BRANCHES}
COMPETITOR_PENALTY = 0.05  # below a competitor's own confidence (at least the two penalties below together)
UNCERTAIN_PENALTY = 0.025  # the branch rests on an absence; a value near its threshold decides it
MEAN_PENALTY = 0.15  # the latency measure is a mean time per token, not a p95
GPU_BLIND_CAP = 0.5  # a GPU-side verdict made without GPU counters
NEAR = 0.05  # "near a threshold": within 5% of it


def _missing(values: Mapping[str, float], name: str) -> bool:
    return math.isnan(values.get(name, math.nan))


def dynamic_base(branch: Branch, values: Mapping[str, float], knee_kind: str | None = None) -> float:
    """A branch's confidence from what is measured; never higher with fewer signals."""
    c = BASE[branch.id]
    gpu_missing = _missing(values, "gpu_busy_ratio")
    if branch.id == "decode_default":
        c = 0.4 if gpu_missing else c
        if knee_kind == RISES_WITH_KV:
            c += 0.15  # ITL rising with resident KV points at bandwidth
    if branch.id == "gpu_idle":
        dram_missing, sm_missing = _missing(values, "dram_bandwidth_ratio"), _missing(values, "sm_active_ratio")
        if dram_missing and sm_missing:
            c -= 0.1  # only NVML duty cycles
        elif dram_missing or sm_missing:
            c = min(c, GPU_BLIND_CAP)  # idle on one counter: the one not read could be busy
    if branch.id == "thrashing_preemptions" and knee_kind == JUMP:
        c += 0.05
    if branch.id == "unmeasured" and _missing(values, "requests_waiting"):
        c -= 0.05  # nor can it tell whether requests wait (a queue gauge may show a queue: less sure still)
    if branch.id == "idle" and _missing(values, "generation_tokens_per_second"):
        c = 0.6  # judged without a token counter
    if _missing(values, "itl_p95_seconds") and branch.id in _LATENCY_JUDGED:
        c -= MEAN_PENALTY  # judged on a mean time per token (or on no latency at all)
    if branch.gpu_side and gpu_missing:
        c = min(c, GPU_BLIND_CAP)
    return c


# Branches whose verdict rests on the latency measure (a mean costs confidence there).
_LATENCY_JUDGED = frozenset(
    b.id for b in tree.BRANCHES if b.step in (tree.DECODE_STEP, tree.ON_TIME_STEP) and b.id != "unmeasured"
)


# Per feature, the thresholds the tree compares it with and the comparisons with another feature.
_THRESHOLDS: dict[str, list[Cmp]] = {}
_PAIRS: dict[str, list[CmpFeatures]] = {}
for _atom in (a for b in tree.BRANCHES for a in tree.BRANCH_ATOMS[b.id]):
    if isinstance(_atom, Cmp):
        _THRESHOLDS.setdefault(_atom.feature, []).append(_atom)
    elif isinstance(_atom, CmpFeatures):
        _PAIRS.setdefault(_atom.left, []).append(_atom)
        _PAIRS.setdefault(_atom.right, []).append(_atom)
# Per branch, the features its condition reads.
_READS = {
    b.id: sorted(
        {
            n
            for a in tree.BRANCH_ATOMS[b.id]
            for n in ((a.left, a.right) if isinstance(a, CmpFeatures) else (a.feature,))
        }
    )
    for b in tree.BRANCHES
}


ITL_QUANTILE = "itl_p95_seconds"
MEAN_TIME_PER_TOKEN = "time_per_token_mean_seconds"


def itl_quantile_bound(values: Mapping[str, float], params: Mapping[str, float]) -> float:
    """The most a missing ITL quantile q could measure given the measured mean time per token:
    mean / (1 - q) (Markov's inequality: a share 1 - q of tokens at x or more costs at least
    (1 - q) x per token). The mean covers the window, the quantile its recent part: the bound takes
    the window's pace as the recent one's, as the tree does where the mean is its latency measure.
    +inf where the quantile is measured or the mean is not."""
    mean = values.get(MEAN_TIME_PER_TOKEN, math.nan)
    q = params.get("itl_quantile", math.nan)
    if not _missing(values, ITL_QUANTILE) or math.isnan(mean) or not q < 1:
        return math.inf
    return mean / (1 - q)


def _rules_out(earlier: Branch, values: Mapping[str, float], params: Mapping[str, float]) -> bool:
    """Whether ``earlier`` could hold only with an ITL quantile over ``itl_quantile_bound``."""
    if ITL_QUANTILE not in _READS[earlier.id] or math.isinf(itl_quantile_bound(values, params)):
        return False
    return not any(evaluate(earlier.condition, f, params) for f in _filled_in(earlier, values, params, for_it=True))


def _candidates(feature: str, values: Mapping[str, float], params: Mapping[str, float]) -> list[float]:
    """Values of a missing feature on either side of every threshold the tree compares it with (an
    ITL quantile no higher than the mean time per token allows)."""
    if feature == ITL_QUANTILE:
        bound = itl_quantile_bound(values, params)
        return [v for v in _unbounded_candidates(feature, values, params) if v <= bound] or [bound]
    return _unbounded_candidates(feature, values, params)


def _unbounded_candidates(feature: str, values: Mapping[str, float], params: Mapping[str, float]) -> list[float]:
    out: set[float] = set()
    for atom in _THRESHOLDS.get(feature, ()):
        thr = atom.threshold.value(params)
        step = max(abs(thr) * NEAR, 1e-3)
        out.update((thr - step, thr + step))
    for pair in _PAIRS.get(feature, ()):
        boundary = _boundary(pair, feature, values, params)
        if not math.isnan(boundary):
            out.update((boundary * (1 - NEAR), boundary * (1 + NEAR), boundary + 0.2, max(0.0, boundary - 0.2)))
    return sorted(v for v in out if v >= 0) or [1.0]


def _boundary(pair: CmpFeatures, feature: str, values: Mapping[str, float], params: Mapping[str, float]) -> float:
    """The value of ``feature`` at which ``left <op> right x scale + offset`` turns, given the other
    side's measured value (NaN where it is missing too)."""
    if feature == pair.left:
        return right_side(pair, values, params)
    scale = pair.scale.value(params) if pair.scale else 1.0
    offset = pair.offset.value(params) if pair.offset else 0.0
    return (values.get(pair.left, math.nan) - offset) / scale if scale else math.nan


# Per branch, the features it holds for want of and compares with nothing: for those, staying
# unmeasured is one of the ways to fill them in (a verdict made for want of GPU counters holds only
# while they stay missing). A feature also compared with a threshold is covered by the values on
# either side of it (and leaving it out too would multiply the search for little).
_ASKS_ABSENT = {
    b.id: frozenset(a.feature for a, negated in signed_atoms(b.condition) if isinstance(a, Present) and negated)
    - {a.feature for a in tree.BRANCH_ATOMS[b.id] if isinstance(a, Cmp)}
    for b in tree.BRANCHES
}


def _filled_in(
    branch: Branch, values: Mapping[str, float], params: Mapping[str, float], for_it: bool = False
) -> Iterator[dict[str, float]]:
    """``values`` with the missing features ``branch``'s condition reads filled in, every way; ``for_it``:
    the ways that could let it hold (what it holds for want of stays missing)."""
    free = [name for name in _READS[branch.id] if _missing(values, name)]
    if for_it:
        free = [name for name in free if name not in _ASKS_ABSENT[branch.id]]
    choices = [_candidates(name, values, params) for name in free]
    for combination in itertools.product(*choices):
        yield {**values, **dict(zip(free, combination, strict=True))}


def near_decisive(branch: Branch, values: Mapping[str, float], params: Mapping[str, float]) -> bool:
    """Whether moving one measured value within 5% of a threshold to its other side changes the verdict."""
    for atom in (a for b in tree.BRANCHES for a in tree.BRANCH_ATOMS[b.id]):
        if not isinstance(atom, Cmp):
            continue
        v = values.get(atom.feature, math.nan)
        thr = atom.threshold.value(params)
        if math.isnan(v) or not thr or abs(v - thr) / abs(thr) >= NEAR:
            continue
        for moved in (thr * (1 - NEAR), thr * (1 + NEAR)):
            if tree.choose_branch({**values, atom.feature: moved}, params).verdict != branch.verdict:
                return True
    return False


class _Assessment:
    """``as_if`` for the branches of one window: earlier competitors cap at their base, filled-in
    absences at their full assessment (each (branch, values) assessed once)."""

    def __init__(self, params: Mapping[str, float], knee_kind: str | None):
        self.params = params
        self.knee_kind = knee_kind
        self.done: dict[tuple[str, Key], float] = {}
        self.busy: set[tuple[str, Key]] = set()
        self.chosen: dict[Key, Branch] = {}

    def branch_of(self, values: Mapping[str, float]) -> Branch:
        key = _measured(values)
        hit = self.chosen.get(key)
        if hit is None:
            hit = self.chosen[key] = tree.choose_branch(values, self.params)
        return hit

    def as_if(self, branch: Branch, values: Mapping[str, float], top: bool = False) -> tuple[float, list[str]]:
        """(how sure ``branch``'s verdict would be on ``values``, the verdicts it could not rule out):
        its own confidence, capped below each competitor's, assessed the same way."""
        params = self.params
        own = dynamic_base(branch, values, self.knee_kind)
        rests_on_absence = not must_hold(branch.condition, values, params)
        if rests_on_absence:
            own -= UNCERTAIN_PENALTY
        if top and near_decisive(branch, values, params):
            own -= UNCERTAIN_PENALTY
        caps = [own]
        unresolved: dict[str, None] = {}
        key = (branch.id, _measured(values))
        self.busy.add(key)

        def compete(other: Branch, where: Mapping[str, float]) -> None:
            their = (other.id, _measured(where))
            if other.verdict == branch.verdict or their in self.busy:
                return
            unresolved[other.verdict] = None
            if their not in self.done:
                self.as_if(other, where)
            caps.append(self.done[their] - COMPETITOR_PENALTY)

        # an earlier branch that could have held: as sure as it would be where its absences are filled in
        for earlier in tree.BRANCHES[: tree.BRANCHES.index(branch)]:
            if earlier.verdict != branch.verdict and could_hold(earlier.condition, values, params):
                if _rules_out(earlier, values, params):
                    continue  # slow decode, ruled out by the measured mean time per token
                for filled in _filled_in(earlier, values, params, for_it=True):
                    if self.branch_of(filled) is earlier:
                        compete(earlier, filled)
                caps.append(dynamic_base(earlier, values, self.knee_kind) - COMPETITOR_PENALTY)
                unresolved[earlier.verdict] = None
        if rests_on_absence:  # what the tree says once the absence is filled in
            for filled in _filled_in(branch, values, params):
                compete(self.branch_of(filled), filled)
        self.busy.discard(key)
        self.done[key] = min(caps)
        return min(caps), list(unresolved)


_FEATURE_ORDER = tuple(sorted({n for reads in _READS.values() for n in reads}))
Key = tuple[float | None, ...]


def _measured(values: Mapping[str, float]) -> Key:
    """The tree's features as a key (None where missing: NaN never equals itself)."""
    return tuple(None if (v := values.get(n, math.nan)) != v else v for n in _FEATURE_ORDER)


def assess(
    values: Mapping[str, float], params: Mapping[str, float], knee_kind: str | None = None
) -> tuple[float, list[str]]:
    """(the confidence of the tree's verdict on ``values``, the verdicts it could not rule out)."""
    frozen_values = tuple(sorted((name, None if v != v else v) for name, v in values.items()))  # NaN != NaN
    c, unresolved = _assess_frozen(frozen_values, tuple(sorted(params.items())), knee_kind)
    return c, list(unresolved)


# The search over a window with many features missing takes ~0.1 s, and a down or idle engine
# repeats the same values every cycle: the answer depends on its arguments alone, so it is kept.
@functools.lru_cache(maxsize=16)
def _assess_frozen(
    values: tuple[tuple[str, float | None], ...], params: tuple[tuple[str, float], ...], knee_kind: str | None
) -> tuple[float, tuple[str, ...]]:
    window = {name: math.nan if v is None else v for name, v in values}
    parameters = dict(params)
    c, unresolved = _Assessment(parameters, knee_kind).as_if(tree.choose_branch(window, parameters), window, top=True)
    return c, tuple(unresolved)


def confidence(
    values: Mapping[str, float], params: Mapping[str, float], knee_kind: str | None, few_samples: bool
) -> tuple[float, list[str]]:
    """``assess``, scaled down for a window of few samples and kept within [0.05, 0.99]."""
    c, unresolved = assess(values, params, knee_kind)
    if few_samples:
        c *= 0.6
    return float(min(0.99, max(0.05, c))), unresolved


__all__ = ["BASE", "GPU_BLIND_CAP", "assess", "confidence", "dynamic_base", "near_decisive"]
