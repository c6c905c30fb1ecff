"""Headless Chromium for the dashboard's browser tests (Playwright driving Debian's chromium).

Never ``playwright install``: the browser is the system one (Debian's chromium, installed by
``bash scripts/install-test-deps.sh --only chromium``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--headless=new",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
VIEWPORT = {"width": 1400, "height": 1000}
# Set to a folder (e.g. docs/img) to keep the pages' screenshots; otherwise they go to tmp.
SCREENSHOT_DIR_ENV = "KVDOCTOR_SCREENSHOT_DIR"


@contextmanager
def chromium_browser(executable: str) -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


class Page:
    """A page plus every console error and uncaught exception it produced."""

    def __init__(self, browser, base_url: str):
        self.base_url = base_url.rstrip("/")
        self.context = browser.new_context(viewport=VIEWPORT)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.opened = time.monotonic()
        self.page.on("console", lambda m: self.errors.append(f"console: {m.text}") if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))

    def goto(self, path: str = "/"):
        self.opened = time.monotonic()
        self.page.goto(self.base_url + path, wait_until="domcontentloaded")
        return self.page

    def close(self):
        self.context.close()

    def chart_points(self) -> list[list[int]]:
        """Points per trace of each Plotly chart on the page, as the browser holds them."""
        return self.page.evaluate(
            "() => Array.from(document.querySelectorAll('.js-plotly-plot'))"
            ".map(g => (g.data || []).map(d => (d.x || []).filter(v => v !== null).length))"
        )

    @staticmethod
    def keeping_screenshots() -> bool:
        """True when the screenshots go to a folder that keeps them (refreshing docs/img)."""
        return bool(os.environ.get(SCREENSHOT_DIR_ENV))

    def screenshot(self, name: str, fallback_dir: Path) -> Path:
        folder = Path(os.environ.get(SCREENSHOT_DIR_ENV) or fallback_dir)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path
