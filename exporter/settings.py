"""Exporter configuration: one pydantic-settings object, filled from flags and ``KVDOCTOR_*``.

Every field has an environment variable ``KVDOCTOR_<FIELD>`` (``KVDOCTOR_ENGINE_URL``,
``KVDOCTOR_INTERVAL``, ...). Collector switches come from the collector registry
(``exporter/collectors/base.py``): ``--collector.NAME`` / ``--no-collector.NAME`` on the command
line, ``KVDOCTOR_COLLECTOR_NAME=true|false`` in the environment. Flags win over the environment.

A bad value is a ``pydantic.ValidationError``; ``error_line`` turns it into the one line the CLI
prints (naming the flag and the variable) before exiting with status 2.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import AliasChoices, Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

ENV_PREFIX = "KVDOCTOR_"
COLLECTOR_ENV_PREFIX = ENV_PREFIX + "COLLECTOR_"


def collector_registry():
    """The collector registry; importing the collectors package imports (registers) every collector."""
    import kvdoctor.exporter.collectors  # noqa: F401
    from kvdoctor.exporter.collectors.base import REGISTRY

    return REGISTRY


def engine_choices() -> tuple[str, ...]:
    from kvdoctor.exporter.adapters import ADAPTERS

    return ("auto", *ADAPTERS)


def normalise_url(value: str, default_path: str = "/metrics") -> str:
    """``http(s)://host[:port][/path]``; an empty path becomes ``/metrics``. ValueError if malformed."""
    text = value.strip()
    try:
        parts = urlsplit(text)
        port = parts.port  # raises ValueError on a non-numeric or out-of-range port
    except ValueError:
        raise ValueError(f"malformed URL {value!r}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"malformed URL {value!r} (expected http://HOST:PORT/metrics)")
    del port
    path = parts.path if parts.path not in ("", "/") else default_path
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


class _CollectorSwitchesFromEnv(PydanticBaseSettingsSource):
    """``KVDOCTOR_COLLECTOR_NAME=true|false`` -> ``collectors={"name": ...}``."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        switches = {
            key[len(COLLECTOR_ENV_PREFIX) :].lower(): raw
            for key, raw in os.environ.items()
            if key.upper().startswith(COLLECTOR_ENV_PREFIX) and len(key) > len(COLLECTOR_ENV_PREFIX)
        }
        return {"collectors": switches} if switches else {}


class ExporterSettings(BaseSettings):
    """Everything ``kvdoctor exporter`` (and ``kvdoctor demo``) can be told."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", validate_default=True)

    engine_url: str | None = Field(
        None, description="URL of the engine's Prometheus endpoint (path defaults to /metrics)."
    )
    engine: str = Field(
        "auto", description="Engine adapter: auto (recognised from the metric families) or an adapter name."
    )
    dcgm_url: str | None = Field(None, description="URL of an existing dcgm-exporter's /metrics (optional).")
    nvml: bool = Field(True, description="Read GPU counters through NVML (same as --collector.nvml).")
    collectors: dict[str, bool] = Field(default_factory=dict, description="Collector switches: name -> enabled.")
    interval: float = Field(1.0, gt=0, description="Seconds between collection cycles.")
    host: str = Field("127.0.0.1", min_length=1, description="Address the HTTP server binds.")
    port: int = Field(9745, ge=0, le=65535, description="Port the HTTP server binds (0: any free port).")
    retention_seconds: float = Field(900.0, gt=0, description="Seconds of snapshots kept in memory.")
    max_snapshots: int = Field(
        3600, ge=1, le=1_000_000, description="Snapshots kept in memory at most (bounds memory whatever the interval)."
    )
    max_series: int = Field(
        5000,
        ge=64,
        le=1_000_000,
        description="Series kept per snapshot at most; the rest are dropped and counted (reason series_cap).",
    )
    scrape_timeout: float | None = Field(
        None,
        gt=0,
        description="Seconds a source may take per collection (default: the interval, at least 0.5, at most 5).",
    )
    max_body_bytes: int = Field(16 * 1024 * 1024, ge=1024, description="Largest /metrics body read from a source.")
    model_config_path: str | None = Field(
        None,
        validation_alias=AliasChoices("model_config_path", "kvdoctor_model_config"),
        description="Hugging Face config.json of the served model (enables the decode-step floor).",
    )
    gpu_peak_bandwidth: float | None = Field(
        None, gt=0, description="Peak DRAM bandwidth of one GPU in bytes/s (overrides NVML and the catalogue)."
    )
    gpu_filter: str = Field("auto", description="Which GPUs the nvml collector reports (see exporter/gpu_filter.py).")
    pod: str | None = Field(None, description="Value of the pod label added to every series.")
    slo_ms: float = Field(
        100.0, gt=0, description="Per-token latency SLO (ITL p95, ms) the live diagnosis compares against."
    )
    diagnosis_window: float = Field(
        60.0, ge=5, le=900, description="Seconds of history the live diagnosis reads each cycle."
    )
    max_window_seconds: int = Field(900, ge=1, description="Longest window GET /api/v1/window serves.")

    @classmethod
    def settings_customise_sources(
        cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings
    ):
        return (init_settings, env_settings, _CollectorSwitchesFromEnv(settings_cls))

    @field_validator("engine_url", "dcgm_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        return normalise_url(value)

    @field_validator("engine")
    @classmethod
    def _engine(cls, value: str) -> str:
        value = value.strip().lower()
        choices = engine_choices()
        if value not in choices:
            raise ValueError(f"unknown engine {value!r} (choose from {', '.join(choices)})")
        return value

    @field_validator("collectors")
    @classmethod
    def _collectors(cls, value: dict[str, bool]) -> dict[str, bool]:
        known = collector_registry()
        normalised = {name.strip().lower().replace("-", "_"): enabled for name, enabled in value.items()}
        unknown = sorted(set(normalised) - set(known))
        if unknown:
            name = unknown[0]
            raise ValueError(
                f"unknown collector {name!r} (--collector.{name} / {COLLECTOR_ENV_PREFIX}{name.upper()}; "
                f"known: {', '.join(sorted(known)) or 'none'})"
            )
        return normalised

    @field_validator("gpu_filter")
    @classmethod
    def _gpu_filter(cls, value: str) -> str:
        from kvdoctor.exporter.gpu_filter import parse_gpu_filter

        return str(parse_gpu_filter(value))

    @field_validator("model_config_path")
    @classmethod
    def _model_config(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        path = Path(value).expanduser()
        try:
            json.loads(path.read_text())
        except FileNotFoundError:
            raise ValueError(f"no such file {value!r}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read {value!r}: {exc.strerror if isinstance(exc, OSError) else exc}") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"{value!r} is not JSON ({exc.msg} at line {exc.lineno})") from None
        return str(path)

    @model_validator(mode="after")
    def _derived(self) -> ExporterSettings:
        if self.scrape_timeout is None:
            self.scrape_timeout = min(max(self.interval, 0.5), 5.0)
        if self.max_window_seconds > self.retention_seconds:
            self.max_window_seconds = max(1, int(self.retention_seconds))
        return self

    def collector_enabled(self, name: str) -> bool:
        """Whether collector ``name`` runs: its switch, else its registry default (``nvml`` also needs ``nvml``)."""
        if name == "nvml" and not self.nvml:
            return False
        if name in self.collectors:
            return self.collectors[name]
        spec = collector_registry().get(name)
        return bool(spec and spec.enabled_by_default)

    def enabled_collectors(self) -> list[str]:
        return [name for name in collector_registry() if self.collector_enabled(name)]


# Field -> the flag that sets it, for error messages.
FLAGS = {
    "engine_url": "--engine-url",
    "engine": "--engine",
    "dcgm_url": "--dcgm-url",
    "nvml": "--nvml/--no-nvml",
    "collectors": "--collector.NAME",
    "interval": "--interval",
    "host": "--host",
    "port": "--port",
    "retention_seconds": "--retention",
    "max_snapshots": "--max-snapshots",
    "max_series": "--max-series",
    "scrape_timeout": "--scrape-timeout",
    "max_body_bytes": "--max-body-bytes",
    "model_config_path": "--model-config",
    "gpu_peak_bandwidth": "--gpu-peak-bandwidth",
    "gpu_filter": "--gpu-filter",
    "pod": "--pod",
    "max_window_seconds": "--max-window",
}


def _env_name(field: str) -> str:
    if field == "model_config_path":
        return "KVDOCTOR_MODEL_CONFIG"
    if field == "collectors":
        return "KVDOCTOR_COLLECTOR_NAME"
    return ENV_PREFIX + field.upper()


def error_line(exc: ValidationError) -> str:
    """The first validation error as one line: ``--interval (KVDOCTOR_INTERVAL): must be > 0, got 0``."""
    err = exc.errors(include_url=False)[0]
    loc = [str(part) for part in err.get("loc", ())]
    field = loc[0] if loc else ""
    where = f"{FLAGS.get(field, field)} ({_env_name(field)})" if field in FLAGS else (field or "configuration")
    if field == "collectors":
        where = f"--collector.{loc[1]} ({COLLECTOR_ENV_PREFIX}{loc[1].upper()})" if len(loc) > 1 else "collector switch"
    message = err.get("msg", "invalid value")
    message = message.removeprefix("Value error, ").replace("Input should be", "must be")
    if err.get("type") in (
        "greater_than",
        "greater_than_equal",
        "less_than",
        "less_than_equal",
        "int_parsing",
        "float_parsing",
        "bool_parsing",
        "int_from_float",
        "missing",
        "string_too_short",
    ):
        message = f"{message[0].lower()}{message[1:]}, got {err.get('input')!r}"
    flag = FLAGS.get(field, "")
    if flag and message.startswith(flag):  # the validator already named the flag
        message = message[len(flag) :].lstrip(": ")
    if err.get("type") == "extra_forbidden":
        return f"unknown setting {field!r}"
    return f"{where}: {message}".replace("\n", " ")


def load_settings(**overrides: Any) -> ExporterSettings:
    """Settings from the environment with ``overrides`` (flags) on top; ValidationError if bad."""
    return ExporterSettings(**{k: v for k, v in overrides.items() if v is not None})
