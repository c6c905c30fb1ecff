"""Regenerates the README's generated tables (the CLI's shared flags and old spellings, exporter
settings, collectors, metrics) in place.

.venv/bin/python scripts/update_readme.py
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from kvdoctor import cli, flags
from kvdoctor.exporter import settings
from kvdoctor.exporter.collectors import base as collectors
from kvdoctor.rules import signals

README = Path(__file__).resolve().parents[1] / "README.md"


def generated_blocks() -> dict[str, str]:
    parser = cli.build_parser()
    return {
        "cli-shared-flags": flags.shared_table(parser),
        "cli-deprecated": flags.deprecated_table(parser),
        "exporter-settings": settings.markdown_table(),
        "metrics": signals.markdown_table(),
        "collectors": collectors.markdown_table(),
    }


def render(text: str) -> str:
    for name, body in generated_blocks().items():
        pattern = re.compile(rf"(<!-- {name}:begin[^>]*-->\n).*?(<!-- {name}:end -->)", re.S)
        if not pattern.search(text):
            raise SystemExit(f"update_readme: README.md lacks the <!-- {name}:begin --> marker")
        text = pattern.sub(lambda m, body=body: m.group(1) + body + "\n" + m.group(2), text)
    return text


if __name__ == "__main__":
    README.write_text(render(README.read_text()))
    sys.exit(0)
