"""The ledger: the bandwidth and capacity arithmetic that says how fast decode *can* be.

Every decode step re-reads the weights and the KV cache of every running sequence, so

    KV bytes per token = 2 (K and V) x layers x kv_heads x head_dim x bytes per element
    live KV bytes      = KV bytes per token x tokens resident
    decode step floor  = (weight bytes + live KV bytes) / peak DRAM bandwidth
    tokens/s ceiling   = 1 / floor (per sequence; the batch shares the step)
    host transfer time = bytes / min(host memory bandwidth, PCIe bandwidth)

Pure functions, no I/O: the caller reads ``config.json`` and passes the dict.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

GB = 1e9
KIB = 1024

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
}


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
    ``num_parameters`` is estimated from the shape when the config does not say.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: str = "bfloat16"
    num_parameters: float | None = None
    kv_latent_dim: int | None = None

    @classmethod
    def from_hf_config(cls, config: dict, name: str | None = None) -> "ModelShape":
        """Read a Hugging Face ``config.json`` dict; raises ``ValueError`` naming a missing field."""
        cfg = config.get("text_config") or config  # multimodal configs nest the language model
        try:
            layers = int(cfg["num_hidden_layers"])
            hidden = int(cfg["hidden_size"])
            heads = int(cfg["num_attention_heads"])
        except KeyError as exc:
            raise ValueError(f"model config lacks {exc.args[0]!r}") from None
        except (TypeError, ValueError) as exc:
            raise ValueError(f"model config has a non-integer shape field: {exc}") from None
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or config.get("torch_dtype") or "bfloat16")
        latent = None
        if cfg.get("kv_lora_rank"):
            latent = int(cfg["kv_lora_rank"]) + int(cfg.get("qk_rope_head_dim") or 0)
        shape = cls(
            name=name or str(config.get("_name_or_path") or (config.get("architectures") or ["model"])[0]),
            num_layers=layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            dtype=dtype.removeprefix("torch."),
            kv_latent_dim=latent,
        )
        return replace(shape, num_parameters=_estimate_parameters(cfg, shape))

    @property
    def weight_bytes(self) -> float:
        return (self.num_parameters or 0.0) * dtype_bytes(self.dtype)


def _estimate_parameters(cfg: dict, shape: ModelShape) -> float | None:
    """Dense decoder estimate: embeddings + per layer (attention + gated MLP); None if unknown."""
    vocab = cfg.get("vocab_size")
    inter = cfg.get("intermediate_size")
    if not vocab or not inter:
        return None
    h, d = shape.hidden_size, shape.head_dim
    attention = h * shape.num_attention_heads * d * 2 + h * shape.num_kv_heads * d * 2
    experts = int(cfg.get("num_local_experts") or cfg.get("n_routed_experts") or cfg.get("num_experts") or 1)
    moe_inter = int(cfg.get("moe_intermediate_size") or inter)
    mlp = 3 * h * (moe_inter * experts if experts > 1 else inter)
    embeddings = vocab * h * (1 if cfg.get("tie_word_embeddings") else 2)
    return float(embeddings + shape.num_layers * (attention + mlp + 2 * h) + h)


def kv_bytes_per_token(shape: ModelShape, kv_dtype: str | None = None) -> float:
    """KV-cache bytes one token occupies (all layers); ``kv_dtype`` defaults to the model dtype."""
    elem = dtype_bytes(kv_dtype or shape.dtype)
    if shape.kv_latent_dim:
        return shape.num_layers * shape.kv_latent_dim * elem
    return 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * elem


def decode_step_floor(weight_bytes: float, live_kv_bytes: float, peak_bandwidth: float) -> float:
    """Seconds: the fastest one decode step can be when bound by DRAM bandwidth."""
    if peak_bandwidth <= 0:
        raise ValueError("peak bandwidth must be positive")
    return (weight_bytes + live_kv_bytes) / peak_bandwidth


def host_transfer_seconds(nbytes: float, host_bandwidth: float, pcie_bandwidth: float) -> float:
    """Seconds to move ``nbytes`` of KV from host memory to the GPU."""
    return nbytes / min(host_bandwidth, pcie_bandwidth)


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_bytes: float
    peak_bandwidth: float  # bytes/s, HBM/GDDR theoretical peak
    pcie_bandwidth: float  # bytes/s per direction


PCIE4_X16 = 31.5 * GB
PCIE5_X16 = 63 * GB

GPU_CATALOGUE: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        GpuSpec("A100-40GB", 40 * GB, 1555 * GB, PCIE4_X16),
        GpuSpec("A100-80GB", 80 * GB, 2039 * GB, PCIE4_X16),
        GpuSpec("A100-80GB-PCIE", 80 * GB, 1935 * GB, PCIE4_X16),
        GpuSpec("H100", 80 * GB, 3350 * GB, PCIE5_X16),
        GpuSpec("H100-NVL", 94 * GB, 3900 * GB, PCIE5_X16),
        GpuSpec("H200", 141 * GB, 4800 * GB, PCIE5_X16),
        GpuSpec("L40S", 48 * GB, 864 * GB, PCIE4_X16),
        GpuSpec("L4", 24 * GB, 300 * GB, PCIE4_X16),
        GpuSpec("B200", 180 * GB, 8000 * GB, PCIE5_X16),
    )
}

# NVML device names -> catalogue keys, most specific first.
_NVML_NAME_PATTERNS = (
    (r"A100.*PCIE.*80|A100.*80.*PCIE", "A100-80GB-PCIE"),
    (r"A100.*80", "A100-80GB"),
    (r"A100", "A100-40GB"),
    (r"H100.*NVL", "H100-NVL"),
    (r"H100", "H100"),
    (r"H200|GH200", "H200"),
    (r"L40S", "L40S"),
    (r"\bL4\b", "L4"),
    (r"B200", "B200"),
)


def lookup_gpu(name: str) -> GpuSpec | None:
    """A catalogue entry by key (``H100``) or by NVML device name (``NVIDIA H100 80GB HBM3``)."""
    key = name.strip()
    for k, spec in GPU_CATALOGUE.items():
        if k.lower() == key.lower():
            return spec
    for pattern, k in _NVML_NAME_PATTERNS:
        if re.search(pattern, key, re.IGNORECASE):
            return GPU_CATALOGUE[k]
    return None


@dataclass(frozen=True)
class Ledger:
    """The ledger for one model on one GPU at a given context and batch."""

    kv_bytes_per_token: float
    live_kv_bytes: float
    weight_bytes: float
    step_floor_seconds: float
    tokens_per_second_per_sequence: float
    tokens_per_second_total: float


def compute_ledger(
    shape: ModelShape, peak_bandwidth: float, context_tokens: int, batch: int = 1, kv_dtype: str | None = None
) -> Ledger:
    """Decode floor for ``batch`` sequences each holding ``context_tokens`` of KV."""
    per_token = kv_bytes_per_token(shape, kv_dtype)
    live = per_token * context_tokens * batch
    floor = decode_step_floor(shape.weight_bytes, live, peak_bandwidth)
    return Ledger(
        kv_bytes_per_token=per_token,
        live_kv_bytes=live,
        weight_bytes=shape.weight_bytes,
        step_floor_seconds=floor,
        tokens_per_second_per_sequence=1.0 / floor,
        tokens_per_second_total=batch / floor,
    )


def _shape(name, layers, hidden, heads, kv_heads, inter, vocab, tied=False, dtype="bfloat16"):
    return ModelShape.from_hf_config(
        {
            "num_hidden_layers": layers,
            "hidden_size": hidden,
            "num_attention_heads": heads,
            "num_key_value_heads": kv_heads,
            "intermediate_size": inter,
            "vocab_size": vocab,
            "tie_word_embeddings": tied,
            "torch_dtype": dtype,
        },
        name=name,
    )


# Shapes from the models' published config.json files, for the dashboard's picker and the demo.
COMMON_MODELS: dict[str, ModelShape] = {
    m.name: m
    for m in (
        _shape("Llama-3.1-8B", 32, 4096, 32, 8, 14336, 128256),
        _shape("Llama-3.1-70B", 80, 8192, 64, 8, 28672, 128256),
        _shape("Llama-2-7B", 32, 4096, 32, 32, 11008, 32000),
        _shape("Mistral-7B", 32, 4096, 32, 8, 14336, 32768),
        _shape("Qwen2.5-7B", 28, 3584, 28, 4, 18944, 152064),
    )
}
