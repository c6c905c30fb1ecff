"""A model's shape: what the ledger needs to know about it, read from its Hugging Face config.

``ModelShape.from_hf_config`` reads a ``config.json`` object: dense, mixture-of-experts (Mixtral,
Qwen-MoE, DeepSeek), MLA attention (DeepSeek-V2/V3 ``kv_lora_rank`` + ``qk_rope_head_dim``) and
quantised weights (``quantization_config``). A field the arithmetic needs and the config lacks is
a ``ValueError`` naming it, never a zero. ``load_model`` / ``load_model_shape``
(``sources/model_files.py``) find the config: a file, a model folder, a cached Hugging Face id,
or a built-in name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

DTYPE_BYTES: dict[str, float] = {
    "float32": 4,
    "fp32": 4,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "bfloat16": 2,
    "bf16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "float8_e4m3fn": 1,
    "int8": 1,
    "int4": 0.5,
    "fp4": 0.5,
}
# The KV-cache element types a deployment may choose (``kvdoctor ledger --kv-dtype``, the Ledger
# page's menu); ``auto`` is the model's own dtype.
KV_CACHE_DTYPES = ("auto", "bf16", "fp16", "fp8", "fp32")
GATED_MLP_MATRICES = 3  # gate, up and down projections
UNKNOWN_QUANTISATION = "unknown quantisation"


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of a dtype name (``bf16``, ``torch.float16``, ``fp8_e4m3``...)."""
    key = str(dtype).lower().removeprefix("torch.")
    if key not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(sorted(DTYPE_BYTES))}")
    return DTYPE_BYTES[key]


@dataclass(frozen=True)
class ModelShape:
    """What the ledger needs to know about a model.

    ``kv_latent_dim`` is set for MLA models (DeepSeek-V2/V3): they cache one compressed latent
    per layer (kv_lora_rank + qk_rope_head_dim elements) instead of K and V per KV head.
    ``num_parameters`` is estimated from the shape; ``weight_bytes_exact`` is the checkpoint's
    tensor bytes where its safetensors files say (then it is the weight figure). A mixture of
    experts has ``num_experts`` routed experts of ``expert_parameters`` each in ``moe_layers``
    layers, ``experts_per_token`` of them active per token.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: str = "bfloat16"  # activations and, by default, the KV cache
    num_parameters: float | None = None
    kv_latent_dim: int | None = None
    weight_dtype: str | None = None  # quantised weights (quantization_config); None: ``dtype``
    weight_bytes_exact: float | None = None
    weight_source: str = "estimated from the config's shape"
    num_experts: int = 0
    experts_per_token: int = 0
    moe_layers: int = 0
    expert_parameters: float = 0.0
    source: str = ""  # where the shape was read from
    max_model_len: int | None = None  # the longest context vLLM accepts (its derived max_model_len)
    max_model_len_source: str = ""  # the config field it comes from: "max_position_embeddings=131072"
    note: str = ""  # how a name was resolved, where it was not taken as given (a variant's built-in shape)

    @classmethod
    def from_hf_config(
        cls, config: Mapping[str, Any], name: str | None = None, weight_bytes_exact: float | None = None
    ) -> ModelShape:
        """Read a Hugging Face ``config.json`` dict; ``ValueError`` naming a missing field.

        ``weight_bytes_exact`` (from the checkpoint's files) spares the fields that only the
        parameter estimate needs (``vocab_size``, ``intermediate_size`` of a dense model).
        """
        cfg = config.get("text_config") or config  # multimodal configs nest the language model
        layers = _int(cfg, "num_hidden_layers")
        hidden = _int(cfg, "hidden_size")
        heads = _int(cfg, "num_attention_heads")
        if layers <= 0 or heads <= 0 or hidden <= 0:
            raise ValueError(_NON_POSITIVE)
        kv_heads = _int(cfg, "num_key_value_heads", default=heads)
        latent = None
        if cfg.get("kv_lora_rank"):
            latent = _int(cfg, "kv_lora_rank") + _int(cfg, "qk_rope_head_dim", why="the MLA latent size")
            head_dim = _int(cfg, "qk_nope_head_dim", default=0) + _int(cfg, "qk_rope_head_dim")
        else:
            head_dim = _int(cfg, "head_dim", default=hidden // heads)
        if kv_heads <= 0 or head_dim <= 0:
            raise ValueError(_NON_POSITIVE)
        dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or config.get("torch_dtype") or "bfloat16")
        dtype = dtype.removeprefix("torch.")
        dtype_bytes(dtype)
        shape = cls(
            name=name or str(config.get("_name_or_path") or (config.get("architectures") or ["model"])[0]),
            num_layers=layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            dtype=dtype,
            kv_latent_dim=latent,
            weight_dtype=_quantised_dtype(config.get("quantization_config") or cfg.get("quantization_config")),
            weight_bytes_exact=float(weight_bytes_exact) if weight_bytes_exact else None,
        )
        limit = derived_max_model_len(cfg)
        if limit is not None:
            shape = replace(shape, max_model_len=limit[0], max_model_len_source=limit[1])
        shape = _with_parameters(cfg, shape, need_total=weight_bytes_exact is None)
        if shape.weight_dtype == UNKNOWN_QUANTISATION:
            if shape.weight_bytes_exact is None or shape.is_moe:
                raise ValueError(
                    "model config has a quantization_config the ledger cannot size; give the model folder: "
                    "its safetensors files carry the exact weight bytes"
                    + (" (and a MoE's expert size needs a known weight type)" if shape.is_moe else "")
                )
            shape = replace(shape, weight_dtype=None)
        return shape

    @property
    def weight_element_bytes(self) -> float:
        return dtype_bytes(self.weight_dtype or self.dtype)

    @property
    def weight_bytes(self) -> float:
        """All weights, bytes: the checkpoint's exact size where known, else parameters x bytes."""
        if self.weight_bytes_exact:
            return self.weight_bytes_exact
        return (self.num_parameters or 0.0) * self.weight_element_bytes

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1 and self.moe_layers > 0

    @property
    def expert_bytes(self) -> float:
        """Bytes of one routed expert."""
        return self.expert_parameters * self.weight_element_bytes

    @property
    def routed_expert_bytes(self) -> float:
        """Bytes of every routed expert of every MoE layer (what a decode step may skip)."""
        return self.moe_layers * self.num_experts * self.expert_bytes if self.is_moe else 0.0


_NON_POSITIVE = "model config has a non-positive layer, head or head_dim count"


# The config fields vLLM reads the model's longest context from (the smallest present wins), and
# the rope scalings that do not lengthen it (``_get_and_verify_max_len`` in vllm/config).
MAX_LEN_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
ROPE_TYPES_NOT_SCALING_THE_LENGTH = ("su", "longrope", "llama3", "mrope", "default")


def derived_max_model_len(cfg: Mapping[str, Any]) -> tuple[int, str] | None:
    """(the longest context vLLM accepts for this config, the field that says so), as vLLM derives
    it: the smallest of the position fields, times the rope scaling's factor where the scaling
    lengthens the context (YaRN from its ``original_max_position_embeddings``). None: no field."""
    found = [(int(cfg[k]), k) for k in MAX_LEN_KEYS if isinstance(cfg.get(k), (int, float)) and cfg[k] > 0]
    if not found:
        return None
    length, key = min(found)
    how = f"{key}={length:,}"
    rope = cfg.get("rope_scaling")
    if isinstance(rope, Mapping) and "gemma3" not in str(cfg.get("model_type") or ""):
        # Gemma 3's positions already include its linear scaling: vLLM does not apply it again
        kind = str(rope.get("rope_type") or rope.get("type") or "")
        factor = rope.get("factor")
        if kind not in ROPE_TYPES_NOT_SCALING_THE_LENGTH and isinstance(factor, (int, float)) and factor > 0:
            original = rope.get("original_max_position_embeddings")
            if kind == "yarn" and isinstance(original, (int, float)) and original > 0:
                length, how = int(original), f"rope_scaling original_max_position_embeddings={int(original):,}"
            length = int(length * factor)
            how += f" x {kind} factor {factor:g}"
    return length, how


def _int(cfg: Mapping[str, Any], field: str, default: int | None = None, why: str = "") -> int:
    """``cfg[field]`` as an int; a missing field without a default is a ValueError naming it."""
    value = cfg.get(field)
    if value is None:
        if default is not None:
            return default
        raise ValueError(f"model config lacks {field!r}" + (f" (needed for {why})" if why else ""))
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"model config has a non-integer {field!r}: {value!r}") from None


def _first_int(cfg: Mapping[str, Any], fields: tuple[str, ...], why: str) -> int:
    for field in fields:
        if cfg.get(field) is not None:
            return _int(cfg, field)
    raise ValueError(f"model config lacks {fields[0]!r} (needed for {why})")


def _quantised_dtype(quant: object) -> str | None:
    """The weights' element type a ``quantization_config`` describes, or None (not quantised)."""
    if not isinstance(quant, Mapping):
        return None
    method = str(quant.get("quant_method") or "").lower()
    bits = quant.get("bits") or quant.get("w_bit") or quant.get("weight_bits")
    if method == "fp8" or "fp8" in str(quant.get("fmt") or ""):
        return "fp8"
    if method in ("mxfp4", "nvfp4") or quant.get("load_in_4bit"):
        return "fp4" if method else "int4"
    for group in (quant.get("config_groups") or {}).values():  # compressed-tensors
        weights = group.get("weights") if isinstance(group, Mapping) else None
        if isinstance(weights, Mapping) and weights.get("num_bits") in (4, 8):
            bits = weights["num_bits"]
            return "fp8" if bits == 8 and weights.get("type") == "float" else f"int{bits}"
    if bits in (4, 8):
        return f"int{bits}"
    if quant.get("load_in_8bit"):
        return "int8"
    return UNKNOWN_QUANTISATION


def _with_parameters(cfg: Mapping[str, Any], shape: ModelShape, need_total: bool) -> ModelShape:
    """The shape with its parameter count (and, for a MoE, its experts) from the config."""
    h, layers = shape.hidden_size, shape.num_layers
    experts = next((int(cfg[f]) for f in ("num_local_experts", "n_routed_experts", "num_experts") if cfg.get(f)), 0)
    why_total = "the weight bytes (or give the model folder: its safetensors index has them exactly)"
    shared = 0.0
    if experts > 1:
        expert_inter = _first_int(cfg, ("moe_intermediate_size", "intermediate_size"), "the size of one expert")
        shape = replace(
            shape,
            num_experts=experts,
            experts_per_token=_first_int(
                cfg, ("num_experts_per_tok", "moe_topk", "experts_per_token"), "the MoE arithmetic"
            ),
            moe_layers=_moe_layer_count(cfg, layers),
            expert_parameters=float(GATED_MLP_MATRICES * h * expert_inter),
        )
        shared_inter = _int(cfg, "n_shared_experts", default=0) * expert_inter
        shared = GATED_MLP_MATRICES * h * (shared_inter + _int(cfg, "shared_expert_intermediate_size", 0))
    exact = "the checkpoint's safetensors files"
    if not need_total and any(cfg.get(f) is None for f in ("vocab_size", "intermediate_size")):
        return replace(shape, weight_source=exact)
    dense_layers = layers - shape.moe_layers
    vocab = _int(cfg, "vocab_size", why=why_total)
    dense_inter = _int(cfg, "intermediate_size", why=why_total) if dense_layers else 0
    embeddings = vocab * h * (1 if cfg.get("tie_word_embeddings") else 2)
    per_layer = _attention_parameters(cfg, shape) + 2 * h
    mlp = float(dense_layers * GATED_MLP_MATRICES * h * dense_inter)
    mlp += shape.moe_layers * (experts * shape.expert_parameters + shared + h * experts)  # + the router
    total = float(embeddings + layers * per_layer + mlp + h)
    return replace(
        shape, num_parameters=total, weight_source=exact if shape.weight_bytes_exact else shape.weight_source
    )


def _moe_layer_count(cfg: Mapping[str, Any], layers: int) -> int:
    """Layers with routed experts: DeepSeek's first_k_dense_replace and moe_layer_freq, Qwen's
    decoder_sparse_step and mlp_only_layers; every layer otherwise."""
    first_dense = _int(cfg, "first_k_dense_replace", default=0)
    if cfg.get("moe_layer_freq") is not None:
        freq = max(1, _int(cfg, "moe_layer_freq"))
        return sum(1 for i in range(first_dense, layers) if i % freq == 0)
    step = max(1, _int(cfg, "decoder_sparse_step", default=1))
    dense_only = set(cfg.get("mlp_only_layers") or ())
    return sum(1 for i in range(first_dense, layers) if i not in dense_only and (i + 1) % step == 0)


def _attention_parameters(cfg: Mapping[str, Any], shape: ModelShape) -> int:
    """One layer's attention projections (MLA's low-rank ones for DeepSeek-style configs)."""
    h, heads = shape.hidden_size, shape.num_attention_heads
    if not shape.kv_latent_dim:
        d = shape.head_dim
        return h * heads * d * 2 + h * shape.num_kv_heads * d * 2
    rope = _int(cfg, "qk_rope_head_dim")
    nope = _int(cfg, "qk_nope_head_dim", why="the MLA attention's size")
    v = _int(cfg, "v_head_dim", why="the MLA attention's size")
    kv_lora = _int(cfg, "kv_lora_rank")
    q_lora = _int(cfg, "q_lora_rank", default=0)
    q = h * q_lora + q_lora + q_lora * heads * (nope + rope) if q_lora else h * heads * (nope + rope)
    kv = h * (kv_lora + rope) + kv_lora + kv_lora * heads * (nope + v)
    return q + kv + heads * v * h


# ------------------------------------------------------------------------ the built-in catalogue
#
# The popular open models, each from its published config.json on the Hugging Face hub (the
# ``source`` repository; https://huggingface.co/<source>/blob/main/config.json): only the fields the
# ledger reads. What the KV bytes per token come from, per family:
# - GQA (Llama 3, Qwen, Mistral, Gemma, Phi, gpt-oss): 2 (K and V) x layers x num_key_value_heads x
#   head_dim x bytes per element; head_dim is the config's where it gives one (Qwen3, Gemma,
#   gpt-oss), else hidden_size / num_attention_heads.
# - MLA (DeepSeek V3 and R1): one compressed latent per layer, not K and V: layers x (kv_lora_rank
#   + qk_rope_head_dim) x bytes per element = 61 x (512 + 64) x 2 = 70,272 bytes in bf16.
# - Sliding-window layers (Gemma 2 and 3, gpt-oss) are counted as full layers: the bytes a token
#   occupies where the context fits the window, and an upper bound beyond it.


def _llama(
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    inter: int,
    vocab: int,
    positions: int,
    *,
    head_dim: int | None = None,
    tied: bool = False,
) -> dict[str, Any]:
    """The fields of a decoder-only config.json, in the names Llama's and most others' use."""
    config: dict[str, Any] = {
        "max_position_embeddings": positions,
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "intermediate_size": inter,
        "vocab_size": vocab,
        "tie_word_embeddings": tied,
        "torch_dtype": "bfloat16",
    }
    if head_dim is not None:
        config["head_dim"] = head_dim
    return config


def _llama3_rope(factor: float) -> dict[str, Any]:
    return {"rope_type": "llama3", "factor": factor, "original_max_position_embeddings": 8192}


def _qwen3_moe(layers: int, hidden: int, heads: int, kv_heads: int, inter: int, moe_inter: int) -> dict[str, Any]:
    return {
        **_llama(layers, hidden, heads, kv_heads, inter, 151936, 40960, head_dim=128),
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": moe_inter,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    }


def _deepseek_v3() -> dict[str, Any]:
    """DeepSeek-V3's and R1's config: MLA, 256 routed experts (8 active) + 1 shared, FP8 weights."""
    return {
        **_llama(61, 7168, 128, 128, 18432, 129280, 163840),
        "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096},
        "moe_intermediate_size": 2048,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "first_k_dense_replace": 3,
        "moe_layer_freq": 1,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]},
    }


def _gpt_oss(layers: int, experts: int) -> dict[str, Any]:
    """openai/gpt-oss: 64 query and 8 KV heads of 64, 4 experts a token, MXFP4 expert weights (the
    attention and embeddings stay bf16, so the weight bytes read a little low), YaRN to 131,072."""
    return {
        **_llama(layers, 2880, 64, 8, 2880, 201088, 131072, head_dim=64),
        "num_local_experts": experts,
        "num_experts_per_tok": 4,
        "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096},
        "sliding_window": 128,
        "quantization_config": {"quant_method": "mxfp4"},
    }


@dataclass(frozen=True)
class CatalogueModel:
    """One built-in model: its name, the Hugging Face repository whose config.json it copies
    (``source``), the repository names that mean it (its base model's; the fine-tunes that
    VARIANT_SUFFIXES name share its shape) and the config's fields."""

    name: str
    source: str  # org/name on the Hugging Face hub
    config: Mapping[str, Any]
    repos: tuple[str, ...] = ()  # more names under the same organisation (the name itself always counts)

    @property
    def owner(self) -> str:
        return self.source.partition("/")[0]

    @property
    def url(self) -> str:
        return f"https://huggingface.co/{self.source}"


def _m(name: str, source: str, config: Mapping[str, Any], *repos: str) -> CatalogueModel:
    return CatalogueModel(name=name, source=source, config=config, repos=repos)


MODEL_CATALOGUE: tuple[CatalogueModel, ...] = (
    # Llama 3, 3.1, 3.2, 3.3 (meta-llama); 3.1's llama3 rope scaling does not lengthen its 131,072
    _m("Llama-3-8B", "meta-llama/Meta-Llama-3-8B", _llama(32, 4096, 32, 8, 14336, 128256, 8192), "Meta-Llama-3-8B"),
    _m("Llama-3-70B", "meta-llama/Meta-Llama-3-70B", _llama(80, 8192, 64, 8, 28672, 128256, 8192), "Meta-Llama-3-70B"),
    _m(
        "Llama-3.1-8B",
        "meta-llama/Llama-3.1-8B",
        {**_llama(32, 4096, 32, 8, 14336, 128256, 131072), "rope_scaling": _llama3_rope(8.0)},
        "Meta-Llama-3.1-8B",
    ),
    _m(
        "Llama-3.1-70B",
        "meta-llama/Llama-3.1-70B",
        {**_llama(80, 8192, 64, 8, 28672, 128256, 131072), "rope_scaling": _llama3_rope(8.0)},
        "Meta-Llama-3.1-70B",
    ),
    _m(
        "Llama-3.1-405B",
        "meta-llama/Llama-3.1-405B",
        {**_llama(126, 16384, 128, 8, 53248, 128256, 131072), "rope_scaling": _llama3_rope(8.0)},
        "Meta-Llama-3.1-405B",
    ),
    _m(
        "Llama-3.2-1B",
        "meta-llama/Llama-3.2-1B",
        {**_llama(16, 2048, 32, 8, 8192, 128256, 131072, head_dim=64, tied=True), "rope_scaling": _llama3_rope(32.0)},
    ),
    _m(
        "Llama-3.2-3B",
        "meta-llama/Llama-3.2-3B",
        {**_llama(28, 3072, 24, 8, 8192, 128256, 131072, head_dim=128, tied=True), "rope_scaling": _llama3_rope(32.0)},
    ),
    _m(
        "Llama-3.3-70B",
        "meta-llama/Llama-3.3-70B-Instruct",
        {**_llama(80, 8192, 64, 8, 28672, 128256, 131072), "rope_scaling": _llama3_rope(8.0)},
    ),
    _m("Llama-2-7B", "meta-llama/Llama-2-7b-hf", _llama(32, 4096, 32, 32, 11008, 32000, 4096), "Llama-2-7b-hf"),
    # Qwen2.5 (the -Instruct configs: 32,768 positions; 131,072 only with the YaRN rope_scaling added)
    _m("Qwen2.5-7B", "Qwen/Qwen2.5-7B-Instruct", _llama(28, 3584, 28, 4, 18944, 152064, 32768)),
    _m("Qwen2.5-14B", "Qwen/Qwen2.5-14B-Instruct", _llama(48, 5120, 40, 8, 13824, 152064, 32768)),
    _m("Qwen2.5-32B", "Qwen/Qwen2.5-32B-Instruct", _llama(64, 5120, 40, 8, 27648, 152064, 32768)),
    _m("Qwen2.5-72B", "Qwen/Qwen2.5-72B-Instruct", _llama(80, 8192, 64, 8, 29568, 152064, 32768)),
    # Qwen3 dense: head_dim 128 whatever hidden_size / heads is; 40,960 positions
    _m("Qwen3-0.6B", "Qwen/Qwen3-0.6B", _llama(28, 1024, 16, 8, 3072, 151936, 40960, head_dim=128, tied=True)),
    _m("Qwen3-1.7B", "Qwen/Qwen3-1.7B", _llama(28, 2048, 16, 8, 6144, 151936, 40960, head_dim=128, tied=True)),
    _m("Qwen3-4B", "Qwen/Qwen3-4B", _llama(36, 2560, 32, 8, 9728, 151936, 40960, head_dim=128, tied=True)),
    _m("Qwen3-8B", "Qwen/Qwen3-8B", _llama(36, 4096, 32, 8, 12288, 151936, 40960, head_dim=128)),
    _m("Qwen3-14B", "Qwen/Qwen3-14B", _llama(40, 5120, 40, 8, 17408, 151936, 40960, head_dim=128)),
    _m("Qwen3-32B", "Qwen/Qwen3-32B", _llama(64, 5120, 64, 8, 25600, 151936, 40960, head_dim=128)),
    # Qwen3 MoE: 128 experts, 8 active, in every layer; the 2507 updates read 262,144 positions
    _m("Qwen3-30B-A3B", "Qwen/Qwen3-30B-A3B", _qwen3_moe(48, 2048, 32, 4, 6144, 768)),
    _m(
        "Qwen3-30B-A3B-2507",
        "Qwen/Qwen3-30B-A3B-Instruct-2507",
        {**_qwen3_moe(48, 2048, 32, 4, 6144, 768), "max_position_embeddings": 262144},
        "Qwen3-30B-A3B-Instruct-2507",
        "Qwen3-30B-A3B-Thinking-2507",
    ),
    _m("Qwen3-235B-A22B", "Qwen/Qwen3-235B-A22B", _qwen3_moe(94, 4096, 64, 4, 12288, 1536)),
    _m(
        "Qwen3-235B-A22B-2507",
        "Qwen/Qwen3-235B-A22B-Instruct-2507",
        {**_qwen3_moe(94, 4096, 64, 4, 12288, 1536), "max_position_embeddings": 262144},
        "Qwen3-235B-A22B-Instruct-2507",
        "Qwen3-235B-A22B-Thinking-2507",
    ),
    # Mistral and Mixtral (mistralai)
    _m("Mistral-7B", "mistralai/Mistral-7B-v0.3", _llama(32, 4096, 32, 8, 14336, 32768, 32768)),
    _m(
        "Mistral-Nemo",
        "mistralai/Mistral-Nemo-Instruct-2407",
        _llama(40, 5120, 32, 8, 14336, 131072, 1024000, head_dim=128),
        "Mistral-Nemo-Base-2407",
    ),
    _m(
        "Mistral-Small-24B",
        "mistralai/Mistral-Small-24B-Instruct-2501",
        _llama(40, 5120, 32, 8, 32768, 131072, 32768, head_dim=128),
        "Mistral-Small-24B-Base-2501",
    ),
    _m(
        "Mixtral-8x7B",
        "mistralai/Mixtral-8x7B-v0.1",
        {**_llama(32, 4096, 32, 8, 14336, 32000, 32768), "num_local_experts": 8, "num_experts_per_tok": 2},
    ),
    _m(
        "Mixtral-8x22B",
        "mistralai/Mixtral-8x22B-v0.1",
        {**_llama(56, 6144, 48, 8, 16384, 32000, 65536), "num_local_experts": 8, "num_experts_per_tok": 2},
    ),
    # Gemma 2 and 3 (google): head_dim 256 (128 for the 27Bs), embeddings tied. Gemma 3's 131,072
    # positions already include its linear rope scaling (vLLM does not apply it again), so the
    # scaling is left out here; 4B and up nest these fields in a text_config.
    _m("gemma-2-2b", "google/gemma-2-2b", _llama(26, 2304, 8, 4, 9216, 256000, 8192, head_dim=256, tied=True)),
    _m("gemma-2-9b", "google/gemma-2-9b", _llama(42, 3584, 16, 8, 14336, 256000, 8192, head_dim=256, tied=True)),
    _m("gemma-2-27b", "google/gemma-2-27b", _llama(46, 4608, 32, 16, 36864, 256000, 8192, head_dim=128, tied=True)),
    _m(
        "gemma-3-1b",
        "google/gemma-3-1b-pt",
        _llama(26, 1152, 4, 1, 6912, 262144, 32768, head_dim=256, tied=True),
        "gemma-3-1b-pt",
    ),
    _m(
        "gemma-3-4b",
        "google/gemma-3-4b-pt",
        _llama(34, 2560, 8, 4, 10240, 262208, 131072, head_dim=256, tied=True),
        "gemma-3-4b-pt",
    ),
    _m(
        "gemma-3-12b",
        "google/gemma-3-12b-pt",
        _llama(48, 3840, 16, 8, 15360, 262208, 131072, head_dim=256, tied=True),
        "gemma-3-12b-pt",
    ),
    _m(
        "gemma-3-27b",
        "google/gemma-3-27b-pt",
        _llama(62, 5376, 32, 16, 21504, 262208, 131072, head_dim=128, tied=True),
        "gemma-3-27b-pt",
    ),
    # DeepSeek V3 and R1 (deepseek-ai): the same MLA shape; V3.1 and the dated updates keep it
    _m(
        "DeepSeek-V3",
        "deepseek-ai/DeepSeek-V3",
        _deepseek_v3(),
        "DeepSeek-V3-Base",
        "DeepSeek-V3.1",
        "DeepSeek-V3.1-Base",
    ),
    _m("DeepSeek-R1", "deepseek-ai/DeepSeek-R1", _deepseek_v3(), "DeepSeek-R1-Zero"),
    # Phi-3 and phi-4 (microsoft); the 128k Phi-3s' longrope scaling does not lengthen 131,072
    _m("Phi-3-mini-4k", "microsoft/Phi-3-mini-4k-instruct", _llama(32, 3072, 32, 32, 8192, 32064, 4096)),
    _m("Phi-3-mini-128k", "microsoft/Phi-3-mini-128k-instruct", _llama(32, 3072, 32, 32, 8192, 32064, 131072)),
    _m("Phi-3-medium-4k", "microsoft/Phi-3-medium-4k-instruct", _llama(40, 5120, 40, 10, 17920, 32064, 4096)),
    _m("Phi-3-medium-128k", "microsoft/Phi-3-medium-128k-instruct", _llama(40, 5120, 40, 10, 17920, 32064, 131072)),
    _m("Phi-3.5-mini", "microsoft/Phi-3.5-mini-instruct", _llama(32, 3072, 32, 32, 8192, 32064, 131072)),
    _m(
        "Phi-3.5-MoE",
        "microsoft/Phi-3.5-MoE-instruct",
        {**_llama(32, 4096, 32, 8, 6400, 32064, 131072), "num_local_experts": 16, "num_experts_per_tok": 2},
    ),
    _m("phi-4", "microsoft/phi-4", _llama(40, 5120, 40, 10, 17920, 100352, 16384)),
    # gpt-oss (openai)
    _m("gpt-oss-20b", "openai/gpt-oss-20b", _gpt_oss(24, 32)),
    _m("gpt-oss-120b", "openai/gpt-oss-120b", _gpt_oss(36, 128)),
)

BUILTIN_CONFIGS: dict[str, dict[str, Any]] = {m.name: dict(m.config) for m in MODEL_CATALOGUE}
COMMON_MODELS: dict[str, ModelShape] = {
    m.name: replace(
        ModelShape.from_hf_config(m.config, name=m.name),
        source=f"built-in shape, from {m.source}'s config.json ({m.url})",
    )
    for m in MODEL_CATALOGUE
}
_BY_NAME: dict[str, CatalogueModel] = {m.name: m for m in MODEL_CATALOGUE}

# Fine-tunes published beside a base model with its shape: chat and instruction tunes, reasoning
# tunes, pretrained ("-pt") checkpoints.
VARIANT_SUFFIXES = ("-chat-hf", "-Instruct", "-Thinking", "-chat", "-it", "-pt", "-hf")
# A version or a date: Mistral-7B-Instruct-v0.2, Mixtral-8x7B-v0.1, DeepSeek-V3-0324, -2507
_VERSION = re.compile(r"-(v\d+(\.\d+)*|\d{4})$", re.I)


def _base_names(name: str) -> list[tuple[str, str]]:
    """``name`` less one more variant or version suffix at each step, each with the first variant
    suffix taken off ("" if none yet): ``DeepSeek-V3-0324`` -> ``DeepSeek-V3`` -> ``DeepSeek``."""
    steps: list[tuple[str, str]] = []
    base, variant = name, ""
    while True:
        stripped = _VERSION.sub("", base)
        for suffix in VARIANT_SUFFIXES:
            if stripped.lower().endswith(suffix.lower()):
                variant = variant or suffix
                stripped = stripped[: -len(suffix)]
                break
        if stripped == base or not stripped:
            return steps
        base = stripped
        steps.append((base, variant))


def _names(model: CatalogueModel) -> set[str]:
    """The repository names (lower case) that mean ``model`` exactly."""
    return {model.name.lower(), model.source.partition("/")[2].lower()} | {r.lower() for r in model.repos}


def _catalogue_match(repo: str) -> tuple[CatalogueModel, bool] | None:
    """(the entry a repository name means, whether exactly) or None: an exact name first, then
    its base less a variant or version suffix."""
    wanted = repo.lower()
    for model in MODEL_CATALOGUE:
        if wanted in _names(model):
            return model, True
    for base, _variant in _base_names(repo):
        for model in MODEL_CATALOGUE:
            if base.lower() in _names(model):
                return model, False
    return None


def builtin_model(spec: str) -> ModelShape | None:
    """A built-in shape by name (case-insensitive, dashes optional: ``Llama-3.1-8B``, ``llama3.1-8b``)
    or by Hugging Face id with or without its organisation (``meta-llama/Llama-3.1-8B``,
    ``Qwen3-8B``), a known variant of it included (``meta-llama/Llama-3.1-8B-Instruct``,
    ``meta-llama/Llama-2-7b-chat-hf``: the shape says so in its ``note``). None when it names none;
    ``ValueError`` for a built-in name under another organisation (``foo/Llama-3.1-8B`` is not
    Meta's model)."""
    text = spec.strip()
    org, _, repo = text.rpartition("/")
    if not org:
        wanted = repo.lower()
        for name, shape in COMMON_MODELS.items():
            if wanted in (name.lower(), name.lower().replace("-", "")):
                return shape
    found = _catalogue_match(repo)
    if found is None:
        return None
    model, exact = found
    if org and org.lower() != model.owner.lower():
        raise ValueError(
            f"unknown model {text!r}: not in the local Hugging Face cache, and the built-in {model.name} shape "
            f"is {model.owner}'s ({model.source}), not {org}'s; give the model's config.json or folder"
        )
    shape = COMMON_MODELS[model.name]
    if exact:
        return shape
    variant = next((v for base, v in _base_names(repo) if base.lower() in _names(model)), "")
    article = "an" if variant.lstrip("-")[:1].lower() in "aeiou" else "a"
    kind = f"{article} {variant} variant" if variant else "a later version"
    return replace(
        shape,
        name=text,
        note=f"{text} is {kind} of {model.name}: the built-in {model.name} shape (the same layers, heads and weights)",
    )


def catalogue_source(name: str) -> str:
    """The Hugging Face repository a built-in shape's fields come from ("" for another name)."""
    model = _BY_NAME.get(name)
    return model.source if model else ""
