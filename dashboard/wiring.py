"""Callback dependencies in one line a group: ``each(Output, "children", ids.A, ids.B)``.

A page's callbacks read and write many components the same way (every dropdown's ``value``, every
store's ``data``); naming the property once keeps the callback's signature short and in order.
"""

from __future__ import annotations

from dash.dependencies import DashDependency


def each(kind: type[DashDependency], prop: str, *component_ids: str) -> list[DashDependency]:
    """``kind(id, prop)`` for every id, in order: an ``Output``, ``Input`` or ``State`` a component."""
    return [kind(component_id, prop) for component_id in component_ids]
