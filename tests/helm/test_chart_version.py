"""The chart's version moves with its files: ``helm/chart-releases.txt`` records, for each chart
version, a SHA-256 of every file the chart packages (symlinked files by their content, so a change
to rules/alerts.yaml or the Grafana dashboard is a change to the chart). Files that differ from
the record of the version in Chart.yaml mean the chart changed without a bump."""

from __future__ import annotations

import fnmatch
import hashlib
import itertools
import os
import re
from pathlib import Path

import pytest
import yaml

from tests.support.tools import ROOT

CHART_DIR = ROOT / "helm" / "kvdoctor"
RELEASES = ROOT / "helm" / "chart-releases.txt"
_SEMVER = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")


def chart_files(chart: Path) -> list[Path]:
    """The files ``helm package`` takes: every file under ``chart`` (links followed) but those
    its .helmignore names, sorted."""
    ignore = chart / ".helmignore"
    patterns = [
        line.strip().rstrip("/")
        for line in (ignore.read_text().splitlines() if ignore.exists() else [])
        if line.strip() and not line.startswith("#")
    ]
    files = []
    for folder, dirs, names in os.walk(chart, followlinks=True):
        dirs[:] = [d for d in dirs if not any(fnmatch.fnmatch(d, p) for p in patterns)]
        files += [Path(folder, n) for n in names if not any(fnmatch.fnmatch(n, p) for p in patterns)]
    return sorted(files, key=lambda p: p.relative_to(chart).as_posix())


def chart_digest(chart: Path) -> str:
    """SHA-256 over each file's path inside the chart and its content."""
    digest = hashlib.sha256()
    for path in chart_files(chart):
        digest.update(path.relative_to(chart).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def releases(text: str) -> list[tuple[str, str]]:
    """``(version, digest)`` per line of the record, in order (comments and blank lines skipped)."""
    out = []
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            version, digest = line.split()
            out.append((version, digest))
    return out


def semver(version: str) -> tuple[int, ...]:
    match = _SEMVER.match(version)
    assert match, f"not a MAJOR.MINOR.PATCH version: {version!r}"
    return tuple(int(g) for g in match.groups())


def check(chart: Path, record: str) -> list[str]:
    """What is wrong with ``chart`` against the record: an empty list when its version is recorded
    with its current files, and every recorded version is higher than the one before."""
    version = str(yaml.safe_load((chart / "Chart.yaml").read_text())["version"])
    recorded = releases(record)
    problems = [
        f"{b} does not come after {a}" for (a, _), (b, _) in itertools.pairwise(recorded) if semver(b) <= semver(a)
    ]
    digest = chart_digest(chart)
    known = dict(recorded)
    line = f"{version} {digest}"
    if version not in known:
        problems.append(f"chart version {version} is not in {RELEASES.name}: add the line `{line}`")
    elif known[version] != digest:
        problems.append(
            f"the chart's files changed since version {version} was recorded: bump `version` in "
            f"helm/kvdoctor/Chart.yaml and add the line `<new version> {digest}` to {RELEASES.name}"
        )
    elif recorded[-1][0] != version:
        problems.append(f"Chart.yaml says {version}, but the last recorded release is {recorded[-1][0]}")
    return problems


def test_the_chart_version_is_recorded_with_the_charts_current_files():
    assert check(CHART_DIR, RELEASES.read_text()) == []


@pytest.fixture
def chart(tmp_path: Path) -> Path:
    """A small chart: Chart.yaml at 1.0.0, one template, one linked file, a .helmignore."""
    root = tmp_path / "chart"
    (root / "templates").mkdir(parents=True)
    (root / "Chart.yaml").write_text("apiVersion: v2\nname: c\nversion: 1.0.0\n")
    (root / "templates" / "a.yaml").write_text("kind: ConfigMap\n")
    (tmp_path / "rules.yaml").write_text("groups: []\n")
    (root / "rules.yaml").symlink_to(tmp_path / "rules.yaml")
    (root / ".helmignore").write_text("*.swp\n")
    return root


def test_a_change_to_any_packaged_file_without_a_bump_is_caught(chart: Path):
    record = f"1.0.0 {chart_digest(chart)}\n"
    assert check(chart, record) == []
    (chart / "templates" / "a.yaml.swp").write_text("editor noise\n")  # ignored, as helm does
    assert check(chart, record) == []
    for change in (chart / "templates" / "a.yaml", chart.parent / "rules.yaml"):  # a linked file too
        original = change.read_text()
        change.write_text(original + "# changed\n")
        assert any("bump `version`" in p for p in check(chart, record)), change
        change.write_text(original)
    (chart / "templates" / "b.yaml").write_text("kind: Secret\n")  # a new file
    assert any("bump `version`" in p for p in check(chart, record))


def test_a_bump_needs_its_line_and_versions_only_go_up(chart: Path):
    old = f"1.0.0 {chart_digest(chart)}\n"
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: c\nversion: 1.1.0\n")
    new_line = f"1.1.0 {chart_digest(chart)}\n"
    assert any("not in" in p for p in check(chart, old))
    assert check(chart, old + new_line) == []
    assert any("does not come after" in p for p in check(chart, new_line + old))
