"""The canonical signal vocabulary: every source is normalised into these names.

This table is the one source of truth for signal names, types, units, help text and labels.
The exporter registers its metrics from it, the adapters map engine metrics onto it, the rules
read windows keyed by it, the PromQL compiler writes expressions over it and the README's metric
list is generated from it.

Conventions (Prometheus): lower snake case, ``kvdoctor_`` prefix, unit in the name, ``_total`` on
counters, ratios 0..1, no colons. Counters are exported raw, never as pre-computed rates.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    GAUGE = "gauge"
    COUNTER = "counter"
    HISTOGRAM = "histogram"


GPU_LABELS = ("gpu", "uuid", "model")
ENGINE_LABELS = ("engine", "model_name")
POD_LABEL = "pod"


@dataclass(frozen=True)
class Signal:
    """One canonical signal. ``labels`` are the identifying labels; ``pod`` may be added to any."""

    name: str
    kind: Kind
    unit: str
    help: str
    labels: tuple[str, ...] = ()
    source: str = ""  # where it comes from, for the README's metric list

    @property
    def series_names(self) -> tuple[str, ...]:
        """The sample names this signal produces in an exposition."""
        if self.kind is Kind.HISTOGRAM:
            return (self.name + "_bucket", self.name + "_sum", self.name + "_count")
        return (self.name,)


def _gpu(name: str, kind: Kind, unit: str, help: str, extra: tuple[str, ...] = (), source: str = "") -> Signal:
    return Signal(name, kind, unit, help, GPU_LABELS + extra, source)


def _engine(name: str, kind: Kind, unit: str, help: str, extra: tuple[str, ...] = (), source: str = "") -> Signal:
    return Signal(name, kind, unit, help, ENGINE_LABELS + extra, source)


GPU_DRAM_BANDWIDTH_UTILIZATION = "kvdoctor_gpu_dram_bandwidth_utilization_ratio"
GPU_SM_ACTIVE = "kvdoctor_gpu_sm_active_ratio"
GPU_MEMORY_USED = "kvdoctor_gpu_memory_used_bytes"
GPU_MEMORY_TOTAL = "kvdoctor_gpu_memory_total_bytes"
GPU_PCIE_RX = "kvdoctor_gpu_pcie_receive_bytes_per_second"
GPU_PCIE_TX = "kvdoctor_gpu_pcie_transmit_bytes_per_second"
GPU_DRAM_PEAK_BANDWIDTH = "kvdoctor_gpu_dram_peak_bandwidth_bytes_per_second"

# GPU health: what the hardware can do against what it does (clocks, power, link) and its errors.
GPU_TEMPERATURE = "kvdoctor_gpu_temperature_celsius"
GPU_POWER_DRAW = "kvdoctor_gpu_power_draw_watts"
GPU_POWER_LIMIT = "kvdoctor_gpu_power_limit_watts"
GPU_CLOCK = "kvdoctor_gpu_clock_hertz"
GPU_MAX_CLOCK = "kvdoctor_gpu_max_clock_hertz"
GPU_CLOCK_THROTTLE_REASON = "kvdoctor_gpu_clock_throttle_reason"
GPU_XID_ERRORS = "kvdoctor_gpu_xid_errors_total"
GPU_LAST_XID = "kvdoctor_gpu_last_xid"
GPU_ECC_ERRORS = "kvdoctor_gpu_ecc_errors_total"
GPU_REMAPPED_ROWS = "kvdoctor_gpu_remapped_rows_total"
GPU_ROW_REMAP_PENDING = "kvdoctor_gpu_row_remap_pending"
GPU_ROW_REMAP_FAILURE = "kvdoctor_gpu_row_remap_failure"
GPU_PCIE_LINK_GENERATION = "kvdoctor_gpu_pcie_link_generation"
GPU_PCIE_LINK_MAX_GENERATION = "kvdoctor_gpu_pcie_link_max_generation"
GPU_PCIE_LINK_WIDTH = "kvdoctor_gpu_pcie_link_width_lanes"
GPU_PCIE_LINK_MAX_WIDTH = "kvdoctor_gpu_pcie_link_max_width_lanes"
GPU_PCIE_REPLAYS = "kvdoctor_gpu_pcie_replays_total"
GPU_HEALTH_SIGNALS = (
    GPU_TEMPERATURE,
    GPU_POWER_DRAW,
    GPU_POWER_LIMIT,
    GPU_CLOCK,
    GPU_MAX_CLOCK,
    GPU_CLOCK_THROTTLE_REASON,
    GPU_XID_ERRORS,
    GPU_LAST_XID,
    GPU_ECC_ERRORS,
    GPU_REMAPPED_ROWS,
    GPU_ROW_REMAP_PENDING,
    GPU_ROW_REMAP_FAILURE,
    GPU_PCIE_LINK_GENERATION,
    GPU_PCIE_LINK_MAX_GENERATION,
    GPU_PCIE_LINK_WIDTH,
    GPU_PCIE_LINK_MAX_WIDTH,
    GPU_PCIE_REPLAYS,
)

KV_CACHE_USAGE = "kvdoctor_kv_cache_usage_ratio"
KV_CACHE_CAPACITY = "kvdoctor_kv_cache_capacity_tokens"
PREEMPTIONS = "kvdoctor_preemptions_total"
KV_TRANSFER_BYTES = "kvdoctor_kv_transfer_bytes_total"
PREFIX_CACHE_QUERIES = "kvdoctor_prefix_cache_queries_total"
PREFIX_CACHE_HITS = "kvdoctor_prefix_cache_hits_total"
PREFIX_CACHE_HITS_BY_TIER = "kvdoctor_prefix_cache_hits_by_tier_total"
PREFIX_CACHE_HIT_RATIO = "kvdoctor_prefix_cache_hit_ratio"
INTER_TOKEN_LATENCY = "kvdoctor_inter_token_latency_seconds"
TIME_TO_FIRST_TOKEN = "kvdoctor_time_to_first_token_seconds"
REQUESTS_RUNNING = "kvdoctor_requests_running"
REQUESTS_WAITING = "kvdoctor_requests_waiting"
REQUESTS_SWAPPED = "kvdoctor_requests_swapped"
KV_CACHE_HOST_USAGE = "kvdoctor_kv_cache_host_usage_ratio"
GENERATION_TOKENS = "kvdoctor_generation_tokens_total"
GENERATION_SECONDS = "kvdoctor_generation_seconds_total"
PROMPT_TOKENS = "kvdoctor_prompt_tokens_total"
ITL_SLO = "kvdoctor_inter_token_latency_slo_seconds"
TTFT_SLO = "kvdoctor_time_to_first_token_slo_seconds"
TOKENS_OVER_ITL_SLO = "kvdoctor_tokens_over_itl_slo_total"
REQUESTS_OVER_TTFT_SLO = "kvdoctor_requests_over_ttft_slo_total"
# Engine series the exporter counts itself from the engine's histograms (exporter/slo_counters.py).
SLO_COUNTERS = (TOKENS_OVER_ITL_SLO, REQUESTS_OVER_TTFT_SLO)
CONTEXT_INFO = "kvdoctor_context_info"
ENGINE_INFO = "kvdoctor_engine_info"

DIAGNOSIS_VERDICT = "kvdoctor_diagnosis_verdict"
DECODE_STEP_FLOOR = "kvdoctor_decode_step_floor_seconds"

SOURCE_UP = "kvdoctor_source_up"
SOURCE_SCRAPE_DURATION = "kvdoctor_source_scrape_duration_seconds"
SOURCE_ERRORS = "kvdoctor_source_errors_total"
BUILD_INFO = "kvdoctor_build_info"

# The standard process metrics of every Prometheus client library (PROCESS_SIGNALS, not kvdoctor_*).
PROCESS_CPU_SECONDS = "process_cpu_seconds_total"
PROCESS_RESIDENT_MEMORY = "process_resident_memory_bytes"
PROCESS_VIRTUAL_MEMORY = "process_virtual_memory_bytes"
PROCESS_START_TIME = "process_start_time_seconds"
PROCESS_OPEN_FDS = "process_open_fds"
PROCESS_MAX_FDS = "process_max_fds"

# Values of the ``method`` label on the GPU ratio signals: how the number was measured.
METHOD_GPM = "gpm"  # NVML GPM (Hopper+): DRAM bandwidth and SM activity
METHOD_DCGM = "dcgm"  # dcgm-exporter's profiling counters: the same quantities
METHOD_NVML_UTIL = "nvml_util"  # NVML utilisation rates: duty cycles, not bandwidth or SM activity

# Values of the ``clock`` label on the clock signals.
CLOCK_SM = "sm"
CLOCK_MEMORY = "memory"

# Values of the ``error`` label on the ECC and remapped-row counters, and of ``scope`` on ECC:
# volatile counts since the driver loaded, aggregate over the GPU's life (its InfoROM).
ERROR_CORRECTED = "corrected"
ERROR_UNCORRECTED = "uncorrected"
SCOPE_VOLATILE = "volatile"
SCOPE_AGGREGATE = "aggregate"

# The clock throttle (NVML "clocks event") reasons: the ``reason`` label of
# kvdoctor_gpu_clock_throttle_reason, each with its bit in NVML's mask, which DCGM's
# DCGM_FI_DEV_CLOCKS_EVENT_REASONS (formerly ..._CLOCK_THROTTLE_REASONS) reports unchanged.
# gpu_idle, applications_clocks_setting, sync_boost and display_clock_setting hold clocks down by
# design; sw_power_cap and the slowdowns are what slows a loaded GPU.
CLOCK_THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)


def throttle_reason_states(mask: int) -> dict[str, float]:
    """The state set of an NVML/DCGM clock-event bitmask: every reason, 1.0 when its bit is set."""
    return {reason: 1.0 if mask & bit else 0.0 for bit, reason in CLOCK_THROTTLE_REASONS}


# vLLM's inter-token-latency histogram bounds in seconds (vllm/v1/metrics/loggers.py), +Inf left
# out: what the simulated engine exposes and what tests and benchmarks build histograms on.
ITL_BUCKETS: tuple[float, ...] = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)


SIGNALS: dict[str, Signal] = {
    s.name: s
    for s in (
        _gpu(
            GPU_DRAM_BANDWIDTH_UTILIZATION,
            Kind.GAUGE,
            "ratio",
            "DRAM bandwidth used vs the theoretical maximum (0..1). "
            "method=gpm|dcgm is bandwidth; method=nvml_util is a duty cycle, not bandwidth.",
            extra=("method",),
            source="NVML GPM DRAM_BW_UTIL; dcgm-exporter DCGM_FI_PROF_DRAM_ACTIVE; NVML utilization.memory",
        ),
        _gpu(
            GPU_SM_ACTIVE,
            Kind.GAUGE,
            "ratio",
            "Fraction of SMs (gpm, dcgm) or of time (nvml_util) with work running (0..1).",
            extra=("method",),
            source="NVML GPM SM_UTIL; DCGM_FI_PROF_SM_ACTIVE; NVML utilization.gpu",
        ),
        _gpu(GPU_MEMORY_USED, Kind.GAUGE, "bytes", "GPU memory in use.", source="NVML memory info"),
        _gpu(GPU_MEMORY_TOTAL, Kind.GAUGE, "bytes", "GPU memory in total.", source="NVML memory info"),
        _gpu(
            GPU_PCIE_RX,
            Kind.GAUGE,
            "bytes_per_second",
            "PCIe bytes received by the GPU per second (host to device).",
            source="NVML GPM PCIE_RX_PER_SEC; nvmlDeviceGetPcieThroughput; DCGM_FI_PROF_PCIE_RX_BYTES",
        ),
        _gpu(
            GPU_PCIE_TX,
            Kind.GAUGE,
            "bytes_per_second",
            "PCIe bytes transmitted by the GPU per second (device to host).",
            source="NVML GPM PCIE_TX_PER_SEC; nvmlDeviceGetPcieThroughput; DCGM_FI_PROF_PCIE_TX_BYTES",
        ),
        _gpu(
            GPU_DRAM_PEAK_BANDWIDTH,
            Kind.GAUGE,
            "bytes_per_second",
            "Theoretical peak DRAM bandwidth of the GPU.",
            source="NVML bus width x max memory clock x data rate, the GPU catalogue, or --gpu-peak-bandwidth",
        ),
        _gpu(
            GPU_TEMPERATURE,
            Kind.GAUGE,
            "celsius",
            "GPU core temperature.",
            source="nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU); DCGM_FI_DEV_GPU_TEMP",
        ),
        _gpu(
            GPU_POWER_DRAW,
            Kind.GAUGE,
            "watts",
            "Power the GPU board draws.",
            source="nvmlDeviceGetPowerUsage; DCGM_FI_DEV_POWER_USAGE",
        ),
        _gpu(
            GPU_POWER_LIMIT,
            Kind.GAUGE,
            "watts",
            "The power limit the driver enforces (the lowest of every limiter); a draw at it caps the clocks.",
            source="nvmlDeviceGetEnforcedPowerLimit; DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
        ),
        _gpu(
            GPU_CLOCK,
            Kind.GAUGE,
            "hertz",
            "Current clock (clock=sm|memory).",
            extra=("clock",),
            source="nvmlDeviceGetClockInfo; DCGM_FI_DEV_SM_CLOCK, DCGM_FI_DEV_MEM_CLOCK",
        ),
        _gpu(
            GPU_MAX_CLOCK,
            Kind.GAUGE,
            "hertz",
            "Maximum clock the GPU supports (clock=sm|memory): the current clock's ceiling.",
            extra=("clock",),
            source="nvmlDeviceGetMaxClockInfo; DCGM_FI_DEV_MAX_SM_CLOCK, DCGM_FI_DEV_MAX_MEM_CLOCK",
        ),
        _gpu(
            GPU_CLOCK_THROTTLE_REASON,
            Kind.GAUGE,
            "",
            "1 for each clock throttle (clocks event) reason active now, 0 for the others (a state set): "
            "gpu_idle, applications_clocks_setting, sw_power_cap, hw_slowdown, sync_boost, "
            "sw_thermal_slowdown, hw_thermal_slowdown, hw_power_brake_slowdown, display_clock_setting.",
            extra=("reason",),
            source="nvmlDeviceGetCurrentClocksEventReasons (older: ...ClocksThrottleReasons); "
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS (older: DCGM_FI_DEV_CLOCK_THROTTLE_REASONS)",
        ),
        _gpu(
            GPU_XID_ERRORS,
            Kind.COUNTER,
            "",
            "XID critical errors the driver reported for the GPU since the exporter started watching.",
            source="NVML events (nvmlDeviceRegisterEvents nvmlEventTypeXidCriticalError, polled without waiting)",
        ),
        _gpu(
            GPU_LAST_XID,
            Kind.GAUGE,
            "",
            "The code of the last XID error seen (0: none since the watch started).",
            source="NVML events; DCGM_FI_DEV_XID_ERRORS",
        ),
        _gpu(
            GPU_ECC_ERRORS,
            Kind.COUNTER,
            "",
            "ECC memory errors (error=corrected|uncorrected; scope=volatile: since the driver loaded, "
            "aggregate: over the GPU's life).",
            extra=("error", "scope"),
            source="nvmlDeviceGetTotalEccErrors; DCGM_FI_DEV_ECC_SBE/DBE_VOL/AGG_TOTAL",
        ),
        _gpu(
            GPU_REMAPPED_ROWS,
            Kind.COUNTER,
            "",
            "DRAM rows remapped to spares after memory errors (error=corrected|uncorrected).",
            extra=("error",),
            source="nvmlDeviceGetRemappedRows; DCGM_FI_DEV_CORRECTABLE/UNCORRECTABLE_REMAPPED_ROWS",
        ),
        _gpu(
            GPU_ROW_REMAP_PENDING,
            Kind.GAUGE,
            "",
            "1 when a row remapping waits for a GPU reset to take effect.",
            source="nvmlDeviceGetRemappedRows; DCGM_FI_DEV_ROW_REMAP_PENDING",
        ),
        _gpu(
            GPU_ROW_REMAP_FAILURE,
            Kind.GAUGE,
            "",
            "1 when a row remapping failed (no spare row left: the GPU needs replacing).",
            source="nvmlDeviceGetRemappedRows; DCGM_FI_DEV_ROW_REMAP_FAILURE",
        ),
        _gpu(
            GPU_PCIE_LINK_GENERATION,
            Kind.GAUGE,
            "",
            "PCIe link generation the link trained at now (an idle GPU may drop it to save power).",
            source="nvmlDeviceGetCurrPcieLinkGeneration; DCGM_FI_DEV_PCIE_LINK_GEN",
        ),
        _gpu(
            GPU_PCIE_LINK_MAX_GENERATION,
            Kind.GAUGE,
            "",
            "Highest PCIe link generation this GPU and its slot support together.",
            source="nvmlDeviceGetMaxPcieLinkGeneration; DCGM_FI_DEV_PCIE_MAX_LINK_GEN",
        ),
        _gpu(
            GPU_PCIE_LINK_WIDTH,
            Kind.GAUGE,
            "lanes",
            "PCIe lanes the link trained with now.",
            source="nvmlDeviceGetCurrPcieLinkWidth; DCGM_FI_DEV_PCIE_LINK_WIDTH",
        ),
        _gpu(
            GPU_PCIE_LINK_MAX_WIDTH,
            Kind.GAUGE,
            "lanes",
            "Most PCIe lanes this GPU and its slot support together.",
            source="nvmlDeviceGetMaxPcieLinkWidth; DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH",
        ),
        _gpu(
            GPU_PCIE_REPLAYS,
            Kind.COUNTER,
            "",
            "PCIe packets the link had to resend (replays): a rising count is a failing link.",
            source="nvmlDeviceGetPcieReplayCounter; DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        ),
        _engine(
            KV_CACHE_USAGE,
            Kind.GAUGE,
            "ratio",
            "Fraction of the engine's GPU KV-cache pool in use (0..1).",
            source="vllm:kv_cache_usage_perc, sglang:token_usage, trtllm_kv_cache_utilization",
        ),
        _engine(
            KV_CACHE_CAPACITY,
            Kind.GAUGE,
            "tokens",
            "Tokens the engine's GPU KV-cache pool can hold.",
            source="vllm:cache_config_info num_gpu_blocks x block_size",
        ),
        _engine(
            PREEMPTIONS,
            Kind.COUNTER,
            "",
            "Requests preempted (recompute or swap) or retracted because the KV pool ran out.",
            source="vllm:num_preemptions_total, sglang:num_retracted_reqs",
        ),
        _engine(
            KV_TRANSFER_BYTES,
            Kind.COUNTER,
            "bytes",
            "KV bytes moved between the GPU and another tier (direction=to_gpu|from_gpu).",
            extra=("direction", "tier"),
            source="vllm:kv_offload_total_bytes, LMCache, Dynamo KVBM",
        ),
        _engine(
            PREFIX_CACHE_QUERIES,
            Kind.COUNTER,
            "tokens",
            "Prompt tokens looked up in the prefix cache.",
            source="vllm:prefix_cache_queries_total",
        ),
        _engine(
            PREFIX_CACHE_HITS,
            Kind.COUNTER,
            "tokens",
            "Prompt tokens found in the prefix cache (any tier).",
            source="vllm:prefix_cache_hits_total",
        ),
        _engine(
            PREFIX_CACHE_HITS_BY_TIER,
            Kind.COUNTER,
            "tokens",
            "Prefix-cache hit tokens by the tier that served them (tier=device|host|disk|p2p|...).",
            extra=("tier",),
            source="vllm:prompt_tokens_cached_by_source_total",
        ),
        _engine(
            PREFIX_CACHE_HIT_RATIO,
            Kind.GAUGE,
            "ratio",
            "Prefix-cache hit ratio, for engines that only export a ratio (0..1).",
            source="sglang:cache_hit_rate",
        ),
        _engine(
            INTER_TOKEN_LATENCY,
            Kind.HISTOGRAM,
            "seconds",
            "Time between consecutive output tokens, with the engine's own buckets.",
            source="vllm:inter_token_latency_seconds (older: vllm:time_per_output_token_seconds)",
        ),
        _engine(
            TIME_TO_FIRST_TOKEN,
            Kind.HISTOGRAM,
            "seconds",
            "Time to first token, with the engine's own buckets.",
            source="vllm:time_to_first_token_seconds",
        ),
        _engine(REQUESTS_RUNNING, Kind.GAUGE, "", "Requests in the running batch.", source="vllm:num_requests_running"),
        _engine(REQUESTS_WAITING, Kind.GAUGE, "", "Requests queued, waiting.", source="vllm:num_requests_waiting"),
        _engine(
            REQUESTS_SWAPPED,
            Kind.GAUGE,
            "",
            "Requests whose KV blocks are swapped out to host memory right now (preempted by swapping).",
            source="vllm:num_requests_swapped (vLLM V0)",
        ),
        _engine(
            KV_CACHE_HOST_USAGE,
            Kind.GAUGE,
            "ratio",
            "Fraction of the engine's host (CPU) KV-cache pool in use (0..1).",
            source="vllm:cpu_cache_usage_perc (vLLM V0), sglang:hicache_host_used/total_tokens, "
            "trtllm_kv_cache_host_utilization",
        ),
        _engine(
            GENERATION_TOKENS, Kind.COUNTER, "tokens", "Output tokens generated.", source="vllm:generation_tokens_total"
        ),
        _engine(
            PROMPT_TOKENS,
            Kind.COUNTER,
            "tokens",
            "Prompt tokens of the requests the engine received, prefix-cache hits included "
            "(what was sent, not what was computed).",
            source="vllm:prompt_tokens_total, sglang:prompt_tokens_total",
        ),
        _engine(
            GENERATION_SECONDS,
            Kind.COUNTER,
            "seconds",
            "Seconds spent generating output tokens, summed over requests; divided by "
            "generation_tokens_total it is a MEAN time per output token (engines without an ITL histogram).",
            source="llamacpp:tokens_predicted_seconds_total",
        ),
        Signal(
            ITL_SLO,
            Kind.GAUGE,
            "seconds",
            "The inter-token latency SLO (ITL p95) this exporter diagnoses against; the alert rules read it per pod.",
            (),
            source="kvdoctor exporter --slo-ms",
        ),
        Signal(
            TTFT_SLO,
            Kind.GAUGE,
            "seconds",
            "The time-to-first-token SLO (TTFT p95) of this engine, published only where one is set; "
            "the TTFT burn-rate alerts read it per pod.",
            (),
            source="kvdoctor exporter --ttft-slo-ms",
        ),
        _engine(
            TOKENS_OVER_ITL_SLO,
            Kind.COUNTER,
            "tokens",
            "Output tokens whose inter-token latency was over this exporter's ITL SLO, counted since it started "
            "from the engine's ITL histogram (the bucket holding the SLO in proportion, as histogram_quantile "
            "interpolates); over the histogram's _count it is the SLO's error ratio, which the burn-rate alerts read.",
            source="kvdoctor exporter: kvdoctor_inter_token_latency_seconds and --slo-ms",
        ),
        _engine(
            REQUESTS_OVER_TTFT_SLO,
            Kind.COUNTER,
            "requests",
            "Requests whose time to first token was over this exporter's TTFT SLO, counted since it started from "
            "the engine's TTFT histogram as the ITL one is; published only where a TTFT SLO is set.",
            source="kvdoctor exporter: kvdoctor_time_to_first_token_seconds and --ttft-slo-ms",
        ),
        Signal(
            CONTEXT_INFO,
            Kind.GAUGE,
            "",
            "1, labelled with what the exporter knows beyond its samples: the model's shape (model_*), "
            "the GPU (gpu_model) and its peak DRAM bandwidth (peak_bandwidth_bytes_per_second), the KV dtype.",
            ("model", "gpu_model", "peak_bandwidth_bytes_per_second", "kv_dtype"),
            source="kvdoctor exporter --model, --gpu-peak-bandwidth, the GPU collectors",
        ),
        Signal(
            ENGINE_INFO,
            Kind.GAUGE,
            "",
            "1, labelled with the engine adapter in use (engine, the engine label of every engine series; "
            "adapter; selection=auto|configured), the endpoints it reads and the canonical signals the "
            "engine cannot provide (cannot_provide, comma-separated, without the kvdoctor_ prefix).",
            ("engine", "adapter", "selection", "endpoints", "cannot_provide"),
            source="the engine collector (--engine-url, --engine)",
        ),
        Signal(
            DIAGNOSIS_VERDICT,
            Kind.GAUGE,
            "",
            "1 for the current diagnosis verdict, 0 for the others (a state set).",
            ("verdict",),
            source="kvdoctor rules",
        ),
        Signal(
            DECODE_STEP_FLOOR,
            Kind.GAUGE,
            "seconds",
            "Ledger: (weights + live KV bytes) / peak DRAM bandwidth; the fastest a decode step can be.",
            (),
            source="kvdoctor ledger, when the model shape is known",
        ),
        Signal(
            SOURCE_UP,
            Kind.GAUGE,
            "",
            "1 if the source's last collection succeeded, 0 if it failed (absent: not applicable here).",
            ("source",),
            source="every collector, every cycle",
        ),
        Signal(
            SOURCE_SCRAPE_DURATION,
            Kind.GAUGE,
            "seconds",
            "How long the source's last collection took.",
            ("source",),
            source="every collector, every cycle",
        ),
        Signal(
            SOURCE_ERRORS,
            Kind.COUNTER,
            "",
            "Collection errors by source and reason.",
            ("source", "reason"),
            source="every collector, every cycle",
        ),
        Signal(
            BUILD_INFO,
            Kind.GAUGE,
            "",
            "Always 1: the kvdoctor version, its source revision and the Python version running it.",
            ("version", "revision", "python"),
            source="the exporter itself",
        ),
    )
}

PROCESS_SIGNALS: dict[str, Signal] = {
    s.name: s
    for s in (
        Signal(PROCESS_CPU_SECONDS, Kind.COUNTER, "seconds", "Total user and system CPU time spent in seconds."),
        Signal(PROCESS_RESIDENT_MEMORY, Kind.GAUGE, "bytes", "Resident memory size in bytes."),
        Signal(PROCESS_VIRTUAL_MEMORY, Kind.GAUGE, "bytes", "Virtual memory size in bytes."),
        Signal(PROCESS_START_TIME, Kind.GAUGE, "seconds", "Start time of the process since unix epoch in seconds."),
        Signal(PROCESS_OPEN_FDS, Kind.GAUGE, "", "Number of open file descriptors."),
        Signal(PROCESS_MAX_FDS, Kind.GAUGE, "", "Maximum number of open file descriptors."),
    )
}


def signal_for_series(series_name: str) -> Signal | None:
    """The signal a sample name belongs to (``x_bucket`` belongs to histogram ``x``)."""
    if series_name in SIGNALS:
        return SIGNALS[series_name]
    if series_name in PROCESS_SIGNALS:
        return PROCESS_SIGNALS[series_name]
    for suffix in ("_bucket", "_sum", "_count"):
        if series_name.endswith(suffix):
            sig = SIGNALS.get(series_name[: -len(suffix)])
            if sig is not None and sig.kind is Kind.HISTOGRAM:
                return sig
    return None


def markdown_table() -> str:
    """The README's metric list, generated from this table (tests/test_readme.py checks it)."""
    rows = ["| metric | type | labels | from |", "|---|---|---|---|"]
    for sig in SIGNALS.values():
        labels = ", ".join(f"`{label}`" for label in sig.labels)
        rows.append(f"| `{sig.name}` | {sig.kind.value} | {labels} | {sig.source} |")
    for sig in PROCESS_SIGNALS.values():
        rows.append(f"| `{sig.name}` | {sig.kind.value} |  | the exporter's own process (/proc) |")
    return "\n".join(rows)
