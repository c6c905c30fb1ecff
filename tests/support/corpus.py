"""The labelled diagnosis corpus: cases with the verdict that is *truly* right, judged by the Python
tree and by the PromQL rules (promtool) on the same samples, and scored.

Each ``Case`` is a series of canonical samples and its truth (what is really happening, never
what today's tree answers):

- every cause alone (``alone``), and the ``unknown`` of a window too short to judge (fewer than
  ``MIN_SAMPLES`` samples: the last one or two scrapes only);
- every cause with a queue behind it, steady and growing (``queue_steady``, ``queue_growing``):
  the queue is the cause's consequence, so the truth stays the cause. A small steady queue that
  delays nobody is ``healthy``; a queue growing behind an engine whose decode is on time is
  ``request_queueing``;
- every ordered pair of causes in sequence (``change``): cause A for a window and more, then B;
  the truth is B, and the *lag* is the time from the switch until the verdict is B and stays B;
- each with noise (``noise``), with one signal family missing (``missing``: ``gpu`` no GPU
  counters, ``itl`` no ITL histogram, ``ttft`` no TTFT histogram; the truth is kept, so accuracy
  honestly drops where the tree cannot tell), sampled every 1 s or 15 s (``step``; judged on the
  window the rules for that interval read), on each engine's exposition (``engine``);
- the recorded windows the repository holds (``recorded``): the simulator trace of
  tests/fixtures/traces, the real vLLM 0.32 fill sequence, and single real pages of each engine
  (one scrape: ``unknown``).

Engine expositions go through the real adapters: the canonical series are rendered into the
engine's own families by inverting its mapping table (``exporter/adapters``) and normalised back,
scrape by scrape, with ``normalise_page`` -- what the engine cannot publish (TGI's KV usage,
TensorRT-LLM's preemptions, llama.cpp's ITL histogram) is gone, what it publishes differently
(SGLang's prompt tokens as prefix queries, llama.cpp's mean time per token) comes back as the
adapter reads it.

Both halves read bit-identical samples: the series are written once in promtool's expanding
notation and the Python window is decoded from that text (as ``tests/support/scenarios.py`` does).
The PromQL half runs ``promtool test rules`` on rule files generated from the current code for
the case's interval and reads ``kvdoctor:verdict`` at each judged instant from promtool's report
(every expression test is written to fail, so promtool prints what it got).

    from tests.support.corpus import corpus, judge_python, judge_promql, score
    cases = corpus("small")
    scores = score(cases, judge_python(cases))
"""

from __future__ import annotations

import functools
import json
import math
import multiprocessing
import re
import subprocess
import tempfile
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from kvdoctor.exporter.adapters import ADAPTERS, EngineAdapter, MetricMap, normalise_page
from kvdoctor.exporter.adapters.base import PERCENT, Ratio
from kvdoctor.exporter.adapters.vllm import kv_capacity_tokens
from kvdoctor.exporter.replay import AdapterNormaliser
from kvdoctor.rules import promql, rule_file
from kvdoctor.rules.context import Context
from kvdoctor.rules.diagnosis import diagnose
from kvdoctor.rules.thresholds import Thresholds
from kvdoctor.rules.verdicts import VERDICTS, verdict_code
from kvdoctor.signals.trace import format_raw_captures, parse_trace
from kvdoctor.signals.vocabulary import (
    GENERATION_SECONDS,
    INTER_TOKEN_LATENCY,
    KV_TRANSFER_BYTES,
    PREFIX_CACHE_HITS,
    PREFIX_CACHE_HITS_BY_TIER,
    PREFIX_CACHE_QUERIES,
    PROMPT_TOKENS,
    SIGNALS,
    SOURCE_UP,
    TIME_TO_FIRST_TOKEN,
    Kind,
)
from kvdoctor.signals.window import SeriesKey, Window, format_series
from tests.support.scenarios import (
    BASE,
    HOST_TIER_HITS,
    IDLE_ENGINE,
    PREFILL_BURST,
    PREFILL_DELAYS,
    THRASHING,
    Gpu,
    Latency,
    Noisy,
    RampAtEnd,
    Scenario,
    decode_series,
    encode_series,
)

ROOT = Path(__file__).resolve().parents[2]

UNKNOWN = "unknown"  # a window too short to judge
MIN_SAMPLES = 3  # fewer samples than this in the window: the truth is ``unknown``
# Every label, in the matrix's order: the tree's verdicts, then ``unknown`` (unless the tree has it).
LABELS: tuple[str, ...] = (*VERDICTS, *((UNKNOWN,) if UNKNOWN not in VERDICTS else ()))
QUIET = ("idle", "healthy")  # verdicts that say nothing is slow
SLOW = tuple(v for v in LABELS if v not in (*QUIET, UNKNOWN))

SIZES = ("small", "full")
ENGINES = ("vllm_v1", "vllm_v0", "sglang", "trtllm", "tgi", "llamacpp")
ADAPTER_OF = {
    "vllm_v1": "vllm",
    "vllm_v0": "vllm",
    "sglang": "sglang",
    "trtllm": "trtllm",
    "tgi": "tgi",
    "llamacpp": "llamacpp",
}
MISSING = ("", "gpu", "itl", "ttft")  # "": every family there
MISSING_WORDS = {"": "all signals", "gpu": "no GPU counters", "itl": "no ITL histogram", "ttft": "no TTFT"}
INTERVALS = (1.0, 15.0)
KINDS = ("alone", "queue_steady", "queue_growing", "change", "recorded")
# The causes that change into one another (every ordered pair): the slow ones and healthy.
CHANGE_CAUSES = ("healthy", *SLOW)
# The issue's own cause changes (issue 24, "Why" 3): in the small corpus whatever else is left out.
ISSUE_CHANGES = (
    ("kv_tier_miss", "host_overhead_bound"),
    ("kv_thrashing", "memory_bandwidth_bound"),
    ("kv_capacity_pressure", "kv_tier_miss"),
)
LAG_TARGET_SECONDS = 25.0  # at 1 s sampling: one state window (15 s) plus a scrape, with margin
# Seconds after a switch over which the verdict is followed (a settled verdict must hold to the end).
OBSERVE_SECONDS = {1.0: 90.0, 15.0: 240.0}


def thresholds_for(step: float) -> Thresholds:
    """The thresholds the rules for this scrape interval are compiled with (the Python half uses the same)."""
    return promql.rule_thresholds(None, step)


# ------------------------------------------------------------------------------ the causes

# ITL p95 ~0.165 s and a mean of ~0.116 s (llama.cpp shows only the mean) against the 100 ms SLO
_SLOW_ITL = Latency(base=0.11, mix=((0.9, 1.0), (0.1, 1.5)))
_SLOW_TTFT = Latency(base=1.6, mix=((0.8, 1.0), (0.2, 1.6)))  # p95 ~2.6 s: over the 2 s TTFT threshold


def _cause(name: str, truth: str, why: str, **changes: object) -> Scenario:
    return BASE.but(name=name, expected=truth, why=why, **changes)


ALONE: dict[str, Scenario] = {
    s.expected: s
    for s in (
        _cause("healthy", "healthy", "steady traffic, ITL p95 ~40 ms against a 100 ms SLO, nobody waits"),
        _cause(
            "idle",
            "idle",
            "no tokens, nothing running; KV usage left high by earlier traffic",
            **IDLE_ENGINE,
        ),
        _cause(
            "kv_thrashing",
            "kv_thrashing",
            "3 preemptions a minute, KV usage oscillating at the ceiling, ITL jumps 4x above 95% usage",
            **THRASHING,
        ),
        _cause(
            "kv_tier_miss",
            "kv_tier_miss",
            "prefix hits served from the host tier (2.5 GB/s of KV into the GPU), pool at 60%, ITL over the SLO",
            latency=_SLOW_ITL,
            **HOST_TIER_HITS,
            gpus=(Gpu(dram=0.5, sm=0.4, pcie_rx=2.6e9),),
        ),
        _cause(
            "kv_capacity_pressure",
            "kv_capacity_pressure",
            "KV pool at 95%, no preemption; admission waits, so TTFT p95 ~2.6 s while decode is on time",
            kv_usage=0.95,
            ttft=_SLOW_TTFT,
        ),
        _cause(
            "request_queueing",
            "request_queueing",
            "20 requests wait at the sequence limit (KV at 40%), TTFT p95 ~2.6 s, decode on time",
            kv_usage=0.4,
            waiting=20,
            ttft=_SLOW_TTFT,
        ),
        _cause(
            "memory_bandwidth_bound",
            "memory_bandwidth_bound",
            "ITL over the SLO, DRAM bandwidth 88% busy, SM 55%",
            kv_usage=0.6,
            latency=_SLOW_ITL,
            gpus=(Gpu(dram=0.88, sm=0.55),),
        ),
        _cause(
            "compute_bound",
            "compute_bound",
            "heavy prefill (60k prompt tokens/s), SM 93% busy, DRAM 50%, ITL over the SLO",
            latency=Latency(base=0.09, mix=PREFILL_DELAYS),
            **PREFILL_BURST,
        ),
        _cause(
            "host_overhead_bound",
            "host_overhead_bound",
            "ITL over the SLO while the GPU is mostly idle (DRAM 25%, SM 30%): the host loop is slow",
            latency=_SLOW_ITL,
            gpus=(Gpu(dram=0.25, sm=0.3),),
        ),
    )
}


def _with_queue(s: Scenario, growing: bool, window: float) -> tuple[Scenario, str]:
    """``s`` with a queue behind it, and the truth: the cause itself (the queue is its consequence),
    except on an engine that is not slow, where a growing queue is ``request_queueing`` and a small
    steady one that delays nobody is ``healthy``."""
    truth = s.expected
    if growing:
        queue: dict[str, object] = dict(
            waiting=RampAtEnd(1.0, 40.0, window),
            ttft=Latency(base=0.4, mix=((0.8, 1.0), (0.2, 1.5)), over_time=RampAtEnd(1.0, 6.0, window)),
        )
        if truth == "healthy":
            truth = "request_queueing"
        return s.but(**queue), truth
    if truth == "healthy":  # issue 24's harmless queue: ITL 30 ms, TTFT p95 0.35 s, one waiting
        harmless = Latency(base=0.03, mix=((0.95, 1.0), (0.05, 1.2)))
        return s.but(waiting=1, latency=harmless, ttft=Latency(base=0.25, mix=((0.9, 1.0), (0.1, 1.4)))), truth
    return s.but(waiting=max(8.0, float(s.waiting)), ttft=_SLOW_TTFT), truth  # type: ignore[arg-type]


def _noisy(s: Scenario, seed: int) -> Scenario:
    """``s`` with seeded noise: rates +-10%, gauges +-3 points (KV usage +-1), latencies +-12% per scrape."""

    def jitter(value: object, spread: float, k: int, relative: bool = True) -> object:
        if not isinstance(value, (int, float)) or value == 0:
            return value
        return Noisy(float(value), spread * float(value) if relative else spread, seed=seed + k)

    gpus = tuple(
        replace(
            g,
            dram=jitter(g.dram, 0.03, 10 + 3 * i, relative=False),
            sm=jitter(g.sm, 0.03, 11 + 3 * i, relative=False),
            pcie_rx=jitter(g.pcie_rx, 0.1, 12 + 3 * i),
        )
        for i, g in enumerate(s.gpus)
    )
    kv = s.kv_usage
    if isinstance(kv, (int, float)) and 0 < kv <= 0.97:
        kv = Noisy(float(kv), 0.01, seed=seed + 5)
    ttft = s.ttft
    if ttft is not None and ttft.over_time is None:
        ttft = replace(ttft, over_time=Noisy(1.0, 0.12, seed=seed + 7))
    latency = s.latency if s.latency.over_time is not None else replace(s.latency, over_time=Noisy(1.0, 0.12, seed))
    return s.but(
        generation_tokens_per_second=jitter(s.generation_tokens_per_second, 0.1, 1),
        prompt_tokens_per_second=jitter(s.prompt_tokens_per_second, 0.1, 2),
        requests_per_second=jitter(s.requests_per_second, 0.1, 3),
        running=jitter(s.running, 0.1, 4),
        waiting=jitter(s.waiting, 0.15, 6),
        kv_usage=kv,
        latency=latency,
        ttft=ttft,
        gpus=gpus,
    )


def _for_engine(s: Scenario, engine: str) -> Scenario:
    """The scenario as this engine runs it: its labels, and llama.cpp's latency measure (the mean
    time per token; it has no ITL histogram) -- everything else the adapter round trip decides."""
    s = s.but(engine=ADAPTER_OF[engine], pod=f"{engine.replace('_', '-')}-0")
    if engine == "llamacpp":
        s = s.but(itl_histogram=False, mean_time_per_token=True, ttft=None, prefix_queries_per_second=None)
    return s


# ------------------------------------------------------------------------- engine expositions


def _signal_of(name: str) -> tuple[str, str]:
    """(signal, histogram suffix or "") of a canonical sample name."""
    for suffix in ("_bucket", "_sum", "_count"):
        base = name[: -len(suffix)]
        if name.endswith(suffix) and base in SIGNALS and SIGNALS[base].kind is Kind.HISTOGRAM:
            return base, suffix
    return name, ""


_ENGINE_SIGNALS = frozenset(m.target for adapter in ADAPTERS.values() for m in adapter.maps)


def from_engine(name: str) -> bool:
    """A canonical sample an engine adapter produces (not the GPU collector's, not the exporter's own)."""
    return _signal_of(name)[0] in _ENGINE_SIGNALS


def is_counter(name: str) -> bool:
    """A canonical sample that only grows (a counter, or a histogram's bucket, sum or count)."""
    signal, suffix = _signal_of(name)
    return bool(suffix) or name.endswith("_total") or (signal in SIGNALS and SIGNALS[signal].kind is Kind.COUNTER)


# Signals an engine generation never publishes, beyond what its adapter's table lacks.
_NOT_PUBLISHED: dict[str, tuple[str, ...]] = {
    "vllm_v1": tuple(ADAPTERS["vllm"].legacy_only),  # V0's swap gauges and hit-rate gauge
    "vllm_v0": (PREFIX_CACHE_HITS_BY_TIER, KV_TRANSFER_BYTES),  # no KV connector metrics before V1
    "llamacpp": (PREFIX_CACHE_HITS, PREFIX_CACHE_QUERIES, PREFIX_CACHE_HITS_BY_TIER),
}
_OLDEST_NAMES = ("vllm_v0",)  # generations that publish a renamed family under its old name
# Where two canonical signals come from one engine family (SGLang's prompt tokens are its prefix
# queries too; its per-tier cached tokens add up to its hits), the one rendered.
_FAMILY_OWNER = (PROMPT_TOKENS, PREFIX_CACHE_HITS_BY_TIER)
TOKENS_PER_BLOCK = 16


@dataclass(frozen=True)
class _Native:
    name: str
    labels: tuple[tuple[str, str], ...]
    scale: float  # engine value = canonical value x scale
    partner: tuple[str, tuple[tuple[str, str], ...], float] | None = None  # a constant sample beside it


def _row_for(adapter: EngineAdapter, signal: str, labels: Mapping[str, str]) -> MetricMap | None:
    """The first unconditional row of the table that yields ``signal`` with these labels."""
    loose = None
    for m in adapter.maps:
        if m.target != signal or m.requires or not any(not isinstance(s, Ratio) for s in m.sources):
            continue
        const = dict(m.const_labels)
        if all(labels.get(k) == v for k, v in const.items()):
            return m
        # KV moved from a tier the engine names differently (vLLM's "cpu" for the host): the direction decides
        if loose is None and signal == KV_TRANSFER_BYTES and labels.get("direction") == const.get("direction"):
            loose = m
    return loose


def _native(adapter: EngineAdapter, engine: str, key: SeriesKey) -> _Native | None:
    """Where the engine publishes canonical series ``key``: its family, labels and scale (None: nowhere)."""
    name, label_tuple = key
    labels = dict(label_tuple)
    signal, suffix = _signal_of(name)
    if signal in _NOT_PUBLISHED.get(engine, ()):
        return None
    m = _row_for(adapter, signal, labels)
    if m is None:
        return None
    plain = [s for s in m.source_list() if not isinstance(s, Ratio)]
    source, match = plain[-1] if engine in _OLDEST_NAMES else plain[0]
    raw = {k: labels[k] for k in adapter.keep_labels if k in labels}
    for src, dst in {**adapter.engine_labels, **m.rename_labels}.items():
        if dst in labels and dst not in m.const_labels:
            raw[src] = labels[dst]
    raw.update(match)
    if suffix == "_bucket":
        raw["le"] = labels["le"]
    scale = 1.0 / m.scale
    if m.unit == PERCENT:
        scale *= 100.0
    family = source + suffix if suffix and not source.endswith(suffix) else source
    if m.times is not None:  # e.g. TensorRT-LLM's KV blocks x tokens per block
        partner = (m.times[0], tuple(sorted({**raw, **m.times[1]}.items())), float(TOKENS_PER_BLOCK))
        return _Native(family, tuple(sorted(raw.items())), scale / TOKENS_PER_BLOCK, partner)
    if m.value is not None:
        if m.value is kv_capacity_tokens:  # vLLM's cache_config_info: the capacity lives in its labels
            return _Native(family, tuple(sorted(raw.items())), math.nan)
        if m.value(raw, 1.0) != 1.0:
            return None
    return _Native(family, tuple(sorted(raw.items())), scale)


def render_native(series: Mapping[SeriesKey, np.ndarray], engine: str) -> dict[SeriesKey, np.ndarray]:
    """The canonical engine series as this engine's own families (the series of other sources --
    the GPU collector, the exporter's own -- are left out here: ``through_adapter`` passes them on)."""
    adapter = ADAPTERS[ADAPTER_OF[engine]]
    owners: dict[str, str] = {}
    placed: list[tuple[str, _Native, np.ndarray]] = []
    for key, values in series.items():
        if not from_engine(key[0]):
            continue
        native = _native(adapter, engine, key)
        if native is None:
            continue
        signal = _signal_of(key[0])[0]
        placed.append((signal, native, values))
        current = owners.get(native.name)
        if current is None or (signal in _FAMILY_OWNER and current not in _FAMILY_OWNER):
            owners[native.name] = signal
    out: dict[SeriesKey, np.ndarray] = {}
    for signal, native, values in placed:
        if owners[native.name] != signal:
            continue
        if math.isnan(native.scale):  # vLLM's capacity: an info gauge whose labels carry the size
            size = float(np.nanmax(values))
            labels = dict(native.labels)
            if engine in _OLDEST_NAMES:
                labels.update(num_gpu_blocks=f"{size / TOKENS_PER_BLOCK:g}", block_size=str(TOKENS_PER_BLOCK))
            else:
                labels["kv_cache_size_tokens"] = f"{size:g}"
            out[(native.name, tuple(sorted(labels.items())))] = np.where(np.isnan(values), np.nan, 1.0)
            continue
        out[(native.name, native.labels)] = values * native.scale
        if native.partner is not None:
            name, labels, value = native.partner
            out[(name, labels)] = np.where(np.isnan(values), np.nan, value)
    return out


def through_adapter(series: Mapping[SeriesKey, np.ndarray], engine: str, pod: str) -> dict[SeriesKey, np.ndarray]:
    """The canonical series as the exporter reads them from this engine: rendered into its
    families, then normalised back scrape by scrape by the real adapter; other sources' series unchanged."""
    adapter = ADAPTERS[ADAPTER_OF[engine]]
    native = render_native(series, engine)
    n = len(next(iter(series.values()))) if series else 0
    keys = list(native)
    matrix = np.vstack([native[k] for k in keys]) if keys else np.empty((0, n))
    out: dict[SeriesKey, np.ndarray] = {}
    extra = {"pod": pod}
    for i in range(n):
        column = matrix[:, i]
        raw = [(k[0], dict(k[1]), float(v)) for k, v in zip(keys, column, strict=True) if not math.isnan(v)]
        for key, value in normalise_page(adapter, raw, extra).items():
            row = out.get(key)
            if row is None:
                row = out[key] = np.full(n, np.nan)
            row[i] = value
    out.update({k: v for k, v in series.items() if not from_engine(k[0])})
    return out


# ------------------------------------------------------------------------------- splicing


def splice(before: Mapping[SeriesKey, np.ndarray], after: Mapping[SeriesKey, np.ndarray], at: int) -> dict:
    """``before``'s samples up to index ``at``, ``after``'s from there: gauges switch, counters go on
    from where they were by ``after``'s increases (a counter only one side has stays flat on the
    other: it exists but does not move; a gauge only one side has is absent on the other)."""
    out: dict[SeriesKey, np.ndarray] = {}
    for key in {**before, **after}:
        a, b = before.get(key), after.get(key)
        counter = is_counter(key[0])
        if a is not None and b is not None:
            v = a.copy()
            v[at:] = (a[at - 1] + (b[at:] - b[at - 1])) if counter else b[at:]
        elif a is not None:
            v = a.copy()
            v[at:] = a[at - 1] if counter else np.nan
        else:
            assert b is not None
            v = b.copy()
            v[:at] = b[at - 1] if counter else np.nan
        out[key] = np.round(v, 6) if counter else v
    return out


# ------------------------------------------------------------------------------------ cases


@dataclass(frozen=True)
class Case:
    """One labelled case. ``scenario`` (and ``before`` for a change of cause) give the canonical
    series; ``recorded`` names a recording of the repository instead."""

    kind: str
    cause: str  # the scenario's cause (for a change: the one after the switch)
    truth: str
    engine: str = "vllm_v1"
    missing: str = ""
    noise: bool = False
    step: float = 1.0
    scenario: Scenario | None = None
    before: Scenario | None = None  # a change of cause: the cause until ``switch_at``
    previous: str = ""
    switch_at: float | None = None
    samples: int | None = None  # only the last this many scrapes (a window too short to judge)
    recorded: str = ""  # a recording's path under the repository
    why: str = ""

    @property
    def id(self) -> str:
        cause = f"{self.previous}->{self.cause}" if self.previous else self.cause
        if self.recorded:
            return f"recorded/{self.recorded}"
        parts = [self.kind, cause, self.engine, f"{self.step:g}s"]
        parts += ["noisy"] if self.noise else []
        parts += [f"no-{self.missing}"] if self.missing else []
        parts += [f"last-{self.samples}"] if self.samples else []
        return "/".join(parts)

    @property
    def thresholds(self) -> Thresholds:
        return thresholds_for(self.step)

    @property
    def window_seconds(self) -> float:
        return self.thresholds.window_seconds

    @property
    def end(self) -> float:
        return float(self.times[-1])

    @property
    def times(self) -> np.ndarray:
        return _times(self)

    @property
    def reference(self) -> bool:
        """On vLLM V1 (every engine family there) with every signal family: the tree can tell."""
        return self.engine == "vllm_v1" and not self.missing and self.samples is None

    def eval_times(self) -> list[float]:
        """The instants judged: the end; for a change, every scrape from the switch to the end."""
        if self.switch_at is None:
            return [self.end]
        t = self.times
        return [float(x) for x in t[t >= self.switch_at]]

    def encoded(self) -> dict[SeriesKey, str]:
        return _encoded(self)

    def full_window(self) -> Window:
        """Every sample, decoded from the notation promtool reads; scrapes with no sample left out."""
        return _full_window(self)

    def window_at(self, t: float) -> Window:
        """The window the tree judges at ``t`` (both ends included, like a PromQL range)."""
        return self.full_window().slice(t - self.window_seconds, t)


def _duration(step: float, before: bool) -> float:
    """A static case: the window and a minute, in whole minutes; a change: A for a window and a half, then B."""
    window = thresholds_for(step).window_seconds
    if before:
        return math.ceil((1.5 * window) / step) * step + OBSERVE_SECONDS[step]
    return math.ceil((window + 60.0) / 60.0) * 60.0


@functools.cache
def _times(case: Case) -> np.ndarray:
    if case.recorded:
        return np.arange(len(next(iter(_recorded_series(case.recorded).values())))).astype(float)
    assert case.scenario is not None
    return case.scenario.times


@functools.cache
def _series(case: Case) -> dict[SeriesKey, np.ndarray]:
    if case.recorded:
        return dict(_recorded_series(case.recorded))
    assert case.scenario is not None
    series = case.scenario.series()
    if case.before is not None and case.switch_at is not None:
        at = int(np.searchsorted(case.scenario.times, case.switch_at))
        series = splice(case.before.series(), series, at)
    drop = {
        "": (),
        "gpu": ("kvdoctor_gpu_",),
        "itl": (INTER_TOKEN_LATENCY, GENERATION_SECONDS),
        "ttft": (TIME_TO_FIRST_TOKEN,),
    }[case.missing]
    series = {k: v for k, v in series.items() if not k[0].startswith(drop)} if drop else series
    series = through_adapter(series, case.engine, case.scenario.pod)
    if case.samples is not None:
        keep = np.zeros(len(case.scenario.times), dtype=bool)
        keep[-case.samples :] = True
        series = {k: np.where(keep, v, np.nan) for k, v in series.items()}
    return series


@functools.cache
def _encoded(case: Case) -> dict[SeriesKey, str]:
    return {key: encode_series(values) for key, values in _series(case).items() if not np.isnan(values).all()}


@functools.cache
def _full_window(case: Case) -> Window:
    t = case.times
    series = {key: decode_series(text, len(t)) for key, text in _encoded(case).items()}
    present = np.zeros(len(t), dtype=bool)
    for values in series.values():
        present |= ~np.isnan(values)
    return Window(t[present], {k: v[present] for k, v in series.items()})


# --------------------------------------------------------------------------- recordings

# (path, truth, why): the repository's recorded windows. A single page is one scrape: unknown.
RECORDINGS: tuple[tuple[str, str, str], ...] = (
    (
        "tests/fixtures/traces/simulator-kv-thrashing.om",
        "kv_thrashing",
        "30 s recorded by an exporter scraping the simulated vLLM in its kv_thrashing scenario",
    ),
    (
        "tests/fixtures/vllm-0.32-cpu/fill-sequence",
        "kv_capacity_pressure",
        "16 scrapes of a real vLLM 0.32: KV usage 0.97 in 3 s, the queue grows to 13, no preemption yet",
    ),
    ("tests/fixtures/vllm-0.32-cpu/big-model-after-long-decode.txt", UNKNOWN, "one real vLLM page"),
    ("tests/fixtures/engines/sglang/current.txt", UNKNOWN, "one real SGLang page"),
    ("tests/fixtures/engines/trtllm/serve-current.txt", UNKNOWN, "one real TensorRT-LLM page"),
    ("tests/fixtures/engines/tgi/tgi-3.txt", UNKNOWN, "one real TGI page"),
    ("tests/fixtures/llamacpp-11434/metrics-busy.txt", UNKNOWN, "one real llama.cpp page"),
)
_T0 = 1_700_000_000


@functools.cache
def _recorded_series(path: str) -> dict[SeriesKey, np.ndarray]:
    """A recording as canonical series on a 1 s grid from 0 (each sample at its nearest second)."""
    source = ROOT / path
    if source.is_dir():
        pages = sorted(source.glob("*.txt"))
        text = format_raw_captures((_T0 + i, p.read_text()) for i, p in enumerate(pages))
    elif source.suffix == ".om":
        text = source.read_text()
    else:
        text = format_raw_captures([(_T0, source.read_text())])
    window = parse_trace(text, AdapterNormaliser(), source=path).window
    offsets = np.round(window.timestamps - window.timestamps[0]).astype(int)
    n = int(offsets[-1]) + 1 if len(offsets) else 0
    out: dict[SeriesKey, np.ndarray] = {}
    for key, values in window.series.items():
        row = np.full(n, np.nan)
        row[offsets] = values  # a later sample rounding onto the same second wins
        labels = dict(key[1])
        labels.setdefault("pod", "recorded-0")
        if key[0].startswith("kvdoctor_gpu_") or "engine" in labels:
            out[(key[0], tuple(sorted(labels.items())))] = row
    # the exporter that recorded it publishes its own series at every scrape (a raw engine capture has none)
    up = np.full(n, np.nan)
    up[offsets] = 1.0
    out.setdefault((SOURCE_UP, (("pod", "recorded-0"), ("source", "engine"))), up)
    return out


# ------------------------------------------------------------------------------ the corpus


def _seed(text: str) -> int:
    return zlib.crc32(text.encode()) % 100_000


def _scenario(base: Scenario, *, step: float, engine: str, noise: bool, seed_of: str, duration: float) -> Scenario:
    s = _for_engine(base, engine).but(step=step, duration=duration)
    return _noisy(s, _seed(seed_of)) if noise else s


def static_case(
    cause: str, kind: str = "alone", engine: str = "vllm_v1", missing: str = "", noise: bool = False, step: float = 1.0
) -> Case:
    """``cause`` alone or with a queue (steady or growing), in one of the corpus's variants."""
    duration = _duration(step, before=False)
    base, truth = ALONE[cause], cause
    if kind != "alone":
        base, truth = _with_queue(base, kind == "queue_growing", thresholds_for(step).window_seconds)
    key = f"{kind}/{cause}/{engine}/{step:g}/{missing}"
    s = _scenario(base, step=step, engine=engine, noise=noise, seed_of=key, duration=duration)
    return Case(kind, cause, truth, engine, missing, noise, step, scenario=s, why=base.why)


def short_case(cause: str, samples: int, engine: str = "vllm_v1", step: float = 1.0) -> Case:
    """``cause`` seen through only its last ``samples`` scrapes: too short to judge."""
    s = _scenario(ALONE[cause], step=step, engine=engine, noise=False, seed_of="", duration=_duration(step, False))
    why = f"{cause}, but only the last {samples} scrape(s): too few to judge"
    return Case("alone", cause, UNKNOWN, engine, step=step, scenario=s, samples=samples, why=why)


def change_case(
    first: str, then: str, engine: str = "vllm_v1", missing: str = "", noise: bool = False, step: float = 1.0
) -> Case:
    """``first`` for a window and a half, then ``then`` (the truth) for ``OBSERVE_SECONDS``."""
    duration = _duration(step, before=True)
    switch = duration - OBSERVE_SECONDS[step]
    key = f"change/{first}->{then}/{engine}/{step:g}/{missing}"
    a = _scenario(ALONE[first], step=step, engine=engine, noise=noise, seed_of=key + "/a", duration=duration)
    b = _scenario(ALONE[then], step=step, engine=engine, noise=noise, seed_of=key + "/b", duration=duration)
    why = f"{first} until {OBSERVE_SECONDS[step]:g} s before the end, then {then}"
    return Case("change", then, then, engine, missing, noise, step, b, a, first, switch, why=why)


def recorded_cases() -> list[Case]:
    return [Case("recorded", truth, truth, "recorded", recorded=path, why=why) for path, truth, why in RECORDINGS]


def _covers(engine: str, missing: str) -> bool:
    """Whether dropping ``missing`` changes anything on this engine (llama.cpp has no ITL
    histogram or TTFT, TGI no TTFT: those variants are the plain case again)."""
    lacks = {"llamacpp": ("itl", "ttft"), "tgi": ("ttft",)}
    return missing not in lacks.get(engine, ())


def _queued_causes() -> list[str]:
    return [c for c in ALONE if c != "idle"]


def corpus(size: str = "small") -> list[Case]:
    """The labelled cases, in a fixed order; ``small`` runs in CI, ``full`` is every combination."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES}, got {size!r}")
    causes = list(ALONE)
    cases: list[Case] = []
    if size == "small":
        cases += [static_case(c) for c in causes]
        cases += [short_case("memory_bandwidth_bound", 2), short_case("healthy", 1)]
        cases += [static_case(c, kind) for kind in ("queue_steady", "queue_growing") for c in _queued_causes()]
        ring = [(a, CHANGE_CAUSES[(i + 1) % len(CHANGE_CAUSES)]) for i, a in enumerate(CHANGE_CAUSES)]
        ring += [p for p in ISSUE_CHANGES if p not in ring]
        cases += [change_case(a, b) for a, b in ring]
        cases += [static_case(c, noise=True) for c in causes]
        cases += [static_case(c, missing=m) for m in MISSING[1:] for c in causes]
        cases += [static_case(c, step=15.0) for c in causes]
        cases += [static_case(c, engine=e) for e in ENGINES[1:] for c in causes]
        cases += recorded_cases()
        return cases
    kinds = ("alone", "queue_steady", "queue_growing")
    for step in INTERVALS:
        for engine in ENGINES:
            for missing in MISSING:
                if not _covers(engine, missing):
                    continue
                for noise in (False, True):
                    for kind in kinds:
                        for c in causes if kind == "alone" else _queued_causes():
                            cases.append(static_case(c, kind, engine, missing, noise, step))
        for engine in ENGINES:
            cases += [short_case("memory_bandwidth_bound", 2, engine, step), short_case("healthy", 1, engine, step)]
    pairs = [(a, b) for a in CHANGE_CAUSES for b in CHANGE_CAUSES if a != b]
    for step in INTERVALS:
        for missing in MISSING:
            for noise in (False, True):
                cases += [change_case(a, b, "vllm_v1", missing, noise, step) for a, b in pairs]
    for engine in ENGINES[1:]:
        cases += [change_case(a, b, engine) for a, b in pairs]
    cases += recorded_cases()
    return cases


# ------------------------------------------------------------------------------ judging

Verdicts = dict[str, dict[float, str]]  # case id -> instant -> verdict


def python_verdict(case: Case, t: float) -> str:
    """The Python tree's verdict on the window the case is judged on at ``t``."""
    window = case.window_at(t)
    try:
        return diagnose(window, Context(), case.thresholds).verdict
    except Exception:
        if len(window) < MIN_SAMPLES:  # a tree that refuses a window too short to judge
            return UNKNOWN
        raise


def _judge_some(cases: Sequence[Case]) -> Verdicts:
    return {c.id: {t: python_verdict(c, t) for t in c.eval_times()} for c in cases}


def judge_python(cases: Sequence[Case], jobs: int = 1) -> Verdicts:
    """The Python tree's verdict at every instant judged, in ``jobs`` processes."""
    if jobs <= 1 or len(cases) < 50:
        return _judge_some(cases)
    chunks = [cases[i :: jobs * 4] for i in range(jobs * 4)]
    verdicts: Verdicts = {}
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("fork")) as pool:
        for part in pool.map(_judge_some, chunks):
            verdicts.update(part)
    return {c.id: verdicts[c.id] for c in cases}


# kvdoctor:verdict covers the active engines of a window that can be judged: no sample is the tree's
# idle where the window holds enough scrapes (kvdoctor:judgeable, 0 below), else unknown (-1 below)
_NOT_JUDGEABLE = -1
_CODE_TO_VERDICT = {verdict_code(v): v for v in VERDICTS} | {_NOT_JUDGEABLE: "unknown"}
_NO_VERDICT = "idle"
_FAILED = re.compile(r"time: ([0-9a-z.]+),\s*\n\s*exp: [^\n]*\n\s*got: ([^\n]*)")
_SAMPLE = re.compile(r"\{([^}]*)\} (\S+)")


def _prom_seconds(text: str) -> float:
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)", text):
        total += float(number) * {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}[unit]
    return total


def _test_group(index: int, case: Case) -> dict:
    judged = f"kvdoctor:verdict or on() (group({promql.JUDGEABLE_RECORD}) * 0) or on() vector({_NOT_JUDGEABLE})"
    expr = f'label_replace({judged}, "case", "{index}", "", "")'
    return {
        "name": case.id,
        "interval": f"{case.step:g}s",
        "input_series": [{"series": format_series(k), "values": v} for k, v in sorted(case.encoded().items())],
        # exp_samples empty and a sample always there: every test fails, and promtool prints what it got
        "promql_expr_test": [{"expr": expr, "eval_time": f"{t:g}s", "exp_samples": []} for t in case.eval_times()],
    }


def _evaluation_interval(case: Case) -> float:
    """A change is followed scrape by scrape; a static case is judged once, at its end (a whole
    minute: the rules read raw ranges only, so evaluating them less often changes nothing there;
    a recording ending elsewhere is evaluated at every scrape)."""
    return 60.0 if case.switch_at is None and case.end % 60.0 == 0 else case.step


@functools.cache
def rules_file(step: float, directory: str) -> Path:
    """The rule file for this scrape interval, generated from the current code."""
    path = Path(directory) / f"rules-{step:g}s.yaml"
    path.write_text(rule_file.render_rules_yaml(scrape_interval_seconds=step))
    return path


def parse_promtool(output: str) -> dict[int, dict[float, str]]:
    """promtool's failure report -> case index -> instant -> verdict (no sample: the tree's idle)."""
    out: dict[int, dict[float, str]] = defaultdict(dict)
    for when, got in _FAILED.findall(output):
        index, verdict = None, _NO_VERDICT
        for labels, value in _SAMPLE.findall(got):
            m = re.search(r'case="(\d+)"', labels)
            if m:
                index = int(m.group(1))
            code = round(float(value))
            if code:
                verdict = _CODE_TO_VERDICT.get(code, f"code {code}")
                named = re.search(r'verdict="([^"]*)"', labels)
                if named and named.group(1) != verdict:  # the label and the code must name one verdict
                    verdict = f"{named.group(1)} labelled, code {code}"
        if index is not None:
            out[index][_prom_seconds(when)] = verdict
    return out


def judge_promql(
    cases: Sequence[Case], promtool: str, jobs: int = 2, chunk: int = 40, progress: Callable[[str], None] | None = None
) -> Verdicts:
    """Every case through ``promtool test rules`` with the rules for its interval: the
    ``kvdoctor:verdict`` the rules record at each instant judged."""
    verdicts: Verdicts = {}
    with tempfile.TemporaryDirectory(prefix="kvdoctor-corpus-") as tmp:
        batches: list[tuple[Path, list[tuple[int, Case]]]] = []
        groups: dict[tuple[float, float], list[tuple[int, Case]]] = defaultdict(list)
        for i, case in enumerate(cases):
            groups[(case.step, _evaluation_interval(case))].append((i, case))
        for (step, every), members in sorted(groups.items()):
            rules = rules_file(step, tmp)
            for start in range(0, len(members), chunk):
                part = members[start : start + chunk]
                path = Path(tmp) / f"cases-{step:g}s-{every:g}s-{start}.test.json"
                doc = {
                    "rule_files": [str(rules)],
                    "evaluation_interval": f"{every:g}s",
                    "tests": [_test_group(i, c) for i, c in part],
                }
                path.write_text(json.dumps(doc))
                batches.append((path, part))

        def run(batch: tuple[Path, list[tuple[int, Case]]]) -> dict[int, dict[float, str]]:
            path, part = batch
            result = subprocess.run(
                [promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=1800
            )
            got = parse_promtool(result.stdout + result.stderr)
            for i, case in part:
                if set(got.get(i, {})) != set(case.eval_times()):
                    report = (result.stdout + result.stderr)[-3000:]
                    raise RuntimeError(f"promtool gave no verdict for {case.id} at every instant:\n{report}")
            if progress is not None:
                progress(f"promtool: {path.name} ({len(part)} cases)")
            return got

        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            for (_, part), got in zip(batches, pool.map(run, batches), strict=True):
                for i, case in part:
                    verdicts[case.id] = dict(sorted(got[i].items()))
    return verdicts


# ------------------------------------------------------------------------------ scoring


@dataclass
class Scores:
    """What a judge made of the corpus: the confusion matrix and every figure taken from it."""

    matrix: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))  # truth -> verdict -> n
    wrong: list[tuple[str, str, str]] = field(default_factory=list)  # (case id, truth, verdict)
    by_missing: dict[str, dict[str, list[int]]] = field(default_factory=lambda: defaultdict(dict))
    by_engine: dict[str, dict[str, list[int]]] = field(default_factory=lambda: defaultdict(dict))
    by_step: dict[str, dict[str, list[int]]] = field(default_factory=lambda: defaultdict(dict))
    lags: dict[str, float | None] = field(default_factory=dict)  # change case id -> seconds (None: never settled)
    lag_step: dict[str, float] = field(default_factory=dict)
    lag_case: dict[str, Case] = field(default_factory=dict)
    # change case id -> the verdicts after the switch other than the new cause
    interim: dict[str, Counter[str]] = field(default_factory=dict)

    @property
    def cases(self) -> int:
        return sum(sum(row.values()) for row in self.matrix.values())

    @property
    def correct(self) -> int:
        return sum(row[truth] for truth, row in self.matrix.items())

    def accuracy(self) -> dict[str, float]:
        """Per truth: the share of its cases the verdict got right."""
        return {t: self.matrix[t][t] / sum(self.matrix[t].values()) for t in LABELS if self.matrix.get(t)}

    @property
    def false_healthy(self) -> list[tuple[str, str, str]]:
        """Slow causes the verdict called healthy or idle."""
        return [w for w in self.wrong if w[1] in SLOW and w[2] in QUIET]

    def worst_lag(self, step: float, reference: bool = False) -> tuple[float | None, str, int, int]:
        """(worst settled lag, its case, how many changes settled, how many never did) at ``step``;
        ``reference``: only the changes on vLLM V1 with every signal family there (noisy or not),
        where the tree can tell every cause apart and the lag target applies."""
        lags = {
            k: v
            for k, v in self.lags.items()
            if self.lag_step[k] == step and (not reference or self.lag_case[k].reference)
        }
        settled = {k: v for k, v in lags.items() if v is not None}
        if not settled:
            return None, "", 0, len(lags)
        worst = max(settled, key=lambda k: (settled[k], k))
        return settled[worst], worst, len(settled), len(lags) - len(settled)


def _tally(table: dict[str, dict[str, list[int]]], column: str, truth: str, ok: bool) -> None:
    cell = table[truth].setdefault(column, [0, 0])
    cell[0] += ok
    cell[1] += 1


def lag(case: Case, verdicts: Mapping[float, str]) -> float | None:
    """Seconds from the switch until the verdict is the new cause and stays it (None: not at the end)."""
    assert case.switch_at is not None
    times = sorted(verdicts)
    if not times or verdicts[times[-1]] != case.truth:
        return None
    first = times[-1]
    for t in reversed(times):
        if verdicts[t] != case.truth:
            break
        first = t
    return first - case.switch_at


def score(cases: Iterable[Case], verdicts: Verdicts) -> Scores:
    """The scores of one judge's verdicts: each case counts once, by its verdict at the end."""
    s = Scores()
    for case in cases:
        got = verdicts[case.id]
        final = got[max(got)]
        s.matrix[case.truth][final] += 1
        ok = final == case.truth
        if not ok:
            s.wrong.append((case.id, case.truth, final))
        _tally(s.by_missing, case.missing, case.truth, ok)
        _tally(s.by_engine, case.engine, case.truth, ok)
        _tally(s.by_step, f"{case.step:g}s", case.truth, ok)
        if case.switch_at is not None:
            s.lags[case.id] = lag(case, got)
            s.lag_step[case.id] = case.step
            s.lag_case[case.id] = case
            s.interim[case.id] = Counter(v for v in got.values() if v != case.truth)
    return s


# ------------------------------------------------------------------------------ floors


def floors_of(scores: Scores) -> dict[str, object]:
    """The figures a later tree must not fall below (accuracy per truth, rounded down to 0.1%) or
    above (false-healthy count, changes that never settle)."""
    unsettled = sum(v is None for v in scores.lags.values())
    return {
        "accuracy": {t: math.floor(a * 1000) / 1000 for t, a in scores.accuracy().items()},
        "false_healthy_max": len(scores.false_healthy),
        "unsettled_changes_max": unsettled,
        "cases": scores.cases,
    }


def below_floors(scores: Scores, floors: Mapping[str, object]) -> list[str]:
    """Every way ``scores`` falls short of ``floors`` (empty: all met)."""
    problems = []
    accuracy = scores.accuracy()
    wanted = floors.get("accuracy", {})
    assert isinstance(wanted, dict)
    for truth, floor in sorted(wanted.items()):
        got = accuracy.get(truth)
        if got is None:
            problems.append(f"{truth}: no case in the corpus any more (floor {floor:.3f})")
        elif got + 1e-9 < float(floor):
            taken = Counter(v for _, t, v in scores.wrong if t == truth).most_common(3)
            problems.append(
                f"{truth}: accuracy {got:.3f} below its floor {float(floor):.3f} "
                f"(its cases now read {', '.join(f'{v} x{n}' for v, n in taken)})"
            )
    fh = len(scores.false_healthy)
    fh_max = floors.get("false_healthy_max")
    if isinstance(fh_max, int) and fh > fh_max:
        problems.append(f"false-healthy: {fh} cases, more than the recorded {fh_max}")
    unsettled = sum(v is None for v in scores.lags.values())
    un_max = floors.get("unsettled_changes_max")
    if isinstance(un_max, int) and unsettled > un_max:
        problems.append(f"cause changes never settled: {unsettled}, more than the recorded {un_max}")
    return problems
