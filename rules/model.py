"""A model's shape: what the ledger needs to know about it, and the one loader that reads it.

``load_model_shape`` is how every part of kvdoctor gets a shape from a Hugging Face
``config.json`` (the exporter's ``--model-config``, ``kvdoctor ledger`` and ``diagnose``, the
dashboard's upload): from the file's path, its bytes or the parsed JSON, with one-line
``ValueError``s. ``_read_config`` turns a source into the JSON object; a new kind of source (a
model folder, a Hugging Face cache id) is one more branch there.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
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
}

ConfigSource = str | os.PathLike[str] | bytes | Mapping[str, Any]


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
    def from_hf_config(cls, config: Mapping[str, Any], name: str | None = None) -> ModelShape:
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
        if layers <= 0 or heads <= 0:
            raise ValueError(_NON_POSITIVE)
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        if kv_heads <= 0 or head_dim <= 0:
            raise ValueError(_NON_POSITIVE)
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


_NON_POSITIVE = "model config has a non-positive layer, head or head_dim count"


def _estimate_parameters(cfg: Mapping[str, Any], shape: ModelShape) -> float | None:
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


# ----------------------------------------------------------------------------- loading


def load_model_shape(source: ConfigSource, *, default_name: str | None = None, label: str | None = None) -> ModelShape:
    """The shape a Hugging Face ``config.json`` describes, its dtype known.

    ``source``: the file's path, its bytes, or the parsed JSON. The name is the config's
    ``_name_or_path``, else ``default_name``, else (a file) its folder's name or its stem, else the
    config's architecture. Anything unusable raises ``ValueError`` with one line naming the source
    (``label``; default: the quoted path, or "the config").
    """
    path: Path | None = None
    if isinstance(source, (bytes, Mapping)):
        where = label or "the config"
        config = _read_config(source, where)
    else:
        path = Path(source).expanduser()
        where = label or repr(os.fspath(source))
        config = _read_config(path, where)
    name = config.get("_name_or_path") or default_name
    if not name and path is not None:
        name = path.parent.name or path.stem
    try:
        shape = ModelShape.from_hf_config(config, name=name)
        dtype_bytes(shape.dtype)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}" if path is not None or label else str(exc)) from None
    return shape


def _read_config(source: Path | bytes | Mapping[str, Any], where: str) -> Mapping[str, Any]:
    """The config as a JSON object; ``where`` names it in errors."""
    if isinstance(source, Mapping):
        config: object = source
    else:
        try:
            text = source.read_text(encoding="utf-8") if isinstance(source, Path) else source.decode("utf-8")
        except FileNotFoundError:
            raise ValueError(f"no such file {where}") from None
        except UnicodeDecodeError:
            raise ValueError(f"{where} is not a text file") from None
        except OSError as exc:
            raise ValueError(f"cannot read {where}: {exc.strerror or exc}") from None
        try:
            config = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where} is not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(config, Mapping):
        raise ValueError(f"{where} is not a model config (expected a JSON object)")
    return config


# ------------------------------------------------------------------------ common shapes


def _shape(
    name: str, layers: int, hidden: int, heads: int, kv_heads: int, inter: int, vocab: int, tied: bool = False
) -> ModelShape:
    return ModelShape.from_hf_config(
        {
            "num_hidden_layers": layers,
            "hidden_size": hidden,
            "num_attention_heads": heads,
            "num_key_value_heads": kv_heads,
            "intermediate_size": inter,
            "vocab_size": vocab,
            "tie_word_embeddings": tied,
            "torch_dtype": "bfloat16",
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
