"""The simulated engine's HTTP face: vLLM-format ``/metrics`` on loopback, plus a scenario switch.

The exposition is what vLLM 0.32 serves (tests/fixtures/vllm-0.32-cpu): the same families in the
same order, the same HELP texts, vLLM's bucket boundaries, ``_total`` on counter TYPE lines, a
``_created`` gauge per counter and histogram, labels ``engine="0"`` and ``model_name``, the
``vllm:cache_config_info`` info gauge, and the Python/process families of prometheus_client. The
offloading connector's ``vllm:kv_offload_total_bytes``/``_time`` counters are there too (the
simulated engine runs with a CPU tier configured), so the exporter goes through exactly the
scrape and adapter path it uses against a real vLLM.

Endpoints (all on the engine's port):

=====================  ========================================================================
``GET /metrics``       the exposition (text format 0.0.4)
``GET /health``        200, like vLLM
``GET /v1/models``     the served model, like vLLM's OpenAI server
``GET /scenario``      ``{"scenario", "active", "queue", "summary", "expected_verdict", "choices",
                       "queue_choices"}``
``POST /scenario``     switch the workload now: body ``{"scenario": "kv_thrashing"}`` (or
                       ``?scenario=...``), optionally with the queue behind it, ``"queue":
                       "growing"`` (``none``, ``steady``, ``growing``; scenarios.py; without it
                       the queue stays; alone, it restarts the current scenario with that
                       queue); 200 with the new state, 400 naming the choices
``GET /gpu``           the simulated GPU's cumulative counters (JSON), read by the
                       ``simulated_gpu`` collector the way GPM reads a device
``POST /v1/completions``, ``POST /v1/chat/completions``
                       OpenAI-compatible answers, streamed or not, made by the simulated
                       engine beside the scenario's clients (serving.py): ``kvdoctor stress``
                       runs against the demo
=====================  ========================================================================

``python -m kvdoctor.simulator.engine_server --scenario cycle --port 8000`` runs one
on its own (e.g. for a Prometheus test or to point a separately started exporter at it).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from kvdoctor.signals.records import attributes

from .deployment import EngineConfig
from .gpu import gpu_payload
from .physics import Simulation
from .scenarios import QUEUE_CHOICES, SCENARIO_CHOICES
from .serving import ApiError, CompletionRun, parse_request
from .vllm_metrics import ADMISSION_REJECTION_REASONS, CACHE_TIERS, FINISHED_REASONS, PROMPT_SOURCES, TRANSFER_TYPES

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MAX_REQUEST_BYTES = 1 << 20  # a request body past this is cut (prompts of a few thousand words fit)

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


def scenario_payload(sim: Simulation) -> dict:
    active = sim.active_scenario
    return {
        "scenario": sim.scenario,
        "active": active.name,
        "queue": sim.queue,
        **attributes(active, "summary expected_verdict"),
        "choices": list(SCENARIO_CHOICES),
        "queue_choices": list(QUEUE_CHOICES),
    }


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # quiet: the demo prints its own status line
        pass

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, payload: dict) -> None:
        self._send(status, json.dumps(payload).encode())

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        sim = self.server.sim
        path = urlsplit(self.path).path
        if path == "/metrics":
            self._send(200, render_metrics(sim, self.server.registry), CONTENT_TYPE)
        elif path in ("/health", "/healthz"):
            self._send(200, b"", "text/plain")
        elif path == "/scenario":
            self._json(200, scenario_payload(sim))
        elif path == "/gpu":
            self._json(200, gpu_payload(sim))
        elif path == "/v1/models":
            self._json(
                200,
                {
                    "object": "list",
                    "data": [
                        {
                            "id": sim.config.model_name,
                            "object": "model",
                            "owned_by": "kvdoctor-simulator",
                            "max_model_len": sim.config.max_model_len,
                        }
                    ],
                },
            )
        else:
            self._json(404, {"error": f"no such endpoint {path!r}"})

    def do_POST(self):
        parts = urlsplit(self.path)
        if parts.path in ("/v1/completions", "/v1/chat/completions"):
            self._complete(chat=parts.path.endswith("/chat/completions"))
            return
        if parts.path != "/scenario":
            self._json(404, {"error": f"no such endpoint {parts.path!r}"})
            return
        raw = self._body()
        query = parse_qs(parts.query)
        name = (query.get("scenario") or [None])[0]
        queue = (query.get("queue") or [None])[0]
        if raw and (name is None or queue is None):
            try:
                body = json.loads(raw)
            except ValueError:
                self._json(400, {"error": 'body is not JSON; send {"scenario": NAME}'})
                return
            if isinstance(body, dict):
                name = body.get("scenario") if name is None else name
                queue = body.get("queue") if queue is None else queue
        sim = self.server.sim
        if name is None and queue is not None:
            name = sim.scenario  # only the queue changes: the current scenario restarts with it
        if not isinstance(name, str) or name not in SCENARIO_CHOICES:
            self._json(400, {"error": f"unknown scenario {name!r}", "choices": list(SCENARIO_CHOICES)})
            return
        if queue is not None and queue not in QUEUE_CHOICES:
            self._json(400, {"error": f"unknown queue {queue!r}", "queue_choices": list(QUEUE_CHOICES)})
            return
        sim.set_scenario(name, queue)
        self._json(200, scenario_payload(sim))

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(min(length, MAX_REQUEST_BYTES)) if length else b""

    def _complete(self, chat: bool) -> None:
        sim = self.server.sim
        try:
            try:
                body = json.loads(self._body() or b"null")
            except ValueError:
                raise ApiError(400, "the request body is not JSON") from None
            completion = parse_request(body, chat, sim.config.model_name, sim.config.max_model_len)
        except ApiError as exc:
            self._json(exc.status, exc.payload())
            return
        run = CompletionRun(sim, completion)
        try:
            if not completion.stream:
                self._json(200, run.answer())
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for event in run.events():
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        finally:
            run.cancel()  # a client that left mid-answer frees its KV blocks; a no-op when done


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256  # a load generator opens its connections all at once

    def handle_error(self, request, client_address):
        # A scraper that gives up mid-response (its timeout) is not the engine's problem; stay quiet
        # instead of printing socketserver's traceback into the demo's terminal.
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)

    def __init__(self, address, sim: Simulation):
        self.sim = sim
        self.registry = build_registry(sim)
        super().__init__(address, _Handler)


class EngineServer:
    """The simulated engine served on ``host:port`` (port 0: a free one) from a daemon thread.

    Binding a port in use raises ``OSError`` (errno EADDRINUSE) from the constructor.
    """

    def __init__(self, sim: Simulation, host: str = "127.0.0.1", port: int = 0):
        self.sim = sim
        self._server = _Server((host, port), sim)
        self.host, self.port = self._server.server_address[:2]
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name=f"kvdoctor-sim-engine-{self.port}",
            daemon=True,
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def metrics_url(self) -> str:
        return self.url + "/metrics"

    def start(self) -> EngineServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def __enter__(self) -> EngineServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kvdoctor.simulator.engine_server",
        description="Serve the simulated vLLM engine's /metrics on loopback.",
    )
    parser.add_argument("--scenario", default="healthy", choices=SCENARIO_CHOICES)
    parser.add_argument("--queue", default="none", choices=QUEUE_CHOICES, help="the queue behind the scenario")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        sim = Simulation(args.scenario, seed=args.seed, queue=args.queue)
        server = EngineServer(sim, args.host, args.port).start()
    except OSError as exc:
        print(f"simulated engine: cannot bind {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"simulated vLLM engine ({args.scenario}) on {server.metrics_url}", flush=True)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    stop.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
