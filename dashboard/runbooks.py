"""The alerts' runbooks, served by the dashboard at ``/runbooks/<Alert>`` (and ``<Alert>.md``), so an
alert's runbook_url is absolute and opens wherever the dashboard is reachable.

The pages are docs/runbooks/*.md of the repository (``KVDOCTOR_RUNBOOKS_DIR`` elsewhere), rendered
to HTML with markdown-it where it is installed, else shown as text. Only names of files in that
folder are served: ``/runbooks/<anything else>`` is a 404.
"""

from __future__ import annotations

import html
import os
import re
from pathlib import Path

from flask import Flask, Response, abort

ENV = "KVDOCTOR_RUNBOOKS_DIR"
ROUTE = "/runbooks/<name>"
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9]*$")


def runbooks_dir() -> Path:
    given = os.environ.get(ENV)
    if given:
        return Path(given)
    return Path(__file__).resolve().parents[1] / "docs" / "runbooks"


def available(folder: Path | None = None) -> dict[str, Path]:
    """Alert name -> its runbook file."""
    root = folder or runbooks_dir()
    if not root.is_dir():
        return {}
    return {p.stem: p for p in sorted(root.glob("*.md")) if _NAME.match(p.stem) and p.stem != "README"}


def to_html(markdown_text: str, title: str) -> str:
    try:
        from markdown_it import MarkdownIt  # noqa: PLC0415 (optional: text without it)

        body = MarkdownIt("commonmark").enable("table").render(markdown_text)
    except ImportError:
        body = f"<pre>{html.escape(markdown_text)}</pre>"
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>kvdoctor runbook: {html.escape(title)}</title>"
        "<style>body{font-family:sans-serif;max-width:50em;margin:2em auto;line-height:1.5}"
        "code,pre{background:#f4f4f4}</style></head>"
        f"<body>{body}</body></html>"
    )


def serve(name: str) -> Response:
    name = name.removesuffix(".md")
    path = available().get(name) if _NAME.match(name) else None
    if path is None:
        abort(404)
    return Response(to_html(path.read_text(encoding="utf-8"), name), mimetype="text/html")


def install(server: Flask) -> None:
    """Serve the runbooks on ``server`` (behind the dashboard's auth, like every route)."""
    server.add_url_rule(ROUTE, "runbook", serve)
