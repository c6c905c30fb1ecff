"""The install layout: the top-level folders as one ``kvdoctor`` package, every sub-package listed."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
FOLDERS = {folder: package for package, folder in PACKAGE_DIRS.items()}


def test_every_top_level_folder_with_code_is_mapped():
    code_folders = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "bench"}
    assert code_folders == set(FOLDERS)


def _declared_packages() -> set[str]:
    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])


def _packages_on_disk() -> set[str]:
    found = set()
    for folder, package in FOLDERS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([package, *rel.parts]))
    return found


def test_every_package_folder_is_declared():
    assert _packages_on_disk() == _declared_packages()


@pytest.mark.parametrize("bare", sorted(set(FOLDERS) - {"kvdoctor"}))
def test_nothing_installed_under_a_bare_name(bare):
    declared = _declared_packages()
    assert not any(p == bare or p.startswith(bare + ".") for p in declared)


def test_signal_vocabulary_follows_prometheus_conventions():
    from kvdoctor.rules.signals import SIGNALS, Kind

    for name, sig in SIGNALS.items():
        assert name.startswith("kvdoctor_") and ":" not in name and name == name.lower()
        assert name.endswith("_total") == (sig.kind is Kind.COUNTER), name
        if sig.unit and sig.kind is not Kind.COUNTER:
            assert name.endswith("_" + sig.unit), name
