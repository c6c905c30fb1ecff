"""The simulated engine's ``/metrics`` as vLLM 0.32 renders it (tests/fixtures/vllm-0.32-cpu).

The same families in the same order, the same HELP texts, vLLM's bucket boundaries, ``_total`` on
counter TYPE lines, a ``_created`` gauge per counter and histogram, labels ``engine="0"`` and
``model_name``, the ``vllm:cache_config_info`` info gauge, and the Python/process families of
prometheus_client. The offloading connector's ``vllm:kv_offload_total_bytes``/``_time`` counters
are there too (the simulated engine runs with a CPU tier configured). ``engine_server.py`` serves it.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from .deployment import EngineConfig
from .physics import Simulation
from .vllm_metrics import ADMISSION_REJECTION_REASONS, CACHE_TIERS, FINISHED_REASONS, PROMPT_SOURCES, TRANSFER_TYPES

_MFU_HELP = "(for Model Flops Utilization calculations)."
# (family, HELP) in vLLM 0.32's order; counters first, then histograms.
COUNTERS = (
    ("vllm:estimated_flops_per_gpu", f"Estimated number of floating point operations per GPU {_MFU_HELP}"),
    ("vllm:estimated_read_bytes_per_gpu", f"Estimated number of bytes read from memory per GPU {_MFU_HELP}"),
    ("vllm:estimated_write_bytes_per_gpu", f"Estimated number of bytes written to memory per GPU {_MFU_HELP}"),
)
GAUGES = (
    ("vllm:num_requests_running", "Number of requests in model execution batches."),
    ("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
)
WAITING_BY_REASON_HELP = (
    "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; "
    "'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). "
    "Sum of all reasons equals vllm:num_requests_waiting."
)
SLEEP_STATE_HELP = (
    "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
    "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2."
)
CACHE_COUNTERS = (
    ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."),
    ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."),
    (
        "vllm:external_prefix_cache_queries",
        "External prefix cache queries from KV connector cross-instance cache "
        "sharing, in terms of number of queried tokens.",
    ),
    (
        "vllm:external_prefix_cache_hits",
        "External prefix cache hits from KV connector cross-instance cache "
        "sharing, in terms of number of cached tokens.",
    ),
    ("vllm:mm_cache_queries", "Multi-modal cache queries, in terms of number of queried items."),
    ("vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items."),
    ("vllm:num_preemptions", "Cumulative number of preemption from the engine."),
    ("vllm:prompt_tokens", "Number of prefill tokens processed."),
)
CACHED_BY_SOURCE_HELP = (
    "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host (offloaded to DRAM), "
    "disk, p2p (transferred from another vLLM instance) or external_unspecified. Counted at admission; sums to "
    "vllm:prefix_cache_hits + vllm:external_prefix_cache_hits."
)
HISTOGRAMS = (
    ("vllm:request_prompt_tokens", "Number of prefill tokens processed."),
    ("vllm:request_generation_tokens", "Number of generation tokens processed."),
    ("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step."),
    ("vllm:request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens."),
    ("vllm:request_params_n", "Histogram of the n request parameter."),
    ("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter."),
    ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds."),
    ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds."),
    ("vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request."),
    ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds."),
    ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request."),
    ("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request."),
    ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request."),
    ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request."),
    ("vllm:request_num_preemptions", "Histogram of the number of times a request was preempted."),
    (
        "vllm:request_prefill_kv_computed_tokens",
        "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
    ),
)
OFFLOAD_COUNTERS = (
    ("vllm:kv_offload_total_bytes", "Number of bytes transferred by the KV offloading connector, by transfer type."),
    ("vllm:kv_offload_total_time", "Seconds spent transferring KV by the KV offloading connector, by transfer type."),
)


def cache_config_labels(config: EngineConfig) -> dict[str, str]:
    """``vllm:cache_config_info``'s labels for this deployment (the fixture's label set)."""
    return {
        "_block_size_resolved": "True",
        "block_size": str(config.block_size),
        "cache_dtype": config.kv_cache_dtype,
        "cache_hit_alignment_tokens": "None",
        "effective_attention_block_size": str(config.block_size),
        "enable_mamba_shared_prefix_checkpoint": "False",
        "enable_prefix_caching": "True",
        "gpu_memory_utilization": str(config.gpu_memory_utilization),
        "hash_block_size": "None",
        "is_attention_free": "False",
        "kv_cache_dtype_skip_layers": "[]",
        "kv_cache_layout": "None",
        "kv_cache_max_concurrency": str(round(config.capacity_tokens / config.max_model_len, 2)),
        "kv_cache_memory_bytes": str(int(config.num_gpu_blocks * config.block_size * config.kv_bytes_per_token)),
        "kv_cache_size_tokens": str(config.capacity_tokens),
        "kv_offloading_backend": "native",
        "kv_offloading_size": str(round(config.cpu_offload_bytes / 1024**3, 1)),
        "kv_sharing_fast_prefill": "False",
        "mamba_block_size": "None",
        "mamba_cache_dtype": "auto",
        "mamba_cache_mode": "none",
        "mamba_page_size_padded": "None",
        "mamba_ssm_cache_dtype": "auto",
        "num_cpu_blocks": str(config.num_cpu_blocks),
        "num_gpu_blocks": str(config.num_gpu_blocks),
        "num_gpu_blocks_override": "None",
        "prefix_cache_retention_interval": "0",
        "prefix_caching_hash_algo": "sha256",
        "prefix_match_unit": "None",
        "replayssm_buffer_len": "16",
        "skip_page_size_padded": "None",
        "sliding_window": "None",
        "swa_bounded_replay": "True",
        "use_kda_recoverssm": "False",
        "use_replayssm": "False",
        "user_specified_block_size": "False",
    }


class VllmMetrics:
    """A prometheus_client collector rendering a Simulation the way vLLM renders itself."""

    def __init__(self, sim: Simulation):
        self.sim = sim

    def collect(self):
        sim = self.sim
        sim.sync()
        state, stats = sim.snapshot()
        created = sim.created
        base = ["engine", "model_name"]
        ids = ["0", sim.config.model_name]

        def counter(name: str, help_text: str, value: float):
            fam = CounterMetricFamily(name, help_text, labels=base)
            fam.add_metric(ids, value, created=created)
            return fam

        def labelled_counter(name: str, help_text: str, label: str, values: dict[str, float], order, engine=True):
            names = (base if engine else ["model_name"]) + [label]
            fam = CounterMetricFamily(name, help_text, labels=names)
            for key in order:
                fam.add_metric((ids if engine else ids[1:]) + [key], values[key], created=created)
            return fam

        def gauge(name: str, help_text: str, value: float):
            fam = GaugeMetricFamily(name, help_text, labels=base)
            fam.add_metric(ids, value)
            return fam

        for name, help_text in COUNTERS:
            yield counter(name, help_text, stats.counters[name])
        yield gauge(GAUGES[0][0], GAUGES[0][1], state.running)
        yield gauge(GAUGES[1][0], GAUGES[1][1], state.waiting)
        fam = GaugeMetricFamily("vllm:num_requests_waiting_by_reason", WAITING_BY_REASON_HELP, labels=[*base, "reason"])
        fam.add_metric([*ids, "capacity"], state.waiting)
        fam.add_metric([*ids, "deferred"], 0.0)
        yield fam
        fam = GaugeMetricFamily("vllm:engine_sleep_state", SLEEP_STATE_HELP, labels=[*base, "sleep_state"])
        for sleep_state, value in (("awake", 1.0), ("weights_offloaded", 0.0), ("discard_all", 0.0)):
            fam.add_metric([*ids, sleep_state], value)
        yield fam
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", state.kv_usage)
        for name, help_text in CACHE_COUNTERS:
            yield counter(name, help_text, stats.counters[name])
        yield labelled_counter(
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            "source",
            stats.labelled["vllm:prompt_tokens_by_source"],
            PROMPT_SOURCES,
        )
        yield counter(
            "vllm:prompt_tokens_cached",
            "Number of cached prompt tokens (local + external).",
            stats.counters["vllm:prompt_tokens_cached"],
        )
        yield labelled_counter(
            "vllm:prompt_tokens_cached_by_source",
            CACHED_BY_SOURCE_HELP,
            "source",
            stats.labelled["vllm:prompt_tokens_cached_by_source"],
            CACHE_TIERS,
        )
        yield counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", stats.counters["vllm:generation_tokens"]
        )
        yield labelled_counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            "finished_reason",
            stats.labelled["vllm:request_success"],
            FINISHED_REASONS,
        )
        yield labelled_counter(
            "vllm:admission_rejections",
            "Number of admission attempts rejected by a queue limit, by reason.",
            "reason",
            stats.labelled["vllm:admission_rejections"],
            ADMISSION_REJECTION_REASONS,
            engine=False,
        )
        for name, help_text in HISTOGRAMS:
            hist = stats.histograms[name]
            fam = HistogramMetricFamily(name, help_text, labels=base)
            fam.add_metric(ids, [(floatToGoString(b), float(c)) for b, c in hist.cumulative()], hist.sum)
            fam.samples.append(Sample(name + "_created", dict(zip(base, ids, strict=True)), created, None, None))
            yield fam
        for name, help_text in OFFLOAD_COUNTERS:
            yield labelled_counter(name, help_text, "transfer_type", stats.labelled[name], TRANSFER_TYPES)
        fam = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=[*sorted(cache_config_labels(sim.config)), "engine"],
        )
        info = cache_config_labels(sim.config)
        fam.add_metric([info[k] for k in sorted(info)] + ["0"], 1.0)
        yield fam


def build_registry(sim: Simulation) -> CollectorRegistry:
    """A registry holding what vLLM's /metrics holds: Python and process families, then vLLM's."""
    registry = CollectorRegistry(auto_describe=False)
    GCCollector(registry=registry)
    PlatformCollector(registry=registry)
    ProcessCollector(registry=registry)
    registry.register(VllmMetrics(sim))
    return registry


def render_metrics(sim: Simulation, registry: CollectorRegistry | None = None) -> bytes:
    """The simulated engine's /metrics body."""
    return generate_latest(registry or build_registry(sim))
