"""ExporterSettings: defaults, environment, collector switches, validation messages."""

from __future__ import annotations

import json
import os

import pytest
from pydantic import ValidationError

from kvdoctor.exporter.collectors.base import CollectorSpec
from kvdoctor.exporter.settings import ExporterSettings, error_line, load_settings, normalise_url


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for key in list(os.environ):
        if key.startswith("KVDOCTOR_"):
            monkeypatch.delenv(key)


@pytest.fixture
def registry(monkeypatch):
    """A known collector registry for switch tests (the real one may not be complete yet)."""
    fake = {
        "engine": CollectorSpec("engine", "engine /metrics", True, lambda s: None),
        "nvml": CollectorSpec("nvml", "NVML", True, lambda s: None),
        "dcgm": CollectorSpec("dcgm", "dcgm-exporter", False, lambda s: None),
    }
    monkeypatch.setattr("kvdoctor.exporter.settings.collector_registry", lambda: fake)
    return fake


def first_error(**kw) -> str:
    with pytest.raises(ValidationError) as info:
        load_settings(**kw)
    return error_line(info.value)


def test_defaults():
    s = ExporterSettings()
    assert (s.host, s.port, s.interval, s.retention_seconds) == ("127.0.0.1", 9745, 1.0, 900.0)
    assert s.engine == "auto" and s.engine_url is None and s.nvml is True
    assert s.scrape_timeout == 1.0  # derived from the interval


@pytest.mark.parametrize("interval, timeout", [(0.1, 0.5), (1.0, 1.0), (2.0, 2.0), (30.0, 5.0)])
def test_scrape_timeout_defaults_from_the_interval(interval, timeout):
    assert ExporterSettings(interval=interval).scrape_timeout == timeout


def test_environment_fills_fields_and_flags_win(monkeypatch):
    monkeypatch.setenv("KVDOCTOR_INTERVAL", "2.5")
    monkeypatch.setenv("KVDOCTOR_ENGINE_URL", "http://127.0.0.1:8000")
    monkeypatch.setenv("KVDOCTOR_POD", "from-env")
    s = load_settings(pod="from-flag", interval=None)
    assert s.interval == 2.5
    assert s.engine_url == "http://127.0.0.1:8000/metrics"
    assert s.pod == "from-flag"


def test_model_config_comes_from_kvdoctor_model_config(monkeypatch, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"num_hidden_layers": 2}))
    monkeypatch.setenv("KVDOCTOR_MODEL_CONFIG", str(path))
    assert ExporterSettings().model_config_path == str(path)


@pytest.mark.parametrize(
    "url, normalised",
    [
        ("http://127.0.0.1:8000", "http://127.0.0.1:8000/metrics"),
        ("http://127.0.0.1:8000/", "http://127.0.0.1:8000/metrics"),
        ("https://engine:8443/prometheus/metrics", "https://engine:8443/prometheus/metrics"),
        (" http://[::1]:9000/metrics ", "http://[::1]:9000/metrics"),
    ],
)
def test_urls_are_normalised(url, normalised):
    assert normalise_url(url) == normalised


@pytest.mark.parametrize("url", ["localhost:8000", "ftp://x/metrics", "http://", "http://host:port/", "not a url"])
def test_malformed_urls_name_the_flag_and_the_variable(url):
    line = first_error(engine_url=url)
    assert line.startswith("--engine-url (KVDOCTOR_ENGINE_URL): malformed URL")


def test_unknown_engine_lists_the_choices():
    line = first_error(engine="nosuchengine")
    assert line.startswith("--engine (KVDOCTOR_ENGINE): unknown engine 'nosuchengine'")
    assert "auto" in line


@pytest.mark.parametrize("value", [0, -1])
def test_interval_must_be_positive(value):
    assert first_error(interval=value).startswith("--interval (KVDOCTOR_INTERVAL): must be greater than 0")


def test_a_bad_environment_value_is_one_line(monkeypatch):
    monkeypatch.setenv("KVDOCTOR_PORT", "nine")
    line = first_error()
    assert line.startswith("--port (KVDOCTOR_PORT):") and "\n" not in line


def test_missing_and_unparseable_model_config(tmp_path):
    assert "no such file" in first_error(model_config_path=str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert "is not JSON" in first_error(model_config_path=str(bad))


def test_collector_switches_from_flags_and_environment(monkeypatch, registry):
    monkeypatch.setenv("KVDOCTOR_COLLECTOR_DCGM", "true")
    monkeypatch.setenv("KVDOCTOR_COLLECTOR_ENGINE", "false")
    s = load_settings()
    assert s.collector_enabled("dcgm") and not s.collector_enabled("engine") and s.collector_enabled("nvml")
    s = load_settings(collectors={"engine": True})  # a flag wins over the environment
    assert s.collector_enabled("engine") and s.collector_enabled("dcgm")
    assert s.enabled_collectors() == ["engine", "nvml", "dcgm"]


def test_no_nvml_turns_the_nvml_collector_off(registry):
    assert not ExporterSettings(nvml=False).collector_enabled("nvml")
    assert not ExporterSettings(nvml=False, collectors={"nvml": True}).collector_enabled("nvml")


def test_unknown_collector_switch_is_refused(monkeypatch, registry):
    monkeypatch.setenv("KVDOCTOR_COLLECTOR_BOGUS", "true")
    line = first_error()
    assert "unknown collector 'bogus'" in line and "KVDOCTOR_COLLECTOR_BOGUS" in line


def test_unparseable_collector_switch_names_it(monkeypatch, registry):
    monkeypatch.setenv("KVDOCTOR_COLLECTOR_DCGM", "perhaps")
    assert first_error().startswith("--collector.dcgm (KVDOCTOR_COLLECTOR_DCGM):")


def test_window_bound_never_exceeds_retention():
    assert ExporterSettings(retention_seconds=120, max_window_seconds=900).max_window_seconds == 120
