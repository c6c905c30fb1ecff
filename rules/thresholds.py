"""Every number the decision tree compares against, in one documented object.

The Python evaluator (``diagnose``) and the PromQL compiler (``rules/promql.py``) read the same
``Thresholds``, so the verdict on a dashboard and the alert that fires agree. Each default is
documented beside it. Override any subset with ``Thresholds.from_mapping`` (``--thresholds FILE``
is read by ``sources/thresholds_file.py``); unknown keys and out-of-range values are rejected
with one clear line (``ValueError``).
The latency SLO is not a threshold: it is part of the service, so it comes with
``Context.slo_seconds`` (and ``kvdoctor rules export --slo-ms``); its default is ``DEFAULT_SLO_SECONDS``.

``sized_for_interval(thresholds, seconds)`` widens every range the tree reads to hold at least
``MIN_SAMPLES_PER_RANGE`` samples taken ``seconds`` apart: the alert rules for a Prometheus
scraping every 30 s or 1 m, the exporter's live diagnosis at its collection interval.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

# The window a verdict is read from (seconds): the exporter's live diagnosis, the dashboard's and
# ``kvdoctor stress``'s read the last this many seconds; the alert rules' ranges are this long.
DIAGNOSIS_WINDOW_SECONDS = 60.0
# The per-token latency SLO (ITL p95, seconds) a diagnosis and the alert rules use unless told.
DEFAULT_SLO_SECONDS = 0.1
# Every range the tree reads holds at least this many samples (rate and trend need several).
MIN_SAMPLES_PER_RANGE = 4
# The fewest snapshots a window needs to be judged: a rate or a growth needs two samples in the
# state sub-window, and one more keeps a single late scrape from deciding. Fewer: verdict unknown
# (no verdict record in PromQL).
MIN_WINDOW_SAMPLES = 3
# The scrape interval the default rule file is sized for (its ranges also hold two samples at 30 s).
DEFAULT_SCRAPE_INTERVAL_SECONDS = 15.0


def _knob(default: float, help: str, lo: float = 0.0, hi: float = math.inf, lo_open: bool = False) -> float:
    return field(default=default, metadata={"help": help, "range": (lo, hi, lo_open)})


@dataclass(frozen=True)
class Thresholds:
    """The decision tree's knobs. A comment (``help``) per knob; ranges are checked on load."""

    # --- the window
    window_seconds: float = _knob(
        DIAGNOSIS_WINDOW_SECONDS,
        "Length of the evaluation window in seconds: the window the exporter diagnoses and the alert "
        "rules' longest range. Widened to 12 sampling intervals where samples are sparser (`kvdoctor "
        "rules export --scrape-interval`): each third of it carries the ITL trend and needs 4 samples.",
        lo=3.0,
        lo_open=False,
    )
    state_window_seconds: float = _knob(
        15.0,
        "Length in seconds of the recent sub-window (the end of the window) over which the tree reads "
        "the state of things now: KV usage, requests running and waiting, DRAM bandwidth, SM activity, "
        "the ITL and TTFT quantiles, and the rates that pick the cause (tokens, preemptions, KV moved, "
        "PCIe). Shorter than the window so a verdict follows a change of cause within one sub-window "
        "and a scrape, and a counter flat for this long is never quoted as current; the ITL trend and "
        "the knee keep the whole window. Capped at window_seconds; widened to 4 sampling intervals "
        "where samples are sparser.",
        lo=1.0,
        lo_open=False,
    )

    # --- step 1: is anything happening?
    idle_tokens_per_second: float = _knob(
        0.0,
        "Generated tokens per second at or below which the engine counts as idle (a KV usage "
        "left over from earlier traffic does not count as activity).",
    )

    # --- step 2: capacity and placement
    preemptions_per_minute: float = _knob(
        1.0,
        "Preemptions per minute over the window at or above which the KV pool is thrashing. "
        "One preemption in a 60 s window is enough: a preemption is itself proof the pool ran out.",
        lo_open=True,
    )
    kv_usage_quantile: float = _knob(
        0.9,
        "Quantile of KV-cache usage over the window compared with the ceiling. A high quantile, "
        "not the mean, because usage oscillates while the pool is exhausted (each preemption frees blocks).",
        hi=1.0,
    )
    kv_ceiling_ratio: float = _knob(
        0.90, "KV-cache usage (that quantile) at or above which the pool counts as full.", hi=1.0, lo_open=True
    )
    queue_waiting_min: float = _knob(
        1.0,
        "Median requests waiting over the state sub-window at or above which requests wait. A queue is "
        "slowness only where it delays: TTFT over ttft_slow_seconds, a queue that grows (queue_growth_per_minute), "
        "or no TTFT histogram to tell; beside slow decode it is the consequence, not the cause.",
        lo_open=True,
    )
    queue_growth_per_minute: float = _knob(
        10.0,
        "Growth of the queue (requests waiting, the slope of a least-squares line over the state "
        "sub-window, per minute) at or above which a queue counts as growing: requests arrive faster "
        "than the engine admits them, so each waits longer than the last.",
        lo_open=True,
    )
    ttft_slow_seconds: float = _knob(
        2.0,
        "Time to first token (its p95 over the window) at or above which requests count as delayed "
        "even where the queue looks short: the service's TTFT SLO.",
        lo_open=True,
    )
    requests_swapped_min: float = _knob(
        1.0,
        "Median requests swapped out to host memory (vLLM V0) at or above which the KV pool is thrashing.",
        lo_open=True,
    )
    kv_to_gpu_bytes_per_second_min: float = _knob(
        1e9,
        "KV bytes per second moved into the GPU from another tier (host, disk, remote) at or above "
        "which the transfer is significant.",
        lo_open=True,
    )
    pcie_receive_bytes_per_second_min: float = _knob(
        1e9,
        "Median PCIe receive bandwidth (bytes/s, busiest GPU) at or above which host-to-GPU traffic is significant.",
        lo_open=True,
    )
    slow_tier_hit_fraction_min: float = _knob(
        0.2,
        "Share of prefix-cache hit tokens served from a tier other than the GPU (host, disk, p2p) "
        "at or above which the hits count as served from a slow tier.",
        hi=1.0,
        lo_open=True,
    )

    # --- step 3: is decode slow?
    itl_quantile: float = _knob(
        0.95,
        "Inter-token-latency quantile compared with the SLO (from the histogram's bucket increases "
        "over the state sub-window).",
        hi=1.0,
        lo_open=True,
    )
    ttft_quantile: float = _knob(
        0.95,
        "Time-to-first-token quantile compared with ttft_slow_seconds (from the histogram's bucket "
        "increases over the window: requests are fewer than tokens).",
        hi=1.0,
        lo_open=True,
    )
    trend_ratio: float = _knob(
        1.5,
        "ITL rises when the median of the window's last third is at least this multiple of the "
        "median of its first third.",
        lo=1.0,
        lo_open=True,
    )
    trend_min_slo_fraction: float = _knob(
        0.5,
        "A rising ITL counts only once the last third's median has reached this fraction of the SLO "
        "(a rise from 5 to 8 ms is not a problem with a 100 ms SLO).",
        hi=1.0,
    )

    # --- step 4: bandwidth, compute or host
    gpu_quantile: float = _knob(
        0.5,
        "Quantile over the window of each GPU gauge (DRAM bandwidth, SM active, PCIe); the busiest "
        "GPU's value is used.",
        hi=1.0,
    )
    bandwidth_high_ratio: float = _knob(
        0.80,
        "DRAM bandwidth utilisation at or above which decode is memory-bandwidth bound "
        "(unless SM activity is clearly higher).",
        hi=1.0,
        lo_open=True,
    )
    sm_high_ratio: float = _knob(
        0.80,
        "SM activity at or above which decode is compute bound (when bandwidth is not high, or "
        "SM activity is clearly above it).",
        hi=1.0,
        lo_open=True,
    )
    clearly_above_margin: float = _knob(
        0.15,
        "How far (in ratio points) SM activity must exceed DRAM bandwidth to call a GPU busy on "
        "both compute bound rather than bandwidth bound.",
        hi=1.0,
    )
    host_overhead_gpu_max: float = _knob(
        0.5,
        "When both DRAM bandwidth and SM activity (any method, busiest GPU) stay below this while "
        "decode is slow, the time goes to the host: scheduler, CPU, Python, locks.",
        hi=1.0,
        lo_open=True,
    )
    prefill_heavy_ratio: float = _knob(
        10.0,
        "Without GPU counters: prompt tokens per generated token at or above which a slow decode "
        "is blamed on prefill compute rather than bandwidth.",
        lo_open=True,
    )

    # --- headline and knee
    prefix_hit_ratio_high: float = _knob(
        0.5,
        "Prefix-cache hit ratio at or above which a slow verdict's headline says 'cache hit but "
        "slow' (the confusion the on-call engineer arrives with).",
        hi=1.0,
    )
    knee_min_points: float = _knob(10, "Intervals with tokens needed before knee detection says anything.", lo=3)
    knee_min_kv_span: float = _knob(
        0.05, "KV usage must vary by at least this much over the window for a knee to be detected.", hi=1.0
    )
    knee_jump_ratio: float = _knob(
        1.5,
        "ITL above the knee at least this multiple of ITL below it: 'latency jumps at KV ~x%'.",
        lo=1.0,
        lo_open=True,
    )
    knee_rise_ratio: float = _knob(
        1.2,
        "ITL at the top of the KV range at least this multiple of ITL at the bottom (fitted): "
        "'latency rises together with KV'.",
        lo=1.0,
        lo_open=True,
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
                raise ValueError(f"threshold {f.name} must be a number, got {value!r}")
            lo, hi, lo_open = f.metadata["range"]
            if value < lo or (lo_open and value == lo) or value > hi:
                bound = f"{'>' if lo_open else '>='} {lo:g}" + (f" and <= {hi:g}" if hi != math.inf else "")
                raise ValueError(f"threshold {f.name} must be {bound}, got {value!r}")

    # ------------------------------------------------------------------------- construction
    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any] | None, source: str = "thresholds") -> Thresholds:
        """Defaults overridden by ``mapping``; unknown keys or bad values raise one-line ``ValueError``."""
        if mapping is None:
            return cls()
        if not isinstance(mapping, Mapping):
            raise ValueError(
                f"{source}: expected a mapping of threshold names to numbers, got {type(mapping).__name__}"
            )
        known = {f.name for f in fields(cls)}
        unknown = sorted(str(k) for k in mapping if k not in known)
        if unknown:
            raise ValueError(f"{source}: unknown threshold(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        try:
            return cls(**dict(mapping))
        except ValueError as exc:
            raise ValueError(f"{source}: {exc}") from None

    def as_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def describe(cls) -> dict[str, str]:
        """Knob name -> its help text (for docs and ``--help``)."""
        return {f.name: f.metadata["help"] for f in fields(cls)}


DEFAULT_THRESHOLDS = Thresholds()


def sized_for_interval(thresholds: Thresholds, interval_seconds: float) -> Thresholds:
    """``thresholds`` with every range holding at least ``MIN_SAMPLES_PER_RANGE`` samples taken
    ``interval_seconds`` apart: the state sub-window, and the window (its thirds carry the ITL
    trend, so it holds three such ranges). Already wide enough: returned unchanged."""
    if not interval_seconds > 0 or not math.isfinite(interval_seconds):
        raise ValueError(f"the sampling interval must be a positive number of seconds, got {interval_seconds!r}")
    least = MIN_SAMPLES_PER_RANGE * float(interval_seconds)
    window = max(thresholds.window_seconds, 3 * least)
    state = min(window, max(thresholds.state_window_seconds, least))
    if window == thresholds.window_seconds and state == thresholds.state_window_seconds:
        return thresholds
    return replace(thresholds, window_seconds=window, state_window_seconds=state)
