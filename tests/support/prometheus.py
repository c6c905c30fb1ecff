"""A real Prometheus server on loopback, with its own config, rule files and TSDB folder, and its HTTP API.

    prom = PrometheusServer.configured(binary, workdir, targets=["127.0.0.1:9745"], rule_files={"kv.yml": text})
    prom.start().wait_for_targets_up()
    prom.wait_for_value("kvdoctor_kv_cache_usage_ratio", lambda v: v > 0.5)
    prom.stop()

The ``prometheus_server`` fixture (tests/support/fixtures.py) does the same and stops it after the test.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.support.processes import OnLoopback, Process, RunsProcess, http_ok, start_on_free_port
from tests.support.tools import wait_until

READY_TIMEOUT = 60.0
# The first scraped sample reaches the query API ~6 s after start, even at a 1 s interval.
POLL_TIMEOUT = 20.0


class PrometheusError(RuntimeError):
    """The Prometheus server answered a query with an error."""


def as_yaml(content: str | Mapping[str, Any] | list[Any]) -> str:
    return content if isinstance(content, str) else yaml.safe_dump(content, sort_keys=False)


def scrape_config(
    targets: Iterable[str] = (),
    scrape_interval: str = "1s",
    evaluation_interval: str = "1s",
    metrics_path: str = "/metrics",
) -> dict[str, Any]:
    """A config with one job "kvdoctor" scraping ``targets`` every ``scrape_interval``."""
    return {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": evaluation_interval},
        "scrape_configs": [
            {"job_name": "kvdoctor", "metrics_path": metrics_path, "static_configs": [{"targets": list(targets)}]}
        ],
    }


class Polling:
    """``wait_for`` over a ``query(expr)`` that returns an instant query's result vector."""

    def query(self, expr: str) -> list[dict[str, Any]]:
        raise NotImplementedError

    def wait_for(
        self,
        expr: str,
        predicate: Callable[[list[dict[str, Any]]], bool] = bool,
        timeout: float | None = None,
    ) -> list[dict[str, Any]]:
        """Polls ``expr`` until ``predicate(result)`` (default: non-empty) and returns the result."""

        def probe() -> list[dict[str, Any]] | None:
            result = self.query(expr)
            return result if predicate(result) else None

        return wait_until(
            probe, timeout=timeout or POLL_TIMEOUT, interval=0.5, what=f"{type(self).__name__} query {expr!r} matching"
        )


class PrometheusServer(OnLoopback, RunsProcess, Polling):
    """A real prometheus process on 127.0.0.1 (a free port) with its files in ``workdir``."""

    def __init__(
        self,
        binary: str,
        workdir: Path,
        config_path: Path,
        extra_args: Iterable[str] = (),
        data_dir: Path | None = None,
    ):
        self.binary = binary
        self.workdir = workdir
        self.config_path = config_path
        self.extra_args = list(extra_args)
        self.data_dir = data_dir or workdir / "data"
        self.log_path = workdir / "prometheus.log"
        self.process: Process | None = None
        self.port = 0

    @classmethod
    def configured(
        cls,
        binary: str,
        workdir: Path,
        config: str | Mapping[str, Any] | None = None,
        *,
        targets: Iterable[str] = (),
        rule_files: Mapping[str, str | Mapping[str, Any]] | Iterable[str | os.PathLike[str]] = (),
        scrape_interval: str = "1s",
        evaluation_interval: str = "1s",
        metrics_path: str = "/metrics",
        tsdb_blocks: str | os.PathLike[str] | None = None,
        extra_args: Iterable[str] = (),
    ) -> PrometheusServer:
        """Writes the config (``config``, a dict or YAML text, else one job scraping ``targets``) and the
        ``rule_files`` (name -> YAML text/dict, or paths to copy) into ``workdir``; ``tsdb_blocks`` (a
        folder of blocks, e.g. from ``promtool tsdb create-blocks-from openmetrics``) is copied into the
        TSDB folder. Not started yet."""
        workdir.mkdir(parents=True, exist_ok=True)
        if config is None:
            cfg = scrape_config(targets, scrape_interval, evaluation_interval, metrics_path)
        else:
            cfg = dict(yaml.safe_load(config) if isinstance(config, str) else config)
        rules_dir = workdir / "rules"
        rules_dir.mkdir(exist_ok=True)
        written = []
        items = rule_files.items() if isinstance(rule_files, Mapping) else [(None, p) for p in rule_files]
        for name, content in items:
            if name is None:
                dest = rules_dir / Path(content).name
                shutil.copyfile(content, dest)
            else:
                dest = rules_dir / name
                dest.write_text(as_yaml(content))
            written.append(str(dest))
        if written:
            cfg["rule_files"] = list(cfg.get("rule_files") or []) + written
        config_path = workdir / "prometheus.yml"
        config_path.write_text(as_yaml(cfg))
        server = cls(binary, workdir, config_path, extra_args)
        if tsdb_blocks is not None:
            shutil.copytree(tsdb_blocks, server.data_dir, dirs_exist_ok=True)
        return server

    # -- lifecycle
    def start(self) -> PrometheusServer:
        return start_on_free_port(self._launch)

    def _launch(self, port: int) -> PrometheusServer:
        self.port = port
        self.process = Process(
            [
                self.binary,
                f"--config.file={self.config_path}",
                f"--storage.tsdb.path={self.data_dir}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--web.enable-lifecycle",
                *self.extra_args,
            ],
            log=self.log_path,
            name="prometheus",
        ).start()
        self.process.wait_for(http_ok(f"{self.url}/-/ready"), timeout=READY_TIMEOUT, interval=0.1, what="ready")
        return self

    # -- HTTP API
    def api(self, path: str, **params: Any) -> Any:
        """GET /api/v1/<path>; returns the ``data`` field, raises PrometheusError on an API error."""
        resp = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=10)
        body = resp.json()
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query; the result vector (list of {"metric": {...}, "value": [ts, "v"]})."""
        result: list[dict[str, Any]] = self.api("query", query=expr)["result"]
        return result

    def query_values(self, expr: str) -> list[float]:
        return [float(r["value"][1]) for r in self.query(expr)]

    def wait_for_value(self, expr: str, predicate: Callable[[float], bool], timeout: float | None = None) -> float:
        """Polls until some series of ``expr`` has a value satisfying ``predicate``; returns it."""

        def matching(result: list[dict[str, Any]]) -> bool:
            return any(predicate(float(r["value"][1])) for r in result)

        result = self.wait_for(expr, matching, timeout)
        return next(float(r["value"][1]) for r in result if predicate(float(r["value"][1])))

    def targets(self) -> list[dict[str, Any]]:
        targets: list[dict[str, Any]] = self.api("targets")["activeTargets"]
        return targets

    def wait_for_targets_up(self, timeout: float | None = None) -> list[dict[str, Any]]:
        """Waits until every configured scrape target has been scraped successfully."""

        def probe() -> list[dict[str, Any]] | None:
            active = self.targets()
            return active if active and all(t["health"] == "up" for t in active) else None

        try:
            return wait_until(probe, timeout=timeout or POLL_TIMEOUT, interval=0.5, what="all prometheus targets up")
        except TimeoutError as exc:
            detail = [(t["scrapeUrl"], t["health"], t.get("lastError")) for t in self.targets()]
            raise TimeoutError(f"{exc}: {detail}") from None

    def alerts(self) -> list[dict[str, Any]]:
        alerts: list[dict[str, Any]] = self.api("alerts")["alerts"]
        return alerts

    def wait_for_alert(self, name: str, state: str = "firing", timeout: float | None = None) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            return next(
                (a for a in self.alerts() if a["labels"].get("alertname") == name and a["state"] == state), None
            )

        return wait_until(probe, timeout=timeout or POLL_TIMEOUT, interval=0.5, what=f"alert {name} {state}")

    def rule_groups(self) -> list[dict[str, Any]]:
        groups: list[dict[str, Any]] = self.api("rules")["groups"]
        return groups
