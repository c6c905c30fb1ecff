"""Dashboard settings: one frozen object, filled from arguments and ``KVDOCTOR_DASHBOARD_*``.

| variable | default | meaning |
|---|---|---|
| ``KVDOCTOR_DASHBOARD_EXPORTER_URL`` | - | the kvdoctor exporter to read (live window, diagnosis, status) |
| ``KVDOCTOR_DASHBOARD_PROMETHEUS_URL`` | - | a Prometheus that scrapes exporters (Fleet page, history) |
| ``KVDOCTOR_DASHBOARD_REFRESH`` | ``1`` | seconds between live updates |
| ``KVDOCTOR_DASHBOARD_LIVE_SECONDS`` | ``900`` | seconds of data the live charts keep |
| ``KVDOCTOR_DASHBOARD_REQUEST_TIMEOUT`` | ``2`` | seconds an exporter answer may take (Prometheus gets at least 15) |
| ``KVDOCTOR_DASHBOARD_USERS`` | - | basic-auth users, ``user:password,user2:password2`` |
| ``KVDOCTOR_DASHBOARD_AUTH_FILE`` | - | file of ``user:password`` lines (a mounted secret) |

The URLs are fixed here, once: the dashboard never fetches a URL that came from a request.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pydantic import Field, ValidationError, ValidationInfo, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, SettingsConfigDict

from kvdoctor.dashboard.auth import users_from_env
from kvdoctor.sources.environment import ENV_PREFIX as KVDOCTOR_ENV_PREFIX
from kvdoctor.sources.environment import EnvironmentSource, reading
from kvdoctor.sources.urls import UrlError, base_url

ENV_PREFIX = KVDOCTOR_ENV_PREFIX + "DASHBOARD_"


def normalise_base_url(value: str, what: str) -> str:
    """``http(s)://host[:port][/prefix]``, without a trailing slash (``sources/urls.py``, as every
    verb checks a URL: a scheme is needed); ``ValueError`` with one line naming ``what`` otherwise."""
    try:
        return base_url(value)
    except UrlError as exc:
        raise ValueError(exc.about(f"{what} URL")) from None


# The fields the environment may set (``KVDOCTOR_DASHBOARD_<FIELD>`` or the field's alias); the
# users come from ``auth.users_from_env``, the rest are the layout's tuning, not settings.
FROM_ENVIRONMENT = frozenset(
    {"exporter_url", "prometheus_url", "refresh_seconds", "live_seconds", "request_timeout_seconds"}
)


class _Environment(EnvironmentSource):
    """The environment ``from_env`` was given (else the process's), for ``FROM_ENVIRONMENT`` only."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        if field_name not in FROM_ENVIRONMENT:
            return None, field_name, False
        return super().get_field_value(field, field_name)


class DashboardSettings(BaseSettings):
    """Everything the dashboard is told: arguments first, then ``KVDOCTOR_DASHBOARD_*``."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, frozen=True, extra="forbid", populate_by_name=True, env_ignore_empty=True
    )

    exporter_url: str | None = Field(None, description="exporter URL")
    prometheus_url: str | None = Field(None, description="Prometheus URL")
    refresh_seconds: float = Field(1.0, gt=0, description="refresh", validation_alias=ENV_PREFIX + "REFRESH")
    live_seconds: int = Field(900, ge=10, le=24 * 3600, description="live window")
    # Trailing window over which rates and latency quantiles are computed for each point.
    rate_window_seconds: float = 10.0
    # Points per trace: the live charts' extendData cap and the history downsampling target. Two
    # per pixel column (a column's low and high) of the widest plot this layout makes, ~1,000 px.
    max_points: int = Field(2000, ge=100)
    # Points per chart: a chart with many traces (8 GPUs x 2) shares this budget, so a day of
    # history stays quick to draw; each trace still gets at least MIN_POINTS_PER_TRACE.
    max_chart_points: int = 8000
    # Range queries ask Prometheus for this many times max_points, for MinMaxLTTB to choose from.
    # 1: Prometheus's work and the JSON between us grow with the points asked for (a day of
    # history costs a fifth to a third less than at 2), and more candidates only catch more of the
    # gauge spikes one to two steps long: a counter's burst is kept at any step (promql.rate_window
    # covers every step), and a gauge spike shorter than a step would need *_over_time either way.
    oversampling: int = 1
    request_timeout_seconds: float = Field(
        2.0,
        gt=0,
        description="request timeout",
        validation_alias=ENV_PREFIX + "REQUEST_TIMEOUT",
    )
    users: Mapping[str, str] = Field(default_factory=dict, repr=False)

    @classmethod
    def settings_customise_sources(
        cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings
    ):
        return (init_settings, _Environment(settings_cls))

    @field_validator("exporter_url", "prometheus_url")
    @classmethod
    def _base_url(cls, value: str | None, info: ValidationInfo) -> str | None:
        what = cls.model_fields[str(info.field_name)].description or "URL"
        return normalise_base_url(value, what.removesuffix(" URL")) if value else None

    @property
    def live_points_cap(self) -> int:
        """Points a live trace keeps: the live window at the refresh rate, at most ``max_points``."""
        return max(10, min(self.max_points, int(self.live_seconds / self.refresh_seconds) + 1))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> DashboardSettings:
        """Settings from ``environ`` (default: the process's); keyword arguments that are not None
        win. ``ValueError`` with one line naming the setting (and its variable) on a bad value."""
        values = {k: v for k, v in overrides.items() if v is not None}
        if "users" not in values:
            values["users"] = users_from_env(os.environ if environ is None else environ)
        try:
            with reading(environ):
                return cls(**values)
        except ValidationError as exc:
            raise ValueError(error_line(exc)) from None


def error_line(exc: ValidationError) -> str:
    """The first error as one line: ``refresh (KVDOCTOR_DASHBOARD_REFRESH): must be ...``."""
    err = exc.errors(include_url=False)[0]
    name = str(err["loc"][0]) if err.get("loc") else ""
    fields = DashboardSettings.model_fields
    info = fields.get(name) or next((f for f in fields.values() if f.validation_alias == name), None)
    message = err.get("msg", "invalid value").removeprefix("Value error, ").replace("Input should be", "must be")
    if info is None:
        return f"unknown dashboard setting {name!r}" if name else message
    words = info.description or name.lower()
    if message.startswith(words):  # the validator named it already
        return message
    variable = info.validation_alias if isinstance(info.validation_alias, str) else ENV_PREFIX + name.upper()
    return f"{words} ({variable}): {message}, got {err.get('input')!r}"
