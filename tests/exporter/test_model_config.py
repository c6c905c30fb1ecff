"""The exporter's --model takes the model as people have it (a config.json, a model folder,
a cached Hugging Face id, a built-in name), and a config the ledger cannot use is a one-line error
naming the field."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from kvdoctor.exporter import assembly
from kvdoctor.exporter.live_diagnosis import decode_floor
from kvdoctor.exporter.settings import ExporterSettings, error_line
from kvdoctor.ledger.arithmetic import weight_bytes_per_step
from kvdoctor.ledger.model import BUILTIN_CONFIGS, COMMON_MODELS
from kvdoctor.signals import vocabulary as S
from tests.support.models import TINY_CONFIG, write_config

pytestmark = pytest.mark.usefixtures("clean_env")


@pytest.fixture
def hf_cache(monkeypatch, tmp_path):
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


def build(value: str):
    return assembly.build_exporter(
        ExporterSettings(model_config_path=value), diagnose_hook=None, include_registry=False
    ).model_shape


def test_a_config_json_and_its_model_folder(tmp_path, hf_cache):
    path = write_config(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 4_321_000}}))
    for value in (str(path), str(tmp_path)):
        shape = build(value)
        assert shape.num_layers == 4 and shape.weight_bytes == 4_321_000


def test_a_hugging_face_id_in_the_local_cache_and_a_builtin_name(hf_cache):
    snapshot = hf_cache / "models--mistralai--Mixtral-8x7B-Instruct-v0.1" / "snapshots" / "41bd4c9"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(BUILTIN_CONFIGS["Mixtral-8x7B"]))
    assert ExporterSettings(model_config_path="mistralai/Mixtral-8x7B-Instruct-v0.1").model_config_path == (
        "mistralai/Mixtral-8x7B-Instruct-v0.1"
    )
    shape = build("mistralai/Mixtral-8x7B-Instruct-v0.1")
    assert shape.name == "mistralai/Mixtral-8x7B-Instruct-v0.1" and shape.is_moe
    assert build("Llama-3.1-8B").num_kv_heads == 8


def test_a_model_nowhere_is_refused_when_the_settings_are_read(hf_cache):
    with pytest.raises(ValidationError) as info:
        ExporterSettings(model_config_path="someone/not-cached")
    line = error_line(info.value)
    assert line.startswith("--model (KVDOCTOR_MODEL)") and "unknown model 'someone/not-cached'" in line
    assert "never downloads" in line and "\n" not in line


def test_a_config_missing_a_field_is_a_config_error_naming_it(tmp_path, hf_cache):
    write_config(tmp_path, {k: v for k, v in TINY_CONFIG.items() if k != "intermediate_size"})
    with pytest.raises(assembly.ConfigError, match="lacks 'intermediate_size'"):
        build(str(tmp_path))


def test_the_exporters_floor_reads_the_experts_its_running_batch_touches():
    mixtral = COMMON_MODELS["Mixtral-8x7B"]
    peak = ((S.GPU_DRAM_PEAK_BANDWIDTH, (("gpu", "0"),)), 1e12)

    def floor(running):
        return decode_floor(dict([peak, ((S.REQUESTS_RUNNING, ()), running)]), mixtral)

    assert floor(1) == weight_bytes_per_step(mixtral, 1) / 1e12
    assert floor(64) == weight_bytes_per_step(mixtral, 64) / 1e12 > 3 * floor(1)


# ------------------------------------------------------------------- the served model (the chart's)


def built(**settings):
    return assembly.build_exporter(ExporterSettings(**settings), diagnose_hook=None, include_registry=False)


def test_the_served_model_resolves_from_the_catalogue_offline(hf_cache):
    exporter = built(served_model="Qwen/Qwen3-8B")
    assert exporter.model_shape is COMMON_MODELS["Qwen3-8B"]
    assert "missing" not in exporter.context() and exporter.context()["model"]["name"] == "Qwen3-8B"
    assert "https://huggingface.co/Qwen/Qwen3-8B" in exporter.context()["model"]["source"]


def test_the_served_model_resolves_from_the_mounted_hugging_face_cache(hf_cache):
    snapshot = hf_cache / "models--acme--tiny-chat" / "snapshots" / "r1"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(TINY_CONFIG))
    shape = built(served_model="acme/tiny-chat").model_shape
    assert shape.name == "acme/tiny-chat" and shape.num_layers == TINY_CONFIG["num_hidden_layers"]


def test_a_served_model_not_found_starts_anyway_and_says_what_supplies_it(hf_cache, caplog):
    exporter = built(served_model="acme/still-downloading")
    assert exporter.model_shape is None
    missing = exporter.context()["missing"]
    assert missing.startswith("model 'acme/still-downloading' not found") and "\n" not in missing
    assert "--model" in missing and "sidecar.model" in missing
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [missing]


def test_no_model_at_all_is_said_once(hf_cache, caplog):
    exporter = built()
    assert exporter.context()["missing"].startswith("model unknown: no decode-step floor")


def test_the_model_flag_wins_over_the_served_model(hf_cache):
    assert built(model_config_path="Llama-3.1-8B", served_model="Qwen3-8B").model_shape is COMMON_MODELS["Llama-3.1-8B"]
