"""Small collectors implementing the Collector protocol, for runtime and app tests."""

from __future__ import annotations

import threading
from collections.abc import Callable

from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.collection import Collected, NotApplicable, SourceError
from kvdoctor.signals.window import labels_of

ITL_BUCKETS = ("0.01", "0.025", "0.05", "0.1", "0.25", "+Inf")


def gpu_samples(n_gpus: int = 8, step: int = 0) -> Collected:
    """Every canonical GPU signal for ``n_gpus`` GPUs; values move with ``step``."""
    out = Collected()
    for i in range(n_gpus):
        base = labels_of(gpu=str(i), uuid=f"GPU-{i:08d}", model="NVIDIA H100 80GB HBM3")
        method = labels_of(dict(base), method="gpm")
        out.add(S.GPU_DRAM_BANDWIDTH_UTILIZATION, (0.5 + 0.01 * i + 0.001 * step) % 1.0, method)
        out.add(S.GPU_SM_ACTIVE, (0.3 + 0.01 * i) % 1.0, method)
        out.add(S.GPU_MEMORY_USED, 60e9 + i * 1e6 + step, base)
        out.add(S.GPU_MEMORY_TOTAL, 80e9, base)
        out.add(S.GPU_PCIE_RX, 1e8 * (step % 7), base)
        out.add(S.GPU_PCIE_TX, 5e7 * (step % 5), base)
        out.add(S.GPU_DRAM_PEAK_BANDWIDTH, 3.35e12, base)
    return out


def engine_samples(step: int = 0, usage: float = 0.5, capacity: float = 4096.0) -> Collected:
    """A few canonical engine signals, including an ITL histogram with the engine's buckets."""
    out = Collected()
    eng = labels_of(engine="vllm", model_name="tiny", dp_rank="0")
    out.add(S.KV_CACHE_USAGE, usage, eng)
    out.add(S.KV_CACHE_CAPACITY, capacity, labels_of(engine="vllm", dp_rank="0"))  # as vLLM: no model_name
    out.add(S.REQUESTS_RUNNING, 4, eng)
    out.add(S.REQUESTS_WAITING, 1, eng)
    out.add(S.PREEMPTIONS, 3 + step, eng)
    out.add(S.GENERATION_TOKENS, 1000 + 100 * step, eng)
    cumulative = 0
    for i, le in enumerate(ITL_BUCKETS):
        cumulative += 10 * (i + 1) + step
        out.add(S.INTER_TOKEN_LATENCY + "_bucket", cumulative, labels_of(dict(eng), le=le))
    out.add(S.INTER_TOKEN_LATENCY + "_sum", 12.5 + step, eng)
    out.add(S.INTER_TOKEN_LATENCY + "_count", cumulative, eng)
    return out


class StaticCollector:
    """Returns a fresh copy of the same samples every cycle (or of ``make(step)``)."""

    def __init__(self, name: str, make: Callable[[int], Collected]):
        self.name = name
        self._make = make
        self.calls = 0
        self.closed = False

    def collect(self) -> Collected:
        out = self._make(self.calls)
        self.calls += 1
        return out

    def close(self) -> None:
        self.closed = True


class ScriptedCollector:
    """Follows a script, one entry per call (the last repeats): a Collected to return or an
    exception instance to raise."""

    def __init__(self, name: str, script: list):
        self.name = name
        self.script = list(script)
        self.calls = 0
        self.closed = False

    def collect(self) -> Collected:
        step = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        if isinstance(step, BaseException):
            raise step
        return step

    def close(self) -> None:
        self.closed = True


class BlockingCollector:
    """Blocks in collect() until released: a source that hangs for as long as the test wants."""

    def __init__(self, name: str = "stuck"):
        self.name = name
        self.release = threading.Event()
        self.entered = threading.Event()

    def collect(self) -> Collected:
        self.entered.set()
        self.release.wait(30)
        return Collected({(S.REQUESTS_RUNNING, labels_of(engine="stuck")): 2.0})

    def close(self) -> None:
        self.release.set()


def not_applicable(name: str = "nvml") -> ScriptedCollector:
    return ScriptedCollector(name, [NotApplicable("no NVIDIA driver here")])


def failing(name: str, reason: str = "connection_refused") -> ScriptedCollector:
    return ScriptedCollector(name, [SourceError(reason, f"{name}: {reason}")])


class FakeClock:
    """A settable clock for deterministic timestamps."""

    def __init__(self, start: float = 1_700_000_000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
