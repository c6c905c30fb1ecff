"""Reading the generated Grafana dashboard as Grafana would: its panels, their queries, its variables."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tests.support.tools import ROOT

COMMITTED = ROOT / "grafana" / "kvdoctor-dashboard.json"
CHART_COPY = ROOT / "helm" / "kvdoctor" / "files" / "grafana-dashboard.json"
# What Grafana puts for $__rate_interval at a 1 s scrape interval and a short time range: at least
# four scrape intervals (Grafana's rule), here with room for a busy machine.
RATE_INTERVAL = "20s"


def load(text: str | None = None) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(COMMITTED.read_text() if text is None else text)
    return data


def panels(board: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The panels that show data (rows left out), in order."""
    return [p for p in board["panels"] if p["type"] != "row"]


@dataclass(frozen=True)
class Target:
    panel: str
    ref: str
    expr: str
    instant: bool
    legend: str


def targets(board: Mapping[str, Any]) -> list[Target]:
    return [
        Target(p["title"], t["refId"], t["expr"], bool(t.get("instant")), t.get("legendFormat", ""))
        for p in panels(board)
        for t in p["targets"]
    ]


def variables(board: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in board["templating"]["list"]}


def substitute(expr: str, values: Mapping[str, str], rate_interval: str = RATE_INTERVAL) -> str:
    """``expr`` with the dashboard's variables replaced as Grafana does (``$name`` and ``${name}``);
    any variable left over is an error."""
    text = expr.replace("$__rate_interval", rate_interval)
    for name, value in values.items():
        text = text.replace(f"${{{name}}}", value).replace(f"${name}", value)
    leftover = re.findall(r"\$\{?\w+", text)
    assert not leftover, f"variables left in {text!r}: {leftover}"
    return text


def label_values_query(query: str) -> tuple[str, str]:
    """Grafana's ``label_values(<selector>, <label>)`` split into the series selector and the label."""
    match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
    assert match, f"not a label_values query: {query!r}"
    return match.group(1), match.group(2)
