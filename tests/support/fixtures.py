"""The shared pytest fixtures and the ``needs_tools`` hook (a plugin: tests/conftest.py loads it).

Every fixture that starts something stops it after the test, whatever happened:

- ``free_port``: a TCP port on 127.0.0.1 that was free a moment ago.
- ``clean_env``: no KVDOCTOR_* variable from the caller's environment (``pytest.mark.usefixtures("clean_env")``).
- ``run_cli("diagnose", ..., timeout=, env=, clean_env=, input=, cwd=)``: ``python -m kvdoctor`` run to
  its end, as (rc, stdout, stderr).
- ``spawn(process)``: starts a ``Process`` (tests/support/processes.py), e.g.
  ``spawn(kvdoctor("exporter", "--port", "0"))``.
- ``fake_server(routes_or_behaviour, tls=...)``: a ``FakeServer`` (tests/support/servers.py).
- ``prometheus_server(targets=..., rule_files=...)``: a real Prometheus (tests/support/prometheus.py);
  the test must be marked ``needs_tools("prometheus")``.
- ``demo(scenario, in_process=False, dashboard=False, ...)``: the demo with its URLs (tests/support/demo.py).
- ``browser`` (one per module) and ``open_page(base_url)``: headless Chromium (tests/support/browser.py);
  the test must be marked ``needs_tools("chromium")``.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support import tools
from tests.support.browser import Page, chromium_browser
from tests.support.demo import Demo, DemoProcess, InProcessDemo
from tests.support.processes import Completed, Process, run_kvdoctor
from tests.support.prometheus import PrometheusServer
from tests.support.servers import Behaviour, FakeServer


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    tools.current_test = item  # tools.require checks the test's marker
    try:
        yield
    finally:
        tools.current_test = None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before the fixtures: every tool the test's ``needs_tools`` markers name, or skip (or fail)."""
    for marker in item.iter_markers(tools.MARKER):
        for tool in marker.args:
            tools.require(tool)


@pytest.fixture
def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for more than one: tools.free_port())."""
    return tools.free_port()


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No KVDOCTOR_* variable from the caller's environment (CI sets some): the settings' defaults apply."""
    for key in list(os.environ):
        if key.startswith("KVDOCTOR_"):
            monkeypatch.delenv(key)


@pytest.fixture
def run_cli() -> Callable[..., Completed]:
    """run_cli("diagnose", "--window", path, timeout=60, env={...}, input="...") runs
    ``python -m kvdoctor ...`` in a subprocess and returns (rc, stdout, stderr)."""
    return run_kvdoctor


@pytest.fixture
def spawn() -> Iterator[Callable[[Process], Process]]:
    """spawn(process) starts it; every process spawned is stopped after the test."""
    started: list[Process] = []

    def start(process: Process) -> Process:
        started.append(process)
        return process.start()

    yield start
    for process in reversed(started):
        process.stop()


@pytest.fixture
def fake_server() -> Iterator[Callable[..., FakeServer]]:
    """fake_server({"/metrics": respond(page)}) or fake_server(behaviour), stopped after the test."""
    started: list[FakeServer] = []

    def start(
        routes: dict[str, Behaviour] | Behaviour | None = None, *, port: int = 0, tls: ssl.SSLContext | None = None
    ) -> FakeServer:
        started.append(FakeServer(routes, port=port, tls=tls))
        return started[-1]

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def prometheus_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., PrometheusServer]]:
    """Factory: starts a real prometheus on loopback and stops it after the test.

        prom = prometheus_server(targets=[f"127.0.0.1:{port}"], rule_files={"kv.yml": text})
        prom.wait_for_targets_up()
        prom.wait_for_value("kvdoctor_kv_cache_usage_ratio", lambda v: v > 0.5)

    The arguments are those of ``PrometheusServer.configured``: ``config`` (a dict or YAML text)
    replaces the default one (a job "kvdoctor" scraping ``targets`` every ``scrape_interval``);
    ``rule_files``, ``tsdb_blocks`` (copied into the TSDB folder before start) and ``extra_args``
    (e.g. a longer ``--storage.tsdb.retention.time`` for old backfilled samples)."""
    started: list[PrometheusServer] = []

    def start(config: Any = None, **options: Any) -> PrometheusServer:
        binary = tools.require("prometheus")
        server = PrometheusServer.configured(binary, tmp_path_factory.mktemp("prometheus"), config, **options)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def demo() -> Iterator[Callable[..., Demo]]:
    """demo("kv_thrashing", dashboard=True) runs ``kvdoctor demo`` (free ports, no dashboard unless
    asked); demo(..., in_process=True) the same pipeline in this process. Stopped after the test."""
    started: list[Demo] = []

    def start(scenario: str = "healthy", *, in_process: bool = False, **options: Any) -> Demo:
        made: Demo = InProcessDemo(scenario, **options) if in_process else DemoProcess(scenario, **options)
        started.append(made)
        return made.start()

    yield start
    for made in reversed(started):
        made.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium, one for the test module."""
    with chromium_browser(tools.require("chromium")) as launched:
        yield launched


@pytest.fixture
def open_page(browser: Any) -> Iterator[Callable[[str], Page]]:
    """open_page(base_url) opens a Page in the module's browser; every page is closed after the test."""
    opened: list[Page] = []

    def open_one(base_url: str) -> Page:
        opened.append(Page(browser, base_url))
        return opened[-1]

    yield open_one
    for page in opened:
        page.close()
