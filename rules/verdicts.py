"""The verdict catalogue: every verdict the tree can give, defined once.

Each ``Verdict`` holds what every surface needs to show it: its title (dashboard banner, fleet
counts, Grafana), its rank (worst first, the one order every list uses), its severity and colour,
the base confidence of a clean match, its headline builder (``rules/headlines.py``), and its alert
with the runbook named after it. The tree (``rules/tree.py``), the renderer, the confidence model,
the dashboard, the fleet summary, Grafana and the alert rules read it from here; renaming or
re-ranking a verdict is an edit of this table (``tests/rules/test_verdict_catalogue.py``).

``unknown`` is not a branch of the tree: it is the answer for a window too short to judge, and the
fleet's answer for a pod that publishes no verdict.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import headlines
from .headlines import HeadlineFacts

# Severities, worst first: the dashboard's banner class and Grafana's colour follow from them.
CRITICAL = "critical"
WARNING = "warning"
OK = "ok"
QUIET = "quiet"  # idle, unknown: nothing to act on

INFO = "info"  # an alert's severity only: a ticket, nobody paged
SEVERITY_COLOURS = {CRITICAL: "red", WARNING: "orange", INFO: "blue", OK: "green", QUIET: "text"}


@dataclass(frozen=True)
class Verdict:
    """One verdict: its words, its place in every list, how sure a clean match is, its alert."""

    id: str
    title: str
    rank: int  # 0 is the worst; every list of verdicts is sorted by it
    severity: str
    base_confidence: float  # a clean match of its (first) branch
    headline: Callable[[str, HeadlineFacts], str]  # (branch id, facts) -> the headline
    alert: str | None = None  # the alert that fires on it; its runbook is docs/runbooks/<alert>.md
    slow: bool = False  # a reason the service is slow

    @property
    def colour(self) -> str:
        return SEVERITY_COLOURS[self.severity]

    @property
    def runbook(self) -> str | None:
        return f"{self.alert}.md" if self.alert else None


CATALOGUE: tuple[Verdict, ...] = (
    Verdict(
        "kv_thrashing",
        "KV thrashing",
        0,
        CRITICAL,
        0.9,
        headlines.kv_thrashing,
        "KVCacheThrashing",
        slow=True,
    ),
    Verdict(
        "kv_capacity_pressure",
        "KV capacity pressure",
        1,
        WARNING,
        0.8,
        headlines.kv_capacity_pressure,
        "KVCacheCapacityPressure",
        slow=True,
    ),
    Verdict(
        "kv_tier_miss",
        "KV served from a slow tier",
        2,
        WARNING,
        0.8,
        headlines.kv_tier_miss,
        "KVCacheTierMiss",
        slow=True,
    ),
    Verdict(
        "memory_bandwidth_bound",
        "Decode is HBM-bandwidth bound",
        3,
        WARNING,
        0.85,
        headlines.memory_bandwidth_bound,
        "DecodeMemoryBandwidthBound",
        slow=True,
    ),
    Verdict(
        "compute_bound",
        "Compute bound",
        4,
        WARNING,
        0.8,
        headlines.compute_bound,
        "DecodeComputeBound",
        slow=True,
    ),
    Verdict(
        "host_overhead_bound",
        "Host overhead bound",
        5,
        WARNING,
        0.75,
        headlines.host_overhead_bound,
        "DecodeHostOverheadBound",
        slow=True,
    ),
    Verdict(
        "request_queueing",
        "Requests queue",
        6,
        WARNING,
        0.8,
        headlines.request_queueing,
        "RequestsQueueing",
        slow=True,
    ),
    Verdict("unknown", "Not enough data", 7, QUIET, 0.05, headlines.unknown),
    Verdict("healthy", "Healthy", 8, OK, 0.85, headlines.healthy),
    Verdict("idle", "Idle", 9, QUIET, 0.95, headlines.idle),
)

VERDICT_BY_ID: dict[str, Verdict] = {v.id: v for v in CATALOGUE}
UNKNOWN = "unknown"

# The verdicts in their published order: ``kvdoctor:verdict`` codes and the exporter's state set
# number them from 1 in this order, so a new verdict goes at the end (dashboards keep their codes).
VERDICTS: tuple[str, ...] = (
    "idle",
    "healthy",
    "kv_thrashing",
    "kv_tier_miss",
    "kv_capacity_pressure",
    "request_queueing",
    "memory_bandwidth_bound",
    "compute_bound",
    "host_overhead_bound",
    "unknown",
)
SLOW_VERDICTS: tuple[str, ...] = tuple(v.id for v in sorted(CATALOGUE, key=lambda v: v.rank) if v.slow)
WORST_FIRST: tuple[str, ...] = tuple(v.id for v in sorted(CATALOGUE, key=lambda v: v.rank))
ALERT_OF: dict[str, str] = {v.id: v.alert for v in CATALOGUE if v.alert}


def verdict(verdict_id: str) -> Verdict:
    """The catalogue entry of ``verdict_id`` (KeyError naming it when there is none)."""
    return VERDICT_BY_ID[verdict_id]


def rank(verdict_id: str | None) -> int:
    """The verdict's rank, worst first; past every known verdict for None or a name not in the catalogue."""
    entry = VERDICT_BY_ID.get(verdict_id or "")
    return entry.rank if entry else len(CATALOGUE)


def title(verdict_id: str | None) -> str:
    if not verdict_id:
        return "No verdict"
    entry = VERDICT_BY_ID.get(verdict_id)
    return entry.title if entry else verdict_id.replace("_", " ").capitalize()


def severity(verdict_id: str | None) -> str:
    entry = VERDICT_BY_ID.get(verdict_id or "")
    return entry.severity if entry else QUIET


def verdict_code(verdict_id: str) -> int:
    """The number ``kvdoctor:verdict`` and Grafana's timeline give ``verdict_id``: from 1, in ``VERDICTS``."""
    return VERDICTS.index(verdict_id) + 1
