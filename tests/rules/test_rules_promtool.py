"""Agreement, promtool half: the generated rules pass ``promtool check rules`` and, on every
scenario's series, fire exactly the alert the Python evaluator's verdict names."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kvdoctor.rules import promql
from kvdoctor.rules.thresholds import Thresholds
from tests.rules.promtool_suite import write_test_file
from tests.support.scenarios import SCENARIO_BY_NAME, SCENARIOS
from tests.support.tools import promtool, requires_promtool

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "rules" / "alerts.yaml"

pytestmark = requires_promtool


def _promtool(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=timeout)


def test_promtool_check_rules_passes_on_the_committed_file():
    result = _promtool("check", "rules", str(COMMITTED))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.slow
def test_every_scenario_fires_the_matching_alert_and_no_other(tmp_path):
    test_file = write_test_file(tmp_path / "scenarios.test.yaml", COMMITTED, list(SCENARIOS))
    result = _promtool("test", "rules", str(test_file))
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]


def test_the_agreement_test_catches_drift(tmp_path):
    """Rules compiled with a different ceiling disagree with the Python verdicts: promtool must fail."""
    drifted = tmp_path / "drifted.yaml"
    drifted.write_text(promql.render_rules_yaml(Thresholds(kv_ceiling_ratio=0.97)))
    scenarios = [SCENARIO_BY_NAME["kv_ceiling_just_over"]]
    test_file = write_test_file(tmp_path / "drift.test.yaml", drifted, scenarios)
    result = _promtool("test", "rules", str(test_file))
    assert result.returncode != 0
    assert "KVCacheCapacityPressure" in result.stdout + result.stderr
