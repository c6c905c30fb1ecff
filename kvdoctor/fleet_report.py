"""``kvdoctor diagnose --prometheus`` over several pods: the fleet summary as text.

The counts by verdict, then the worst pods first (``rules.fleet.worst_first_key``): pod, verdict,
ITL p95 against the pod's SLO, KV usage, requests waiting, and the first action.
"""

from __future__ import annotations

import math

from kvdoctor.rules.actions import ACTION_BY_ID
from kvdoctor.rules.fleet import FleetRow, FleetSummary
from kvdoctor.rules.verdicts import UNKNOWN
from kvdoctor.signals.units import fmt_ms, fmt_pct

DEFAULT_LIMIT = 20  # rows the text shows unless --limit says otherwise (--json: every row)
_STYLES = {"ok": "32", "slow": "31", "dim": "2", "bold": "1", "warn": "33"}


def _paint(text: str, style: str, colour: bool) -> str:
    return f"\033[{_STYLES[style]}m{text}\033[0m" if colour else text


def _latency(row: FleetRow) -> str:
    if not math.isfinite(row.itl_p95_seconds):
        return "-"
    slo = fmt_ms(row.slo_applied, trim=True) + ("" if math.isfinite(row.slo_seconds) else "*")
    return f"{fmt_ms(row.itl_p95_seconds, trim=True)} / {slo} ({row.slo_ratio:.1f}x)"


def _action(row: FleetRow) -> str:
    return ACTION_BY_ID[row.first_action].title if row.first_action in ACTION_BY_ID else "-"


def _waiting(row: FleetRow) -> str:
    return f"{row.waiting:.0f}" if math.isfinite(row.waiting) else "-"


def render_fleet(summary: FleetSummary, origin: str, limit: int | None = DEFAULT_LIMIT, colour: bool = False) -> str:
    """The counts and the ``limit`` worst pods (None or 0: all of them)."""
    counts = [f"{n} {verdict}" for verdict, n in summary.counts.items() if n]
    lines = [
        _paint(
            f"{len(summary.rows)} pods, {summary.slow} slow: " + ", ".join(counts),
            "slow" if summary.slow else "ok",
            colour,
        ),
        _paint(f"{origin}, {summary.selector}", "dim", colour),
        "",
    ]
    shown = summary.rows if not limit else summary.rows[:limit]
    table = [("pod", "verdict", "ITL p95 / SLO", "KV", "waiting", "first action")]
    for row in shown:
        pod = f"{row.namespace}/{row.pod}" if row.namespace else row.pod
        table.append((pod, row.verdict, _latency(row), fmt_pct(row.kv_usage, missing="-"), _waiting(row), _action(row)))
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    for i, cells in enumerate(table):
        text = "  " + "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()
        if i == 0:
            text = _paint(text, "dim", colour)
        elif summary.rows[i - 1].slow:
            text = _paint(text, "slow", colour)
        elif summary.rows[i - 1].verdict == UNKNOWN:
            text = _paint(text, "warn", colour)
        lines.append(text)
    hidden = len(summary.rows) - len(shown)
    if hidden > 0:
        lines.append(_paint(f"  ({hidden} more: --limit 0 for all, or --json)", "dim", colour))
    if any(math.isfinite(r.itl_p95_seconds) and not math.isfinite(r.slo_seconds) for r in shown):
        lines.append(_paint("  * the pod publishes no SLO: the rules' default applies", "dim", colour))
    for note in summary.notes:
        lines.append(_paint(f"  note: {note}", "warn", colour))
    lines.append(
        _paint("  one pod in full: kvdoctor diagnose --prometheus URL --selector '{pod=\"NAME\"}'", "dim", colour)
    )
    return "\n".join(lines)
