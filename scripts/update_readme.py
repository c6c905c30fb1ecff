"""Regenerates the generated tables of the README and of the manual in docs/, in place: the verdicts
(README), the CLI's shared flags, old spellings and the exporter's settings (docs/commands.md), the
collectors and the metrics (docs/metrics.md). tests/test_readme.py fails when one is stale.

.venv/bin/python scripts/update_readme.py
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

from kvdoctor import cli, flag_tables
from kvdoctor.exporter import settings
from kvdoctor.exporter.collectors import base as collectors
from kvdoctor.rules.actions import ACTION_BY_ID, FIX, VERDICT_ACTIONS
from kvdoctor.rules.alert_specs import VERDICT_ALERT
from kvdoctor.rules.thresholds import MIN_WINDOW_SAMPLES
from kvdoctor.rules.tree import BRANCHES
from kvdoctor.rules.verdicts import SLOW_VERDICTS, UNKNOWN, WORST_FIRST
from kvdoctor.signals import vocabulary as signals

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

# Which file holds which generated block: each table in one place.
FILES: dict[str, tuple[str, ...]] = {
    "README.md": ("verdicts",),
    "docs/commands.md": ("cli-shared-flags", "cli-deprecated", "exporter-settings"),
    "docs/metrics.md": ("collectors", "metrics"),
}


def verdicts_table() -> str:
    """The verdicts, worst first (the catalogue's rank): when (its branches in words), the alert, the
    cheapest two fixes."""
    rows = ["| verdict | when | alert | fix, cheapest first |", "|---|---|---|---|"]
    for verdict in WORST_FIRST:
        when = "; or ".join(b.summary for b in BRANCHES if b.verdict == verdict)
        if verdict == UNKNOWN:
            when = (
                f"the window holds fewer than {MIN_WINDOW_SAMPLES} snapshots: too short to judge (`diagnose` exits 2, "
                "the rules record no verdict)"
            )
        fixes = sorted(
            (ACTION_BY_ID[a] for a in VERDICT_ACTIONS.get(verdict, ()) if ACTION_BY_ID[a].group == FIX),
            key=lambda a: a.cost,
        )
        slow = "" if verdict in SLOW_VERDICTS else " (not slow)"
        alert = f"`{VERDICT_ALERT[verdict]}`" if verdict in VERDICT_ALERT else ""
        rows.append(f"| `{verdict}`{slow} | {when} | {alert} | {'; '.join(a.title for a in fixes[:2])} |")
    return "\n".join(rows)


def generated_blocks() -> dict[str, Callable[[], str]]:
    parser = cli.build_parser()
    return {
        "verdicts": verdicts_table,
        "cli-shared-flags": lambda: flag_tables.shared_table(parser),
        "cli-deprecated": lambda: flag_tables.deprecated_table(parser),
        "exporter-settings": settings.markdown_table,
        "metrics": signals.markdown_table,
        "collectors": collectors.markdown_table,
    }


def render(text: str, names: tuple[str, ...] | None = None, where: str = "README.md") -> str:
    """``text`` with its generated blocks (``names``: those it must hold; default: README.md's) made anew."""
    blocks = generated_blocks()
    for name in FILES[where] if names is None else names:
        pattern = re.compile(rf"(<!-- {name}:begin[^>]*-->\n).*?(<!-- {name}:end -->)", re.S)
        if not pattern.search(text):
            raise SystemExit(f"update_readme: {where} lacks the <!-- {name}:begin --> marker")
        body = blocks[name]()
        text = pattern.sub(lambda m, body=body: m.group(1) + body + "\n" + m.group(2), text)
    return text


def render_file(relative: str) -> tuple[str, str]:
    """(the file's text, what it should be)."""
    text = (ROOT / relative).read_text()
    return text, render(text, FILES[relative], relative)


if __name__ == "__main__":
    for relative in FILES:
        _, fresh = render_file(relative)
        (ROOT / relative).write_text(fresh)
    sys.exit(0)
