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
from dataclasses import dataclass, field

from kvdoctor.dashboard.auth import users_from_env
from kvdoctor.sources.environment import ENV_PREFIX as KVDOCTOR_ENV_PREFIX
from kvdoctor.sources.urls import UrlError, base_url

ENV_PREFIX = KVDOCTOR_ENV_PREFIX + "DASHBOARD_"


def normalise_base_url(value: str, what: str) -> str:
    """``host:port`` or ``http(s)://host[:port][/prefix]`` -> ``http(s)://host[:port][/prefix]``;
    ``ValueError`` with one line naming ``what`` on anything else."""
    try:
        return base_url(value, scheme_optional=True)
    except UrlError as exc:
        raise ValueError(exc.about(f"{what} URL")) from None


@dataclass(frozen=True)
class DashboardSettings:
    exporter_url: str | None = None
    prometheus_url: str | None = None
    refresh_seconds: float = 1.0
    live_seconds: int = 900
    # Trailing window over which rates and latency quantiles are computed for each point.
    rate_window_seconds: float = 10.0
    # Points per trace: the live charts' extendData cap and the history downsampling target. Two
    # per pixel column (a column's low and high) of the widest plot this layout makes, ~1,000 px.
    max_points: int = 2000
    # Points per chart: a chart with many traces (8 GPUs x 2) shares this budget, so a day of
    # history stays quick to draw; each trace still gets at least MIN_POINTS_PER_TRACE.
    max_chart_points: int = 8000
    # Range queries ask Prometheus for this many times max_points, for MinMaxLTTB to choose from.
    # 1: Prometheus's work and the JSON between us grow with the points asked for (a day of
    # history costs a fifth to a third less than at 2), and more candidates only catch more of the
    # gauge spikes one to two steps long: a counter's burst is kept at any step (promql.rate_window
    # covers every step), and a gauge spike shorter than a step would need *_over_time either way.
    oversampling: int = 1
    request_timeout_seconds: float = 2.0
    users: Mapping[str, str] = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if self.exporter_url:
            object.__setattr__(self, "exporter_url", normalise_base_url(self.exporter_url, "exporter"))
        if self.prometheus_url:
            object.__setattr__(self, "prometheus_url", normalise_base_url(self.prometheus_url, "Prometheus"))
        if not self.refresh_seconds > 0:
            raise ValueError(f"refresh must be a positive number of seconds, got {self.refresh_seconds!r}")
        if not 10 <= self.live_seconds <= 24 * 3600:
            raise ValueError(f"live window must be between 10 s and 24 h, got {self.live_seconds!r}")
        if not self.request_timeout_seconds > 0:
            raise ValueError(
                f"request timeout must be a positive number of seconds, got {self.request_timeout_seconds!r}"
            )
        if not self.max_points >= 100:
            raise ValueError(f"max points must be at least 100, got {self.max_points!r}")

    @property
    def live_points_cap(self) -> int:
        """Points a live trace keeps: the live window at the refresh rate, at most ``max_points``."""
        return max(10, min(self.max_points, int(self.live_seconds / self.refresh_seconds) + 1))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides) -> DashboardSettings:
        """Settings from ``KVDOCTOR_DASHBOARD_*``; keyword arguments that are not None win."""
        env = os.environ if environ is None else environ
        values: dict = {}
        for key, name, conv in (
            ("exporter_url", "EXPORTER_URL", str),
            ("prometheus_url", "PROMETHEUS_URL", str),
            ("refresh_seconds", "REFRESH", float),
            ("live_seconds", "LIVE_SECONDS", int),
            ("request_timeout_seconds", "REQUEST_TIMEOUT", float),
        ):
            raw = env.get(ENV_PREFIX + name)
            if raw:
                try:
                    values[key] = conv(raw)
                except ValueError:
                    raise ValueError(f"{ENV_PREFIX}{name} must be a number, got {raw!r}") from None
        if "users" not in overrides or overrides["users"] is None:
            values["users"] = users_from_env(env)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)
