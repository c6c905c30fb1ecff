"""Records as JSON: an object's attributes, by name, in the order named."""

from __future__ import annotations

from typing import Any


def attributes(obj: object, names: str) -> dict[str, Any]:
    """``{name: obj.name}`` for each of the space-separated ``names``, in their order."""
    return {name: getattr(obj, name) for name in names.split()}
