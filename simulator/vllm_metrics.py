"""What the simulated engine counts, laid out as vLLM lays it out: families, label values, buckets.

``VllmStats`` holds vLLM's counters, labelled counters and histograms (cumulative, with vLLM's
bucket boundaries), keyed by family name; ``engine_server`` renders them as vLLM's ``/metrics``.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from kvdoctor.signals.vocabulary import ITL_BUCKETS  # vLLM's, defined once in the vocabulary

# vLLM 0.32's bucket boundaries (tests/fixtures/vllm-0.32-cpu), by histogram family; +Inf is implied.
# fmt: off
TOKENS_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0)
REQUEST_SECONDS_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
    1920.0, 7680.0,
)
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0, 2560.0,
)
ITERATION_TOKENS_BUCKETS = (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0)
# fmt: on
HISTOGRAM_BUCKETS: dict[str, tuple[float, ...]] = {
    "vllm:request_prompt_tokens": TOKENS_BUCKETS,
    "vllm:request_generation_tokens": TOKENS_BUCKETS,
    "vllm:iteration_tokens_total": ITERATION_TOKENS_BUCKETS,
    "vllm:request_max_num_generation_tokens": TOKENS_BUCKETS,
    "vllm:request_params_n": (1.0, 2.0, 5.0, 10.0, 20.0),
    "vllm:request_params_max_tokens": TOKENS_BUCKETS,
    "vllm:time_to_first_token_seconds": TTFT_BUCKETS,
    "vllm:inter_token_latency_seconds": ITL_BUCKETS,
    "vllm:request_time_per_output_token_seconds": ITL_BUCKETS,
    "vllm:e2e_request_latency_seconds": REQUEST_SECONDS_BUCKETS,
    "vllm:request_queue_time_seconds": REQUEST_SECONDS_BUCKETS,
    "vllm:request_inference_time_seconds": REQUEST_SECONDS_BUCKETS,
    "vllm:request_prefill_time_seconds": REQUEST_SECONDS_BUCKETS,
    "vllm:request_decode_time_seconds": REQUEST_SECONDS_BUCKETS,
    "vllm:request_num_preemptions": (1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0),
    "vllm:request_prefill_kv_computed_tokens": TOKENS_BUCKETS,
}

# Plain counters (family names, without ``_total``), zero at start.
PLAIN_COUNTERS = (
    "vllm:num_preemptions",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:external_prefix_cache_queries",
    "vllm:external_prefix_cache_hits",
    "vllm:mm_cache_queries",
    "vllm:mm_cache_hits",
    "vllm:prompt_tokens_cached",
    "vllm:estimated_flops_per_gpu",
    "vllm:estimated_read_bytes_per_gpu",
    "vllm:estimated_write_bytes_per_gpu",
)
# The values each labelled counter's label takes, in vLLM's order.
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHE_TIERS = ("device", "host", "p2p", "disk", "external_unspecified")
TRANSFER_TYPES = ("CPU_to_GPU", "GPU_to_CPU")
ADMISSION_REJECTION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")
LABELLED_COUNTERS: dict[str, tuple[str, ...]] = {
    "vllm:request_success": FINISHED_REASONS,
    "vllm:prompt_tokens_by_source": PROMPT_SOURCES,
    "vllm:prompt_tokens_cached_by_source": CACHE_TIERS,
    "vllm:admission_rejections": ADMISSION_REJECTION_REASONS,
    "vllm:kv_offload_total_bytes": TRANSFER_TYPES,
    "vllm:kv_offload_total_time": TRANSFER_TYPES,
}


class Histogram:
    """A cumulative Prometheus histogram: counts per bucket (``le`` inclusive) plus sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Iterable[float]):
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # last one is +Inf
        self.sum = 0.0

    def observe(self, value: float, n: int = 1) -> None:
        if n <= 0:
            return
        self.counts[bisect.bisect_left(self.bounds, value)] += n
        self.sum += value * n

    @property
    def count(self) -> int:
        return sum(self.counts)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Histogram):
            return NotImplemented
        return (self.bounds, self.counts, self.sum) == (other.bounds, other.counts, other.sum)

    __hash__ = None  # mutable

    def copy(self) -> Histogram:
        twin = Histogram(self.bounds)
        twin.counts = list(self.counts)
        twin.sum = self.sum
        return twin

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, cumulative count) pairs, +Inf last."""
        out, running = [], 0
        for bound, n in zip((*self.bounds, math.inf), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out


@dataclass
class VllmStats:
    """vLLM's metrics, as the engine would count them. Keys are family names."""

    counters: dict[str, float] = field(default_factory=dict)
    labelled: dict[str, dict[str, float]] = field(default_factory=dict)  # family -> label value -> count
    histograms: dict[str, Histogram] = field(default_factory=dict)

    @classmethod
    def new(cls) -> VllmStats:
        return cls(
            counters=dict.fromkeys(PLAIN_COUNTERS, 0.0),
            labelled={name: dict.fromkeys(values, 0.0) for name, values in LABELLED_COUNTERS.items()},
            histograms={name: Histogram(bounds) for name, bounds in HISTOGRAM_BUCKETS.items()},
        )

    def copy(self) -> VllmStats:
        """A deep copy: later counting does not show in it."""
        return VllmStats(
            counters=dict(self.counters),
            labelled={k: dict(v) for k, v in self.labelled.items()},
            histograms={k: h.copy() for k, h in self.histograms.items()},
        )

    def add(self, name: str, value: float) -> None:
        self.counters[name] += value

    def add_labelled(self, name: str, label: str, value: float) -> None:
        self.labelled[name][label] += value

    def observe(self, name: str, value: float, n: int = 1) -> None:
        self.histograms[name].observe(value, n)
