"""The stress report without matplotlib (the [dashboard] extra): HTML, summary and trace, no figure."""

from __future__ import annotations

import json
import sys

import pytest

from kvdoctor.stress.report import FIGURE_NEEDS_EXTRA, render_figure, render_html
from tests.stress.test_stress import FakeEngine, run_stress


@pytest.fixture
def no_matplotlib(monkeypatch):
    """Imports of matplotlib fail, as in an install without the [dashboard] extra."""
    for name in [n for n in sys.modules if n == "matplotlib" or n.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)


def test_without_matplotlib_there_is_no_figure_and_the_page_says_why(no_matplotlib, tmp_path):
    figure = render_figure(None, [], [], None, None, tmp_path / "kv-latency.png")
    assert figure is None and not (tmp_path / "kv-latency.png").exists()

    summary = {
        "settings": {
            "max_concurrency": 4,
            "prompt_tokens": 100,
            "max_tokens": 10,
            "step_seconds": 1.0,
            "kv_saturation": 0.95,
        },
        "endpoint": {"model": "tiny", "api": "http://127.0.0.1:1/v1", "prompt_tokens": 100},
        "verdict": {"pattern": "unknown", "headline": "KV usage unknown", "knee": {"note": ""}},
        "saturation": {"reached": False},
        "steps": [],
        "seconds": 3.0,
    }
    page = render_html(summary, figure, tmp_path / "report.html").read_text()
    assert "<img" not in page and 'href="kv-latency.png"' not in page
    assert "pip install &#x27;kvdoctor[dashboard]&#x27;" in page


def test_kvdoctor_stress_without_matplotlib_writes_the_rest_and_says_so_in_one_line(no_matplotlib, tmp_path, capsys):
    out = tmp_path / "report"
    with FakeEngine() as engine:
        rc = run_stress(
            [
                *("--engine-url", engine.url, "--prompt-tokens", "100", "--max-tokens", "20"),
                *("--max-concurrency", "2", "--step-seconds", "1", "-o", str(out)),
            ]
        )
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "summary.json", "trace.om"]
    assert json.loads((out / "summary.json").read_text())["files"]["figure"] is None
    notes = [line for line in captured.err.splitlines() if "kvdoctor[dashboard]" in line]
    assert notes == [f"kvdoctor stress: note: {FIGURE_NEEDS_EXTRA}"]
    assert "report:" in captured.out
