"""A real exporter in this process scraping an engine URL (usually a FakeServer playing the engine).

``ExporterRig`` puts together the real engine collector, runtime and HTTP app on a free port;
cycles run when the test says (``cycle()``), or on the collection thread (``start=True``). It reads
its own ``/metrics`` page back as {(name, frozenset(labels)): value}.
"""

from __future__ import annotations

import os
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kvdoctor.exporter.app import create_app
from kvdoctor.exporter.collectors.engine import EngineCollector
from kvdoctor.exporter.live_diagnosis import default_diagnose_hook
from kvdoctor.exporter.runtime import Exporter
from kvdoctor.exporter.server import serve_in_thread
from kvdoctor.exporter.settings import ExporterSettings
from kvdoctor.signals import vocabulary as S
from tests.support.tools import wait_until

Page = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse_page(text: str) -> Page:
    """An exposition page as {(sample name, frozenset of its labels): value}."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


class ExporterRig:
    """The real engine collector, runtime and HTTP app, scraping ``engine_url`` every ``interval``
    with ``scrape_timeout``; ``diagnose``: with the rules' diagnosis; ``settings``: more
    ExporterSettings (e.g. ``max_body_bytes``)."""

    def __init__(
        self,
        engine_url: str,
        *,
        scrape_timeout: float,
        interval: float = 0.2,
        start: bool = False,
        diagnose: bool = False,
        **settings: Any,
    ):
        os.environ.pop("KVDOCTOR_POD", None)
        self.settings = ExporterSettings(
            engine_url=engine_url, interval=interval, scrape_timeout=scrape_timeout, nvml=False, **settings
        )
        self.collector = EngineCollector(
            self.settings.engine_url, "auto", timeout=scrape_timeout, max_body_bytes=self.settings.max_body_bytes
        )
        hook = default_diagnose_hook(self.settings) if diagnose else None
        self.exporter = Exporter(self.settings, [self.collector], diagnose_hook=hook)
        if start:
            self.exporter.start()
        self.http = serve_in_thread(create_app(self.exporter), "127.0.0.1", 0)
        self.client = httpx.Client(timeout=5)

    def cycle(self) -> None:
        self.exporter.run_cycle()

    def get(self, path: str) -> httpx.Response:
        return self.client.get(f"{self.http.url}{path}")

    def page(self) -> Page:
        resp = self.get("/metrics")
        assert resp.status_code == 200
        return parse_page(resp.text)

    def up(self) -> float | None:
        return self.page().get((S.SOURCE_UP, frozenset({("source", "engine")})))

    def errors(self, reason: str, source: str = "engine") -> float:
        return self.page().get((S.SOURCE_ERRORS, frozenset({("source", source), ("reason", reason)})), 0.0)

    def wait_up(self, value: float, timeout: float = 15.0) -> None:
        """Until the page says ``kvdoctor_source_up{source="engine"} == value`` (the thread must run)."""
        wait_until(
            lambda: self.up() == value, timeout=timeout, interval=0.05, what=f"source_up{{source=engine}} == {value}"
        )

    def close(self) -> None:
        self.client.close()
        self.http.stop()
        self.exporter.stop()
