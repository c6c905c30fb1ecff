"""Builds the installed ``kvdoctor`` package's shape out of the repository's folders, as symlinks.

pyproject.toml maps the top-level folders onto one package (``rules/`` -> ``kvdoctor.rules``, ...).
An editable install resolves that mapping with an import hook, which static tools cannot follow:
import-linter and mypy look for ``kvdoctor.rules`` under ``kvdoctor/``. This writes
``.cache/package-view/kvdoctor/...`` (a symlink per source file, so it never goes stale within a
run) and prints the folder to put on their path.

    .venv/bin/python scripts/package_view.py   # -> .cache/package-view
"""

from __future__ import annotations

import shutil
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VIEW = ROOT / ".cache" / "package-view"


def build(view: Path = VIEW) -> Path:
    mapping: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    if view.exists():
        shutil.rmtree(view)
    for package, folder in sorted(mapping.items()):
        target = view.joinpath(*package.split("."))
        for source in (ROOT / folder).rglob("*"):
            if "__pycache__" in source.parts or source.is_dir() or source.suffix not in (".py", ".pyi", ".typed"):
                continue
            relative = source.relative_to(ROOT / folder)
            if package == "kvdoctor" and relative.parts[0] != "commands" and len(relative.parts) > 1:
                continue
            link = target / relative
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.exists():
                link.symlink_to(source)
    return view


if __name__ == "__main__":
    print(build())
    sys.exit(0)
