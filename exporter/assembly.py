"""Building an exporter from its settings: the enabled collectors, the model shape, the diagnosis.

``build_exporter(settings)`` is what ``kvdoctor exporter`` runs; ``kvdoctor demo`` adds the
simulated GPU through ``extra_collectors``, so the exporter never imports the simulator.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from kvdoctor.exporter.live_diagnosis import default_diagnose_hook
from kvdoctor.exporter.runtime import Exporter
from kvdoctor.exporter.settings import ExporterSettings, collector_registry, option_for
from kvdoctor.ledger.model import ModelShape
from kvdoctor.signals.collection import Collector, NotApplicable, SourceError
from kvdoctor.sources.model_files import load_model

log = logging.getLogger("kvdoctor.exporter")

DEFAULT_DIAGNOSIS = object()  # build_exporter: the rules' diagnosis with the settings' SLO and window


class ConfigError(ValueError):
    """A configuration that validates field by field but cannot be used (e.g. a bad model config)."""


class _FailedCollector:
    """Stands in for a collector whose construction failed: down every cycle, with the reason."""

    def __init__(self, name: str, message: str):
        self.name = name
        self.message = message

    def collect(self):
        raise SourceError("init_failed", self.message)

    def close(self) -> None:
        pass


def build_collectors(settings: ExporterSettings) -> list[Collector]:
    """The enabled collectors of the registry, built from ``settings``.

    A factory raising NotApplicable leaves that collector out (no source here); any other
    failure becomes a collector that reports ``source_up 0`` with reason ``init_failed``, so a
    broken source is visible without taking the exporter down.
    """
    collectors: list[Collector] = []
    for name, spec in collector_registry().items():
        if not settings.collector_enabled(name):
            continue
        try:
            collectors.append(spec.factory(settings))
        except NotApplicable as exc:
            log.info("collector %s: not applicable here (%s)", name, exc)
        except Exception as exc:
            log.warning("collector %s could not start: %s: %s", name, type(exc).__name__, exc)
            collectors.append(_FailedCollector(name, f"{type(exc).__name__}: {exc}"))
    return collectors


def build_exporter(
    settings: ExporterSettings,
    extra_collectors: Iterable[Collector] = (),
    diagnose_hook=DEFAULT_DIAGNOSIS,
    clock: Callable[[], float] = time.time,
    include_registry: bool = True,
) -> Exporter:
    """An Exporter (not started) for ``settings``: the registry's enabled collectors plus
    ``extra_collectors`` (the demo's simulated GPU, ...), the model shape, and the diagnosis.

    Raises ConfigError when the model config cannot be used.
    """
    shape = None
    missing = ""
    if settings.model_config_path:
        try:
            shape = load_model(settings.model_config_path)
        except ValueError as exc:
            raise ConfigError(f"{option_for('model_config_path').where}: {exc}") from None
    else:
        shape, missing = served_model_shape(getattr(settings, "served_model", None))
        if missing:
            log.warning("%s", missing)
    collectors = build_collectors(settings) if include_registry else []
    extra = list(extra_collectors)
    extra_names = {c.name for c in extra}
    collectors = [c for c in collectors if c.name not in extra_names] + extra  # an explicit collector wins
    hook = default_diagnose_hook(settings, shape) if diagnose_hook is DEFAULT_DIAGNOSIS else diagnose_hook
    exporter = Exporter(settings, collectors, diagnose_hook=hook, clock=clock, model_shape=shape)
    exporter.published.missing = missing
    return exporter


MODEL_FIX = (
    "give --model (KVDOCTOR_MODEL; the chart's sidecar.model or engine.model) a config.json, a model folder, "
    "a Hugging Face id in the cache (the chart mounts the engine's model volume) or a built-in name"
)


def served_model_shape(name: str | None) -> tuple[ModelShape | None, str]:
    """(the shape of the model the engine serves, "") or (None, one line saying what is missing and
    the flag or chart value that supplies it): the decode-step floor and the actions' predicted
    effects need the model's shape."""
    if not name or not name.strip():
        return None, f"model unknown: no decode-step floor and no predicted effects; {MODEL_FIX}"
    try:
        return load_model(name), ""
    except ValueError as exc:
        return (
            None,
            f"model {name.strip()!r} not found ({exc}): no decode-step floor and no predicted effects; {MODEL_FIX}",
        )
