"""Writes a small random-weight Llama-shaped GGUF model for llama-server, with PyPI's ``gguf``.

    python scripts/make_tiny_gguf.py --out .cache/tiny.gguf                 # 4 layers, 256 wide: ~1 ms/token
    python scripts/make_tiny_gguf.py --out slow.gguf --width 1024 --layers 8 --ff 4096   # a slower one

The vocabulary is SentencePiece-style (``tokenizer.ggml.model = llama``): the three special tokens,
the 256 byte tokens (so any text tokenizes), and word pieces of plain English words, a few hundred
in all. The weights are random (seeded): the text it writes means nothing, but every decode step
does the work of a real model of that shape. Written in well under a second at the default size.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import gguf
import numpy as np

# Plain English words (the stress test's fixed text among them): its prompts stay a few tokens a word.
TEXT = (
    "memory bandwidth decode cache block token prefix layer head value key batch queue engine model "
    "latency throughput request server worker tensor kernel page pool tier host device scheduler stream "
    "prompt window signal sample metric counter gauge ratio budget limit river mountain forest garden "
    "market harbor bridge castle planet ocean desert valley meadow island canyon glacier the a of and to "
    "in is it that for on with as was at by this be from or an are not have but we they you which"
)
WORDS = tuple(TEXT.split())
UNKNOWN, CONTROL, NORMAL, BYTE = (
    gguf.TokenType.UNKNOWN,
    gguf.TokenType.CONTROL,
    gguf.TokenType.NORMAL,
    gguf.TokenType.BYTE,
)


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """(pieces, scores, token types): special, byte and word-piece tokens, SentencePiece spelling."""
    pieces = ["<unk>", "<s>", "</s>"]
    types = [UNKNOWN, CONTROL, CONTROL]
    pieces += [f"<0x{b:02X}>" for b in range(256)]
    types += [BYTE] * 256
    letters = sorted({c for w in WORDS for c in w})
    # every prefix of every word: SentencePiece merges a word up from its letters through them
    prefixes = (f"▁{w[:n]}" for w in WORDS for n in range(1, len(w) + 1))
    words = list(dict.fromkeys(["▁", *letters, *prefixes]))
    pieces += words
    types += [NORMAL] * len(words)
    # SentencePiece prefers the higher score: longer pieces first, so words stay one token.
    scores = [0.0] * (3 + 256) + [float(len(p)) - 100.0 for p in words]
    return pieces, scores, [int(t) for t in types]


# The model's shape, by default: write_model's arguments and the command line's.
DEFAULTS = {"layers": 4, "width": 256, "ff": 512, "heads": 4, "kv_heads": 2, "context": 8192, "dtype": "f32", "seed": 0}


def write_model(
    out: Path,
    layers: int = DEFAULTS["layers"],
    width: int = DEFAULTS["width"],
    ff: int = DEFAULTS["ff"],
    heads: int = DEFAULTS["heads"],
    kv_heads: int = DEFAULTS["kv_heads"],
    context: int = DEFAULTS["context"],
    dtype: str = DEFAULTS["dtype"],
    seed: int = DEFAULTS["seed"],
) -> Path:
    """Writes the GGUF file ``out`` and returns it."""
    if width % heads or heads % kv_heads:
        raise ValueError("width must divide by heads, and heads by kv-heads")
    rng = np.random.default_rng(seed)
    np_type = np.float16 if dtype == "f16" else np.float32
    head_dim = width // heads
    pieces, scores, types = vocabulary()

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np_type)

    def norm(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)  # norms stay f32, as converted models keep them

    out.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_name("kvdoctor-tiny-random")
    writer.add_context_length(context)
    writer.add_embedding_length(width)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if dtype == "f16" else gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(pieces)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)

    vocab = len(pieces)
    writer.add_tensor("token_embd.weight", weight(vocab, width))
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", norm(width))
        writer.add_tensor(f"blk.{i}.attn_q.weight", weight(heads * head_dim, width))
        writer.add_tensor(f"blk.{i}.attn_k.weight", weight(kv_heads * head_dim, width))
        writer.add_tensor(f"blk.{i}.attn_v.weight", weight(kv_heads * head_dim, width))
        writer.add_tensor(f"blk.{i}.attn_output.weight", weight(width, heads * head_dim))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", norm(width))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weight(ff, width))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weight(ff, width))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weight(width, ff))
    writer.add_tensor("output_norm.weight", norm(width))
    writer.add_tensor("output.weight", weight(vocab, width))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="the .gguf file to write")
    helps = {"width": "embedding width (default {})", "ff": "feed-forward width (default {})"}
    helps["context"] = "the training context it declares"
    for name, default in DEFAULTS.items():
        kind: dict = {"choices": ("f32", "f16")} if name == "dtype" else {"type": int}
        text = helps.get(name)
        parser.add_argument("--" + name.replace("_", "-"), **kind, default=default, help=text and text.format(default))
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        path = write_model(args.out, **{name: getattr(args, name) for name in DEFAULTS})
    except (ValueError, OSError) as exc:
        print(f"make_tiny_gguf: {exc}", file=sys.stderr)
        return 2
    size = path.stat().st_size / 1e6
    print(f"make_tiny_gguf: wrote {path} ({size:.1f} MB) in {time.perf_counter() - started:.2f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
