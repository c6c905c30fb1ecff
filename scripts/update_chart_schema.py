"""Regenerates the chart schema's alert list in place: monitoring.prometheusRule.alerts in
helm/kvdoctor/values.schema.json names each alert of the rule file (``kvdoctor rules export``), in
its order, so that a misspelt override is refused. The rest of the file is kept byte for byte.
`make generate` runs it; tests/test_generate.py fails when the list is stale.

.venv/bin/python scripts/update_chart_schema.py
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from kvdoctor.rules.rule_file import rule_groups

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "helm" / "kvdoctor" / "values.schema.json"
ALERTS_PATH = ("properties", "monitoring", "properties", "prometheusRule", "properties", "alerts", "properties")

# The alerts object's "properties": {...}, from its opening line to the closing brace at its own indent.
_ALERTS_PROPERTIES = re.compile(
    r'^(?P<indent> *)"alerts": \{\n(?:(?P=indent)  .*\n)*?(?P=indent)  "properties": \{\n'
    r"(?P<body>(?:.*\n)*?)(?P=indent)  \}",
    re.M,
)


def alert_names() -> list[str]:
    """The rule file's alerts, in its order."""
    return [rule["alert"] for group in rule_groups()["groups"] for rule in group["rules"] if "alert" in rule]


def alert_properties() -> dict[str, dict[str, str]]:
    """One override entry per alert."""
    return {
        name: {"$ref": "#/definitions/alertOverride", "description": f"Changes to alert {name}."}
        for name in alert_names()
    }


def render(text: str) -> str:
    """``text`` (the schema) with its alert list made anew."""
    match = _ALERTS_PROPERTIES.search(text)
    if match is None:
        raise SystemExit(f"update_chart_schema: {SCHEMA.name} has no monitoring.prometheusRule.alerts.properties")
    inner = match["indent"] + "    "
    entries = json.dumps(alert_properties(), indent=2).splitlines()[1:-1]  # without the outer braces
    body = "".join(inner + line.removeprefix("  ") + "\n" for line in entries)
    fresh = text[: match.start("body")] + body + text[match.end("body") :]
    node = json.loads(fresh)
    for key in ALERTS_PATH:
        node = node[key]
    assert node == alert_properties(), "the alert list landed in the wrong place"
    return fresh


def render_file() -> tuple[str, str]:
    """(the schema's text, what it should be)."""
    text = SCHEMA.read_text()
    return text, render(text)


if __name__ == "__main__":
    _, fresh = render_file()
    SCHEMA.write_text(fresh)
    sys.exit(0)
