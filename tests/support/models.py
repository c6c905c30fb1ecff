"""A Hugging Face ``config.json`` for tests: a tiny Llama-shaped model (4 layers, 2 KV heads)."""

from __future__ import annotations

import json
from pathlib import Path

TINY_CONFIG = {
    "num_hidden_layers": 4,
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 512,
    "vocab_size": 1000,
    "torch_dtype": "float16",
}


def write_config(folder: Path, config: dict[str, object] | None = None) -> Path:
    """``config`` (the tiny model's by default) as ``folder/config.json``; its path."""
    path = folder / "config.json"
    path.write_text(json.dumps(TINY_CONFIG if config is None else config))
    return path
