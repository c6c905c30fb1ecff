"""kvdoctor exporter: scrape an engine (and the GPUs), serve canonical /metrics and the JSON API."""

from __future__ import annotations

import argparse
import logging
import sys
import textwrap

from pydantic import ValidationError

from kvdoctor.errors import UsageError
from kvdoctor.exporter.adapters import ADAPTERS
from kvdoctor.exporter.app import create_app
from kvdoctor.exporter.assembly import ConfigError, build_exporter
from kvdoctor.exporter.gpu_filter import HELP as GPU_FILTER_HELP
from kvdoctor.exporter.server import ServerError, bind_socket, serve
from kvdoctor.exporter.settings import ExporterSettings, collector_registry, engine_choices, error_line, load_settings

NAME = "exporter"
HELP = "collect engine and GPU signals; serve canonical /metrics and the JSON API"
DESCRIPTION = """\
Scrape an inference engine's /metrics (vLLM, ...), read the GPUs (NVML, or an existing
dcgm-exporter), normalise everything into kvdoctor's canonical signals and serve them on
/metrics (Prometheus text format), with /api/v1/window, /api/v1/diagnosis, /api/v1/status,
/healthz and /readyz. Every flag has an environment variable KVDOCTOR_<FLAG> (e.g.
KVDOCTOR_ENGINE_URL, KVDOCTOR_INTERVAL); flags win.

example: kvdoctor exporter --engine-url http://127.0.0.1:8000/metrics --pod "$POD_NAME"
"""


def _collector_table() -> str:
    registry = collector_registry()
    if not registry:
        return "collectors: none registered\n"
    width = max(len(n) for n in registry) + 2
    lines = [
        "collectors (--collector.NAME / --no-collector.NAME, KVDOCTOR_COLLECTOR_NAME=true|false):",
        f"  {'name':<{width}}{'enabled by default':<20}description",
    ]
    for name, spec in registry.items():
        lines.append(f"  {name:<{width}}{'yes' if spec.enabled_by_default else 'no':<20}{spec.description}")
    return "\n".join(lines) + "\n"


def _adapter_gaps() -> str:
    if not ADAPTERS:
        return ""
    lines = ["engine adapters (--engine) and the canonical signals each cannot provide:"]
    for name, adapter in ADAPTERS.items():
        gaps = ", ".join(adapter.cannot_provide) or "none (provides every engine signal)"
        lines.append(
            textwrap.fill(
                gaps, width=96, initial_indent=f"  {name}: ", subsequent_indent="      ", break_on_hyphens=False
            )
        )
    return "\n".join(lines) + "\n"


def _gpu_filter_help() -> str:
    return GPU_FILTER_HELP.replace("%", "%%")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = {name: field.default for name, field in ExporterSettings.model_fields.items()}
    parser.epilog = _collector_table() + "\n" + _adapter_gaps()

    src = parser.add_argument_group("sources")
    src.add_argument(
        "--engine-url",
        metavar="URL",
        help="the engine's metrics endpoint, e.g. http://127.0.0.1:8000/metrics (path defaults to /metrics)",
    )
    src.add_argument(
        "--engine",
        metavar="NAME",
        help=f"engine adapter: {' | '.join(engine_choices())} (default: auto, recognised from the metric names)",
    )
    src.add_argument("--dcgm-url", metavar="URL", help="an existing dcgm-exporter's /metrics, for GPU counters")
    src.add_argument(
        "--nvml",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="read GPU counters through NVML (default: on; --no-nvml turns the nvml collector off)",
    )
    for name, spec in collector_registry().items():
        src.add_argument(
            f"--collector.{name}",
            dest=f"collector__{name}",
            action=argparse.BooleanOptionalAction,
            default=None,
            help=f"{spec.description} (default: {'on' if spec.enabled_by_default else 'off'})",
        )
    src.add_argument(
        "--scrape-timeout",
        type=float,
        metavar="S",
        help="seconds a source may take per collection (default: the interval, between 0.5 and 5)",
    )
    src.add_argument(
        "--max-body-bytes",
        type=int,
        metavar="N",
        help=f"largest /metrics body read from a source (default: {defaults['max_body_bytes']})",
    )

    ctx = parser.add_argument_group("model and GPU context")
    ctx.add_argument(
        "--model-config",
        dest="model_config_path",
        metavar="PATH",
        help="the served model's Hugging Face config.json (enables kvdoctor_decode_step_floor_seconds)",
    )
    ctx.add_argument(
        "--gpu-peak-bandwidth",
        type=float,
        metavar="BYTES_PER_S",
        help="peak DRAM bandwidth of one GPU in bytes/s (default: from NVML or the GPU catalogue)",
    )
    ctx.add_argument("--gpu-filter", metavar="POLICY", help=_gpu_filter_help())
    ctx.add_argument("--pod", metavar="NAME", help="value of the pod label added to every series")
    ctx.add_argument(
        "--slo-ms",
        type=float,
        metavar="MS",
        help=f"per-token latency SLO the live diagnosis uses (default: {defaults['slo_ms']:g})",
    )
    ctx.add_argument(
        "--diagnosis-window",
        type=float,
        metavar="S",
        help=f"seconds of history the live diagnosis reads (default: {defaults['diagnosis_window']:g})",
    )

    run = parser.add_argument_group("collection and serving")
    run.add_argument(
        "--interval", type=float, metavar="S", help=f"seconds between collections (default: {defaults['interval']:g})"
    )
    run.add_argument("--host", metavar="H", help=f"address to bind (default: {defaults['host']})")
    run.add_argument(
        "--port", type=int, metavar="P", help=f"port to bind (default: {defaults['port']}; 0: any free port)"
    )
    run.add_argument(
        "--retention",
        dest="retention_seconds",
        type=float,
        metavar="S",
        help=f"seconds of samples kept in memory (default: {defaults['retention_seconds']:g})",
    )
    run.add_argument(
        "--max-snapshots",
        type=int,
        metavar="N",
        help=f"collection cycles kept in memory at most (default: {defaults['max_snapshots']})",
    )
    run.add_argument(
        "--max-series",
        type=int,
        metavar="N",
        help=f"series per cycle at most; the excess is dropped and counted (default: {defaults['max_series']})",
    )
    run.add_argument(
        "--max-window",
        dest="max_window_seconds",
        type=int,
        metavar="S",
        help=f"longest window /api/v1/window serves (default: {defaults['max_window_seconds']})",
    )
    run.add_argument(
        "--log-level",
        default="info",
        choices=("debug", "info", "warning", "error"),
        help="log level on stderr (default: info)",
    )


SETTINGS_ARGS = (
    "engine_url",
    "engine",
    "dcgm_url",
    "nvml",
    "scrape_timeout",
    "max_body_bytes",
    "model_config_path",
    "gpu_peak_bandwidth",
    "gpu_filter",
    "pod",
    "interval",
    "host",
    "port",
    "retention_seconds",
    "max_snapshots",
    "max_series",
    "max_window_seconds",
    "slo_ms",
    "diagnosis_window",
)


def settings_from_args(args: argparse.Namespace):
    """ExporterSettings from the environment with the flags given on top; UsageError if invalid."""
    overrides = {name: getattr(args, name, None) for name in SETTINGS_ARGS}
    switches = {
        key.removeprefix("collector__"): value
        for key, value in vars(args).items()
        if key.startswith("collector__") and value is not None
    }
    if switches:
        overrides["collectors"] = switches
    try:
        return load_settings(**overrides)
    except ValidationError as exc:
        raise UsageError(error_line(exc)) from None


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    try:  # bind first: a port in use is a one-line error before anything starts or logs
        sock = bind_socket(settings.host, settings.port)
    except ServerError as exc:
        raise UsageError(str(exc)) from None
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        stream=sys.stderr,
        format="kvdoctor exporter: %(levelname)s %(message)s",
    )
    for noisy in ("httpx", "httpcore"):  # one line per scrape otherwise
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        exporter = build_exporter(settings)  # reads the model config before any collector logs
    except ConfigError as exc:
        sock.close()
        raise UsageError(str(exc)) from None
    app = create_app(exporter)

    def started(handle) -> None:
        exporter.start()
        sources = ", ".join(c.name for c in exporter.collectors) or "none"
        engine = f"; engine {settings.engine_url} ({settings.engine})" if settings.engine_url else "; no --engine-url"
        print(
            f"kvdoctor exporter: serving {handle.url}/metrics every {settings.interval:g} s "
            f"(sources: {sources}{engine})",
            flush=True,
        )

    try:
        return serve(app, settings.host, settings.port, on_started=started, sock=sock)
    except ServerError as exc:
        raise UsageError(str(exc)) from None
    finally:
        exporter.stop()
