"""The scenario suite: canonical series for one engine and its GPUs, plus the verdict they must give.

Each ``Scenario`` is plain data (numbers, patterns, labels). ``series()`` turns it into sample
arrays; those are written once in promtool's expanding notation (``input_series()``) and read back
from that notation for the Python side (``window()``), so the Python evaluator and
``promtool test rules`` see bit-identical samples and cannot drift apart.

Time runs from 0 to ``length`` seconds at ``step``; the verdict is taken on the last
``window_seconds``. A scenario ``settles`` when its signals are steady long enough for the alerts'
``for`` to elapse (the matching alert is *firing* at the end; ``length`` is chosen for that);
otherwise (a latency trend, a short spike) the matching alert is only *pending* at the end.

Other users: replay tests turn ``series()`` into traces; ``SCENARIOS`` is importable as data.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace

import numpy as np

from kvdoctor.rules.promql import ALERT_BY_NAME, VERDICT_ALERT
from kvdoctor.rules.signals import (
    GENERATION_TOKENS,
    GPU_DRAM_BANDWIDTH_UTILIZATION,
    GPU_DRAM_PEAK_BANDWIDTH,
    GPU_MEMORY_TOTAL,
    GPU_MEMORY_USED,
    GPU_PCIE_RX,
    GPU_PCIE_TX,
    GPU_SM_ACTIVE,
    INTER_TOKEN_LATENCY,
    KV_CACHE_CAPACITY,
    KV_CACHE_USAGE,
    KV_TRANSFER_BYTES,
    METHOD_GPM,
    METHOD_NVML_UTIL,
    PREEMPTIONS,
    PREFIX_CACHE_HIT_RATIO,
    PREFIX_CACHE_HITS,
    PREFIX_CACHE_HITS_BY_TIER,
    PREFIX_CACHE_QUERIES,
    PROMPT_TOKENS,
    REQUESTS_RUNNING,
    REQUESTS_WAITING,
    SOURCE_UP,
)
from kvdoctor.rules.signals import (
    ITL_BUCKETS as ITL_BOUNDS,
)
from kvdoctor.rules.thresholds import DIAGNOSIS_WINDOW_SECONDS
from kvdoctor.rules.window import SeriesKey, Window, format_series, labels_of

ITL_BUCKETS = (*ITL_BOUNDS, math.inf)  # vLLM's, as the engine exposes them
WINDOW_SECONDS = DIAGNOSIS_WINDOW_SECONDS
SETTLE_MARGIN = 60.0  # beyond the window and the alert's `for`, so the alert is surely firing
H100 = "NVIDIA H100 80GB HBM3"


# ------------------------------------------------------------------------------- patterns
# A pattern gives a value at each time t (seconds, 0..duration); ``end`` is the last instant.


@dataclass(frozen=True)
class Const:
    value: float

    def at(self, t: np.ndarray, end: float) -> np.ndarray:
        return np.full(len(t), float(self.value))


@dataclass(frozen=True)
class Cycle:
    """Repeats ``values`` one per step (e.g. KV usage oscillating under preemption)."""

    values: tuple[float, ...]

    def at(self, t: np.ndarray, end: float) -> np.ndarray:
        return np.asarray(self.values, dtype=float)[np.arange(len(t)) % len(self.values)]


@dataclass(frozen=True)
class Triangle:
    """A triangle wave between ``lo`` and ``hi`` with ``period`` seconds, ending at ``hi``."""

    lo: float
    hi: float
    period: float

    def at(self, t: np.ndarray, end: float) -> np.ndarray:
        phase = ((t - end) / self.period) % 1.0  # 0 at the end
        up = np.minimum(phase, 1 - phase) * 2  # 0 at the end and at full periods, 1 half-way
        return self.hi - (self.hi - self.lo) * up


@dataclass(frozen=True)
class RampAtEnd:
    """``start`` until ``over`` seconds before the end, then a straight line to ``stop``."""

    start: float
    stop: float
    over: float

    def at(self, t: np.ndarray, end: float) -> np.ndarray:
        frac = np.clip((t - (end - self.over)) / self.over, 0.0, 1.0)
        return self.start + (self.stop - self.start) * frac


@dataclass(frozen=True)
class SpikeAtEnd:
    """``base`` with ``peak`` from ``start`` seconds before the end, for ``length`` seconds."""

    base: float
    peak: float
    start: float
    length: float

    def at(self, t: np.ndarray, end: float) -> np.ndarray:
        inside = (t >= end - self.start) & (t < end - self.start + self.length)
        return np.where(inside, self.peak, self.base)


@dataclass(frozen=True)
class Noisy:
    """``value`` plus uniform noise of +-``spread`` (seeded, so every run is the same)."""

    value: float
    spread: float
    seed: int = 7

    def at(self, t: np.ndarray, end: float) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        return np.round(self.value + rng.uniform(-self.spread, self.spread, len(t)), 4)


Pattern = Const | Cycle | Triangle | RampAtEnd | SpikeAtEnd | Noisy


def _p(value) -> Pattern:
    return value if hasattr(value, "at") else Const(float(value))


# ------------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class Latency:
    """Inter-token latency: each second's tokens are observed at ``base`` x multiplier, split
    over ``mix`` ((share, factor), ...). The multiplier grows with KV usage (``per_kv``), jumps
    above a KV level (``jump_at``, ``jump``) and follows ``over_time`` (a pattern of factors)."""

    base: float = 0.025
    mix: tuple[tuple[float, float], ...] = ((0.95, 1.0), (0.05, 1.6))
    per_kv: float = 0.0
    jump_at: float | None = None
    jump: float = 1.0
    over_time: Pattern | None = None


@dataclass(frozen=True)
class Gpu:
    dram: object = 0.55  # DRAM bandwidth utilisation (ratio or pattern)
    sm: object = 0.45
    pcie_rx: object = 2e7  # bytes/s
    method: str = METHOD_GPM
    model: str = H100


@dataclass(frozen=True)
class Scenario:
    name: str
    expected: str
    why: str
    # engine
    engine: str = "vllm"
    model_name: str = "llama-3.1-8b"
    pod: str = "vllm-0"
    dp_ranks: int = 1
    generation_tokens_per_second: object = 800
    prompt_tokens_per_second: object = 3000
    running: object = 32
    waiting: object = 0
    kv_usage: object = 0.45
    kv_capacity_tokens: float = 400_000
    preemptions_per_minute: float = 0.0
    preemptions_before: float = 12  # counter history from before the scenario
    kv_to_gpu_bytes_per_second: object | None = None
    hits_by_tier: tuple[tuple[str, float], ...] | None = None  # (tier, hit tokens per second), ...
    prefix_queries_per_second: float | None = 3000
    prefix_hit_ratio: float = 0.3
    hit_ratio_gauge: float | None = None  # engines that only export a ratio (SGLang)
    latency: Latency = field(default_factory=Latency)
    itl_histogram: bool = True
    # GPUs
    gpus: tuple[Gpu, ...] = (Gpu(),)
    sources_down: tuple[str, ...] = ()
    # time
    counter_reset_before_end: float | None = None  # engine restart: counters restart from 0
    duration: float | None = None  # default: long enough for the expected alerts to fire
    step: float = 1.0
    window_seconds: float = WINDOW_SECONDS
    settles: bool = True

    # ----------------------------------------------------------------------- arrays
    @property
    def length(self) -> float:
        """Seconds of series: the window, plus the ``for`` of the alerts expected to fire."""
        if self.duration is not None:
            return self.duration
        alerts = [VERDICT_ALERT.get(self.expected)] if self.settles else []
        alerts += list(self.extra_alerts)
        longest = max((_seconds(ALERT_BY_NAME[a].for_) for a in alerts if a), default=0.0)
        return self.window_seconds + longest + SETTLE_MARGIN

    @property
    def times(self) -> np.ndarray:
        return np.arange(round(self.length / self.step) + 1) * self.step

    def engine_labels(self, rank: int | None = None) -> dict[str, str]:
        labels = {"engine": self.engine, "model_name": self.model_name, "pod": self.pod}
        if rank is not None and self.dp_ranks > 1:
            labels["dp_rank"] = str(rank)
        return labels

    def series(self) -> dict[SeriesKey, np.ndarray]:
        """Every canonical series of the scenario as a value per time step (NaN: no sample)."""
        t = self.times
        end = float(t[-1])
        out: dict[SeriesKey, np.ndarray] = {}
        reset_i = None
        if self.counter_reset_before_end is not None:
            reset_i = int(np.searchsorted(t, end - self.counter_reset_before_end))

        def counter(per_step: np.ndarray, before: float = 0.0) -> np.ndarray:
            per_step = np.asarray(per_step, dtype=float)
            inc = np.concatenate([[before], per_step[1:]])
            values = np.cumsum(inc)
            if reset_i is not None:
                values[reset_i:] = np.cumsum(inc[reset_i:]) - inc[reset_i]
            return values

        def whole(rate: np.ndarray) -> np.ndarray:
            """Integer events per step whose running total follows ``rate`` (no drift)."""
            total = np.floor(np.cumsum(rate * self.step) + 1e-9)
            return np.diff(np.concatenate([[0.0], total]))

        kv = _p(self.kv_usage).at(t, end)
        for rank in range(self.dp_ranks):
            lab = self.engine_labels(rank)
            share = 1.0 / self.dp_ranks

            def put(name: str, values: np.ndarray, lab: dict[str, str] = lab, **extra: str) -> None:
                out[(name, labels_of(lab, **extra))] = values

            gen = whole(_p(self.generation_tokens_per_second).at(t, end) * share)
            put(GENERATION_TOKENS, counter(gen, 1e6))
            put(PROMPT_TOKENS, counter(whole(_p(self.prompt_tokens_per_second).at(t, end) * share), 4e6))
            put(REQUESTS_RUNNING, np.round(_p(self.running).at(t, end) * share))
            put(REQUESTS_WAITING, np.round(_p(self.waiting).at(t, end) * share))
            put(KV_CACHE_USAGE, kv)
            put(KV_CACHE_CAPACITY, np.full(len(t), self.kv_capacity_tokens * share))
            put(
                PREEMPTIONS,
                counter(whole(np.full(len(t), self.preemptions_per_minute / 60 * share)), self.preemptions_before),
            )
            if self.kv_to_gpu_bytes_per_second is not None:
                put(
                    KV_TRANSFER_BYTES,
                    counter(whole(_p(self.kv_to_gpu_bytes_per_second).at(t, end) * share)),
                    direction="to_gpu",
                    tier="host",
                )
                put(KV_TRANSFER_BYTES, counter(whole(np.full(len(t), 5e8 * share))), direction="from_gpu", tier="host")
            if self.hits_by_tier:
                for tier, rate in self.hits_by_tier:
                    put(PREFIX_CACHE_HITS_BY_TIER, counter(whole(np.full(len(t), rate * share))), tier=tier)
            if self.prefix_queries_per_second is not None and self.hit_ratio_gauge is None:
                q = whole(np.full(len(t), self.prefix_queries_per_second * share))
                put(PREFIX_CACHE_QUERIES, counter(q, 2e6))
                put(PREFIX_CACHE_HITS, counter(np.floor(q * self.prefix_hit_ratio), 1e6))
            if self.hit_ratio_gauge is not None:
                put(PREFIX_CACHE_HIT_RATIO, np.full(len(t), self.hit_ratio_gauge))
            if self.itl_histogram:
                for key, values in self._itl(t, end, gen, kv, lab, counter).items():
                    out[key] = values

        for i, gpu in enumerate(self.gpus):
            lab = {"gpu": str(i), "uuid": f"GPU-{i:08d}", "model": gpu.model, "pod": self.pod}
            out[(GPU_DRAM_BANDWIDTH_UTILIZATION, labels_of(lab, method=gpu.method))] = _p(gpu.dram).at(t, end)
            out[(GPU_SM_ACTIVE, labels_of(lab, method=gpu.method))] = _p(gpu.sm).at(t, end)
            out[(GPU_PCIE_RX, labels_of(lab))] = _p(gpu.pcie_rx).at(t, end)
            out[(GPU_PCIE_TX, labels_of(lab))] = np.full(len(t), 1e7)
            out[(GPU_MEMORY_USED, labels_of(lab))] = np.full(len(t), 7.2e10)
            out[(GPU_MEMORY_TOTAL, labels_of(lab))] = np.full(len(t), 8.0e10)
            out[(GPU_DRAM_PEAK_BANDWIDTH, labels_of(lab))] = np.full(len(t), 3.35e12)

        for source in ("engine", "nvml"):
            if source == "nvml" and not self.gpus and "nvml" not in self.sources_down:
                continue
            up = 0.0 if source in self.sources_down else 1.0
            out[(SOURCE_UP, labels_of(source=source, pod=self.pod))] = np.full(len(t), up)
        return out

    def _itl(self, t, end, gen, kv, lab, counter) -> dict[SeriesKey, np.ndarray]:
        lat = self.latency
        mult = np.ones(len(t))
        if lat.per_kv:
            mult = mult * (1 + lat.per_kv * kv)
        if lat.jump_at is not None:
            mult = np.where(kv >= lat.jump_at, mult * lat.jump, mult)
        if lat.over_time is not None:
            mult = mult * _p(lat.over_time).at(t, end)
        level = lat.base * mult
        shares = np.array([s for s, _ in lat.mix])
        factors = np.array([f for _, f in lat.mix])
        # tokens per component per step, integers that add up to the step's tokens
        cum = np.floor(np.outer(gen, np.cumsum(shares)) + 1e-9)
        cum[:, -1] = gen
        n = np.diff(np.concatenate([np.zeros((len(t), 1)), cum], axis=1), axis=1)
        obs = level[:, None] * factors[None, :]
        out = {}
        for le in ITL_BUCKETS:
            per_step = (n * (obs <= le)).sum(axis=1)
            out[(INTER_TOKEN_LATENCY + "_bucket", labels_of(lab, le=_le(le)))] = counter(per_step)
        out[(INTER_TOKEN_LATENCY + "_count", labels_of(lab))] = counter(n.sum(axis=1))
        out[(INTER_TOKEN_LATENCY + "_sum", labels_of(lab))] = counter(np.round((n * obs).sum(axis=1), 6))
        return out

    # ------------------------------------------------------------- the two views of one truth
    def encoded(self) -> dict[SeriesKey, str]:
        """Every series in promtool's expanding notation."""
        return dict(_encoded(self))

    def input_series(self) -> list[dict]:
        """promtool ``input_series`` entries."""
        return [{"series": format_series(key), "values": text} for key, text in sorted(self.encoded().items())]

    def full_window(self) -> Window:
        """The whole scenario as a Window, decoded from the same notation promtool reads."""
        t = self.times
        series = {key: decode_series(text, len(t)) for key, text in self.encoded().items()}
        return Window(t.astype(float), series)

    def window(self) -> Window:
        """The last ``window_seconds`` (both ends included, like a PromQL range selector)."""
        w = self.full_window()
        return w.slice(w.end - self.window_seconds, w.end)

    @property
    def eval_seconds(self) -> int:
        return round(float(self.times[-1]))

    @property
    def extra_alerts(self) -> tuple[str, ...]:
        return ("KvdoctorSourceDown",) if self.sources_down else ()

    def but(self, **changes) -> Scenario:
        return replace(self, **changes)


@functools.cache
def _encoded(scenario: Scenario) -> tuple[tuple[SeriesKey, str], ...]:
    return tuple((key, encode_series(values)) for key, values in scenario.series().items())


def _seconds(duration: str) -> float:
    """A Prometheus duration such as ``5m`` or ``30s`` in seconds."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    for unit in ("ms", "s", "m", "h"):
        if duration.endswith(unit) and duration[: -len(unit)].isdigit():
            return float(duration[: -len(unit)]) * units[unit]
    raise ValueError(f"unsupported duration {duration!r}")


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(bound)


# ------------------------------------------------------------------ expanding notation


def _num(v: float) -> str:
    return np.format_float_positional(float(v), unique=True, trim="-")


def encode_series(values: np.ndarray) -> str:
    """Values (NaN = no sample) in promtool's expanding notation: ``a+bxN`` for runs whose
    repeated addition reproduces the values exactly (promtool adds the step N times), ``_xK`` for
    K missing samples, literals otherwise."""
    v = np.asarray(values, dtype=float)
    n = len(v)
    tokens: list[str] = []
    i = 0
    while i < n:
        if math.isnan(v[i]):
            j = i
            while j < n and math.isnan(v[j]):
                j += 1
            tokens.append("_" if j - i == 1 else f"_x{j - i}")
            i = j
            continue
        run = 1
        if i + 2 < n and not (math.isnan(v[i + 1]) or math.isnan(v[i + 2])):
            b = v[i + 1] - v[i]
            if v[i + 2] - v[i + 1] == b:
                rest = v[i:]
                # np.cumsum adds left to right, exactly like promtool's repeated `x += b`
                sim = np.cumsum(np.concatenate([[v[i]], np.full(len(rest) - 1, b)]))
                bad = np.nonzero(sim != rest)[0]
                run = int(bad[0]) if len(bad) else len(rest)
        if run >= 3:
            b = v[i + 1] - v[i]
            a = _num(v[i])
            if b == 0:
                tokens.append(f"{a}x{run - 1}")
            elif b > 0:
                tokens.append(f"{a}+{_num(b)}x{run - 1}")
            else:
                tokens.append(f"{a}-{_num(-b)}x{run - 1}")
            i += run
        else:
            tokens.append(_num(v[i]))
            i += 1
    return " ".join(tokens)


def decode_series(text: str, length: int | None = None) -> np.ndarray:
    """promtool's reading of ``encode_series`` output (``a+bxN`` is N+1 values, ``_xK`` K gaps)."""
    out: list[float] = []
    for token in text.split():
        if token == "_":
            out.append(math.nan)
        elif token.startswith("_x"):
            out.extend([math.nan] * int(token[2:]))
        elif "x" in token:
            head, times = token.rsplit("x", 1)
            k = int(times)
            sign = "+" if "+" in head else ("-" if "-" in head[1:] else None)
            if sign is None:
                out.extend([float(head)] * (k + 1))
            else:
                a_text, b_text = (
                    head.split(sign, 1) if sign == "+" else (head[: head.index("-", 1)], head[head.index("-", 1) + 1 :])
                )
                a, b = float(a_text), float(b_text) * (1 if sign == "+" else -1)
                x = a
                for _ in range(k + 1):
                    out.append(x)
                    x += b
        else:
            out.append(float(token))
    arr = np.asarray(out, dtype=float)
    if length is not None and len(arr) != length:
        raise ValueError(f"decoded {len(arr)} values, expected {length}")
    return arr


# ------------------------------------------------------------------------------ the suite

BASE = Scenario("baseline", "healthy", "steady traffic, fast decode, nothing wrong")

_FULL_POOL = dict(kv_usage=0.95, waiting=4)
_SLOW = Latency(base=0.07, mix=((0.9, 1.0), (0.1, 1.8)))  # ITL p95 ~0.13 s
_NO_GPU = dict(gpus=())

# tokens spread over several buckets, so a latency trend moves the histogram's median smoothly
_WIDE = ((0.25, 0.7), (0.25, 0.9), (0.25, 1.1), (0.25, 1.3))


def _case(name: str, expected: str, why: str, **changes: object) -> Scenario:
    """The baseline with ``changes``: a scenario of the suite and the verdict it must give, and why."""
    return BASE.but(name=name, expected=expected, why=why, **changes)


def _latency_decides(name: str, expected: str, why: str, latency: Latency, **changes: object) -> Scenario:
    """This latency on one GPU busy on HBM bandwidth but not saturated: the SLO and trend checks decide."""
    return _case(name, expected, why, latency=latency, gpus=(Gpu(dram=0.85, sm=0.6),), **changes)


def _slow_on_one_gpu(
    name: str, expected: str, why: str, dram: float, sm: float, method: str = "gpm", **changes: object
) -> Scenario:
    """Decode over the SLO on one GPU with these DRAM bandwidth and SM ratios: the GPU branch decides."""
    return _case(name, expected, why, latency=_SLOW, gpus=(Gpu(dram=dram, sm=sm, method=method),), **changes)


SCENARIOS: tuple[Scenario, ...] = (
    BASE,
    _case(
        "idle_stale_kv",
        "idle",
        "no tokens for minutes; KV usage left high from earlier traffic does not count as activity",
        generation_tokens_per_second=0,
        prompt_tokens_per_second=0,
        running=0,
        kv_usage=0.93,
        prefix_queries_per_second=0,
        gpus=(Gpu(dram=0.0, sm=0.0, pcie_rx=1e5),),
    ),
    _case(
        "idle_threshold_just_over",
        "healthy",
        "one token every two seconds is activity (idle means no tokens at all)",
        generation_tokens_per_second=0.5,
        prompt_tokens_per_second=2,
        running=1,
        kv_usage=0.02,
    ),
    _case(
        "healthy_high_hit_ratio",
        "healthy",
        "a high prefix hit ratio with fast decode is simply healthy",
        prefix_hit_ratio=0.92,
    ),
    _case(
        "thrashing_kv_oscillates_under_preemption",
        "kv_thrashing",
        "vLLM preempts; each preemption frees blocks, so KV usage oscillates below the ceiling at times",
        kv_usage=Cycle((0.78, 0.99, 0.86, 0.97, 0.81, 0.99, 0.9, 0.95)),
        preemptions_per_minute=3,
        waiting=9,
        latency=Latency(base=0.03, jump_at=0.95, jump=4.0),
    ),
    _case(
        "preemptions_just_under",
        "kv_capacity_pressure",
        "pool full and queue backed up, preemption counter has history but none in the window",
        preemptions_before=57,
        **_FULL_POOL,
    ),
    _case(
        "preemptions_just_over",
        "kv_thrashing",
        "one preemption a minute is proof the pool ran out",
        preemptions_per_minute=1.0,
        **_FULL_POOL,
    ),
    _case(
        "thrashing_reload_into_full_pool",
        "kv_thrashing",
        "KV reloaded from host into a pool at the ceiling: evict and reload, no preemption counted",
        kv_usage=0.96,
        kv_to_gpu_bytes_per_second=3e9,
    ),
    _case(
        "tier_miss_cache_hit_but_slow",
        "kv_tier_miss",
        "prefix hits come from the host tier while the GPU pool has room",
        kv_usage=0.6,
        kv_to_gpu_bytes_per_second=2.5e9,
        prefix_hit_ratio=0.85,
        hits_by_tier=(("device", 1500), ("host", 1000)),
        latency=_SLOW,
    ),
    _case(
        "kv_transfer_just_under",
        "healthy",
        "0.9 GB/s of KV loads is under the 1 GB/s bar",
        kv_usage=0.6,
        kv_to_gpu_bytes_per_second=0.9e9,
    ),
    _case(
        "kv_transfer_just_over",
        "kv_tier_miss",
        "1.1 GB/s of KV loads is over the 1 GB/s bar",
        kv_usage=0.6,
        kv_to_gpu_bytes_per_second=1.1e9,
    ),
    BASE.but(name="pcie_just_under", expected="healthy", why="PCIe receive 0.9 GB/s", gpus=(Gpu(pcie_rx=0.9e9),)),
    _case("pcie_just_over", "kv_tier_miss", "PCIe receive 1.1 GB/s, no transfer counter", gpus=(Gpu(pcie_rx=1.1e9),)),
    _case(
        "slow_tier_hits_just_under",
        "healthy",
        "18% of hit tokens from the host tier",
        hits_by_tier=(("device", 820), ("host", 180)),
    ),
    _case(
        "slow_tier_hits_just_over",
        "kv_tier_miss",
        "22% of hit tokens from the host tier",
        hits_by_tier=(("device", 780), ("host", 220)),
    ),
    _case("kv_ceiling_just_under", "healthy", "KV usage 88% with a queue: below the ceiling", kv_usage=0.88, waiting=3),
    _case("kv_ceiling_just_over", "kv_capacity_pressure", "KV usage 92% with a queue", kv_usage=0.92, waiting=3),
    _case(
        "full_pool_empty_queue",
        "healthy",
        "a full pool with nobody waiting is a well-used pool",
        kv_usage=0.95,
        waiting=0,
    ),
    _latency_decides(
        "slo_just_under", "healthy", "ITL p95 ~95 ms, SLO 100 ms", Latency(base=0.06, mix=((0.75, 1.0), (0.25, 1.5)))
    ),
    _latency_decides(
        "slo_just_over",
        "memory_bandwidth_bound",
        "ITL p95 ~105 ms, SLO 100 ms",
        Latency(base=0.06, mix=((0.944, 1.0), (0.056, 2.0))),
    ),
    _latency_decides(
        "trend_just_under",
        "healthy",
        "ITL climbs but the last third's median is under 1.5x the first third's",
        Latency(base=0.04, mix=_WIDE, over_time=RampAtEnd(1.0, 1.6, 40)),
        settles=False,
    ),
    _latency_decides(
        "trend_just_over",
        "memory_bandwidth_bound",
        "ITL still under the SLO but rising fast: the last third's median is over 1.5x the first third's",
        Latency(base=0.04, mix=_WIDE, over_time=RampAtEnd(1.0, 1.9, 40)),
        settles=False,
    ),
    _slow_on_one_gpu("bandwidth_just_under", "compute_bound", "DRAM 78% < 80% with SM 90%", dram=0.78, sm=0.9),
    _slow_on_one_gpu(
        "bandwidth_just_over", "memory_bandwidth_bound", "DRAM 82% with SM 90% (not clearly above)", dram=0.82, sm=0.9
    ),
    _slow_on_one_gpu(
        "sm_just_under",
        "memory_bandwidth_bound",
        "SM 78%, DRAM 60%: neither saturated, the GPU is busy enough not to blame the host",
        dram=0.6,
        sm=0.78,
    ),
    _slow_on_one_gpu("sm_just_over", "compute_bound", "SM 82%, DRAM 60%", dram=0.6, sm=0.82),
    _slow_on_one_gpu(
        "sm_not_clearly_above_bandwidth",
        "memory_bandwidth_bound",
        "DRAM 82%, SM 96%: within the 0.15 margin, bandwidth wins",
        dram=0.82,
        sm=0.96,
    ),
    _slow_on_one_gpu(
        "sm_clearly_above_bandwidth", "compute_bound", "DRAM 82%, SM 98.5%: SM clearly above", dram=0.82, sm=0.985
    ),
    _slow_on_one_gpu("host_overhead_just_under", "host_overhead_bound", "busiest GPU counter 45%", dram=0.3, sm=0.45),
    _slow_on_one_gpu(
        "host_overhead_just_over",
        "memory_bandwidth_bound",
        "busiest GPU counter 55%: not idle enough to blame the host",
        dram=0.3,
        sm=0.55,
    ),
    _case(
        "prefill_ratio_just_under_no_gpu",
        "memory_bandwidth_bound",
        "no GPU counters, 9 prompt tokens per generated token",
        latency=_SLOW,
        prompt_tokens_per_second=7200,
        **_NO_GPU,
    ),
    _case(
        "prefill_ratio_just_over_no_gpu",
        "compute_bound",
        "no GPU counters, 11 prompt tokens per generated token",
        latency=_SLOW,
        prompt_tokens_per_second=8800,
        **_NO_GPU,
    ),
    _case(
        "cpu_engine_latency_rises_with_kv",
        "memory_bandwidth_bound",
        "a CPU engine without GPU counters; ITL rises with resident KV",
        engine="vllm",
        kv_usage=Triangle(0.2, 0.9, 60),
        latency=Latency(base=0.06, per_kv=1.2),
        **_NO_GPU,
    ),
    _case(
        "counter_reset_inside_window",
        "kv_capacity_pressure",
        "the engine restarted 30 s ago: counters drop to 0, which is not a burst of preemptions",
        counter_reset_before_end=30,
        preemptions_before=57,
        **_FULL_POOL,
    ),
    _slow_on_one_gpu(
        "counter_reset_bandwidth_bound",
        "memory_bandwidth_bound",
        "histogram counters reset inside the window; the ITL p95 must still be right",
        dram=0.88,
        sm=0.6,
        counter_reset_before_end=25,
    ),
    _case(
        "prefill_burst",
        "compute_bound",
        "a sustained burst of long prompts: SMs saturated, decode tokens wait behind prefill",
        prompt_tokens_per_second=60000,
        latency=Latency(base=0.06, mix=((0.85, 1.0), (0.15, 2.5))),
        gpus=(Gpu(dram=0.5, sm=0.93),),
    ),
    _case(
        "short_spike_stays_healthy",
        "healthy",
        "a 2 s latency spike (a prefill) is under 5% of tokens: p95 is robust to it",
        latency=Latency(over_time=SpikeAtEnd(1.0, 16.0, 30, 2)),
        gpus=(Gpu(sm=SpikeAtEnd(0.45, 0.98, 30, 2)),),
        settles=False,
    ),
    _case(
        "capacity_pressure_recent_onset",
        "kv_capacity_pressure",
        "the pool filled and a queue formed 12 s ago: state gauges are read over the recent "
        "sub-window, so the verdict follows within seconds instead of waiting for the whole window",
        kv_usage=SpikeAtEnd(0.5, 0.95, 12, 13),
        waiting=SpikeAtEnd(0, 4, 12, 13),
        settles=False,
    ),
    _case(
        "host_overhead_recent_onset",
        "host_overhead_bound",
        "decode slow all window; the GPU went from bandwidth-bound to mostly idle 12 s ago: "
        "the recent sub-window's medians, not the whole window's, decide",
        latency=_SLOW,
        gpus=(Gpu(dram=SpikeAtEnd(0.88, 0.3, 12, 13), sm=SpikeAtEnd(0.6, 0.4, 12, 13)),),
        settles=False,
    ),
    _slow_on_one_gpu(
        "high_hit_ratio_bandwidth_bound",
        "memory_bandwidth_bound",
        "cache hit but slow: 91% prefix hits, decode bound by HBM bandwidth",
        dram=0.88,
        sm=0.7,
        prefix_hit_ratio=0.91,
    ),
    _slow_on_one_gpu(
        "nvml_duty_cycles_idle_gpu",
        "host_overhead_bound",
        "only NVML duty cycles, both low: the GPU waits on the host",
        dram=0.2,
        sm=0.35,
        method=METHOD_NVML_UTIL,
    ),
    _slow_on_one_gpu(
        "nvml_duty_cycle_is_not_compute",
        "memory_bandwidth_bound",
        "NVML's utilization.gpu near 100% is a duty cycle, not SM activity: not compute bound",
        dram=0.6,
        sm=0.97,
        method=METHOD_NVML_UTIL,
    ),
    _case(
        "gpu_source_down",
        "memory_bandwidth_bound",
        "the NVML source fails: no GPU counters, verdict from engine signals, source-down alert",
        latency=_SLOW,
        sources_down=("nvml",),
        **_NO_GPU,
    ),
    _case(
        "tensor_parallel_8_gpus",
        "memory_bandwidth_bound",
        "8 GPUs, one engine; the busiest GPU sets the step time",
        latency=_SLOW,
        gpus=tuple(
            Gpu(dram=Noisy(0.86 if i == 3 else 0.7, 0.02, seed=i), sm=Noisy(0.6, 0.05, seed=10 + i)) for i in range(8)
        ),
    ),
    _case(
        "data_parallel_ranks",
        "kv_thrashing",
        "two data-parallel ranks; preemptions summed across ranks",
        dp_ranks=2,
        preemptions_per_minute=2,
        kv_usage=0.97,
        waiting=6,
    ),
    _slow_on_one_gpu(
        "sglang_ratio_gauge",
        "memory_bandwidth_bound",
        "SGLang exports a hit-ratio gauge, not counters; high hits, bandwidth bound",
        dram=0.9,
        sm=0.55,
        engine="sglang",
        model_name="qwen2.5-7b",
        pod="sglang-0",
        hit_ratio_gauge=0.8,
    ),
)

SCENARIO_BY_NAME = {s.name: s for s in SCENARIOS}
assert len(SCENARIO_BY_NAME) == len(SCENARIOS), "scenario names must be unique"
