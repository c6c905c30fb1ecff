"""The collector switches from the environment, for ``ExporterSettings`` (``exporter/settings.py``).

``KVDOCTOR_COLLECTOR_NAME=true|false`` switches collector ``NAME``; ``KVDOCTOR_NVML``, the old
spelling of the nvml collector's switch, still works for one release.
"""

from __future__ import annotations

import os
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_settings import PydanticBaseSettingsSource

from kvdoctor.sources.environment import ENV_PREFIX

COLLECTOR_ENV_PREFIX = ENV_PREFIX + "COLLECTOR_"

# Deprecated spellings of collector switches (one release): the flag, and the variable.
DEPRECATED_COLLECTOR_FLAGS = {"nvml": "--nvml"}
DEPRECATED_COLLECTOR_VARIABLES = {ENV_PREFIX + "NVML": "nvml"}


class CollectorSwitchesFromEnv(PydanticBaseSettingsSource):
    """``KVDOCTOR_COLLECTOR_NAME=true|false`` -> ``collectors={"name": ...}``."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        switches = {
            name: os.environ[old]
            for old, name in DEPRECATED_COLLECTOR_VARIABLES.items()
            if os.environ.get(old, "").strip()
        }
        switches.update(
            {
                key[len(COLLECTOR_ENV_PREFIX) :].lower(): raw
                for key, raw in os.environ.items()
                if key.upper().startswith(COLLECTOR_ENV_PREFIX) and len(key) > len(COLLECTOR_ENV_PREFIX) and raw.strip()
            }
        )
        return {"collectors": switches} if switches else {}
