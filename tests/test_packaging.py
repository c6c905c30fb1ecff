"""The install layout: the top-level folders as one ``kvdoctor`` package, every sub-package listed;
the wheel without extras carries the sidecar and the CLI, not the dashboard's dependencies."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
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
    from kvdoctor.signals.vocabulary import SIGNALS, Kind

    for name, sig in SIGNALS.items():
        assert name.startswith("kvdoctor_") and ":" not in name and name == name.lower()
        assert name.endswith("_total") == (sig.kind is Kind.COUNTER), name
        if sig.unit and sig.kind is not Kind.COUNTER:
            assert name.endswith("_" + sig.unit), name


# ------------------------------------------------------------------ the wheel, installed bare


def _run(*cmd, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw)


@pytest.mark.slow
@pytest.mark.needs_tools  # pip and a reachable package index, to install the wheel's dependencies
def test_the_wheel_without_extras_gives_the_sidecar_and_the_cli_without_the_dashboard(tmp_path):
    """Build the wheel, install it without extras into a fresh venv (its dependencies from the
    package index), and use it: the exporter and diagnose work, the dashboard names its extra."""
    source = tmp_path / "src"  # a copy, so that the build leaves nothing in the working tree
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for folder in FOLDERS:
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    built = _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", tmp_path, source)
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("kvdoctor-*.whl")

    venv = tmp_path / "venv"
    created = _run(sys.executable, "-m", "venv", venv)
    assert created.returncode == 0, created.stderr
    python, kvdoctor = venv / "bin/python", venv / "bin/kvdoctor"
    installed = _run(python, "-m", "pip", "install", "-q", wheel, timeout=600)
    assert installed.returncode == 0, installed.stderr

    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVDOCTOR_", "PYTHON"))}
    for module in ("dash", "plotly", "matplotlib", "tsdownsample"):
        probe = _run(python, "-c", f"import {module}", env=env, cwd=tmp_path)
        assert probe.returncode == 1 and "ModuleNotFoundError" in probe.stderr, module
    for command in ("exporter", "diagnose"):
        help_ = _run(kvdoctor, command, "--help", env=env, cwd=tmp_path)
        assert help_.returncode == 0 and f"usage: kvdoctor {command}" in help_.stdout, help_.stderr
    trace = ROOT / "tests/fixtures/traces/simulator-kv-thrashing.om"
    diagnosed = _run(kvdoctor, "diagnose", "--replay", trace, "--json", env=env, cwd=tmp_path)
    assert diagnosed.returncode == 1 and json.loads(diagnosed.stdout)["verdict"] == "kv_thrashing", diagnosed.stderr
    for command in (["dashboard"], ["demo", "--port", "0"]):
        refused = _run(kvdoctor, *command, env=env, cwd=tmp_path, timeout=60)
        assert refused.returncode == 2 and refused.stdout == "", refused.stderr
        (line,) = refused.stderr.splitlines()
        assert "pip install 'kvdoctor[dashboard]'" in line
