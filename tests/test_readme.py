"""The README's generated tables match their one source of truth; its commands exist."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _update_readme():
    spec = importlib.util.spec_from_file_location("update_readme", ROOT / "scripts/update_readme.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_tables_are_current():
    text = (ROOT / "README.md").read_text()
    assert _update_readme().render(text) == text, "run: .venv/bin/python scripts/update_readme.py"


def test_every_command_in_the_readme_table_exists():
    from kvdoctor.cli import build_parser

    text = (ROOT / "README.md").read_text()
    choices = build_parser()._subparsers._group_actions[0].choices
    for line in text.splitlines():
        if line.startswith("| `kvdoctor "):
            command = line.split("`")[1].split()[1]
            assert command in choices, command


def test_ci_runs_the_readme_test_command():
    assert "make test" in (ROOT / "README.md").read_text()
    assert (ROOT / ".ci/run").read_text().strip().endswith("make test")  # the README command, nothing else
