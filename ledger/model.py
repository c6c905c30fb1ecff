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
    if isinstance(rope, Mapping):
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


# ------------------------------------------------------------------------ built-in shapes


def _llama(
    layers: int, hidden: int, heads: int, kv_heads: int, inter: int, vocab: int, positions: int
) -> dict[str, Any]:
    return {
        "max_position_embeddings": positions,
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "intermediate_size": inter,
        "vocab_size": vocab,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }


_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}

# The shape fields of the models' published config.json files (Hugging Face hub), for the
# dashboard's picker, the demo and ``--model NAME``.
BUILTIN_CONFIGS: dict[str, dict[str, Any]] = {
    # Llama 3.1's rope_scaling (rope_type llama3) does not lengthen its 131,072 positions
    "Llama-3.1-8B": {**_llama(32, 4096, 32, 8, 14336, 128256, 131072), "rope_scaling": _LLAMA3_ROPE},
    "Llama-3.1-70B": {**_llama(80, 8192, 64, 8, 28672, 128256, 131072), "rope_scaling": _LLAMA3_ROPE},
    "Llama-2-7B": _llama(32, 4096, 32, 32, 11008, 32000, 4096),
    "Mistral-7B": _llama(32, 4096, 32, 8, 14336, 32768, 32768),
    # Qwen/Qwen2.5-7B-Instruct: 32,768 positions (131,072 only with the YaRN rope_scaling added)
    "Qwen2.5-7B": _llama(28, 3584, 28, 4, 18944, 152064, 32768),
    # mistralai/Mixtral-8x7B-v0.1: 8 experts, 2 active per token
    "Mixtral-8x7B": {
        **_llama(32, 4096, 32, 8, 14336, 32000, 32768),
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
    },
    # deepseek-ai/DeepSeek-V3: MLA, 256 routed experts (8 active) + 1 shared, FP8 weights
    "DeepSeek-V3": {
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
    },
}
COMMON_MODELS: dict[str, ModelShape] = {
    name: replace(ModelShape.from_hf_config(cfg, name=name), source="built-in shape")
    for name, cfg in BUILTIN_CONFIGS.items()
}


# Each built-in shape's Hugging Face organisation and repository names (the base model's; the
# variants VARIANT_SUFFIXES name share its shape).
BUILTIN_REPOS: dict[str, tuple[str, tuple[str, ...]]] = {
    "Llama-3.1-8B": ("meta-llama", ("Llama-3.1-8B", "Meta-Llama-3.1-8B")),
    "Llama-3.1-70B": ("meta-llama", ("Llama-3.1-70B", "Meta-Llama-3.1-70B")),
    "Llama-2-7B": ("meta-llama", ("Llama-2-7b", "Llama-2-7b-hf")),
    "Mistral-7B": ("mistralai", ("Mistral-7B",)),
    "Qwen2.5-7B": ("Qwen", ("Qwen2.5-7B",)),
    "Mixtral-8x7B": ("mistralai", ("Mixtral-8x7B",)),
    "DeepSeek-V3": ("deepseek-ai", ("DeepSeek-V3", "DeepSeek-V3-Base")),
}
# Fine-tunes published beside a base model with its shape: chat and instruction tunes.
VARIANT_SUFFIXES = ("-chat-hf", "-Instruct", "-chat", "-it", "-hf")
_VERSION = re.compile(r"-v\d+(\.\d+)*$", re.I)  # Mistral-7B-Instruct-v0.2, Mixtral-8x7B-v0.1


def _base_name(name: str) -> tuple[str, str]:
    """(``name`` less its variant and version suffixes, the variant suffix it had, "" if none)."""
    base, variant = name, ""
    while True:
        stripped = _VERSION.sub("", base)
        for suffix in VARIANT_SUFFIXES:
            if stripped.lower().endswith(suffix.lower()):
                variant = variant or suffix
                stripped = stripped[: -len(suffix)]
                break
        if stripped == base:
            return base, variant
        base = stripped


def builtin_model(spec: str) -> ModelShape | None:
    """A built-in shape by name (case-insensitive, dashes optional: ``Llama-3.1-8B``, ``llama3.1-8b``)
    or by Hugging Face id (``meta-llama/Llama-3.1-8B``), a known variant of it included
    (``meta-llama/Llama-3.1-8B-Instruct``, ``meta-llama/Llama-2-7b-chat-hf``: the shape says so in
    its ``note``). None when it names none; ``ValueError`` for a built-in name under another
    organisation (``foo/Llama-3.1-8B`` is not Meta's model)."""
    text = spec.strip()
    org, _, repo = text.rpartition("/")
    wanted = repo.lower()
    if not org:
        for name, shape in COMMON_MODELS.items():
            if wanted in (name.lower(), name.lower().replace("-", "")):
                return shape
    base, variant = _base_name(repo)
    for name, (owner, repos) in BUILTIN_REPOS.items():
        names = {r.lower() for r in repos} | {name.lower()}
        if repo.lower() not in names and base.lower() not in names:
            continue
        if org and org.lower() != owner.lower():
            raise ValueError(
                f"unknown model {text!r}: not in the local Hugging Face cache, and the built-in {name} shape "
                f"is {owner}'s ({owner}/{repos[0]}), not {org}'s; give the model's config.json or folder"
            )
        shape = COMMON_MODELS[name]
        if repo.lower() in names:
            return shape
        return replace(
            shape,
            name=text,
            note=f"{text} is a{'n' if variant[1:2].lower() in 'aeiou' else ''} {variant} variant of {name}: "
            f"the built-in {name} shape (the same layers, heads and weights)",
        )
    return None
