"""The environment kvdoctor reads: every variable is named ``KVDOCTOR_<SETTING>``, read through
pydantic-settings.

The exporter's settings use ``ENV_PREFIX`` as it is; the dashboard's add ``DASHBOARD_`` to it
(``dashboard/settings.py``); the CLI's flags read ``KVDOCTOR_<FLAG>`` and ``KVDOCTOR_<VERB>_<FLAG>``
with ``read_variables`` (``kvdoctor/flags.py`` names them and checks each value like its flag).
``EnvironmentSource`` reads the mapping a caller gave ``reading`` (a test's, a command line's),
else the process's environment.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from pydantic import Field, create_model
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict
from pydantic_settings.sources.utils import parse_env_vars

ENV_PREFIX = "KVDOCTOR_"

_ENVIRON: ContextVar[Mapping[str, str] | None] = ContextVar("kvdoctor_environ", default=None)


@contextmanager
def reading(environ: Mapping[str, str] | None) -> Iterator[None]:
    """Within it, ``EnvironmentSource`` reads ``environ`` (None: the process's environment)."""
    token = _ENVIRON.set(environ)
    try:
        yield
    finally:
        _ENVIRON.reset(token)


class EnvironmentSource(EnvSettingsSource):
    """pydantic-settings' environment source, over the mapping ``reading`` was given."""

    def _load_env_vars(self) -> Mapping[str, str | None]:
        environ = _ENVIRON.get()
        if environ is None:
            return super()._load_env_vars()
        return parse_env_vars(environ, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str)


class Variables(BaseSettings):
    """Named variables as set: one optional text field per variable, named as the variable."""

    model_config = SettingsConfigDict(env_prefix="", case_sensitive=True, env_ignore_empty=True, frozen=True)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (EnvironmentSource(settings_cls),)


@functools.lru_cache(maxsize=64)
def _variables_model(names: tuple[str, ...]) -> type[Variables]:
    fields: dict[str, Any] = {name: (str | None, Field(None)) for name in names}
    return create_model("Variables", __base__=Variables, **fields)


def read_variables(names: Iterable[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of ``names`` that ``environ`` (default: the process's environment) sets to
    something other than blanks, as text: the caller checks each value like the flag it stands for."""
    with reading(environ):
        values = _variables_model(tuple(sorted(set(names))))()
    return {name: value for name, value in values.model_dump().items() if value is not None and value.strip()}
