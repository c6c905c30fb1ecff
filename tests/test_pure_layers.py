"""signals/, ledger/ and rules/ take values and return values: no file, cache, environment or YAML
reading (the I/O is ``sources/``'s). import-linter forbids their I/O modules (os, pathlib, io, ...;
pyproject.toml); this catches what an import does not show: the builtin ``open``, a ``Path``
handed in and read, a YAML document parsed."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PURE_FOLDERS = ("signals", "ledger", "rules")
READING_METHODS = {"read_text", "read_bytes", "write_text", "write_bytes", "open", "iterdir", "glob", "rglob", "exists"}
READING_CALLS = {"open", "getenv", "safe_load", "load_all", "safe_load_all", "full_load"}


def reads(source: str) -> list[str]:
    """Each place in ``source`` that reads or writes outside the process, as ``line: call``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in READING_CALLS:
                found.append(f"{node.lineno}: {func.id}()")
            elif isinstance(func, ast.Attribute) and func.attr in READING_METHODS | READING_CALLS:
                found.append(f"{node.lineno}: .{func.attr}()")
        elif isinstance(node, ast.Attribute) and node.attr == "environ":
            found.append(f"{node.lineno}: .environ")
    return found


@pytest.mark.parametrize(
    "snippet",
    [
        "open('f').read()",
        "path.read_text()",
        "with p.open('rb') as f: pass",
        "os.environ['HF_HOME']",
        "yaml.safe_load(text)",
        "getenv('X')",
    ],
)
def test_the_check_sees_each_kind_of_reading(snippet):
    assert reads(snippet)


@pytest.mark.parametrize("folder", PURE_FOLDERS)
def test_the_pure_layers_read_nothing(folder):
    found = {
        str(path.relative_to(ROOT)): hits
        for path in sorted((ROOT / folder).rglob("*.py"))
        if (hits := reads(path.read_text()))
    }
    assert found == {}, f"{folder}/ reads outside the process; move it to sources/: {found}"
