"""`make generate` regenerates every committed generated file, and `make check-generated` (what CI
runs on its clean clone) fails naming the command when one of them is stale."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.processes import run

ROOT = Path(__file__).resolve().parents[1]
CHART_FILES = ROOT / "helm" / "kvdoctor" / "files"
SCHEMA = ROOT / "helm" / "kvdoctor" / "values.schema.json"
STALE_ALERTS = "helm/kvdoctor/files/alerts-1m.yaml"
STALE_SCHEMA = "helm/kvdoctor/values.schema.json"


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _make(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """make ARGS with this venv (sys.prefix), never re-running setup on a copy."""
    if shutil.which("make") is None or shutil.which("git") is None:
        pytest.skip("needs make and git on PATH")
    venv = sys.prefix
    return subprocess.run(
        ["make", "--no-print-directory", f"VENV={venv}", "-o", f"{venv}/.kvdoctor-setup", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_make_generate_writes_every_generated_file():
    """Each committed generated file is named in the recipe: the rule file, every rule copy the chart
    holds (a new scrape interval must be added there), the Grafana JSON, the doc tables, the schema."""
    recipe = _make("-n", "generate").stdout
    copies = {p.name for p in CHART_FILES.glob("alerts-*.yaml") if not p.is_symlink()}
    loop = re.search(r"for interval in (.+?); do", recipe)
    assert loop and copies, recipe
    assert {f"alerts-{interval}.yaml" for interval in loop.group(1).split()} == copies
    for expected in (
        "rules export -o rules/alerts.yaml",
        "-o helm/kvdoctor/files/alerts-$interval.yaml",
        "grafana export -o grafana/kvdoctor-dashboard.json",
        "scripts/update_readme.py",
        "scripts/update_chart_schema.py",
    ):
        assert expected in recipe, expected


def test_the_chart_schema_lists_the_rule_files_alerts_in_order():
    text, fresh = _script("update_chart_schema").render_file()
    assert text == fresh, "helm/kvdoctor/values.schema.json's alert list is stale; run: make generate"


def test_the_schema_update_rewrites_the_alert_list_and_nothing_else():
    update = _script("update_chart_schema")
    text = SCHEMA.read_text()
    first = next(iter(update.alert_properties()))
    entry = f'"{first}": {{\n'
    assert entry in text
    mangled = text.replace(entry, '"KVCacheMisspelt": {\n', 1)
    assert update.render(mangled) == text
    with pytest.raises(SystemExit, match=r"no monitoring\.prometheusRule\.alerts\.properties"):
        update.render(text.replace('"alerts": {', '"alert_overrides": {'))


@pytest.fixture
def clean_checkout(tmp_path: Path) -> Path:
    """A git repository holding this working tree's files (tracked or not, but not ignored) as they
    are now, committed."""
    if shutil.which("git") is None:
        pytest.skip("needs git on PATH")
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    checkout = tmp_path / "kvdoctor"
    for relative in filter(None, listed.stdout.split("\0")):
        source, target = ROOT / relative, checkout / relative
        if not source.exists() and not source.is_symlink():
            continue  # deleted in the working tree, not yet committed
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(source.readlink())
        else:
            shutil.copy2(source, target)
    _git(checkout, "init", "--quiet")
    _commit(checkout, "as the working tree")
    return checkout


def _git(checkout: Path, *args: str) -> None:
    result = run(["git", "-c", "user.name=t", "-c", "user.email=t@localhost", *args], cwd=checkout)
    assert result.rc == 0, result.stderr


def _commit(checkout: Path, message: str) -> None:
    _git(checkout, "add", "-A")
    _git(checkout, "commit", "--quiet", "--allow-empty", "-m", message)


@pytest.mark.slow
def test_check_generated_passes_on_a_current_checkout(clean_checkout):
    result = _make("check-generated", cwd=clean_checkout)
    assert result.returncode == 0, result.stderr
    assert "every generated file is current" in result.stdout


@pytest.mark.slow
def test_check_generated_fails_on_a_stale_file_naming_the_command_and_regenerates_it(clean_checkout):
    alerts = clean_checkout / STALE_ALERTS
    alerts.write_text(alerts.read_text().replace("severity: warning", "severity: info", 1))
    schema = clean_checkout / STALE_SCHEMA
    schema.write_text(schema.read_text().replace("Changes to alert KVCacheTierMiss.", "Changes to it.", 1))
    _commit(clean_checkout, "stale")
    result = _make("check-generated", cwd=clean_checkout)
    assert result.returncode != 0
    assert "`make generate` changed the checkout" in result.stderr
    assert STALE_ALERTS in result.stderr and STALE_SCHEMA in result.stderr
    assert alerts.read_text() == (ROOT / STALE_ALERTS).read_text()
    assert schema.read_text() == SCHEMA.read_text()
