"""Synthetic canonical series (an engine and its GPUs) and a fake exporter HTTP API serving them.

The data is a pure function of time since ``t0`` so a fake exporter can answer
``/api/v1/window?seconds=N`` at any moment with a window that grows like a real one. Used by the
dashboard tests (until, and besides, the real ``kvdoctor demo``) and by bench/bench_dashboard.py,
which also backfills the same samples into a real Prometheus (``backfill``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlsplit

import numpy as np

from kvdoctor.dashboard import derive, promql
from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.window import Window, labels_of
from kvdoctor.simulator.vllm_metrics import TTFT_BUCKETS as VLLM_TTFT_BUCKETS
from tests.support.processes import Process
from tests.support.servers import JSON, FakeServer, send, send_json, serve_until_killed

# vLLM's histogram bounds (seconds), +Inf included.
ITL_BUCKETS = (*S.ITL_BUCKETS, math.inf)
TTFT_BUCKETS = (*VLLM_TTFT_BUCKETS, math.inf)
ENGINE = {"engine": "vllm", "model_name": "tiny"}
CAPACITY_TOKENS = 100_000.0
TOKENS_PER_SECOND = 400.0
PEAK_BANDWIDTH = 3.35e12
WEIGHT_BYTES = 16e9
KV_BYTES_PER_TOKEN = 131072.0


@dataclass(frozen=True)
class Scenario:
    """How the simulated engine behaves; functions of seconds since t0."""

    name: str
    verdict: str
    kv: callable  # -> KV usage 0..1
    itl: callable  # (kv usage) -> mean ITL seconds
    dram: float
    sm: float
    preemptions_per_second: float = 0.0
    kv_to_gpu_bytes_per_second: float = 0.0
    headline: str = ""
    knee: dict | None = None


SCENARIOS = {
    "healthy": Scenario(
        "healthy",
        "healthy",
        kv=lambda t: 0.35 + 0.05 * np.sin(t / 30.0),
        itl=lambda kv: 0.012 + 0.004 * kv,
        dram=0.45,
        sm=0.40,
        headline="Decode is healthy: ITL p95 14 ms is under the 100 ms SLO.",
    ),
    "bandwidth": Scenario(
        "bandwidth",
        "memory_bandwidth_bound",
        kv=lambda t: np.minimum(0.88, 0.30 + 0.004 * t),
        itl=lambda kv: 0.010 + 0.11 * kv,
        dram=0.91,
        sm=0.32,
        headline="Decode is HBM-bandwidth bound: each token re-reads the weights and 9 GB of KV.",
        knee={"kind": "rises_with_kv", "kv_level": 0.5},
    ),
    "thrashing": Scenario(
        "thrashing",
        "kv_thrashing",
        kv=lambda t: 0.95 + 0.03 * np.sin(t / 3.0),
        itl=lambda kv: 0.03 + 0.5 * np.maximum(0.0, kv - 0.94),
        dram=0.7,
        sm=0.35,
        preemptions_per_second=0.8,
        kv_to_gpu_bytes_per_second=2e9,
        headline="KV thrashing: the pool ran out and requests are preempted; prefix hit rate 91% does not help.",
        knee={"kind": "jump", "kv_level": 0.9},
    ),
}


SYNTHETIC_SLO_SECONDS = 0.05  # the SLO the synthetic exporters publish (the diagnosis' context)


def diagnosis_for(scenario: Scenario) -> dict:
    """A Diagnosis JSON in the shape the rules produce."""
    return {
        "verdict": scenario.verdict,
        "confidence": 0.85,
        "headline": scenario.headline,
        "evidence": [
            {
                "signal": S.KV_CACHE_USAGE,
                "value": 0.95,
                "threshold": 0.9,
                "comparison": ">=",
                "measured": True,
                "note": "KV pool nearly full",
            },
            {
                "signal": S.GPU_DRAM_BANDWIDTH_UTILIZATION,
                "value": scenario.dram,
                "threshold": 0.8,
                "comparison": ">=",
                "measured": True,
                "note": "",
            },
            {
                "signal": S.PREFIX_CACHE_HITS,
                "value": None,
                "threshold": None,
                "comparison": "",
                "measured": False,
                "note": "no prefix cache metrics",
            },
        ],
        "actions": [
            {
                "title": "Quantise the KV cache",
                "flag_vllm": "--kv-cache-dtype fp8",
                "flag_sglang": "--kv-cache-dtype fp8_e5m2",
                "effect": "halves KV bytes per token",
            },
            {
                "title": "Cap concurrent sequences",
                "flag_vllm": "--max-num-seqs 64",
                "flag_sglang": "--max-running-requests 64",
                "effect": "",
            },
        ],
        "knee": scenario.knee,
        "missing": [S.PREFIX_CACHE_HITS],
        "context": {"slo_seconds": SYNTHETIC_SLO_SECONDS, "slo_source": "exporter"},
    }


def _normal_cdf(x: np.ndarray) -> np.ndarray:
    """Standard normal CDF, vectorised (Abramowitz & Stegun 7.1.26 erf, error < 1.5e-7)."""
    z = np.abs(x) / math.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erf = 1.0 - poly * np.exp(-z * z)
    return 0.5 * (1.0 + np.sign(x) * erf)


def _bucket_fractions(mean: np.ndarray, bounds: tuple[float, ...], spread: float = 0.25) -> np.ndarray:
    """(n, B) cumulative fraction of observations <= each bound for a log-normal around ``mean``."""
    finite = np.array([b for b in bounds if math.isfinite(b)])
    z = (np.log(finite)[None, :] - np.log(np.maximum(mean, 1e-6))[:, None]) / spread
    frac = _normal_cdf(z)
    return np.hstack([frac, np.ones((len(mean), 1))])


@dataclass
class SyntheticEngine:
    """An engine with ``gpus`` GPUs following ``scenario`` since ``t0`` (1 sample a second)."""

    scenario: Scenario
    t0: float
    gpus: int = 8
    step: float = 1.0
    with_floor: bool = True
    reset_at: float | None = None  # seconds after t0 at which every counter restarts from zero

    # Series are computed ahead, this many steps past the last request, and sliced per request.
    AHEAD = 600

    def window(self, start: float, end: float) -> Window:
        """The samples with start <= ts <= end (ts on the t0 + k*step grid)."""
        k_end = math.floor((end - self.t0) / self.step + 1e-9)
        if k_end < 0:
            return Window.empty()
        cached = self.__dict__.get("_computed")
        if cached is None or cached[0] < k_end:
            ts_all = self.t0 + self.step * np.arange(k_end + self.AHEAD + 1)
            cached = (k_end + self.AHEAD, ts_all, self._series(ts_all - self.t0))
            self.__dict__["_computed"] = cached
        _, ts_all, series = cached
        k_start = max(0, math.ceil((start - self.t0) / self.step - 1e-9))
        part = slice(k_start, k_end + 1)
        return Window(ts_all[part], {k: v[part] for k, v in series.items()})

    def _counter(self, per_step: np.ndarray, t: np.ndarray) -> np.ndarray:
        total = np.cumsum(per_step)
        if self.reset_at is not None:
            after = t >= self.reset_at
            if np.any(after):
                first = int(np.argmax(after))
                base = total[first - 1] if first > 0 else 0.0
                total = np.where(after, total - base, total)
        return total

    def _series(self, t: np.ndarray) -> dict:
        sc, n = self.scenario, len(t)
        out: dict = {}
        eng = labels_of(ENGINE)

        def put(name, values, labels=eng):
            out[(name, labels)] = np.asarray(values, dtype=float) * np.ones(n)

        kv = np.clip(sc.kv(t), 0.0, 1.0)
        mean_itl = sc.itl(kv)
        tokens = np.full(n, TOKENS_PER_SECOND * self.step)
        tokens[0] = 0.0
        put(S.KV_CACHE_USAGE, kv)
        # Like vLLM's cache_config_info: the capacity carries no model_name.
        put(S.KV_CACHE_CAPACITY, CAPACITY_TOKENS, labels_of({"engine": ENGINE["engine"]}))
        put(S.REQUESTS_RUNNING, 16)
        put(S.REQUESTS_WAITING, 3 if sc.preemptions_per_second else 0)
        put(S.GENERATION_TOKENS, self._counter(tokens, t))
        put(S.PROMPT_TOKENS, self._counter(tokens * 2, t))
        put(S.PREFIX_CACHE_QUERIES, self._counter(tokens * 2, t))
        put(S.PREFIX_CACHE_HITS, self._counter(tokens * 1.8, t))
        put(S.PREEMPTIONS, self._counter(np.where(t > 0, sc.preemptions_per_second * self.step, 0.0), t))
        for direction, rate in (
            ("to_gpu", sc.kv_to_gpu_bytes_per_second),
            ("from_gpu", sc.kv_to_gpu_bytes_per_second / 2),
        ):
            put(
                S.KV_TRANSFER_BYTES,
                self._counter(np.where(t > 0, rate * self.step, 0.0), t),
                labels_of(ENGINE, direction=direction, tier="cpu"),
            )
        cum = _bucket_fractions(mean_itl, ITL_BUCKETS) * tokens[:, None]
        for j, le in enumerate(ITL_BUCKETS):
            put(
                S.INTER_TOKEN_LATENCY + "_bucket",
                self._counter(cum[:, j], t),
                labels_of(ENGINE, le="+Inf" if math.isinf(le) else repr(le)),
            )
        put(S.INTER_TOKEN_LATENCY + "_sum", self._counter(mean_itl * tokens, t))
        put(S.INTER_TOKEN_LATENCY + "_count", self._counter(tokens, t))
        requests = np.where(t > 0, 2.0 * self.step, 0.0)
        ttft = _bucket_fractions(np.full(n, 0.08), TTFT_BUCKETS) * requests[:, None]
        for j, le in enumerate(TTFT_BUCKETS):
            put(
                S.TIME_TO_FIRST_TOKEN + "_bucket",
                self._counter(ttft[:, j], t),
                labels_of(ENGINE, le="+Inf" if math.isinf(le) else repr(le)),
            )
        put(S.TIME_TO_FIRST_TOKEN + "_sum", self._counter(0.08 * requests, t))
        put(S.TIME_TO_FIRST_TOKEN + "_count", self._counter(requests, t))
        if self.with_floor:
            put(S.DECODE_STEP_FLOOR, (WEIGHT_BYTES + kv * CAPACITY_TOKENS * KV_BYTES_PER_TOKEN) / PEAK_BANDWIDTH, ())
        for g in range(self.gpus):
            gl = {"gpu": str(g), "uuid": f"GPU-{g:04d}", "model": "NVIDIA H100 80GB HBM3"}
            wobble = 0.03 * np.sin(t / 7.0 + g)
            put(S.GPU_DRAM_BANDWIDTH_UTILIZATION, np.clip(sc.dram + wobble, 0, 1), labels_of(gl, method=S.METHOD_GPM))
            put(S.GPU_SM_ACTIVE, np.clip(sc.sm - wobble, 0, 1), labels_of(gl, method=S.METHOD_GPM))
            put(S.GPU_MEMORY_USED, 70e9, labels_of(gl))
            put(S.GPU_MEMORY_TOTAL, 80e9, labels_of(gl))
            put(S.GPU_PCIE_RX, sc.kv_to_gpu_bytes_per_second / self.gpus + 1e8, labels_of(gl))
            put(S.GPU_PCIE_TX, 5e7, labels_of(gl))
            put(S.GPU_DRAM_PEAK_BANDWIDTH, PEAK_BANDWIDTH, labels_of(gl))
        for source in ("engine", "nvml"):
            put(S.SOURCE_UP, 1, labels_of(source=source))
            put(S.SOURCE_SCRAPE_DURATION, 0.004, labels_of(source=source))
        for verdict in ("idle", "healthy", "kv_thrashing", "memory_bandwidth_bound"):
            put(S.DIAGNOSIS_VERDICT, 1.0 if verdict == sc.verdict else 0.0, labels_of(verdict=verdict))
        return out


@dataclass
class FakeExporter:
    """The exporter's JSON API over HTTP on loopback (a FakeServer), serving a SyntheticEngine.

    ``fail = True`` makes every request answer 500 (a broken exporter); ``stop()`` closes the port
    and its connections (an exporter that went away); ``sources_down`` marks sources down in the
    window and status; ``requests`` lists the paths asked for.
    """

    engine: SyntheticEngine
    max_window_seconds: int = 900
    fail: bool = False
    sources_down: dict = field(default_factory=dict)  # name -> last_error
    diagnosis: dict | None = None
    embed_status: bool = True
    delay: float = 0.0  # seconds each window request takes (a slow exporter)

    def __post_init__(self):
        if self.diagnosis is None:
            self.diagnosis = diagnosis_for(self.engine.scenario)
        self.server = FakeServer(self._answer)

    @property
    def requests(self) -> list[str]:
        return self.server.paths

    def _answer(self, h: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(h.path)
        if self.fail:
            return send_json(h, {"error": "broken on purpose"}, 500)
        if parts.path == "/api/v1/window":
            time.sleep(self.delay)
            try:
                seconds = float(parse_qs(parts.query)["seconds"][0])
            except (KeyError, ValueError):
                return send_json(h, {"error": "seconds"}, 400)
            seconds = min(seconds, self.max_window_seconds)
            now = time.time()
            payload = self.engine.window(now - seconds, now).to_json()
            for item in payload["series"]:
                if item["name"] == S.SOURCE_UP and item["labels"].get("source") in self.sources_down:
                    item["values"] = [0.0 for _ in item["values"]]
            if self.embed_status:  # the real exporter adds its sources' status to the window
                payload["seconds"] = seconds
                payload["sources"] = self.status()["sources"]
            return send_json(h, payload)
        if parts.path == "/api/v1/diagnosis":
            return send_json(h, self.diagnosis)
        if parts.path == "/api/v1/status":
            return send_json(h, self.status())
        return send_json(h, {"error": "not found"}, 404)

    @property
    def url(self) -> str:
        return self.server.url()

    def status(self) -> dict:
        return {
            "sources": {
                name: {"up": name not in self.sources_down, "last_error": self.sources_down.get(name, "")}
                for name in ("engine", "nvml")
            }
        }

    def stop(self) -> None:
        self.server.stop()


# ------------------------------------------------------------------------------ fake Prometheus


def _prom_duration(expr: str) -> float | None:
    m = re.search(r"\[(\d+)s\]", expr)
    return float(m.group(1)) if m else None


@dataclass
class FakePrometheus:
    """The Prometheus HTTP API over loopback for the dashboard's own queries, answered from
    SyntheticEngines (``targets``: instance -> engine). It knows the dashboard's queries by
    regenerating them with kvdoctor.dashboard.promql; any other query is answered with an error
    and recorded in ``unknown``. The PromQL itself is checked against a real Prometheus in
    test_prometheus_real.py; this fake only carries the data."""

    targets: dict
    pods: dict = field(default_factory=dict)  # instance -> pod label
    queries: list = field(default_factory=list)
    unknown: list = field(default_factory=list)

    def __post_init__(self):
        self._cache: dict = {}
        self._answers: dict = {}
        self.server = FakeServer(self._answer)

    def _answer(self, h: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(h.path)
        form = getattr(h, "body", b"").decode()  # the clients POST their queries, form-encoded
        params = {k: v[0] for k, v in parse_qs("&".join(q for q in (parts.query, form) if q)).items()}
        self.queries.append((parts.path, params))
        key = (h.path, form)
        cached = self._answers.get(key)
        if cached is not None:  # the same range query again (the benchmark): answer as fast as we can
            return send(h, cached, content_type=JSON)
        try:
            if parts.path == "/api/v1/query":
                data = self._instant(params["query"], float(params.get("time", time.time())))
            elif parts.path == "/api/v1/query_range":
                data = self._range(params["query"], float(params["start"]), float(params["end"]), float(params["step"]))
            else:
                return send_json(h, {"status": "error", "error": "not found"}, 404)
        except KeyError as exc:
            self.unknown.append(params.get("query"))
            return send_json(h, {"status": "error", "errorType": "bad_data", "error": str(exc)}, 400)
        body = json.dumps({"status": "success", "data": data}).encode()
        if parts.path == "/api/v1/query_range":
            self._answers[key] = body
        return send(h, body, content_type=JSON)

    @property
    def url(self) -> str:
        return self.server.url()

    def stop(self) -> None:
        self.server.stop()

    # -- data
    def _frame(self, instance: str, target: dict, start: float, end: float, rate_window: float):
        key = (instance, tuple(sorted(target.items())), start, end, rate_window)
        if key not in self._cache:
            window = self.targets[instance].window(start - max(rate_window, 60.0), end)
            self._cache[key] = (window, derive.live_frame(window, target, rate_window))
        return self._cache[key]

    def _latest_window(self, instance: str, end: float):
        key = ("latest", instance, end)
        if key not in self._cache:
            self._cache[key] = self.targets[instance].window(end - 1, end)
        return self._cache[key]

    @staticmethod
    def _at(ts: np.ndarray, values: np.ndarray, grid: np.ndarray) -> np.ndarray:
        idx = np.searchsorted(ts, grid + 1e-9, side="right") - 1
        out = np.where(idx >= 0, values[np.clip(idx, 0, None)], np.nan)
        return out

    def _base_labels(self, instance: str) -> dict:
        labels = {"instance": instance, "job": "kvdoctor"}
        if self.pods.get(instance):
            labels["pod"] = self.pods[instance]
        return labels

    def _instant(self, expr: str, at: float) -> dict:
        vector: list = []
        known = False

        def add(metric: dict, value: float):
            if math.isfinite(value):
                vector.append({"metric": metric, "value": [at, repr(float(value))]})

        if expr == promql.instances_query():
            for inst in self.targets:
                add({k: v for k, v in self._base_labels(inst).items() if k != "job"}, 1.0)
            return {"resultType": "vector", "result": vector}
        for inst, engine in self.targets.items():
            m = promql.matchers({promql.TARGET_LABEL: inst})
            base = self._base_labels(inst)
            window, _ = self._frame(inst, {}, at - 120.0, at, 60.0)
            verdicts = [(dict(base, verdict=engine.scenario.verdict), 1.0)]
            pod = {"pod": base["pod"]} if "pod" in base else {}
            answers: dict[str, list[tuple[dict, float]]] = {
                promql.target_listing_query(inst): [
                    (dict(labels, __name__=name, **pod), 1.0)
                    for name, labels in window.series
                    if name in (S.KV_CACHE_USAGE, S.GPU_SM_ACTIVE, S.GPU_DRAM_BANDWIDTH_UTILIZATION)
                ],
                S.SOURCE_UP + m: [
                    (dict(labels, **base, __name__=S.SOURCE_UP), float(values[-1]))
                    for labels, values in window.select(S.SOURCE_UP).items()
                ],
                "up" + m: [(dict(base, __name__="up"), 1.0)],
                f"{S.DIAGNOSIS_VERDICT}{m} == 1": verdicts,
            }
            if expr in answers:
                known = True
                for metric, value in answers[expr]:
                    add(metric, value)
        if not known:
            raise KeyError(f"the fake does not know {expr!r}")
        return {"resultType": "vector", "result": vector}

    def _range(self, expr: str, start: float, end: float, step: float) -> dict:
        grid = start + step * np.arange(math.floor((end - start) / step + 1e-9) + 1)
        rate_window = _prom_duration(expr) or 10.0
        matrix = []

        def add(metric: dict, ts: np.ndarray, values: np.ndarray):
            vals = [
                [float(t), repr(float(v))]
                for t, v in zip(grid, self._at(ts, values, grid), strict=True)
                if math.isfinite(v)
            ]
            if vals:
                matrix.append({"metric": metric, "values": vals})

        for inst in self.targets:
            if expr == promql.recent_window_selector(inst):
                window = self.targets[inst].window(start - 1, end)
                for (name, labels), values in window.series.items():
                    add(dict(labels, __name__=name, **self._base_labels(inst)), window.timestamps, values)
                return {"resultType": "matrix", "result": matrix}
            window = self._latest_window(inst, end)
            candidates = (
                [{}]
                + [{"gpu": dict(labels)["gpu"]} for name, labels in window.series if name == S.GPU_SM_ACTIVE]
                + [
                    {k: v for k, v in labels if k in derive.ENGINE_TARGET_LABELS}
                    for name, labels in window.series
                    if name == S.KV_CACHE_USAGE
                ]
            )
            for target in candidates:
                labels = dict(target, **{promql.TARGET_LABEL: inst})
                for key, q in promql.live_queries(labels, step, 10.0).items():
                    if q != expr:
                        continue
                    _, frame = self._frame(inst, target, start, end, rate_window)
                    if key in ("gpu_dram", "gpu_sm"):
                        for g in frame.gpus:
                            add(
                                {"gpu": g.gpu, "model": g.model, "method": g.dram_method},
                                frame.ts,
                                g.dram if key == "gpu_dram" else g.sm,
                            )
                    elif key == "kv_capacity_tokens":
                        add({}, frame.ts, np.full(len(frame.ts), frame.kv_capacity_tokens))
                    else:
                        add({}, frame.ts, getattr(frame, key))
                    return {"resultType": "matrix", "result": matrix}
        raise KeyError(f"the fake does not know {expr!r}")


def fake_fleet(
    scenarios: Mapping[str, str], *, age: float, gpus: int, pods: Mapping[str, str] | None = None
) -> FakePrometheus:
    """A FakePrometheus over one SyntheticEngine per target (instance -> scenario name), each
    running for ``age`` seconds with ``gpus`` GPUs; ``pods``: instance -> pod label."""
    now = time.time()
    engines = {inst: SyntheticEngine(SCENARIOS[name], t0=now - age, gpus=gpus) for inst, name in scenarios.items()}
    return FakePrometheus(engines, pods=dict(pods or {}))


# ------------------------------------------------------------------- a real Prometheus, backfilled

# What a Prometheus that has run for a day has compacted its 2 h blocks into (2 h -> 6 h -> 18 h).
BACKFILL_BLOCK_SECONDS = 18 * 3600


def write_openmetrics(window: Window, path, labels: Mapping[str, str] | None = None) -> int:
    """``window``'s samples as OpenMetrics text for ``promtool tsdb create-blocks-from openmetrics``,
    each series with ``labels`` added (``instance``, ``job``: what a scrape adds); returns the count.

    One series after the other, in name order so a family is never interleaved; no TYPE lines
    (the TSDB keeps no metadata from a backfill). Timestamps in seconds, whole when they are."""
    extra = dict(labels or {})
    whole = bool(len(window)) and bool(np.all(window.timestamps == np.round(window.timestamps)))
    stamps = [str(int(t)) if whole else f"{t:.3f}" for t in window.timestamps.tolist()]
    count = 0
    with open(path, "w") as out:
        for name, series_labels in sorted(window.series):
            merged = dict(series_labels, **extra)
            text = name + "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(merged.items())) + "}"
            values = window.series[(name, series_labels)]
            keep = np.isfinite(values).tolist()
            out.write(
                "".join([f"{text} {v!r} {t}\n" for v, t, k in zip(values.tolist(), stamps, keep, strict=True) if k])
            )
            count += sum(keep)
        out.write("# EOF\n")
    return count


def _escape(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def backfill(
    engine,
    start: float,
    end: float,
    blocks_dir,
    promtool: str,
    labels: Mapping[str, str] | None = None,
    block_seconds: int = BACKFILL_BLOCK_SECONDS,
    workdir=None,
) -> int:
    """TSDB blocks in ``blocks_dir`` holding ``engine``'s samples in [start, end] (plus ``up`` = 1, as
    a scrape adds it), made by ``promtool tsdb create-blocks-from openmetrics``; returns the samples.
    ``engine``: a SyntheticEngine, or anything with its ``window(start, end) -> Window``.

    promtool reads its whole input once per block it makes, so the samples go in one file per
    block-aligned span, and the next file is written while promtool reads the last one."""
    os.makedirs(blocks_dir, exist_ok=True)
    total, running = 0, []
    with tempfile.TemporaryDirectory(dir=workdir, prefix="kvdoctor-backfill-") as tmp:
        try:
            edge = math.floor(start / block_seconds) * block_seconds
            while edge <= end:
                lo, hi = max(start, edge), min(end, edge + block_seconds - 1e-3)
                edge += block_seconds
                window = engine.window(lo, hi)
                if not len(window):
                    continue
                series = dict(window.series)
                series[("up", ())] = np.ones(len(window))
                path = os.path.join(tmp, f"{int(lo)}.om")
                total += write_openmetrics(Window(window.timestamps, series), path, labels)
                while len(running) >= 2:  # at most two promtools reading at once
                    _finish(*running.pop(0))
                argv = [promtool, "tsdb", "create-blocks-from", f"--max-block-duration={block_seconds}s", "--quiet"]
                running.append((Process([*argv, "openmetrics", path, blocks_dir], name="promtool").start(), path))
            while running:
                _finish(*running.pop(0))
        finally:
            for proc, _ in running:  # only after a failure
                proc.stop()
    return total


def _finish(proc: Process, path: str) -> None:
    rc = proc.wait(timeout=900)
    os.unlink(path)  # the input file: a day of samples is about 1.6 GB of text
    if rc != 0:
        last = proc.output.strip().splitlines()[-1:] or [f"exit status {rc}"]
        raise RuntimeError(f"promtool could not backfill {path}: {last[0]}")


def main(argv=None) -> int:
    """Serve a fake exporter or Prometheus in its own process (the benchmark keeps it off its GIL).

        python -m tests.support.synthetic exporter --minutes 15 --gpus 8
        python -m tests.support.synthetic prometheus --hours 24 --gpus 8 --instance 10.0.0.1:9745 --end T

    Prints the URL on the first line, then serves until killed.
    """
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=("exporter", "prometheus"))
    parser.add_argument("--scenario", default="thrashing", choices=sorted(SCENARIOS))
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--minutes", type=float, default=15)
    parser.add_argument("--hours", type=float, default=24)
    parser.add_argument("--instance", default="10.0.0.1:9745")
    parser.add_argument("--end", type=float, default=None)
    args = parser.parse_args(argv)
    if args.kind == "exporter":
        seconds = int(args.minutes * 60)
        engine = SyntheticEngine(SCENARIOS[args.scenario], t0=time.time() - seconds, gpus=args.gpus)
        engine.window(0, time.time() + 3600)  # compute an hour ahead once
        server = FakeExporter(engine, max_window_seconds=seconds)
    else:
        end = args.end or time.time()
        engine = SyntheticEngine(SCENARIOS[args.scenario], t0=end - args.hours * 3600 - 600, gpus=args.gpus)
        server = FakePrometheus({args.instance: engine})
    serve_until_killed(server.server)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
