"""Shared fixtures: free ports, a real Prometheus server on loopback, and running the CLI.

Tools come from tests/tools.py (installed by scripts/install-test-deps.sh); a test that needs a
missing one is skipped with a reason naming it and the install command.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest
import yaml

# Let tests import `tests.tools` and `tests.e2e.*` whichever way pytest was started. Appended, not
# prepended: the product folders (rules/, exporter/, dashboard/) must not shadow anything as
# top-level packages; the code is imported as the installed `kvdoctor.*`.
_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.append(_ROOT)

from tests import tools  # noqa: E402
from tests.tools import free_port as _free_port  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "requires(*tools): skip unless each named tool of tests/tools.py TOOLS is installed"
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    for marker in item.iter_markers("requires"):
        for tool in marker.args:
            tools.require(tool)


@pytest.fixture
def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for more than one: tests.tools.free_port())."""
    return _free_port()


# --------------------------------------------------------------------------------------------- CLI


class CliResult(NamedTuple):
    rc: int
    stdout: str
    stderr: str


@pytest.fixture
def run_cli() -> Callable[..., CliResult]:
    """run_cli("diagnose", "--window", path, timeout=60, env={...}, input="...") runs
    ``python -m kvdoctor ...`` in a subprocess and returns (rc, stdout, stderr)."""

    def run(
        *args: Any,
        timeout: float = 60,
        env: Mapping[str, str] | None = None,
        input: str | None = None,
        cwd: str | os.PathLike | None = None,
    ) -> CliResult:
        full_env = {**os.environ, **(env or {})}
        proc = subprocess.run(
            [sys.executable, "-m", "kvdoctor", *map(str, args)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=full_env,
            input=input,
            cwd=cwd,
            stdin=None if input is not None else subprocess.DEVNULL,
        )
        return CliResult(proc.returncode, proc.stdout, proc.stderr)

    return run


# -------------------------------------------------------------------------------------- Prometheus


class PrometheusError(RuntimeError):
    """The Prometheus server could not be started or answered a query with an error."""


class PrometheusServer:
    """A real prometheus process on 127.0.0.1 with its own config, rule files and TSDB folder."""

    READY_TIMEOUT = 20.0
    # The first scraped sample reaches the query API ~6 s after start, even at a 1 s interval.
    POLL_TIMEOUT = 20.0

    def __init__(
        self,
        binary: str,
        workdir: Path,
        config_path: Path,
        extra_args: Iterable[str] = (),
        tsdb_blocks: Path | None = None,
    ):
        self.binary = binary
        self.extra_args = list(extra_args)
        self.tsdb_blocks = tsdb_blocks
        self.workdir = workdir
        self.config_path = config_path
        self.log_path = workdir / "prometheus.log"
        self.process: subprocess.Popen | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- lifecycle
    def start(self, attempts: int = 3) -> PrometheusServer:
        for _ in range(attempts):
            self.port = _free_port()
            data = self.workdir / f"data-{self.port}"
            if self.tsdb_blocks is not None:
                shutil.copytree(self.tsdb_blocks, data, dirs_exist_ok=True)
            with open(self.log_path, "ab") as log:
                self.process = subprocess.Popen(
                    [
                        self.binary,
                        f"--config.file={self.config_path}",
                        f"--storage.tsdb.path={data}",
                        f"--web.listen-address=127.0.0.1:{self.port}",
                        "--web.enable-lifecycle",
                        *self.extra_args,
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            try:
                tools.wait_until(self._ready, timeout=self.READY_TIMEOUT, interval=0.1, what="prometheus /-/ready")
                return self
            except (TimeoutError, PrometheusError):
                port_taken = "address already in use" in self.log_tail()
                self.stop()
                if not port_taken:
                    raise PrometheusError(f"prometheus did not become ready:\n{self.log_tail()}") from None
        raise PrometheusError(f"prometheus could not bind a free port in {attempts} attempts:\n{self.log_tail()}")

    def _ready(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise PrometheusError(f"prometheus exited with {self.process.returncode}")
        try:
            return httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # -- HTTP API
    def api(self, path: str, **params: Any) -> Any:
        """GET /api/v1/<path>; returns the ``data`` field, raises PrometheusError on an API error."""
        resp = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=10)
        body = resp.json()
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        """Instant query; the result vector (list of {"metric": {...}, "value": [ts, "v"]})."""
        return self.api("query", query=expr)["result"]

    def query_values(self, expr: str) -> list[float]:
        return [float(r["value"][1]) for r in self.query(expr)]

    def wait_for(
        self, expr: str, predicate: Callable[[list[dict]], bool] = bool, timeout: float | None = None
    ) -> list[dict]:
        """Polls ``expr`` until ``predicate(result)`` (default: non-empty) and returns the result."""

        def probe():
            result = self.query(expr)
            return result if predicate(result) else None

        return tools.wait_until(
            probe, timeout=timeout or self.POLL_TIMEOUT, interval=0.5, what=f"prometheus query {expr!r} matching"
        )

    def wait_for_value(self, expr: str, predicate: Callable[[float], bool], timeout: float | None = None) -> float:
        """Polls until some series of ``expr`` has a value satisfying ``predicate``; returns it."""

        def matching(result: list[dict]) -> bool:
            return any(predicate(float(r["value"][1])) for r in result)

        result = self.wait_for(expr, matching, timeout)
        return next(float(r["value"][1]) for r in result if predicate(float(r["value"][1])))

    def targets(self) -> list[dict]:
        return self.api("targets")["activeTargets"]

    def wait_for_targets_up(self, timeout: float | None = None) -> list[dict]:
        """Waits until every configured scrape target has been scraped successfully."""

        def probe():
            active = self.targets()
            return active if active and all(t["health"] == "up" for t in active) else None

        try:
            return tools.wait_until(
                probe, timeout=timeout or self.POLL_TIMEOUT, interval=0.5, what="all prometheus targets up"
            )
        except TimeoutError as exc:
            detail = [(t["scrapeUrl"], t["health"], t.get("lastError")) for t in self.targets()]
            raise TimeoutError(f"{exc}: {detail}") from None

    def alerts(self) -> list[dict]:
        return self.api("alerts")["alerts"]

    def wait_for_alert(self, name: str, state: str = "firing", timeout: float | None = None) -> dict:
        def probe():
            return next(
                (a for a in self.alerts() if a["labels"].get("alertname") == name and a["state"] == state), None
            )

        return tools.wait_until(probe, timeout=timeout or self.POLL_TIMEOUT, interval=0.5, what=f"alert {name} {state}")

    def rule_groups(self) -> list[dict]:
        return self.api("rules")["groups"]


def _as_yaml(content: str | Mapping | list) -> str:
    return content if isinstance(content, str) else yaml.safe_dump(content, sort_keys=False)


@pytest.fixture
def prometheus_server(tmp_path_factory: pytest.TempPathFactory) -> Iterable[Callable[..., PrometheusServer]]:
    """Factory: starts a real prometheus on loopback and stops it after the test.

        prom = prometheus_server(targets=[f"127.0.0.1:{port}"], rule_files={"kv.yml": text})
        prom.wait_for_targets_up()
        prom.wait_for_value("kvdoctor_kv_cache_usage_ratio", lambda v: v > 0.5)

    ``config`` (a dict or YAML text) replaces the default one (a job "kvdoctor" scraping
    ``targets`` every ``scrape_interval``); ``rule_files`` (name -> YAML text/dict, or paths to
    copy) are written next to it and added to its ``rule_files``. ``tsdb_blocks`` (a folder of
    blocks, e.g. from ``promtool tsdb create-blocks-from openmetrics``) is copied into the TSDB
    folder before start; ``extra_args`` go to prometheus as they are (e.g. a longer
    ``--storage.tsdb.retention.time`` for old backfilled samples). Skips when prometheus is missing.
    """
    tools.require("prometheus")
    started: list[PrometheusServer] = []

    def start(
        config: str | Mapping | None = None,
        *,
        targets: Iterable[str] = (),
        rule_files: Mapping[str, str | Mapping] | Iterable[str | os.PathLike] = (),
        scrape_interval: str = "1s",
        evaluation_interval: str = "1s",
        metrics_path: str = "/metrics",
        tsdb_blocks: str | os.PathLike | None = None,
        extra_args: Iterable[str] = (),
    ) -> PrometheusServer:
        workdir = tmp_path_factory.mktemp("prometheus")
        if config is None:
            cfg: dict = {
                "global": {"scrape_interval": scrape_interval, "evaluation_interval": evaluation_interval},
                "scrape_configs": [
                    {
                        "job_name": "kvdoctor",
                        "metrics_path": metrics_path,
                        "static_configs": [{"targets": list(targets)}],
                    }
                ],
            }
        else:
            cfg = dict(yaml.safe_load(config) if isinstance(config, str) else config)
        rules_dir = workdir / "rules"
        rules_dir.mkdir()
        written = []
        items = rule_files.items() if isinstance(rule_files, Mapping) else [(None, p) for p in rule_files]
        for name, content in items:
            if name is None:
                dest = rules_dir / Path(content).name
                shutil.copyfile(content, dest)
            else:
                dest = rules_dir / name
                dest.write_text(_as_yaml(content))
            written.append(str(dest))
        if written:
            cfg["rule_files"] = list(cfg.get("rule_files") or []) + written
        config_path = workdir / "prometheus.yml"
        config_path.write_text(_as_yaml(cfg))
        server = PrometheusServer(
            tools.require("prometheus"),
            workdir,
            config_path,
            extra_args,
            Path(tsdb_blocks) if tsdb_blocks is not None else None,
        )
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()
