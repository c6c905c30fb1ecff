"""The scenario suite: canonical series for one engine and its GPUs, plus the verdict they must give.

Each ``Scenario`` is plain data (numbers, patterns, labels). ``series()`` turns it into sample
arrays; those are written once in promtool's expanding notation (``input_series()``) and read back
from that notation for the Python side (``window()``), so the Python evaluator and
``promtool test rules`` see bit-identical samples and cannot drift apart.

Time runs from 0 to ``length`` seconds at ``step``; the verdict is taken on the last
``window_seconds``. A scenario ``settles`` when its signals are steady long enough for the alerts'
``for`` to elapse (the matching alert is *firing* at the end; ``length`` is chosen for that);
otherwise (a latency trend, a short spike) the matching alert is only *pending* at the end.
``at_interval(seconds)`` is the same scenario sampled as a Prometheus scraping every ``seconds``
would, judged on the window the rules for that interval read (``sized_for_interval``); scenarios
whose verdict does not hang on seconds-long structure are ``timeless`` and keep their verdict there.

Other users: replay tests turn ``series()`` into traces; ``SCENARIOS`` is importable as data.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace

import numpy as np

from kvdoctor.rules.alert_specs import ALERT_BY_NAME, VERDICT_ALERT
from kvdoctor.rules.thresholds import DIAGNOSIS_WINDOW_SECONDS, Thresholds, sized_for_interval
from kvdoctor.signals.vocabulary import (
    CONTEXT_INFO,
    GENERATION_SECONDS,
    GENERATION_TOKENS,
    GPU_DRAM_BANDWIDTH_UTILIZATION,
    GPU_DRAM_PEAK_BANDWIDTH,
    GPU_MEMORY_TOTAL,
    GPU_MEMORY_USED,
    GPU_PCIE_RX,
    GPU_PCIE_TX,
    GPU_SM_ACTIVE,
    INTER_TOKEN_LATENCY,
    ITL_SLO,
    KV_CACHE_CAPACITY,
    KV_CACHE_HOST_USAGE,
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
    REQUESTS_SWAPPED,
    REQUESTS_WAITING,
    SOURCE_UP,
    TIME_TO_FIRST_TOKEN,
)
from kvdoctor.signals.vocabulary import (
    ITL_BUCKETS as ITL_BOUNDS,
)
from kvdoctor.signals.window import SeriesKey, Window, format_series, labels_of

ITL_BUCKETS = (*ITL_BOUNDS, math.inf)  # vLLM's, as the engine exposes them
# vLLM's time-to-first-token buckets (vllm/v1/metrics/loggers.py)
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0, 2560.0, math.inf,
)  # fmt: skip
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
class Linear:
    """``start`` at time 0, then ``per_second`` more every second (a queue that keeps growing: over
    any part of any window it grows, so it holds at every scrape interval)."""

    start: float
    per_second: float

    def at(self, t: np.ndarray, end: float) -> np.ndarray:
        return self.start + self.per_second * t


@dataclass(frozen=True)
class Noisy:
    """``value`` plus uniform noise of +-``spread`` (seeded, so every run is the same)."""

    value: float
    spread: float
    seed: int = 7

    def at(self, t: np.ndarray, end: float) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        return np.round(self.value + rng.uniform(-self.spread, self.spread, len(t)), 4)


Pattern = Const | Cycle | Triangle | RampAtEnd | SpikeAtEnd | Linear | Noisy


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
    preemptions_per_minute: object = 0.0
    preemptions_before: float = 12  # counter history from before the scenario
    kv_to_gpu_bytes_per_second: object | None = None
    hits_by_tier: tuple[tuple[str, float], ...] | None = None  # (tier, hit tokens per second), ...
    prefix_queries_per_second: float | None = 3000
    prefix_hit_ratio: float = 0.3
    hit_ratio_gauge: float | None = None  # engines that only export a ratio (SGLang)
    latency: Latency = field(default_factory=Latency)
    itl_histogram: bool = True
    mean_time_per_token: bool = False  # llama.cpp: generation seconds / tokens, no ITL histogram
    tokens_at_request_end: float | None = None  # llama.cpp: token counters move only as requests end, every N s
    ttft: Latency | None = field(default_factory=lambda: Latency(base=0.12, mix=((0.9, 1.0), (0.1, 1.6))))
    requests_per_second: object = 4.0  # first tokens (TTFT observations) per second
    swapped: object | None = None  # vLLM V0: requests swapped out to host memory
    kv_host_usage: object | None = None  # vLLM V0: CPU KV-cache usage
    kv_usage_reported: bool = True
    waiting_reported: bool = True
    published_slo: float | None = None  # the SLO the exporter publishes (kvdoctor_inter_token_latency_slo_seconds)
    # GPUs
    gpus: tuple[Gpu, ...] = (Gpu(),)
    sources_down: tuple[str, ...] = ()
    # time
    counter_reset_before_end: float | None = None  # engine restart: counters restart from 0
    duration: float | None = None  # default: long enough for the expected alerts to fire
    step: float = 1.0
    window_seconds: float = WINDOW_SECONDS
    settles: bool = True
    on_threshold: bool = False  # a rate exactly at its threshold: sparse scrapes' extrapolation decides it
    # what else the diagnosis must list among the contributing causes (``Diagnosis.differential``):
    # ``request_queueing`` where requests wait behind a slow decode (the queue as its consequence)
    contributing: tuple[str, ...] = ()

    # ----------------------------------------------------------------------- arrays
    @property
    def length(self) -> float:
        """Seconds of series: the window, plus the ``for`` of the alerts expected to fire."""
        if self.duration is not None:
            return self.duration
        alerts = [VERDICT_ALERT.get(self.expected)] if self.settles else []
        alerts += list(self.extra_alerts)
        # the for of the rules exported for this scrape interval (at least the default export's)
        longest = max((ALERT_BY_NAME[a].for_seconds(max(self.step, 15.0)) for a in alerts if a), default=0.0)
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
            counted = gen if self.tokens_at_request_end is None else self._at_request_ends(t, gen)
            put(GENERATION_TOKENS, counter(counted, 1e6))
            if self.mean_time_per_token:
                mean = self.latency.base * sum(share * factor for share, factor in self.latency.mix)
                put(GENERATION_SECONDS, counter(np.round(counted * mean, 6), round(1e6 * mean, 6)))
            put(PROMPT_TOKENS, counter(whole(_p(self.prompt_tokens_per_second).at(t, end) * share), 4e6))
            put(REQUESTS_RUNNING, np.round(_p(self.running).at(t, end) * share))
            if self.waiting_reported:
                put(REQUESTS_WAITING, np.round(_p(self.waiting).at(t, end) * share))
            if self.swapped is not None:
                put(REQUESTS_SWAPPED, np.round(_p(self.swapped).at(t, end) * share))
            if self.kv_host_usage is not None:
                put(KV_CACHE_HOST_USAGE, _p(self.kv_host_usage).at(t, end))
            if self.kv_usage_reported:
                put(KV_CACHE_USAGE, kv)
                put(KV_CACHE_CAPACITY, np.full(len(t), self.kv_capacity_tokens * share))
            if self.ttft is not None:
                firsts = whole(_p(self.requests_per_second).at(t, end) * share)
                for key, values in self._histogram(
                    TIME_TO_FIRST_TOKEN, TTFT_BUCKETS, self.ttft, t, end, firsts, kv, lab, counter
                ).items():
                    out[key] = values
            put(
                PREEMPTIONS,
                counter(whole(_p(self.preemptions_per_minute).at(t, end) / 60 * share), self.preemptions_before),
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
                for key, values in self._histogram(
                    INTER_TOKEN_LATENCY, ITL_BUCKETS, self.latency, t, end, gen, kv, lab, counter
                ).items():
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

        if self.published_slo is not None:
            out[(ITL_SLO, labels_of(pod=self.pod))] = np.full(len(t), self.published_slo)
            out[(CONTEXT_INFO, labels_of(pod=self.pod, gpu_model=H100))] = np.ones(len(t))
        for source in ("engine", "nvml"):
            if source == "nvml" and not self.gpus and "nvml" not in self.sources_down:
                continue
            up = 0.0 if source in self.sources_down else 1.0
            out[(SOURCE_UP, labels_of(source=source, pod=self.pod))] = np.full(len(t), up)
        return out

    def _at_request_ends(self, t: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """Tokens counted only when requests end (llama.cpp): everything since the last end, every
        ``tokens_at_request_end`` seconds (none at all when that is longer than the scenario)."""
        every = float(self.tokens_at_request_end or 0.0)
        ends = np.floor(t / every) != np.floor(np.concatenate([[-1.0], t[:-1]]) / every)
        ends[0] = False
        out = np.zeros(len(t))
        pending = 0.0
        for i, n in enumerate(tokens):
            pending += n
            if ends[i]:
                out[i], pending = pending, 0.0
        return out

    def _histogram(self, name, buckets, lat, t, end, counts, kv, lab, counter) -> dict[SeriesKey, np.ndarray]:
        """A latency histogram: each step's ``counts`` observations at ``lat``'s level x multiplier."""
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
        # observations per component per step, integers that add up to the step's count
        cum = np.floor(np.outer(counts, np.cumsum(shares)) + 1e-9)
        cum[:, -1] = counts
        n = np.diff(np.concatenate([np.zeros((len(t), 1)), cum], axis=1), axis=1)
        obs = level[:, None] * factors[None, :]
        out = {}
        for le in buckets:
            per_step = (n * (obs <= le)).sum(axis=1)
            out[(name + "_bucket", labels_of(lab, le=_le(le)))] = counter(per_step)
        out[(name + "_count", labels_of(lab))] = counter(n.sum(axis=1))
        out[(name + "_sum", labels_of(lab))] = counter(np.round((n * obs).sum(axis=1), 6))
        return out

    @property
    def timeless(self) -> bool:
        """Its verdict does not hang on seconds-long structure (a spike, a ramp, a recent onset, a
        restart, a series only seconds long), so it holds at any scrape interval."""
        patterns = [
            self.generation_tokens_per_second, self.prompt_tokens_per_second, self.running, self.waiting,
            self.kv_usage, self.kv_to_gpu_bytes_per_second, self.requests_per_second, self.swapped,
            self.preemptions_per_minute,
            *(g.dram for g in self.gpus), *(g.sm for g in self.gpus), *(g.pcie_rx for g in self.gpus),
        ]  # fmt: skip
        timed = (SpikeAtEnd, RampAtEnd, Triangle)
        return (
            not any(isinstance(x, timed) for x in patterns)
            and self.latency.over_time is None
            and (self.ttft is None or self.ttft.over_time is None)
            and self.counter_reset_before_end is None
            and self.tokens_at_request_end is None
            and not self.on_threshold
            and self.duration is None
        )

    def at_interval(self, seconds: float, thresholds: Thresholds | None = None) -> Scenario:
        """This scenario scraped every ``seconds``, judged on the window the rules for that interval read."""
        sized = sized_for_interval(thresholds or Thresholds(), seconds)
        return replace(self, step=float(seconds), window_seconds=sized.window_seconds)

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
_QUEUED_TTFT = Latency(base=2.5, mix=((0.8, 1.0), (0.2, 1.3)))  # first tokens wait in the queue: TTFT p95 ~3 s
_NO_GPU = dict(gpus=())
_LLAMACPP = dict(
    engine="llamacpp",
    model_name="tiny",
    pod="llama-0",
    itl_histogram=False,
    ttft=None,
    kv_usage_reported=False,
    prefix_queries_per_second=None,
    **_NO_GPU,
)

# What a cause looks like on the baseline: the suite's scenarios and the corpus's causes
# (tests/support/corpus.py) start from these.
IDLE_ENGINE = dict(
    generation_tokens_per_second=0,
    prompt_tokens_per_second=0,
    running=0,
    kv_usage=0.93,  # left high by earlier traffic
    prefix_queries_per_second=0,
    requests_per_second=0,
    gpus=(Gpu(dram=0.0, sm=0.0, pcie_rx=1e5),),
)
THRASHING = dict(
    kv_usage=Cycle((0.78, 0.99, 0.86, 0.97, 0.81, 0.99, 0.9, 0.95)),
    preemptions_per_minute=3,
    latency=Latency(base=0.03, jump_at=0.95, jump=4.0),
)
HOST_TIER_HITS = dict(
    kv_usage=0.6,
    kv_to_gpu_bytes_per_second=2.5e9,
    prefix_hit_ratio=0.85,
    hits_by_tier=(("device", 1500), ("host", 1000)),
)
PREFILL_BURST = dict(prompt_tokens_per_second=60000, gpus=(Gpu(dram=0.5, sm=0.93),))
PREFILL_DELAYS = ((0.85, 1.0), (0.15, 2.5))  # decode tokens that wait behind a prefill

# Issue 24: a queue sits beside almost every cause, and the cause changes inside one window.
_QUEUE = ("request_queueing",)  # the queue behind a slow decode: a consequence in the differential
# A change of cause this many seconds before the evaluation instant: one state window plus one
# scrape (at 1 s), the most a new cause may lag (issue 24: <= 25 s at a 1 s interval).
CHANGE_LAG = Thresholds().state_window_seconds + 1.0


# Beside a full pool the tree keeps preemptions over the window's last third (a thrash too sparse for
# the state window to see every time), so a thrash that stopped there yields one third and a scrape on.
SPARSE_THRASH_LAG = Thresholds().window_seconds / 3 + 1.0


def _since_change(before: float, after: float, lag: float = CHANGE_LAG) -> SpikeAtEnd:
    """``before`` until ``lag`` seconds before the end, ``after`` from then on."""
    return SpikeAtEnd(before, after, lag, lag + 1)


# tokens spread over several buckets, so a latency trend moves the histogram's median smoothly
_WIDE = ((0.25, 0.7), (0.25, 0.9), (0.25, 1.1), (0.25, 1.3))


def _case(name: str, expected: str, why: str, **changes: object) -> Scenario:
    """The baseline with ``changes``: a scenario of the suite and the verdict it must give, and why."""
    return BASE.but(name=name, expected=expected, why=why, **changes)


def _latency_decides(name: str, expected: str, why: str, latency: Latency, **changes: object) -> Scenario:
    """This latency on one GPU busy on HBM bandwidth but not saturated: the SLO check decides."""
    return _case(name, expected, why, latency=latency, gpus=(Gpu(dram=0.85, sm=0.6),), **changes)


def _slow_on_one_gpu(
    name: str, expected: str, why: str, dram: float, sm: float, method: str = "gpm", **changes: object
) -> Scenario:
    """Decode over the SLO on one GPU with these DRAM bandwidth and SM ratios: the GPU branch decides."""
    return _case(name, expected, why, latency=_SLOW, gpus=(Gpu(dram=dram, sm=sm, method=method),), **changes)


def _on_llamacpp(name: str, expected: str, why: str, seconds_per_token: float, **changes: object) -> Scenario:
    """llama.cpp (no KV usage, no ITL histogram): the mean time per token is the latency measure."""
    latency = Latency(base=seconds_per_token, mix=((1.0, 1.0),))
    return _case(name, expected, why, mean_time_per_token=True, latency=latency, **changes, **_LLAMACPP)


def _either_side(
    threshold: str, under: tuple[str, str, dict], over: tuple[str, str, dict], **common: object
) -> tuple[Scenario, Scenario]:
    """``<threshold>_just_under`` and ``<threshold>_just_over``: both with ``common``, each side with
    its verdict, why and own changes."""
    return tuple(  # type: ignore[return-value]
        _case(f"{threshold}_just_{side}", expected, why, **common, **changes)
        for side, (expected, why, changes) in (("under", under), ("over", over))
    )


SCENARIOS: tuple[Scenario, ...] = (
    BASE,
    _case(
        "idle_stale_kv",
        "idle",
        "no tokens for minutes; KV usage left high from earlier traffic does not count as activity",
        **IDLE_ENGINE,
    ),
    _case(
        "idle_threshold_just_over",
        "healthy",
        "one token every two seconds is activity (idle means no tokens at all)",
        generation_tokens_per_second=0.5,
        prompt_tokens_per_second=2,
        running=1,
        kv_usage=0.02,
        requests_per_second=0.1,
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
        waiting=9,
        **THRASHING,
        contributing=_QUEUE,  # decode is slow (the stalls) and 9 wait: the queue is its consequence
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
        "a preemption in every state window (one per 15 s, the least rate the tree reads as current) is proof "
        "the pool ran out, and requests wait",
        preemptions_per_minute=4.0,
        **_FULL_POOL,
    ),
    _case(
        "preemptions_on_a_fast_engine",
        "healthy",
        "3 preemptions a minute while ITL is on time and nobody waits: a note, not a slow verdict",
        preemptions_per_minute=3.0,
        kv_usage=0.93,
    ),
    _case(
        "thrashing_reload_into_full_pool",
        "kv_thrashing",
        "KV reloaded from host into a pool at the ceiling while requests wait: evict and reload",
        kv_usage=0.96,
        waiting=5,
        kv_to_gpu_bytes_per_second=3e9,
    ),
    _case(
        "vllm_v0_swapping",
        "kv_thrashing",
        "vLLM V0 swaps requests out to host memory (num_requests_swapped, cpu_cache_usage_perc) while requests wait",
        kv_usage=0.97,
        waiting=6,
        swapped=3,
        kv_host_usage=0.4,
    ),
    _case(
        "tier_miss_cache_hit_but_slow",
        "kv_tier_miss",
        "prefix hits come from the host tier while the GPU pool has room, and ITL is over the SLO",
        latency=_SLOW,
        **HOST_TIER_HITS,
    ),
    _case(
        "pcie_tier_traffic_fast_decode",
        "healthy",
        "heavy PCIe traffic and a high prefix-hit ratio (host-tier hits) but ITL p95 ~30 ms: the transfer hides",
        kv_usage=0.6,
        prefix_hit_ratio=0.9,
        hits_by_tier=(("device", 800), ("host", 1900)),
        latency=Latency(base=0.025, mix=((0.9, 1.0), (0.1, 1.2))),
        gpus=(Gpu(pcie_rx=12e9),),
    ),
    *_either_side(
        "kv_transfer",
        (
            "memory_bandwidth_bound",
            "0.9 GB/s of KV loads is under the 1 GB/s bar; decode is slow for another reason",
            dict(kv_to_gpu_bytes_per_second=0.9e9),
        ),
        (
            "kv_tier_miss",
            "1.1 GB/s of KV loads is over the 1 GB/s bar, and decode is slow",
            dict(kv_to_gpu_bytes_per_second=1.1e9),
        ),
        kv_usage=0.6,
        latency=_SLOW,
    ),
    *_either_side(
        "pcie",
        (
            "memory_bandwidth_bound",
            "PCIe receive 0.9 GB/s; decode is slow for another reason",
            dict(gpus=(Gpu(pcie_rx=0.9e9),)),
        ),
        ("kv_tier_miss", "PCIe receive 1.1 GB/s, no transfer counter, decode slow", dict(gpus=(Gpu(pcie_rx=1.1e9),))),
        latency=_SLOW,
    ),
    *_either_side(
        "slow_tier_hits",
        (
            "memory_bandwidth_bound",
            "18% of hit tokens from the host tier; decode is slow for another reason",
            dict(hits_by_tier=(("device", 820), ("host", 180))),
        ),
        (
            "kv_tier_miss",
            "22% of hit tokens from the host tier, decode slow",
            dict(hits_by_tier=(("device", 780), ("host", 220))),
        ),
        latency=_SLOW,
    ),
    _case(
        "lmcache_hits_count_with_the_engines_own",
        "kv_tier_miss",
        "LMCache hits (a tier without the GPU's own) add to the engine's hit counter: 25% of all hits off the GPU",
        hits_by_tier=(("lmcache", 300),),
        prefix_queries_per_second=3000,
        prefix_hit_ratio=0.3,
        latency=_SLOW,
    ),
    *_either_side(
        "kv_ceiling",
        (
            "request_queueing",
            "KV usage 88% with a queue that delays first tokens: below the ceiling, so the batch "
            "limit, not the pool, holds requests back",
            dict(kv_usage=0.88),
        ),
        ("kv_capacity_pressure", "KV usage 92% with a queue that delays first tokens", dict(kv_usage=0.92)),
        waiting=3,
        ttft=_QUEUED_TTFT,
    ),
    _case(
        "capacity_pressure_400_waiting",
        "kv_capacity_pressure",
        "KV usage 97% with 400 requests waiting: add replicas or route away first, then make KV smaller",
        kv_usage=0.97,
        waiting=400,
        ttft=Latency(base=4.0, mix=((0.9, 1.0), (0.1, 1.5))),
    ),
    _case(
        "capacity_pressure_ttft_over_slo",
        "kv_capacity_pressure",
        "KV usage 95%, the queue drains between scrapes but first tokens take 3-4 s: TTFT over its SLO",
        kv_usage=0.95,
        ttft=Latency(base=3.0, mix=((0.8, 1.0), (0.2, 1.3))),
    ),
    _case(
        "full_pool_empty_queue",
        "healthy",
        "a full pool with nobody waiting and decode on time is a well-used pool (a note: headroom is low)",
        kv_usage=0.97,
        waiting=0,
    ),
    _case(
        "vllm_max_num_seqs_queue",
        "request_queueing",
        "vLLM at --max-num-seqs 32: 32 running, 20 waiting (first tokens take 2.5 s), KV at 40%: the sequence "
        "limit, not memory",
        kv_usage=0.4,
        running=32,
        waiting=20,
        ttft=_QUEUED_TTFT,
    ),
    _on_llamacpp(
        "llamacpp_slots_full_queue",
        "request_queueing",
        "llama.cpp with 4 slots and 16 clients: 4 running, 12 deferred; no KV usage, no ITL histogram",
        seconds_per_token=0.0016,
        running=4,
        waiting=12,
        generation_tokens_per_second=300,
    ),
    _on_llamacpp(
        "llamacpp_mean_time_per_token_fast",
        "healthy",
        "llama.cpp, no ITL histogram: the mean time per token (1.6 ms) is the latency measure, under the SLO",
        seconds_per_token=0.0016,
        running=2,
        generation_tokens_per_second=600,
    ),
    _on_llamacpp(
        "llamacpp_mean_time_per_token_slow",
        "memory_bandwidth_bound",
        "llama.cpp on a slow model: the mean time per token (150 ms) is over the SLO; no GPU counters",
        seconds_per_token=0.15,
        running=2,
        generation_tokens_per_second=12,
        prompt_tokens_per_second=60,
    ),
    _on_llamacpp(
        "long_request_is_not_idle",
        "healthy",
        "one llama.cpp request streams for longer than the window: its tokens are counted only when it ends, "
        "but it runs, so the engine is not idle (and its speed is not measured yet)",
        seconds_per_token=0.09,
        running=1,
        generation_tokens_per_second=11,
        tokens_at_request_end=100_000,
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
        "published_slo_15ms",
        "memory_bandwidth_bound",
        "ITL p95 ~19 ms on an exporter started with --slo-ms 15: its published SLO, not the 100 ms default, decides",
        Latency(base=0.016, mix=((0.9, 1.0), (0.1, 1.2))),
        published_slo=0.015,
    ),
    _latency_decides(
        "published_slo_default_would_pass",
        "healthy",
        "the same ITL on an exporter that publishes a 30 ms SLO: healthy",
        Latency(base=0.016, mix=((0.9, 1.0), (0.1, 1.2))),
        published_slo=0.03,
    ),
    _latency_decides(
        "trend_rising_under_slo",
        "healthy",
        "ITL rising fast (the last third's median over 1.5x the first third's) but under the SLO: a note, not slow",
        Latency(base=0.04, mix=_WIDE, over_time=RampAtEnd(1.0, 1.9, 40)),
        settles=False,
    ),
    _slow_on_one_gpu("bandwidth_just_under", "compute_bound", "DRAM 78% < 80% with SM 90%", dram=0.78, sm=0.9),
    _slow_on_one_gpu(
        "bandwidth_just_over", "memory_bandwidth_bound", "DRAM 82% with SM 90% (not clearly above)", dram=0.82, sm=0.9
    ),
    _case(
        "busy_bus_fast_decode",
        "healthy",
        "DRAM bandwidth 92% busy but every token on time: a busy bus is not a problem (a note)",
        gpus=(Gpu(dram=0.92, sm=0.5),),
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
        latency=Latency(base=0.06, mix=PREFILL_DELAYS),
        **PREFILL_BURST,
    ),
    _case(
        "compute_bound_with_prefix_hits",
        "compute_bound",
        "compute bound while the engine reports prefix hits: enabling prefix caching is not an action",
        prefix_hit_ratio=0.6,
        latency=Latency(base=0.06, mix=PREFILL_DELAYS),
        **PREFILL_BURST,
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
        "two data-parallel ranks; preemptions summed across ranks (each rank preempts in every state window)",
        dp_ranks=2,
        preemptions_per_minute=8,
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
    # ---------------------------------------------------------------- issue 24's "Why", case by case
    # 1. the queue does not pre-empt the cause: a slow decode builds a queue, the cause is the verdict
    _case(
        "bandwidth_bound_queue_forming",
        "memory_bandwidth_bound",
        "ITL p95 ~0.25 s against a 100 ms SLO, DRAM bandwidth 90%, SM 30%, and a queue forming (12 more "
        "waiting a minute, TTFT p95 still ~1 s): decode cannot move data fast enough; the queue building "
        "behind it is its consequence",
        latency=Latency(base=0.16, mix=((0.9, 1.0), (0.1, 1.5))),
        gpus=(Gpu(dram=0.9, sm=0.3),),
        kv_usage=0.7,
        waiting=Linear(1, 0.2),
        ttft=Latency(base=0.9, mix=((1.0, 1.0),)),
        contributing=_QUEUE,
    ),
    _case(
        "bandwidth_bound_24_waiting",
        "memory_bandwidth_bound",
        "the same bandwidth-bound decode with 24 requests waiting and first tokens taking 5-7 s: "
        "the fix is FP8 KV or a smaller batch, not replicas first",
        latency=Latency(base=0.16, mix=((0.9, 1.0), (0.1, 1.5))),
        gpus=(Gpu(dram=0.9, sm=0.3),),
        kv_usage=0.7,
        waiting=24,
        ttft=Latency(base=5.0, mix=((0.8, 1.0), (0.2, 1.4))),
        contributing=_QUEUE,
    ),
    _case(
        "compute_bound_growing_queue",
        "compute_bound",
        "SMs 95% busy with heavy prefill (60k prompt tokens/s), decode tokens wait behind it, and the "
        "queue grows by one every two seconds: compute is the cause, the queue its consequence",
        prompt_tokens_per_second=60000,
        latency=Latency(base=0.06, mix=PREFILL_DELAYS),
        gpus=(Gpu(dram=0.5, sm=0.95),),
        waiting=Linear(2, 0.5),
        ttft=Latency(base=3.0, mix=((0.8, 1.0), (0.2, 1.5))),
        contributing=_QUEUE,
    ),
    _case(
        "host_overhead_ten_waiting",
        "host_overhead_bound",
        "ITL p95 ~0.45 s (4x the SLO) while the GPU is almost idle (DRAM 8%, SM 12%) and ten requests "
        "wait: the host loop is the cause, the queue its consequence",
        generation_tokens_per_second=25,
        prompt_tokens_per_second=120,
        running=8,
        waiting=10,
        latency=Latency(base=0.35, mix=((0.9, 1.0), (0.1, 1.3))),
        gpus=(Gpu(dram=0.08, sm=0.12),),
        requests_per_second=0.3,
        ttft=Latency(base=6.0, mix=((0.8, 1.0), (0.2, 1.4))),
        contributing=_QUEUE,
    ),
    # 2. a harmless queue is not slowness
    _case(
        "harmless_queue_one_waiting",
        "healthy",
        "ITL p95 30 ms against a 100 ms SLO, TTFT p95 0.35 s, one request waiting at every scrape: "
        "nobody is delayed, so the queue is not slowness",
        latency=Latency(base=0.025, mix=((0.9375, 1.0), (0.0625, 1.2))),
        ttft=Latency(base=0.2, mix=((11 / 12, 1.0), (1 / 12, 1.5))),
        requests_per_second=12,
        waiting=1,
    ),
    # decode on time, the pool has room, and requests are delayed: the queue is the verdict
    _case(
        "queue_growing_decode_on_time",
        "request_queueing",
        "decode on time (ITL p95 25 ms), KV at 50%, the queue began to grow a minute ago (2 -> 32) while "
        "TTFT p95 is still under 1 s: the sequence limit or too few replicas",
        kv_usage=0.5,
        waiting=RampAtEnd(2, 32, 60),
        ttft=Latency(base=0.6, mix=((1.0, 1.0),)),
    ),
    _case(
        "ttft_over_threshold_decode_on_time",
        "request_queueing",
        "decode on time, KV at 50%, a steady queue of 3, but first tokens take 3-4 s: TTFT p95 over its "
        "2 s threshold, so requests are delayed",
        kv_usage=0.5,
        waiting=3,
        ttft=Latency(base=3.0, mix=((0.8, 1.0), (0.2, 1.3))),
    ),
    # 3. the verdict follows the incident: a change of cause one state window plus a scrape ago
    _case(
        "tier_miss_then_host_overhead",
        "host_overhead_bound",
        "decode slow throughout; KV came from the host tier at 6 GB/s until 16 s ago, since then the "
        "transfer counter is flat and the GPU almost idle: the host is the cause now, and the old "
        "transfer rate is not quoted as current",
        latency=Latency(base=0.2, mix=((0.9, 1.0), (0.1, 1.4))),
        kv_usage=0.6,
        waiting=4,
        kv_to_gpu_bytes_per_second=_since_change(6e9, 0.0),
        gpus=(Gpu(dram=_since_change(0.5, 0.08), sm=_since_change(0.35, 0.1), pcie_rx=_since_change(6e9, 2e7)),),
        settles=False,
        contributing=_QUEUE,
    ),
    _case(
        "thrashing_stops_bandwidth_remains",
        "memory_bandwidth_bound",
        "6 preemptions a minute until 16 s ago, none since (KV down from 98% to 80%); decode still slow "
        "on a bandwidth-bound GPU: thrashing is over, bandwidth is the cause now",
        latency=Latency(base=0.16, mix=((0.9, 1.0), (0.1, 1.5))),
        gpus=(Gpu(dram=0.9, sm=0.35),),
        preemptions_per_minute=_since_change(6.0, 0.0),
        kv_usage=_since_change(0.98, 0.8),
        waiting=_since_change(12, 2),
        settles=False,
        contributing=_QUEUE,
    ),
    _case(
        "capacity_pressure_then_tier_miss",
        "kv_tier_miss",
        "a full pool (KV 97%) with a growing queue until 16 s ago; since then KV at 70% and 6 GB/s of "
        "prefix KV from the host tier, decode slow: a tier miss, not a hybrid thrashing quoting the "
        "old KV usage",
        latency=Latency(base=0.16, mix=((0.9, 1.0), (0.1, 1.5))),
        kv_usage=_since_change(0.97, 0.7),
        waiting=_since_change(20, 3),
        kv_to_gpu_bytes_per_second=_since_change(0.0, 6e9),
        gpus=(Gpu(pcie_rx=_since_change(2e7, 6e9)),),
        settles=False,
        contributing=_QUEUE,
    ),
    _case(
        "thrashing_stops_pool_stays_full",
        "kv_capacity_pressure",
        "6 preemptions a minute until a third of the window and a scrape ago (21 s), none since; the pool "
        "stays at 95% and requests wait: the full pool delays admission, nothing is preempted now",
        preemptions_per_minute=_since_change(6.0, 0.0, SPARSE_THRASH_LAG),
        **_FULL_POOL,
        settles=False,
    ),
    # 4. a window too short to judge: verdict unknown (the CLI exits 2), never healthy
    _slow_on_one_gpu(
        "window_one_snapshot",
        "unknown",
        "one snapshot of a slow engine (`diagnose --window 1`): no rate, no quantile can be read",
        dram=0.9,
        sm=0.3,
        waiting=5,
        duration=0.0,
        settles=False,
    ),
    _slow_on_one_gpu(
        "window_two_snapshots",
        "unknown",
        "two snapshots of a slow engine: one interval, fewer than the features need (3 samples)",
        dram=0.9,
        sm=0.3,
        waiting=5,
        duration=1.0,
        settles=False,
    ),
)

SCENARIO_BY_NAME = {s.name: s for s in SCENARIOS}
assert len(SCENARIO_BY_NAME) == len(SCENARIOS), "scenario names must be unique"
