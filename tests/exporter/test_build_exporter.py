"""build_exporter: the registry's enabled collectors, extra collectors, model shape, diagnosis."""

from __future__ import annotations

import json

import pytest

from kvdoctor.exporter import assembly as command
from kvdoctor.exporter.collectors.base import CollectorSpec
from kvdoctor.exporter.settings import ExporterSettings
from kvdoctor.rules.verdicts import VERDICTS
from kvdoctor.signals import vocabulary as S
from kvdoctor.signals.collection import NotApplicable
from tests.exporter.exporter_fakes import StaticCollector, engine_samples, gpu_samples
from tests.support.models import write_config

pytestmark = pytest.mark.usefixtures("clean_env")  # no KVDOCTOR_* from the caller's environment


@pytest.fixture
def registry(monkeypatch):
    def absent(settings):
        raise NotApplicable("no such hardware here")

    def broken(settings):
        raise RuntimeError("driver exploded")

    fake = {
        "engine": CollectorSpec("engine", "engine", True, lambda s: StaticCollector("engine", engine_samples)),
        "absent": CollectorSpec("absent", "not here", True, absent),
        "broken": CollectorSpec("broken", "fails to start", True, broken),
        "optional": CollectorSpec(
            "optional", "off by default", False, lambda s: StaticCollector("optional", gpu_samples)
        ),
    }
    monkeypatch.setattr("kvdoctor.exporter.settings.collector_registry", lambda: fake)
    monkeypatch.setattr("kvdoctor.exporter.assembly.collector_registry", lambda: fake)
    return fake


def test_enabled_collectors_are_built_and_failures_are_visible_not_fatal(registry):
    exp = command.build_exporter(ExporterSettings(interval=0.1), diagnose_hook=None)
    assert [c.name for c in exp.collectors] == ["engine", "broken"]
    exp.run_cycle()
    status = exp.status()
    assert status["engine"]["up"] is True
    assert status["broken"]["up"] is False
    assert status["broken"]["last_error_reason"] == "init_failed"
    assert "driver exploded" in status["broken"]["last_error"]


def test_switches_select_collectors(registry):
    settings = ExporterSettings(interval=0.1, collectors={"optional": True, "engine": False})
    names = [c.name for c in command.build_exporter(settings, diagnose_hook=None).collectors]
    assert names == ["broken", "optional"]


def test_extra_collectors_replace_registry_ones_of_the_same_name(registry):
    mine = StaticCollector("engine", lambda step: gpu_samples(1, step))
    exp = command.build_exporter(ExporterSettings(interval=0.1), extra_collectors=[mine], diagnose_hook=None)
    assert [c for c in exp.collectors if c.name == "engine"] == [mine]
    exp.run_cycle()
    assert any(name == S.GPU_MEMORY_USED for name, _ in exp.store.latest().samples)


def test_model_config_is_loaded_into_a_shape(registry, tmp_path):
    path = write_config(tmp_path)
    exp = command.build_exporter(ExporterSettings(model_config_path=str(path)), diagnose_hook=None)
    assert exp.model_shape.num_layers == 4 and exp.model_shape.num_kv_heads == 2


def test_an_unusable_model_config_is_a_config_error(registry, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"hidden_size": 256}))
    with pytest.raises(command.ConfigError, match="num_hidden_layers"):
        command.build_exporter(ExporterSettings(model_config_path=str(path)))


def test_the_default_diagnosis_is_used_when_the_rules_have_it(registry):
    from kvdoctor.exporter.live_diagnosis import MIN_DIAGNOSIS_SNAPSHOTS

    exp = command.build_exporter(ExporterSettings(interval=0.1))
    assert exp.diagnose_hook is not None
    for _ in range(MIN_DIAGNOSIS_SNAPSHOTS):
        exp.run_cycle()
    assert exp.diagnosis()["verdict"] in VERDICTS
    assert f'{S.DIAGNOSIS_VERDICT}{{verdict="{exp.diagnosis()["verdict"]}"}} 1.0' in exp.metrics_bytes().decode()
