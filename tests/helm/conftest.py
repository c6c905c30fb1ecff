"""Fixtures for the chart tests: the chart under test and the real helm binary."""

from __future__ import annotations

import pytest

from tests import tools
from tests.helm.chart import ChartUnderTest, Helm, chart_under_test


@pytest.fixture(scope="session")
def chart(tmp_path_factory) -> ChartUnderTest:
    """The chart, reading rules/alerts.yaml through its symlink (a placeholder in a temporary copy
    of the repository layout while the rules package has not generated the file yet)."""
    return chart_under_test(tmp_path_factory.mktemp("repo"))


@pytest.fixture(scope="session")
def helm_session(chart) -> Helm | None:
    path = tools.helm()
    return Helm(path, chart) if path else None


@pytest.fixture
def helm(helm_session) -> Helm:
    """The helm binary (tests using it skip, naming the install command, when it is missing)."""
    if helm_session is None:
        tools.require("helm")
    return helm_session
