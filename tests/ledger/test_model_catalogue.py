"""The built-in catalogue of popular open models: each id people serve resolves offline, with or
without its organisation, in any case, to the KV bytes per token its published config gives."""

from __future__ import annotations

import pytest

from kvdoctor.ledger.arithmetic import kv_bytes_per_token
from kvdoctor.ledger.model import COMMON_MODELS, MODEL_CATALOGUE, ModelShape, builtin_model
from kvdoctor.sources.model_files import load_model

BF16 = 2


def gqa(layers: int, kv_heads: int, head_dim: int) -> int:
    """K and V, each KV head once, every layer, bf16."""
    return 2 * layers * kv_heads * head_dim * BF16


# (id as served, built-in entry, KV bytes per token by hand from the config's numbers)
POPULAR = [
    ("meta-llama/Llama-3.1-8B-Instruct", "Llama-3.1-8B", gqa(32, 8, 4096 // 32)),
    ("meta-llama/Llama-3.1-70B-Instruct", "Llama-3.1-70B", gqa(80, 8, 8192 // 64)),
    ("meta-llama/Llama-3.1-405B-Instruct", "Llama-3.1-405B", gqa(126, 8, 16384 // 128)),
    ("meta-llama/Llama-3.3-70B-Instruct", "Llama-3.3-70B", gqa(80, 8, 128)),
    ("meta-llama/Llama-3.2-1B-Instruct", "Llama-3.2-1B", gqa(16, 8, 64)),
    ("meta-llama/Meta-Llama-3-8B-Instruct", "Llama-3-8B", gqa(32, 8, 128)),
    ("Qwen/Qwen2.5-7B-Instruct", "Qwen2.5-7B", gqa(28, 4, 3584 // 28)),
    ("Qwen/Qwen2.5-14B-Instruct", "Qwen2.5-14B", gqa(48, 8, 5120 // 40)),
    ("Qwen/Qwen2.5-32B-Instruct", "Qwen2.5-32B", gqa(64, 8, 5120 // 40)),
    ("Qwen/Qwen2.5-72B-Instruct", "Qwen2.5-72B", gqa(80, 8, 8192 // 64)),
    ("Qwen/Qwen3-0.6B", "Qwen3-0.6B", gqa(28, 8, 128)),  # head_dim 128, not 1024 / 16
    ("Qwen/Qwen3-8B", "Qwen3-8B", gqa(36, 8, 128)),
    ("Qwen/Qwen3-32B", "Qwen3-32B", gqa(64, 8, 128)),  # head_dim 128, not 5120 / 64
    ("Qwen/Qwen3-30B-A3B", "Qwen3-30B-A3B", gqa(48, 4, 128)),
    ("Qwen/Qwen3-30B-A3B-Instruct-2507", "Qwen3-30B-A3B-2507", gqa(48, 4, 128)),
    ("Qwen/Qwen3-235B-A22B", "Qwen3-235B-A22B", gqa(94, 4, 128)),
    ("mistralai/Mistral-7B-Instruct-v0.3", "Mistral-7B", gqa(32, 8, 128)),
    ("mistralai/Mixtral-8x7B-Instruct-v0.1", "Mixtral-8x7B", gqa(32, 8, 128)),
    ("mistralai/Mixtral-8x22B-Instruct-v0.1", "Mixtral-8x22B", gqa(56, 8, 6144 // 48)),
    ("google/gemma-2-9b-it", "gemma-2-9b", gqa(42, 8, 256)),
    ("google/gemma-2-27b-it", "gemma-2-27b", gqa(46, 16, 128)),
    ("google/gemma-3-12b-it", "gemma-3-12b", gqa(48, 8, 256)),
    ("google/gemma-3-27b-it", "gemma-3-27b", gqa(62, 16, 128)),
    # MLA: one latent per layer, kv_lora_rank + qk_rope_head_dim elements, not K and V per head
    ("deepseek-ai/DeepSeek-V3", "DeepSeek-V3", 61 * (512 + 64) * BF16),
    ("deepseek-ai/DeepSeek-R1", "DeepSeek-R1", 61 * (512 + 64) * BF16),
    ("deepseek-ai/DeepSeek-R1-0528", "DeepSeek-R1", 61 * (512 + 64) * BF16),
    ("microsoft/Phi-3-mini-4k-instruct", "Phi-3-mini-4k", gqa(32, 32, 3072 // 32)),
    ("microsoft/Phi-3-medium-128k-instruct", "Phi-3-medium-128k", gqa(40, 10, 5120 // 40)),
    ("microsoft/phi-4", "phi-4", gqa(40, 10, 5120 // 40)),
    ("openai/gpt-oss-20b", "gpt-oss-20b", gqa(24, 8, 64)),
    ("openai/gpt-oss-120b", "gpt-oss-120b", gqa(36, 8, 64)),
]


@pytest.mark.parametrize("served, entry, kv_bytes", POPULAR)
def test_a_popular_id_resolves_offline_with_its_kv_bytes_per_token(tmp_path, served, entry, kv_bytes):
    empty_cache = {"HF_HUB_CACHE": str(tmp_path)}
    shape = load_model(served, environ=empty_cache)
    assert kv_bytes_per_token(shape) == kv_bytes
    assert shape.num_layers == COMMON_MODELS[entry].num_layers
    assert entry in shape.note or shape is COMMON_MODELS[entry]


@pytest.mark.parametrize("spec", ["Qwen/Qwen3-8B", "qwen/qwen3-8b", "Qwen3-8B", "QWEN3-8B", "qwen3-8b"])
def test_ids_match_in_any_case_with_or_without_the_organisation(spec):
    assert builtin_model(spec) is COMMON_MODELS["Qwen3-8B"]


def test_an_mla_model_caches_one_latent_per_layer_not_k_and_v():
    v3 = COMMON_MODELS["DeepSeek-V3"]
    assert v3.kv_latent_dim == 512 + 64
    per_head_k_and_v = 2 * 61 * 128 * (128 + 64) * BF16  # what 128 KV heads would take: 48x more
    assert kv_bytes_per_token(v3) == 70_272 and per_head_k_and_v / kv_bytes_per_token(v3) > 40
    assert kv_bytes_per_token(v3, "fp8") == 61 * 576


@pytest.mark.parametrize("model", MODEL_CATALOGUE, ids=lambda m: m.name)
def test_every_entry_names_the_config_it_copies(model):
    shape = COMMON_MODELS[model.name]
    assert model.source.count("/") == 1 and f"https://huggingface.co/{model.source}" in shape.source
    assert builtin_model(model.source).num_layers == shape.num_layers  # its own source id resolves to it
    assert shape.max_model_len and shape.weight_bytes > 0


@pytest.mark.parametrize(
    "served, parameters_billion",
    [("Qwen3-30B-A3B", 30.5), ("Qwen3-235B-A22B", 235.1), ("Llama-3.1-405B", 405.9), ("DeepSeek-R1", 671.0)],
)
def test_the_configs_give_the_published_parameter_counts(served, parameters_billion):
    """A wrong hidden or expert size would show here: the counts the model cards publish."""
    assert COMMON_MODELS[served].num_parameters == pytest.approx(parameters_billion * 1e9, rel=0.005)


def test_gemma3_positions_are_not_scaled_again():
    config = {
        "model_type": "gemma3_text",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 2,
        "max_position_embeddings": 131072,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        "vocab_size": 10,
        "intermediate_size": 8,
    }
    assert ModelShape.from_hf_config(config).max_model_len == 131072
    assert ModelShape.from_hf_config({**config, "model_type": "llama"}).max_model_len == 131072 * 8


def test_a_builtin_under_another_organisation_is_refused():
    with pytest.raises(ValueError, match="the built-in Qwen3-8B shape is Qwen's"):
        builtin_model("someone/Qwen3-8B")
