"""The model loader: a config.json, a model folder, a cached Hugging Face id, a built-in name; the
config's MoE, MLA and quantisation fields; and missing fields named, never zero."""

from __future__ import annotations

import json
import struct

import pytest

from kvdoctor.ledger.arithmetic import kv_bytes_per_token, weight_bytes_per_step
from kvdoctor.ledger.model import BUILTIN_CONFIGS, COMMON_MODELS, ModelShape
from kvdoctor.sources.model_files import find_in_hf_cache, hf_hub_cache, load_model, load_model_shape
from tests.support.errors import one_line_error
from tests.support.models import TINY_CONFIG

CONFIG = TINY_CONFIG
MIXTRAL = BUILTIN_CONFIGS["Mixtral-8x7B"]


def test_the_same_shape_from_a_path_bytes_and_a_dict(tmp_path):
    folder = tmp_path / "tiny-model"
    folder.mkdir()
    path = folder / "config.json"
    path.write_text(json.dumps(CONFIG))
    from_path = load_model_shape(path)
    assert from_path.name == "tiny-model"  # no _name_or_path: the folder names it
    assert from_path.source == str(path)
    again = load_model_shape(json.dumps(CONFIG).encode(), default_name="tiny-model")
    assert {**from_path.__dict__, "source": ""} == {**again.__dict__, "source": ""}
    assert load_model_shape(CONFIG).num_kv_heads == 2 and load_model_shape(CONFIG).dtype == "float16"
    assert load_model_shape({**CONFIG, "_name_or_path": "org/m"}, default_name="x").name == "org/m"


@pytest.mark.parametrize(
    "text, phrase",
    [
        ("{nope", "is not JSON (Expecting property name enclosed in double quotes at line 1)"),
        ("[1, 2]", "is not a model config (expected a JSON object)"),
        (json.dumps({"hidden_size": 8}), "model config lacks 'num_hidden_layers'"),
        (json.dumps({**CONFIG, "num_attention_heads": 0}), "non-positive layer, head or head_dim count"),
        (json.dumps({**CONFIG, "torch_dtype": "fp7"}), "unknown dtype 'fp7'"),
    ],
)
def test_an_unusable_config_is_one_line_naming_the_file(tmp_path, text, phrase):
    path = tmp_path / "config.json"
    path.write_text(text)
    message = one_line_error(ValueError, load_model_shape, path)
    assert phrase in message and str(path) in message


@pytest.mark.parametrize(
    "config, field",
    [
        ({k: v for k, v in CONFIG.items() if k != "intermediate_size"}, "'intermediate_size' (needed for the weight"),
        ({k: v for k, v in CONFIG.items() if k != "vocab_size"}, "'vocab_size' (needed for the weight bytes"),
        ({**MIXTRAL, "num_experts_per_tok": None}, "'num_experts_per_tok' (needed for the MoE arithmetic)"),
        ({**CONFIG, "kv_lora_rank": 512}, "'qk_rope_head_dim' (needed for the MLA latent size)"),
        ({**CONFIG, "num_hidden_layers": "four"}, "non-integer 'num_hidden_layers'"),
    ],
)
def test_a_field_the_arithmetic_needs_is_named_never_zero(tmp_path, config, field):
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"model config (lacks|has a)") as info:
        load_model(str(tmp_path))
    assert field in str(info.value)


def test_a_missing_or_unreadable_file(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        load_model_shape(tmp_path / "missing.json")
    with pytest.raises(ValueError, match=r"no such file 'nowhere/config\.json'"):
        load_model("nowhere/config.json", environ={"HF_HUB_CACHE": str(tmp_path)})
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match="is not a text file"):
        load_model_shape(tmp_path / "binary.json")
    with pytest.raises(ValueError, match=r"^the config is not JSON"):
        load_model_shape(b"not json")
    with pytest.raises(ValueError, match=r"a folder without a config\.json"):
        load_model(str(tmp_path))


# ----------------------------------------------------------------------------- model folders


def write_index(folder, total_size):
    index = {
        "metadata": {"total_size": total_size},
        "weight_map": {"lm_head.weight": "model-00001-of-00002.safetensors"},
    }
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def test_a_model_folder_takes_its_weight_bytes_from_the_safetensors_index(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**CONFIG, "_name_or_path": "org/tiny"}))
    write_index(tmp_path, 123_456_789)
    shape = load_model(str(tmp_path))
    assert shape.weight_bytes == 123_456_789 and shape.weight_bytes_exact == 123_456_789
    assert shape.weight_source == "model.safetensors.index.json metadata.total_size, exactly"
    assert shape.name == "org/tiny"
    # the config.json itself finds the index beside it
    assert load_model(str(tmp_path / "config.json")).weight_bytes == 123_456_789


def test_a_folder_index_spares_the_fields_only_the_estimate_needs(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in CONFIG.items() if k != "intermediate_size"}))
    write_index(tmp_path, 5_000_000)
    shape = load_model(str(tmp_path))
    assert shape.weight_bytes == 5_000_000 and shape.num_parameters is None


def test_a_single_safetensors_file_gives_its_tensor_bytes(tmp_path):
    header = json.dumps({"w": {"dtype": "F16", "shape": [10, 10], "data_offsets": [0, 200]}}).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(200))
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    shape = load_model(str(tmp_path))
    assert shape.weight_bytes == 200 and "model.safetensors" in shape.weight_source
    (tmp_path / "model.safetensors").write_bytes(b"\x00\x01")
    with pytest.raises(ValueError, match="is not a safetensors file"):
        load_model(str(tmp_path))


def test_a_moe_folder_splits_its_exact_weights_into_shared_and_experts(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(MIXTRAL))
    write_index(tmp_path, 93_405_585_408)  # mistralai/Mixtral-8x7B-v0.1's total_size
    shape = load_model(str(tmp_path))
    shared = 93_405_585_408 - 32 * 8 * 352_321_536
    assert weight_bytes_per_step(shape, 1) == shared + 32 * 2 * 352_321_536


# ------------------------------------------------------------------------- Hugging Face cache


def cache_snapshot(cache, repo_id, revision, config=CONFIG, main=True):
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(config))
    if main:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(revision)
    return snapshot


def test_a_hugging_face_id_is_found_in_the_local_cache(tmp_path):
    cache = tmp_path / "hub"
    snapshot = cache_snapshot(cache, "meta-llama/Llama-3.1-8B-Instruct", "abc123", BUILTIN_CONFIGS["Llama-3.1-8B"])
    write_index(snapshot, 16_060_522_496)
    shape = load_model("meta-llama/Llama-3.1-8B-Instruct", environ={"HF_HUB_CACHE": str(cache)})
    assert shape.name == "meta-llama/Llama-3.1-8B-Instruct"
    assert shape.weight_bytes_exact == 16_060_522_496 and shape.source == str(snapshot / "config.json")
    assert kv_bytes_per_token(shape) == 131_072
    # the snapshot folder itself names the model by its id
    assert load_model(str(snapshot)).name == "meta-llama/Llama-3.1-8B-Instruct"


def test_the_cache_is_found_where_huggingface_hub_looks():
    assert str(hf_hub_cache({"HF_HUB_CACHE": "/a", "HF_HOME": "/b"})) == "/a"
    assert str(hf_hub_cache({"HF_HOME": "/b"})) == "/b/hub"
    assert str(hf_hub_cache({"XDG_CACHE_HOME": "/c"})) == "/c/huggingface/hub"
    assert hf_hub_cache({}).parts[-3:] == (".cache", "huggingface", "hub")


def test_refs_main_picks_the_snapshot_else_the_newest(tmp_path):
    cache_snapshot(tmp_path, "org/m", "old", main=False)
    newest = cache_snapshot(tmp_path, "org/m", "new", main=False)
    assert find_in_hf_cache("org/m", {"HF_HUB_CACHE": str(tmp_path)}) == newest
    (tmp_path / "models--org--m" / "refs").mkdir()
    (tmp_path / "models--org--m" / "refs" / "main").write_text("old\n")
    assert find_in_hf_cache("org/m", {"HF_HUB_CACHE": str(tmp_path)}).name == "old"
    assert find_in_hf_cache("org/absent", {"HF_HUB_CACHE": str(tmp_path)}) is None


def test_an_uncached_id_is_refused_without_the_network(tmp_path):
    with pytest.raises(ValueError) as info:
        load_model("someone/never-downloaded", environ={"HF_HUB_CACHE": str(tmp_path)})
    message = str(info.value)
    assert "unknown model 'someone/never-downloaded'" in message and str(tmp_path) in message
    assert "never downloads" in message and "Llama-3.1-8B" in message


# ----------------------------------------------------------------------------- built-in names


@pytest.mark.parametrize("spec", ["Llama-3.1-8B", "llama-3.1-8b", "llama3.18b", "meta-llama/Llama-3.1-8B"])
def test_builtin_names_keep_working(tmp_path, spec):
    assert load_model(spec, environ={"HF_HUB_CACHE": str(tmp_path)}) is COMMON_MODELS["Llama-3.1-8B"]


def test_a_cached_id_wins_over_the_builtin_of_the_same_name(tmp_path):
    cache_snapshot(
        tmp_path, "meta-llama/Llama-3.1-8B", "r1", {**BUILTIN_CONFIGS["Llama-3.1-8B"], "num_hidden_layers": 2}
    )
    assert load_model("meta-llama/Llama-3.1-8B", environ={"HF_HUB_CACHE": str(tmp_path)}).num_layers == 2


# ----------------------------------------------------------------------------- config fields


def test_quantised_weights_use_their_element_size():
    fp8 = ModelShape.from_hf_config({**CONFIG, "quantization_config": {"quant_method": "fp8"}})
    awq = ModelShape.from_hf_config({**CONFIG, "quantization_config": {"quant_method": "awq", "bits": 4}})
    plain = ModelShape.from_hf_config(CONFIG)
    assert fp8.weight_bytes == plain.num_parameters == awq.weight_bytes * 2
    assert fp8.dtype == "float16" and kv_bytes_per_token(fp8) == kv_bytes_per_token(plain)  # KV stays fp16
    with pytest.raises(ValueError, match="quantization_config the ledger cannot size"):
        ModelShape.from_hf_config({**CONFIG, "quantization_config": {"quant_method": "mystery"}})
    sized = ModelShape.from_hf_config(
        {**CONFIG, "quantization_config": {"quant_method": "mystery"}}, weight_bytes_exact=9e6
    )
    assert sized.weight_bytes == 9e6


def test_qwen_moe_layers_and_shared_expert():
    qwen_moe = {
        **BUILTIN_CONFIGS["Llama-3.1-8B"],
        "num_experts": 60,
        "num_experts_per_tok": 4,
        "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632,
        "decoder_sparse_step": 2,
        "mlp_only_layers": [1],
    }
    shape = ModelShape.from_hf_config(qwen_moe)
    assert shape.moe_layers == 15  # layers 1, 3, ..., 31 minus layer 1
    assert shape.expert_parameters == 3 * 4096 * 1408


def test_a_multimodal_config_reads_its_text_model():
    shape = ModelShape.from_hf_config({"architectures": ["Llava"], "text_config": CONFIG})
    assert shape.num_layers == 4 and shape.name == "Llava"
