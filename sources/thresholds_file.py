"""Threshold overrides from a YAML file (``--thresholds FILE``): read here, checked by ``Thresholds``.

    # thresholds.yaml
    kv_ceiling_ratio: 0.95
    bandwidth_high_ratio: 0.75

An empty file gives the defaults; an unreadable file, invalid YAML, an unknown key or an
out-of-range value is one ``ValueError`` line.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from kvdoctor.rules.thresholds import Thresholds

__all__ = ["load_thresholds"]


def load_thresholds(path: str | Path) -> Thresholds:
    """The defaults overridden by the YAML mapping in ``path``."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"cannot read thresholds file {path}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"thresholds file {path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    return Thresholds.from_mapping(data, source=f"thresholds file {path}")
