"""Exporter configuration: one pydantic-settings object, declared once, filled from flags and ``KVDOCTOR_*``.

Each field carries everything said about it anywhere: its command-line flag, metavar, help and
help group (``setting(...)``). ``options()`` reads them back: the CLI builds ``kvdoctor exporter``'s
flags from it, ``markdown_table()`` is the README's configuration table, error messages name the
flag and the variable, and tests/helm/ checks the chart's flags against it.

Every field's environment variable is ``KVDOCTOR_<FIELD>`` (``KVDOCTOR_ENGINE_URL``,
``KVDOCTOR_INTERVAL``, ...), unless the field declares its names as a ``validation_alias``
(``KVDOCTOR_MODEL``, then its deprecated names). Collector switches come from the collector registry
(``exporter/collectors/base.py``): ``--collector.NAME`` / ``--no-collector.NAME`` on the command
line, ``KVDOCTOR_COLLECTOR_NAME=true|false`` in the environment (``exporter/collector_switches.py``
reads them). Flags win over the environment; an empty variable counts as unset. A field's old flag
spellings (``deprecated=``) still work for one release (the CLI warns): ``--model-config`` is
``--model``; ``--nvml`` / ``--no-nvml`` (and ``KVDOCTOR_NVML``) are the nvml collector's switch.

A bad value is a ``pydantic.ValidationError``; ``error_line`` turns it into the one line the CLI
prints (naming the flag and the variable) before exiting with status 2.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlunsplit

from pydantic import AliasChoices, Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, SettingsConfigDict

from kvdoctor.exporter.adapters import ADAPTERS
from kvdoctor.exporter.collector_switches import COLLECTOR_ENV_PREFIX, CollectorSwitchesFromEnv
from kvdoctor.exporter.collectors import REGISTRY, CollectorSpec
from kvdoctor.exporter.gpu_filter import HELP as GPU_FILTER_HELP
from kvdoctor.exporter.gpu_filter import parse_gpu_filter
from kvdoctor.exporter.web_config import WebConfigError, load_web_config
from kvdoctor.rules.thresholds import DEFAULT_SLO_SECONDS, DIAGNOSIS_WINDOW_SECONDS
from kvdoctor.sources.environment import ENV_PREFIX
from kvdoctor.sources.model_files import locate_model, read_config
from kvdoctor.sources.paths import METRICS_PATH
from kvdoctor.sources.urls import split_http_url

# Help groups, in the order `kvdoctor exporter --help` shows them.
SOURCES = "sources"
CONTEXT = "model and GPU context"
SERVING = "collection and serving"

DEFAULT_PORT = 9745  # the exporter's port unless --port says otherwise

LogLevel = Literal["debug", "info", "warning", "error"]


def collector_registry() -> dict[str, CollectorSpec]:
    """The collector registry (filled by importing the collectors package)."""
    return REGISTRY


def engine_choices() -> tuple[str, ...]:
    return ("auto", *ADAPTERS)


def normalise_url(value: str, default_path: str = METRICS_PATH) -> str:
    """``http(s)://host[:port][/path]``; an empty path becomes ``/metrics``. ``UrlError`` (a
    ValueError) if it is not one."""
    parts = split_http_url(value)
    path = parts.path if parts.path not in ("", "/") else default_path
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def setting(
    default: Any,
    help: str,
    *,
    flag: str,
    group: str,
    metavar: str | None = None,
    deprecated: tuple[str, ...] = (),
    **field: Any,
) -> Any:
    """A settings field with its flag, metavar, help, help group and old flag spellings.

    ``help`` says what the value does; ``(default: X; KVDOCTOR_Y)`` is added where it is shown,
    unless the help already explains its default (a default computed from other settings).
    """
    extra = {"flag": flag, "group": group, "metavar": metavar, "deprecated": list(deprecated)}
    return Field(default, description=help, json_schema_extra=extra, **field)


class ExporterSettings(BaseSettings):
    """Everything ``kvdoctor exporter`` (and ``kvdoctor demo``) can be told, in ``--help`` order."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        extra="forbid",
        validate_default=True,
        populate_by_name=True,  # a field with env aliases is still set by its own name
        env_ignore_empty=True,  # KVDOCTOR_X= (set but empty) is unset, as for every verb's variables
    )

    # --------------------------------------------------------------------------- sources
    engine_url: str | None = setting(
        None,
        "the engine's metrics endpoint, e.g. http://127.0.0.1:8000/metrics (path defaults to /metrics)",
        flag="--engine-url",
        metavar="URL",
        group=SOURCES,
    )
    engine: str = setting(
        "auto",
        f"engine adapter: auto (recognised from the metric names) or one of {', '.join(ADAPTERS)}",
        flag="--engine",
        metavar="NAME",
        group=SOURCES,
    )
    dcgm_url: str | None = setting(
        None, "an existing dcgm-exporter's /metrics, for GPU counters", flag="--dcgm-url", metavar="URL", group=SOURCES
    )
    collectors: dict[str, bool] = Field(
        default_factory=dict,
        description="turn a collector on or off (the collectors are listed below)",
        json_schema_extra={"flag": "--collector.NAME", "group": SOURCES, "metavar": None},
    )
    scrape_timeout: float | None = setting(
        None,
        "seconds a source may take per collection (default: the interval, between 0.5 and 5)",
        flag="--scrape-timeout",
        metavar="S",
        group=SOURCES,
        gt=0,
    )
    max_body_bytes: int = setting(
        16 * 1024 * 1024,
        "largest /metrics body read from a source",
        flag="--max-body-bytes",
        metavar="N",
        group=SOURCES,
        ge=1024,
    )

    # --------------------------------------------------------------------------- context
    model_config_path: str | None = setting(
        None,
        "the served model: its config.json, its folder, its Hugging Face id in the local cache, or a built-in "
        "name (enables kvdoctor_decode_step_floor_seconds)",
        flag="--model",
        metavar="MODEL",
        group=CONTEXT,
        deprecated=("--model-config",),
        validation_alias=AliasChoices("kvdoctor_model", "kvdoctor_model_config", "kvdoctor_model_config_path"),
    )
    served_model: str | None = setting(
        None,
        "the model the engine serves, by name (the chart passes engine.model): looked up like --model, "
        "but one it cannot find (not yet in the Hugging Face cache, not built in) is said at start and in "
        "the context instead of refusing to start; --model wins",
        flag="--served-model",
        metavar="NAME",
        group=CONTEXT,
    )
    gpu_peak_bandwidth: float | None = setting(
        None,
        "peak DRAM bandwidth of one GPU in bytes/s (default: from NVML or the GPU catalogue)",
        flag="--gpu-peak-bandwidth",
        metavar="BYTES_PER_S",
        group=CONTEXT,
        gt=0,
    )
    gpu_filter: str = setting("auto", GPU_FILTER_HELP, flag="--gpu-filter", metavar="POLICY", group=CONTEXT)
    pod: str | None = setting(
        None, "value of the pod label added to every series", flag="--pod", metavar="NAME", group=CONTEXT
    )
    slo_ms: float = setting(
        DEFAULT_SLO_SECONDS * 1000,
        "per-token latency SLO (ITL p95, ms) the live diagnosis compares against; published as "
        "kvdoctor_inter_token_latency_slo_seconds, so clients and the alert rules use it too",
        flag="--slo-ms",
        metavar="MS",
        group=CONTEXT,
        gt=0,
    )
    ttft_slo_ms: float | None = setting(
        None,
        "time-to-first-token SLO (TTFT p95, ms), where the service has one; published as "
        "kvdoctor_time_to_first_token_slo_seconds, so the TTFT burn-rate alerts page on it "
        "(default: none, no TTFT alerts)",
        flag="--ttft-slo-ms",
        metavar="MS",
        group=CONTEXT,
        gt=0,
    )
    diagnosis_window: float = setting(
        DIAGNOSIS_WINDOW_SECONDS,
        "seconds of history the live diagnosis reads each cycle",
        flag="--diagnosis-window",
        metavar="S",
        group=CONTEXT,
        ge=5,
        le=900,
    )

    # --------------------------------------------------------------------------- serving
    interval: float = setting(1.0, "seconds between collections", flag="--interval", metavar="S", group=SERVING, gt=0)
    host: str = setting("127.0.0.1", "address to bind", flag="--host", metavar="HOST", group=SERVING, min_length=1)
    port: int = setting(
        DEFAULT_PORT, "port to bind; 0: any free port", flag="--port", metavar="PORT", group=SERVING, ge=0, le=65535
    )
    retention_seconds: float = setting(
        900.0, "seconds of samples kept in memory", flag="--retention", metavar="S", group=SERVING, gt=0
    )
    max_snapshots: int = setting(
        3600,
        "collection cycles kept in memory at most (bounds memory whatever the interval)",
        flag="--max-snapshots",
        metavar="N",
        group=SERVING,
        ge=1,
        le=1_000_000,
    )
    max_series: int = setting(
        5000,
        "series per cycle at most; the excess is dropped and counted (reason series_cap)",
        flag="--max-series",
        metavar="N",
        group=SERVING,
        ge=64,
        le=1_000_000,
    )
    max_window_seconds: int = setting(
        900,
        "longest window /api/v1/window serves (at most the retention)",
        flag="--max-window",
        metavar="S",
        group=SERVING,
        ge=1,
    )
    log_level: LogLevel = setting("info", "log level on stderr", flag="--log-level", group=SERVING)
    web_config_file: str | None = setting(
        None,
        "exporter-toolkit web configuration (YAML): TLS, client certificates, basic auth with bcrypt hashes",
        flag="--web.config.file",
        metavar="PATH",
        group=SERVING,
    )

    @classmethod
    def settings_customise_sources(
        cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings
    ):
        return (init_settings, env_settings, CollectorSwitchesFromEnv(settings_cls))

    @model_validator(mode="before")
    @classmethod
    def _nvml_shorthand(cls, data: Any) -> Any:
        """``nvml=False``, the old field (deprecated with ``--nvml``): the nvml collector's switch."""
        if isinstance(data, dict) and "nvml" in data:
            data = dict(data)
            enabled = data.pop("nvml")
            data["collectors"] = {"nvml": enabled, **dict(data.get("collectors") or {})}
        return data

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

    @field_validator("log_level", mode="before")
    @classmethod
    def _log_level(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

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

    @field_validator("web_config_file")
    @classmethod
    def _web_config(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        try:
            load_web_config(value)  # the whole file and its certificates, before anything starts
        except WebConfigError as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("gpu_filter")
    @classmethod
    def _gpu_filter(cls, value: str) -> str:
        return str(parse_gpu_filter(value))

    @field_validator("model_config_path")
    @classmethod
    def _model_config(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        found = locate_model(value)  # a config.json, a folder, a cached Hugging Face id or a built-in name
        if isinstance(found, tuple):
            read_config(found[0])  # readable JSON; its fields are checked when the exporter is built
            return value.strip() if found[1] else str(found[0])
        return value.strip()

    @model_validator(mode="after")
    def _derived(self) -> ExporterSettings:
        if self.scrape_timeout is None:
            self.scrape_timeout = min(max(self.interval, 0.5), 5.0)
        if self.max_window_seconds > self.retention_seconds:
            self.max_window_seconds = max(1, int(self.retention_seconds))
        return self

    def collector_enabled(self, name: str) -> bool:
        """Whether collector ``name`` runs: its switch, else its registry default."""
        if name in self.collectors:
            return self.collectors[name]
        spec = collector_registry().get(name)
        return bool(spec and spec.enabled_by_default)

    def enabled_collectors(self) -> list[str]:
        return [name for name in collector_registry() if self.collector_enabled(name)]


# ------------------------------------------------------------------------------- the fields, read back


@dataclass(frozen=True)
class Option:
    """One setting as the outside sees it: flag, environment variables, default, help."""

    field: str
    flag: str  # "--retention"; "--collector.NAME" for the collector switches
    metavar: str | None
    help: str
    group: str
    env: tuple[str, ...]  # the variables that set it, the documented one first
    default: Any
    kind: type  # bool, int, float, str (the argparse type), or dict for the collector switches
    choices: tuple[str, ...] | None = None
    deprecated: tuple[str, ...] = ()  # old spellings of the flag, working for one release

    @property
    def is_switch(self) -> bool:
        return self.kind is bool

    @property
    def is_collectors(self) -> bool:
        return self.kind is dict

    def flag_names(self) -> tuple[str, ...]:
        """Every spelling on the command line (``--nvml``, ``--no-nvml``; one per collector)."""
        if self.is_collectors:
            return tuple(f"--{no}collector.{name}" for name in collector_registry() for no in ("", "no-"))
        if self.is_switch:
            return (self.flag, "--no-" + self.flag.removeprefix("--"))
        return (self.flag,)

    @property
    def where(self) -> str:
        """How messages name the setting: ``--nvml/--no-nvml (KVDOCTOR_NVML)``."""
        return f"{'/'.join(self.flag_names())} ({self.env[0]})"

    def default_text(self) -> str | None:
        """The default as the help and the README show it; None where the help explains it."""
        if self.is_collectors or self.default is None:
            return None
        if self.is_switch:
            return "on" if self.default else "off"
        return f"{self.default:g}" if isinstance(self.default, float) else str(self.default)

    def help_line(self) -> str:
        """The help with its default and environment variable: ``... (default: 1; env KVDOCTOR_INTERVAL)``."""
        default = self.default_text()
        notes = [f"default: {default}"] if default is not None else []
        if self.env:
            notes.append(f"env {self.env[0]}")
        return f"{self.help} ({'; '.join(notes)})" if notes else self.help


def _env_names(name: str, info: FieldInfo) -> tuple[str, ...]:
    if name == "collectors":
        return (COLLECTOR_ENV_PREFIX + "NAME",)
    alias = info.validation_alias
    if isinstance(alias, AliasChoices):
        return tuple(str(choice).upper() for choice in alias.choices)
    if isinstance(alias, str):
        return (alias.upper(),)
    return (ENV_PREFIX + name.upper(),)


def _kind(annotation: Any) -> tuple[type, tuple[str, ...] | None]:
    """The argparse type of a field's annotation (``float | None`` -> float) and its choices."""
    if typing.get_origin(annotation) is Literal:
        return str, tuple(typing.get_args(annotation))
    if typing.get_origin(annotation) is dict:
        return dict, None
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return (args[0] if args else annotation), None


def options() -> list[Option]:
    """Every setting, in ``--help`` order."""
    found = []
    for name, info in ExporterSettings.model_fields.items():
        extra = info.json_schema_extra
        if not isinstance(extra, dict) or "flag" not in extra:
            raise TypeError(f"ExporterSettings.{name} has no flag: declare it with setting(...)")
        kind, choices = _kind(info.annotation)
        found.append(
            Option(
                field=name,
                flag=str(extra["flag"]),
                metavar=str(extra["metavar"]) if extra.get("metavar") else None,
                help=info.description or "",
                group=str(extra["group"]),
                env=_env_names(name, info),
                default=None if info.default_factory is not None else info.default,
                kind=kind,
                choices=choices,
                deprecated=tuple(extra.get("deprecated") or ()),
            )
        )
    return found


def option_for(field: str) -> Option | None:
    return next((o for o in options() if o.field == field), None)


def markdown_table() -> str:
    """The README's configuration table (tests/test_readme.py checks it)."""
    rows = ["| flag | environment variable | default | what it sets |", "|---|---|---|---|"]
    for option in options():
        flag = " / ".join(f"`{f}`" for f in option.flag_names()) if option.is_switch else f"`{option.flag}`"
        if option.is_collectors:
            flag = "`--collector.NAME` / `--no-collector.NAME`"
        env = " or ".join(f"`{e}`" for e in option.env)
        default = option.default_text()
        what = " ".join(option.help.replace("|", "\\|").split())
        if option.choices:
            what = f"{what}: {', '.join(option.choices)}"
        rows.append(f"| {flag} | {env} | {f'`{default}`' if default is not None else ''} | {what} |")
    return "\n".join(rows)


def error_line(exc: ValidationError) -> str:
    """The first validation error as one line: ``--interval (KVDOCTOR_INTERVAL): must be > 0, got 0``."""
    err = exc.errors(include_url=False)[0]
    loc = [str(part) for part in err.get("loc", ())]
    field = loc[0] if loc else ""
    option = option_for(field) or next((o for o in options() if field in (e.lower() for e in o.env)), None)
    if err.get("type") == "extra_forbidden" or option is None:
        return f"unknown setting {field!r}" if field else "configuration: " + err.get("msg", "invalid value")
    if option.is_collectors:
        where = f"--collector.{loc[1]} ({COLLECTOR_ENV_PREFIX}{loc[1].upper()})" if len(loc) > 1 else "collector switch"
    else:
        where = option.where
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
        "literal_error",
    ):
        message = f"{message[0].lower()}{message[1:]}, got {err.get('input')!r}"
    if message.startswith(option.flag):  # the validator already named the flag
        message = message[len(option.flag) :].lstrip(": ")
    return f"{where}: {message}".replace("\n", " ")


def load_settings(**overrides: Any) -> ExporterSettings:
    """Settings from the environment with ``overrides`` (flags) on top; ValidationError if bad."""
    return ExporterSettings(**{k: v for k, v in overrides.items() if v is not None})
