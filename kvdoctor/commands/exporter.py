"""kvdoctor exporter: scrape an engine (and the GPUs), serve canonical /metrics and the JSON API."""

from __future__ import annotations

import argparse
import logging
import sys
import textwrap
from typing import Any

from pydantic import ValidationError

from kvdoctor import flags
from kvdoctor.errors import UsageError
from kvdoctor.exporter.adapters import ADAPTERS
from kvdoctor.exporter.app import create_app
from kvdoctor.exporter.assembly import ConfigError, build_exporter
from kvdoctor.exporter.collector_switches import COLLECTOR_ENV_PREFIX, DEPRECATED_COLLECTOR_FLAGS
from kvdoctor.exporter.server import ServerError, bind_socket, serve
from kvdoctor.exporter.settings import (
    ExporterSettings,
    collector_registry,
    error_line,
    load_settings,
    options,
)
from kvdoctor.exporter.web_config import WebConfigError

NAME = "exporter"
HELP = "collect engine and GPU signals; serve canonical /metrics and the JSON API"
DESCRIPTION = """\
Scrape an inference engine's /metrics (vLLM, ...), read the GPUs (NVML, or an existing
dcgm-exporter), normalise everything into kvdoctor's canonical signals and serve them on
/metrics (Prometheus text format), with /api/v1/window, /api/v1/diagnosis, /api/v1/status,
/healthz and /readyz. Every flag has an environment variable, named in its help (e.g.
KVDOCTOR_ENGINE_URL, KVDOCTOR_INTERVAL); flags win.

examples:
  kvdoctor exporter --engine-url http://127.0.0.1:8000/metrics --pod "$POD_NAME"
  kvdoctor exporter --engine-url http://127.0.0.1:8000 --model meta-llama/Llama-3.1-8B-Instruct --slo-ms 50
  KVDOCTOR_ENGINE_URL=http://127.0.0.1:8000 kvdoctor exporter --no-collector.nvml --port 0
"""
EXIT_STATUS = """\
exit status: 0 stopped (SIGTERM or Ctrl-C), 2 a usage or configuration error (a flag, a variable, the
web config file, a port in use), 3 an internal error. A source that cannot be read never stops it:
kvdoctor_source_up says so."""


def _collector_table() -> str:
    registry = collector_registry()
    if not registry:
        return "collectors: none registered\n"
    width = max(len(n) for n in registry) + 2
    lines = [
        f"collectors (--collector.NAME / --no-collector.NAME, {COLLECTOR_ENV_PREFIX}NAME=true|false):",
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


def _adapter_phrase(engine: str) -> str:
    """How the start-up line names the engine adapter and what it cannot provide."""
    if engine == "auto":
        return "adapter: recognised from its /metrics, then logged with what it cannot provide"
    gaps = ", ".join(n.removeprefix("kvdoctor_") for n in ADAPTERS[engine].cannot_provide) or "nothing"
    return f"adapter {engine}, configured; cannot provide: {gaps}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of every ExporterSettings field (exporter/settings.py declares them)."""
    parser.epilog = EXIT_STATUS + "\n\n" + _collector_table() + "\n" + _adapter_gaps()
    groups = {}
    for option in options():
        if option.group not in groups:
            groups[option.group] = parser.add_argument_group(option.group)
        group = groups[option.group]
        help_line = option.help_line().replace("%", "%%")
        if option.is_collectors:
            for name, spec in collector_registry().items():
                old = DEPRECATED_COLLECTOR_FLAGS.get(name)
                action = group.add_argument(
                    f"--collector.{name}",
                    *([old] if old else []),
                    dest=f"collector__{name}",
                    action=argparse.BooleanOptionalAction,
                    default=None,
                    help=f"{spec.description} (default: {'on' if spec.enabled_by_default else 'off'}; "
                    f"env {COLLECTOR_ENV_PREFIX}{name.upper()})".replace("%", "%%"),
                )
                if old:
                    flags.deprecate(action, old, "--no-" + old.removeprefix("--"))
                _read_by_settings(action, COLLECTOR_ENV_PREFIX + name.upper())
        else:
            takes: dict[str, Any] = (
                {"action": argparse.BooleanOptionalAction}
                if option.is_switch
                else {"type": option.kind, "choices": option.choices, "metavar": option.metavar}
            )
            action = group.add_argument(
                option.flag, *option.deprecated, dest=option.field, default=None, help=help_line, **takes
            )
            _read_by_settings(action, option.env[0], option.deprecated)


def _read_by_settings(action: argparse.Action, variable: str, deprecated: tuple[str, ...] = ()) -> None:
    """The flag's variable is the settings' (read and checked by ExporterSettings, not argparse)."""
    action.env = variable  # type: ignore[attr-defined]
    action.env_read_by_settings = True  # type: ignore[attr-defined]
    if deprecated:
        flags.deprecate(action, *deprecated)


def settings_from_args(args: argparse.Namespace) -> ExporterSettings:
    """ExporterSettings from the environment with the flags given on top; UsageError if invalid."""
    overrides = {o.field: getattr(args, o.field, None) for o in options() if not o.is_collectors}
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
        level=getattr(logging, settings.log_level.upper(), logging.INFO),
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
    try:
        app = create_app(exporter)
    except WebConfigError as exc:  # changed since the settings read it
        sock.close()
        raise UsageError(f"--web.config.file: {exc}") from None

    def started(handle) -> None:
        exporter.start()
        sources = ", ".join(c.name for c in exporter.collectors) or "none"
        engine = "; no --engine-url"
        if settings.engine_url:
            engine = f"; engine {settings.engine_url} ({_adapter_phrase(settings.engine)})"
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
