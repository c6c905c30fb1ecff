"""A fake fleet: N engines on one port, each serving a copy of the real exporter's exposition.

    server = FleetServer(engines=300)             # in this process (tests)
    python -m tests.support.fleet_server --engines 1000 --gpus 8 --interval 5   # its own process;
                                                  # prints its URL on the first line

Engine ``i`` is ``GET /engine/<i>/metrics``. Each engine follows one scenario of the scenario
suite (tests/support/scenarios.py: the series and the verdict they must give, checked against the
Python tree, promtool and replay), chosen by ``fleet_plan`` from ``MIX``, so every engine's verdict
and alert are known in advance (``FleetEngine.expected``, ``.alert``).

Its page is the real exporter's: for each scenario a real ``Exporter`` (exporter/runtime.py) is
fed the scenario's samples for a diagnosis window, with ``--pod`` set, and its page is taken as the
template: every series it renders (the canonical ones, the sources' health, the verdict state set
the exporter itself diagnosed, the published SLO and context, build info, ``process_*``). Each
scrape of an engine is then rendered with the exporter's own ``ExpositionRenderer`` from that
template, the engine's ``pod``, and the scenario's values at the engine's own step: the scenario
sampled every ``interval`` seconds (``Scenario.at_interval``, the form the rule tests use), one
step per scrape, its counters advancing. An engine's clock starts at its first scrape, half a step
before it, so Prometheus' scrapes (a fixed offset per target) each land inside their own step.

``plan_json`` / ``GET /plan`` list the engines (namespace, pod, instance label, scenario, expected
verdict and alert), ``GET /families`` the metric names served and the series per engine,
``GET /slo-counts`` what the SLO rules record for each engine at its first step (for a backfill);
``scrape_config`` is the Prometheus job that scrapes each engine as its own target, labelled like
a Kubernetes pod target (``namespace``, ``instance`` as a pod IP and port).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

import numpy as np

from kvdoctor.exporter.assembly import build_exporter
from kvdoctor.exporter.exposition import ExpositionRenderer
from kvdoctor.exporter.settings import DEFAULT_PORT, load_settings
from kvdoctor.exporter.slo_counters import slo_counts
from kvdoctor.rules.alert_specs import VERDICT_ALERT
from kvdoctor.rules.feature_promql import ENGINE_KEYS
from kvdoctor.rules.slo_alerts import OBJECTIVES
from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.collection import Collected
from kvdoctor.signals.records import attributes
from kvdoctor.signals.stats import observations_over
from kvdoctor.signals.textparse import iter_samples
from kvdoctor.signals.window import SeriesKey, labels_of
from tests.support.scenarios import SCENARIO_BY_NAME, Scenario
from tests.support.servers import FakeServer, send, send_json, serve_until_killed

# Scenario -> share of the fleet, in twentieths: mostly healthy, every verdict present. Each is
# timeless and far from its thresholds, so it keeps its verdict at any scrape interval.
MIX: tuple[tuple[str, int], ...] = (
    ("baseline", 9),  # healthy
    ("idle_stale_kv", 2),  # idle
    ("data_parallel_ranks", 1),  # kv_thrashing, preempting in every state window (a sparser thrash can alternate
    # with capacity pressure where scrapes fall between the rule evaluations: docs/DESIGN.md, the tree)
    ("tier_miss_cache_hit_but_slow", 1),  # kv_tier_miss
    ("capacity_pressure_400_waiting", 1),  # kv_capacity_pressure
    ("vllm_max_num_seqs_queue", 1),  # request_queueing
    ("tensor_parallel_8_gpus", 3),  # memory_bandwidth_bound
    ("sm_clearly_above_bandwidth", 1),  # compute_bound
    ("nvml_duty_cycles_idle_gpu", 1),  # host_overhead_bound
)
NAMESPACES = ("chat", "search", "agents", "batch")
STRIDE = 7  # engine i takes slot (i * STRIDE) % 20 of the mix: the verdicts spread over the fleet
PATH_RE = re.compile(r"^/engine/(\d+)/metrics$")
TEMPLATE_CYCLES = 75  # the exporter's diagnosis window (60 s at 1 Hz) and a few cycles more
DEFAULT_INTERVAL = 5.0
DEFAULT_HOURS = 4.0  # how long the engines' series last; past that an engine repeats its last step
DEFAULT_GPUS = 8
# Every engine's exporter publishes a TTFT SLO too, so the TTFT burn-rate rules run on the whole fleet
# (the TTFT SLO feeds the burn alerts only: no verdict changes with it).
SLO_MS = 100.0
TTFT_SLO_MS = 2000.0


@dataclass(frozen=True)
class FleetEngine:
    """One engine of the fleet and what it must be diagnosed as."""

    index: int
    namespace: str
    pod: str
    scenario: str
    expected: str  # the verdict its scenario gives
    alert: str | None  # the alert that verdict fires (None: healthy, idle)

    @property
    def path(self) -> str:
        return f"/engine/{self.index}/metrics"

    @property
    def instance(self) -> str:
        """Its ``instance`` label: a pod IP and the exporter's port, as Kubernetes discovery gives."""
        return f"10.{16 + self.index // 62500}.{self.index // 250 % 250}.{self.index % 250 + 1}:{DEFAULT_PORT}"

    def to_json(self) -> dict[str, Any]:
        return attributes(self, "index namespace pod instance path scenario expected alert")


def _slots() -> list[str]:
    slots = [name for name, share in MIX for _ in range(share)]
    assert len(slots) == 20 and math.gcd(STRIDE, 20) == 1
    return slots


def fleet_plan(engines: int) -> list[FleetEngine]:
    """The fleet of ``engines`` engines: the same for the same size, in the server and its readers."""
    slots = _slots()
    plan = []
    for i in range(engines):
        scenario = SCENARIO_BY_NAME[slots[(i * STRIDE) % len(slots)]]
        namespace = NAMESPACES[i % len(NAMESPACES)]
        plan.append(
            FleetEngine(
                i,
                namespace,
                f"{scenario.engine}-{namespace}-{i:04d}",
                scenario.name,
                scenario.expected,
                VERDICT_ALERT.get(scenario.expected),
            )
        )
    return plan


def plan_json(plan: list[FleetEngine]) -> list[dict[str, Any]]:
    return [e.to_json() for e in plan]


def scrape_config(target: str, plan: list[FleetEngine], interval: float = DEFAULT_INTERVAL) -> dict[str, Any]:
    """The Prometheus scrape job for ``plan``: each engine its own target on ``target``
    (``host:port``), its path, ``namespace`` and ``instance`` as target labels."""
    return {
        "job_name": "kvdoctor",
        "scrape_interval": f"{interval:g}s",
        "scrape_timeout": f"{min(interval, 10.0):g}s",
        "static_configs": [
            {
                "targets": [target],
                "labels": {"__metrics_path__": e.path, "namespace": e.namespace, "instance": e.instance},
            }
            for e in plan
        ],
    }


def with_gpus(scenario: Scenario, gpus: int) -> Scenario:
    """``scenario`` with ``gpus`` GPUs (its own ones repeated); unchanged when it has none."""
    if not scenario.gpus or gpus <= 0:
        return scenario
    return scenario.but(gpus=tuple(scenario.gpus[i % len(scenario.gpus)] for i in range(gpus)))


# ------------------------------------------------------------------------ one scenario's pages


class _Replay:
    """A collector replaying one scenario's samples, one step per call (the engine or the GPUs)."""

    def __init__(self, name: str, series: dict[SeriesKey, np.ndarray], gpus: bool):
        self.name = name
        self.step = 0
        self.series = {k: v for k, v in series.items() if k[0].startswith("kvdoctor_gpu_") == gpus}

    def collect(self) -> Collected:
        out = Collected()
        for key, values in self.series.items():
            value = values[min(self.step, len(values) - 1)]
            if not math.isnan(value):
                out.samples[key] = float(value)
        self.step += 1
        return out

    def close(self) -> None:
        pass


@dataclass
class EngineKind:
    """The pages of one scenario: the exporter's series (with the scenario's pod) and their values
    at each step."""

    scenario: Scenario
    keys: list[tuple[str, dict[str, str]]]
    values: np.ndarray  # (steps, series)
    verdict: str  # what the real exporter diagnosed from the scenario

    @classmethod
    def build(cls, scenario: Scenario, interval: float, hours: float) -> EngineKind:
        template = _exporter_page(scenario)
        keys = [(name, labels) for name, labels, _, _ in template]
        base = np.array([value for _, _, value, _ in template], dtype=float)
        steps = scenario.but(step=float(interval), duration=hours * 3600.0).series()
        values = np.tile(base, (len(next(iter(steps.values()))), 1))
        for j, (name, labels) in enumerate(keys):
            column = steps.get((name, labels_of(labels)))
            if column is not None:
                if np.isnan(column).any():
                    raise ValueError(f"scenario {scenario.name}: {name} has steps without a sample")
                values[:, j] = column
        _count_over_slo(keys, values)
        verdicts = [labels["verdict"] for name, labels, value, _ in template if name == S.DIAGNOSIS_VERDICT and value]
        return cls(scenario, keys, values, verdicts[0] if verdicts else "")

    def slo_counts(self, engine: FleetEngine) -> list[dict[str, Any]]:
        """What the SLO rules record for ``engine`` at its first step (``slo_alerts``' per-engine counters:
        each objective's over-SLO counter and observations, summed per engine): the values a backfill
        of the hours before the run holds them at."""
        out = []
        first = self.values[0]
        for o in OBJECTIVES:
            for record, source in ((o.errors_record, o.over_counter), (o.events_record, o.events)):
                sums: dict[tuple, float] = {}
                for j, (name, labels) in enumerate(self.keys):
                    if name == source:
                        full = {**labels, "namespace": engine.namespace, "pod": engine.pod, "instance": engine.instance}
                        key = tuple(full.get(k, "") for k in ENGINE_KEYS)
                        sums[key] = sums.get(key, 0.0) + float(first[j])
                out += [
                    {"record": record, "labels": dict(zip(ENGINE_KEYS, k, strict=True)), "value": v}
                    for k, v in sums.items()
                ]
        return out


def _count_over_slo(keys: list[tuple[str, dict[str, str]]], values: np.ndarray) -> None:
    """The exporter's SLO counters at every step, from the steps' cumulative buckets (in place): what
    ``exporter/slo_counters.py`` counts, with the SLOs fixed from the first step on."""
    for count in slo_counts(SLO_MS / 1e3, TTFT_SLO_MS / 1e3):
        buckets: dict[tuple, list[tuple[float, int]]] = {}
        for j, (name, labels) in enumerate(keys):
            if name == count.histogram + "_bucket":
                rest = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
                buckets.setdefault(rest, []).append((float(labels["le"]), j))
        for j, (name, labels) in enumerate(keys):
            series = buckets.get(tuple(sorted(labels.items()))) if name == count.counter else None
            if series:
                bounds = [b for b, _ in series]
                columns = values[:, [i for _, i in series]]
                values[:, j] = [observations_over(count.slo_seconds, bounds, list(row)) for row in columns]


def _exporter_page(scenario: Scenario) -> list:
    """The real exporter's page after a diagnosis window of ``scenario`` (1 s cycles), parsed."""
    series = scenario.series()
    clock = [1.0e9]
    exporter = build_exporter(
        load_settings(pod=scenario.pod, slo_ms=SLO_MS, ttft_slo_ms=TTFT_SLO_MS),
        [_Replay("engine", series, gpus=False), _Replay("nvml", series, gpus=True)],
        clock=lambda: clock[0],
        include_registry=False,
    )
    try:
        for _ in range(TEMPLATE_CYCLES):
            exporter.run_cycle()
            clock[0] += 1.0
        return list(iter_samples(exporter.metrics_bytes().decode()))
    finally:
        exporter.stop()


# ------------------------------------------------------------------------------------ the server


class FleetServer:
    """The fleet of ``fleet_plan(engines)`` served by one FakeServer (one port)."""

    def __init__(
        self,
        engines: int,
        gpus: int = DEFAULT_GPUS,
        interval: float = DEFAULT_INTERVAL,
        hours: float = DEFAULT_HOURS,
        port: int = 0,
    ):
        self.plan = fleet_plan(engines)
        self.interval = float(interval)
        self.kinds = {
            name: EngineKind.build(with_gpus(SCENARIO_BY_NAME[name], gpus), interval, hours)
            for name in sorted({e.scenario for e in self.plan})
        }
        for kind in self.kinds.values():
            if kind.verdict != kind.scenario.expected:
                raise ValueError(
                    f"the exporter diagnoses scenario {kind.scenario.name} as {kind.verdict}, "
                    f"not {kind.scenario.expected}: it cannot stand for a known verdict"
                )
        self._keys = [
            tuple((name, labels_of(labels, pod=e.pod)) for name, labels in self.kinds[e.scenario].keys)
            for e in self.plan
        ]
        self._renderers = [ExpositionRenderer(cache_size=1) for _ in self.plan]
        self._started: list[float | None] = [None] * len(self.plan)
        self.scrapes = [0] * len(self.plan)
        self._locks = [threading.Lock() for _ in self.plan]
        self.server = FakeServer(self._answer, port=port)

    @property
    def series_per_engine(self) -> dict[str, int]:
        return {name: len(kind.keys) for name, kind in self.kinds.items()}

    def families(self) -> dict[str, Any]:
        """The metric names the engines serve, and how many series an engine of each scenario has."""
        names = sorted({name for kind in self.kinds.values() for name, _ in kind.keys})
        return {"names": names, "per_engine": self.series_per_engine}

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    @property
    def url(self) -> str:
        return self.server.url()

    def page(self, index: int, now: float | None = None) -> bytes:
        """Engine ``index``'s page at ``now``; its clock starts at its first page."""
        now = time.time() if now is None else now
        engine = self.plan[index]
        kind = self.kinds[engine.scenario]
        with self._locks[index]:
            started = self._started[index]
            if started is None:
                started = self._started[index] = now - self.interval / 2
            step = min(int((now - started) // self.interval), len(kind.values) - 1)
            self.scrapes[index] += 1
            return self._renderers[index].render(self._keys[index], kind.values[step].tolist())

    def _answer(self, h: BaseHTTPRequestHandler) -> None:
        path = h.path.split("?", 1)[0]
        found = PATH_RE.match(path)
        if found and int(found.group(1)) < len(self.plan):
            return send(h, self.page(int(found.group(1))))
        if path == "/plan":
            return send_json(h, plan_json(self.plan))
        if path == "/scrapes":
            return send_json(h, self.scrapes)
        if path == "/families":
            return send_json(h, self.families())
        if path == "/slo-counts":
            return send_json(h, [c for e in self.plan for c in self.kinds[e.scenario].slo_counts(e)])
        return send(h, b"not found\n", 404, "text/plain")

    def stop(self) -> None:
        self.server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.fleet_server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", type=int, required=True)
    parser.add_argument("--gpus", type=int, default=DEFAULT_GPUS)
    parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL, help="seconds per step (the scrape)")
    parser.add_argument("--hours", type=float, default=DEFAULT_HOURS, help="how long the series last")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    if args.engines < 1:
        parser.error("--engines must be at least 1")
    fleet = FleetServer(args.engines, args.gpus, args.interval, args.hours, args.port)
    print(
        f"# {len(fleet.plan)} engines, series per engine: {json.dumps(fleet.series_per_engine)}",
        file=sys.stderr,
        flush=True,
    )
    serve_until_killed(fleet.server)
    return 0


if __name__ == "__main__":
    sys.exit(main())
