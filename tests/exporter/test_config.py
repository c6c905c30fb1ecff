"""ExporterSettings: defaults, environment, collector switches, validation messages."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from kvdoctor.exporter.collectors.base import CollectorSpec
from kvdoctor.exporter.settings import (
    ExporterSettings,
    error_line,
    load_settings,
    markdown_table,
    option_for,
    options,
)

pytestmark = pytest.mark.usefixtures("clean_env")  # no KVDOCTOR_* from the caller's environment


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
    assert s.engine == "auto" and s.engine_url is None and s.collector_enabled("nvml")
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


@pytest.mark.parametrize("url", ["localhost:8000", "ftp://x/metrics", "http://", "http://host:port/", "not a url"])
def test_malformed_urls_name_the_flag_and_the_variable(url):
    line = first_error(engine_url=url)
    assert line.startswith("--engine-url (KVDOCTOR_ENGINE_URL): ") and repr(url) in line


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


def test_the_old_nvml_setting_is_the_nvml_collector_switch(registry, monkeypatch):
    assert not ExporterSettings(nvml=False).collector_enabled("nvml")  # deprecated: collectors={"nvml": False}
    assert ExporterSettings(nvml=False, collectors={"nvml": True}).collector_enabled("nvml")  # the switch wins
    monkeypatch.setenv("KVDOCTOR_NVML", "false")  # deprecated: KVDOCTOR_COLLECTOR_NVML
    assert not ExporterSettings().collector_enabled("nvml")
    monkeypatch.setenv("KVDOCTOR_COLLECTOR_NVML", "true")
    assert ExporterSettings().collector_enabled("nvml")


def test_unknown_collector_switch_is_refused(monkeypatch, registry):
    monkeypatch.setenv("KVDOCTOR_COLLECTOR_BOGUS", "true")
    line = first_error()
    assert "unknown collector 'bogus'" in line and "KVDOCTOR_COLLECTOR_BOGUS" in line


def test_unparseable_collector_switch_names_it(monkeypatch, registry):
    monkeypatch.setenv("KVDOCTOR_COLLECTOR_DCGM", "perhaps")
    assert first_error().startswith("--collector.dcgm (KVDOCTOR_COLLECTOR_DCGM):")


def test_window_bound_never_exceeds_retention():
    assert ExporterSettings(retention_seconds=120, max_window_seconds=900).max_window_seconds == 120


# --------------------------------------------------------------------- the settings, declared once

# Every flag, environment variable and default the exporter had before the settings were
# declared in one place: none may disappear or change (but for the renames of the CLI grammar, #17:
# --model-config is now a deprecated spelling of --model, --nvml of --collector.nvml; both still
# work, tests/test_cli_grammar.py).
KNOWN = [
    ("engine_url", "--engine-url", "KVDOCTOR_ENGINE_URL", None),
    ("engine", "--engine", "KVDOCTOR_ENGINE", "auto"),
    ("dcgm_url", "--dcgm-url", "KVDOCTOR_DCGM_URL", None),
    ("scrape_timeout", "--scrape-timeout", "KVDOCTOR_SCRAPE_TIMEOUT", 1.0),
    ("max_body_bytes", "--max-body-bytes", "KVDOCTOR_MAX_BODY_BYTES", 16 * 1024 * 1024),
    ("model_config_path", "--model", "KVDOCTOR_MODEL", None),
    ("gpu_peak_bandwidth", "--gpu-peak-bandwidth", "KVDOCTOR_GPU_PEAK_BANDWIDTH", None),
    ("gpu_filter", "--gpu-filter", "KVDOCTOR_GPU_FILTER", "auto"),
    ("pod", "--pod", "KVDOCTOR_POD", None),
    ("slo_ms", "--slo-ms", "KVDOCTOR_SLO_MS", 100.0),
    ("diagnosis_window", "--diagnosis-window", "KVDOCTOR_DIAGNOSIS_WINDOW", 60.0),
    ("interval", "--interval", "KVDOCTOR_INTERVAL", 1.0),
    ("host", "--host", "KVDOCTOR_HOST", "127.0.0.1"),
    ("port", "--port", "KVDOCTOR_PORT", 9745),
    ("retention_seconds", "--retention", "KVDOCTOR_RETENTION_SECONDS", 900.0),
    ("max_snapshots", "--max-snapshots", "KVDOCTOR_MAX_SNAPSHOTS", 3600),
    ("max_series", "--max-series", "KVDOCTOR_MAX_SERIES", 5000),
    ("max_window_seconds", "--max-window", "KVDOCTOR_MAX_WINDOW_SECONDS", 900),
    ("log_level", "--log-level", "KVDOCTOR_LOG_LEVEL", "info"),
]


@pytest.mark.parametrize("field, flag, env, default", KNOWN, ids=[k[0] for k in KNOWN])
def test_every_known_flag_variable_and_default_is_kept(field, flag, env, default):
    option = option_for(field)
    assert option is not None and option.flag == flag and env in option.env
    assert getattr(ExporterSettings(), field) == default


def test_every_field_declares_its_flag_help_and_group():
    fields = set(ExporterSettings.model_fields)
    assert {o.field for o in options()} == fields
    for option in options():
        assert option.flag.startswith("--") and option.help and option.group, option
        assert option.env and all(e.startswith("KVDOCTOR_") for e in option.env), option
    flags = [f for o in options() for f in o.flag_names()]
    assert len(flags) == len(set(flags))


def test_the_variable_is_kvdoctor_field_unless_an_alias_is_declared():
    for option in options():
        info = ExporterSettings.model_fields[option.field]
        if option.field != "collectors" and info.validation_alias is None:
            assert option.env == (f"KVDOCTOR_{option.field.upper()}",)


@pytest.mark.parametrize("env", ["KVDOCTOR_MODEL", "KVDOCTOR_MODEL_CONFIG", "KVDOCTOR_MODEL_CONFIG_PATH"])
def test_the_model_config_is_read_from_its_declared_variables(monkeypatch, tmp_path, env):
    path = tmp_path / "config.json"
    path.write_text("{}")
    monkeypatch.setenv(env, str(path))
    assert ExporterSettings().model_config_path == str(path)


def test_an_unprefixed_variable_is_never_read(monkeypatch, tmp_path):
    monkeypatch.setenv("MODEL_CONFIG_PATH", str(tmp_path / "missing.json"))
    monkeypatch.setenv("INTERVAL", "7")
    assert ExporterSettings().model_config_path is None and ExporterSettings().interval == 1.0


def test_log_level_from_the_environment_in_any_case(monkeypatch):
    monkeypatch.setenv("KVDOCTOR_LOG_LEVEL", "DEBUG")
    assert ExporterSettings().log_level == "debug"
    monkeypatch.setenv("KVDOCTOR_LOG_LEVEL", "loud")
    assert first_error().startswith("--log-level (KVDOCTOR_LOG_LEVEL): must be 'debug'")


@pytest.mark.parametrize("option", options(), ids=lambda o: o.field)
def test_every_error_names_the_flag_and_the_variable(option):
    bad = {bool: "perhaps", int: "many", float: "soon", str: 7, dict: {"bogus": True}}[option.kind]
    if option.kind is str and option.field not in ("engine", "engine_url", "dcgm_url", "gpu_filter", "log_level"):
        return  # free text: nothing to get wrong
    line = first_error(**{option.field: "nosuchvalue" if option.kind is str else bad})
    if option.is_collectors:
        assert "unknown collector 'bogus'" in line and "--collector.bogus / KVDOCTOR_COLLECTOR_BOGUS" in line
    else:
        assert line.startswith(f"{'/'.join(option.flag_names())} ({option.env[0]}): "), line


def test_help_shows_the_default_and_the_variable():
    assert option_for("retention_seconds").help_line().endswith("(default: 900; env KVDOCTOR_RETENTION_SECONDS)")
    assert option_for("pod").help_line().endswith("(env KVDOCTOR_POD)")
    assert option_for("interval").help_line().endswith("(default: 1; env KVDOCTOR_INTERVAL)")


def test_the_readme_table_has_a_row_per_setting():
    rows = markdown_table().splitlines()[2:]
    assert len(rows) == len(options())
    assert "| `--retention` | `KVDOCTOR_RETENTION_SECONDS` | `900` |" in markdown_table()
