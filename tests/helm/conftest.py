"""Fixtures for the chart tests: the chart under test and the real helm binary."""

from __future__ import annotations

import pytest

from tests.helm.chart import ChartUnderTest, Helm, chart_under_test
from tests.support import tools


@pytest.fixture(scope="session")
def chart() -> ChartUnderTest:
    """The chart, reading the real rules/alerts.yaml through its symlink (the tests fail without it)."""
    return chart_under_test()


@pytest.fixture(scope="session")
def helm(chart) -> Helm:
    """The real helm binary on the chart (the tests using it are marked needs_tools("helm"))."""
    return Helm(tools.require("helm"), chart)
