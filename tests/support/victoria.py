"""VictoriaMetrics on loopback: a single node, vmagent scraping into it, vmalert evaluating rule files
against it and writing the recorded series back (remote write), as a deployment past one Prometheus runs.

    stack = VictoriaStack(workdir, targets=["127.0.0.1:9745"], rule_files=[Path("rules/alerts.yaml")],
                          scrape_interval="1s", evaluation_interval="1s").start()
    stack.wait_for("kvdoctor:kv_usage:15s")        # the recorded series, written back by vmalert
    stack.url                                     # the query API: /api/v1/query, /api/v1/query_range
    stack.stop()

All three are the binaries of Debian's ``victoria-metrics`` package (1.79), unpacked into
.tools/victoria-metrics by ``scripts/install-test-deps.sh --only victoria-metrics``. vmalert sends
its alerts to a fake Alertmanager on loopback (1.79 has no notifier black hole); they are also on
vmalert's own ``/api/v1/alerts``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import httpx

from tests.support.processes import OnLoopback, Process, RunsProcess, http_ok, start_on_free_port
from tests.support.prometheus import Polling, PrometheusError, as_yaml
from tests.support.servers import FakeServer, respond
from tests.support.tools import vmagent, vmalert

READY_TIMEOUT = 30.0


class _Server(OnLoopback, RunsProcess):
    """One VictoriaMetrics binary on 127.0.0.1 (a free port), its files in ``workdir``."""

    name = ""

    def __init__(self, binary: str, workdir: Path):
        self.binary = binary
        self.workdir = workdir
        self.port = 0
        self.process: Process | None = None
        workdir.mkdir(parents=True, exist_ok=True)

    def arguments(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> Any:
        return start_on_free_port(self._launch)

    def _launch(self, port: int) -> Any:
        self.port = port
        argv = [self.binary, f"-httpListenAddr=127.0.0.1:{port}", "-loggerLevel=WARN", *self.arguments()]
        self.process = Process(argv, log=self.workdir / f"{self.name}.log", name=self.name).start()
        self.process.wait_for(http_ok(f"{self.url}/health"), timeout=READY_TIMEOUT, interval=0.1, what="healthy")
        return self


class VictoriaMetrics(_Server):
    """The single-node database: its Prometheus query API at ``url`` + ``/api/v1/...``.

    ``latency_offset``: its ``-search.latencyOffset``, how far behind now an instant query reads
    (default 30 s there). vmalert reads the series its own rules recorded back through this API, so
    each level of rules reading records lags one offset behind the one before: 1 s here, so the
    tests do not wait minutes for the verdict."""

    name = "victoria-metrics"

    def __init__(self, binary: str, workdir: Path, latency_offset: str = "1s"):
        super().__init__(binary, workdir)
        self.latency_offset = latency_offset

    def arguments(self) -> list[str]:
        return [
            f"-storageDataPath={self.workdir / 'data'}",
            "-retentionPeriod=1d",
            "-search.disableCache",
            f"-search.latencyOffset={self.latency_offset}",
        ]

    @property
    def write_url(self) -> str:
        return f"{self.url}/api/v1/write"


class VmAgent(_Server):
    """vmagent scraping ``targets`` every ``scrape_interval`` into ``remote_write``."""

    name = "vmagent"

    def __init__(self, binary: str, workdir: Path, remote_write: str, config: dict[str, Any]):
        super().__init__(binary, workdir)
        self.remote_write = remote_write
        self.config_path = workdir / "scrape.yml"
        self.config_path.write_text(as_yaml(config))

    def arguments(self) -> list[str]:
        return [
            f"-promscrape.config={self.config_path}",
            f"-remoteWrite.url={self.remote_write}",
            f"-remoteWrite.tmpDataPath={self.workdir / 'queue'}",
            "-remoteWrite.flushInterval=200ms",
        ]


class VmAlert(_Server):
    """vmalert evaluating ``rule_files`` against ``datasource`` every ``evaluation_interval``, its
    recorded series and alert states written to ``remote_write``, its alerts sent to ``notifier``."""

    name = "vmalert"

    def __init__(
        self,
        binary: str,
        workdir: Path,
        datasource: str,
        remote_write: str,
        notifier: str,
        rule_files: Sequence[Path],
        evaluation_interval: str,
    ):
        super().__init__(binary, workdir)
        self.datasource, self.remote_write, self.notifier = datasource, remote_write, notifier
        self.rule_files = list(rule_files)
        self.evaluation_interval = evaluation_interval

    def arguments(self) -> list[str]:
        return [
            f"-datasource.url={self.datasource}",
            f"-remoteWrite.url={self.remote_write}",
            "-remoteWrite.flushInterval=200ms",
            f"-notifier.url={self.notifier}",
            f"-evaluationInterval={self.evaluation_interval}",
            *(f"-rule={path}" for path in self.rule_files),
        ]

    def alerts(self) -> list[dict[str, Any]]:
        """vmalert's alerts (its Prometheus-compatible ``/api/v1/alerts``)."""
        body = httpx.get(f"{self.url}/api/v1/alerts", timeout=10).json()
        alerts: list[dict[str, Any]] = body["data"]["alerts"]
        return alerts


class VictoriaStack(OnLoopback, Polling):
    """VictoriaMetrics, vmagent (job "kvdoctor" scraping ``targets``) and vmalert (``rule_files``);
    ``url``/``port`` are the database's, whose query API the stores' clients read."""

    def __init__(
        self,
        binary: str,
        workdir: Path,
        *,
        targets: Iterable[str] = (),
        labels: dict[str, dict[str, str]] | None = None,
        rule_files: Sequence[Path] = (),
        scrape_interval: str = "1s",
        evaluation_interval: str = "1s",
    ):
        """``labels``: target -> extra labels of its series (as a Prometheus static config gives)."""
        self.workdir = workdir
        self.db = VictoriaMetrics(binary, workdir / "db")
        self.alertmanager = FakeServer(respond(b"{}", content_type="application/json"))
        config = {
            "global": {"scrape_interval": scrape_interval},
            "scrape_configs": [
                {
                    "job_name": "kvdoctor",
                    "static_configs": [{"targets": [t], "labels": (labels or {}).get(t, {})} for t in targets],
                }
            ],
        }
        agent, alerter = vmagent(binary), vmalert(binary)
        if agent is None or alerter is None:
            raise FileNotFoundError(f"vmagent and vmalert must sit beside {binary}")
        self.agent = VmAgent(agent, workdir / "agent", "", config)
        self.alerter = VmAlert(
            alerter, workdir / "alert", "", "", self.alertmanager.url(), rule_files, evaluation_interval
        )

    @property
    def port(self) -> int:  # type: ignore[override]
        return self.db.port

    def start(self) -> VictoriaStack:
        try:
            self.db.start()
            self.agent.remote_write = self.db.write_url
            self.agent.start()
            if self.alerter.rule_files:
                self.alerter.datasource = self.alerter.remote_write = self.db.url
                self.alerter.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for server in (self.alerter, self.agent, self.db):
            server.stop()
        self.alertmanager.stop()

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query now; the result vector."""
        body = httpx.post(f"{self.url}/api/v1/query", data={"query": expr}, timeout=10).json()
        if body.get("status") != "success":
            raise PrometheusError(f"{expr}: {body.get('errorType')}: {body.get('error')}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result
