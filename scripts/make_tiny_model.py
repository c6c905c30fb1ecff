"""Builds a tiny Llama-shaped model with random weights, entirely locally (no download).

A byte-level BPE tokenizer is trained with the `tokenizers` library on generated text and
wrapped in transformers' PreTrainedTokenizerFast with a chat template; the model is a
LlamaForCausalLM from a LlamaConfig (hidden 256, intermediate 512, 4 layers, 4 heads, 2 KV heads)
with seeded random weights. Both are saved into one folder that vLLM can serve.

Run it with a python that has torch and transformers (the vLLM venv):

    .cache/vllm-venv/bin/python scripts/make_tiny_model.py --out .cache/tiny-model

The folder is written next to its destination and renamed into place, so a concurrent reader
never sees half a model. An existing model is kept unless --force.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parents[1] / ".cache" / "tiny-model"
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{{ message['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SHAPE = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2)

_WORDS = [
    "kv",
    "cache",
    "token",
    "decode",
    "prefill",
    "latency",
    "bandwidth",
    "memory",
    "block",
    "page",
    "preempt",
    "queue",
    "request",
    "model",
    "layer",
    "head",
    "tensor",
    "batch",
    "prefix",
    "hit",
    "miss",
    "tier",
    "host",
    "device",
    "gpu",
    "cpu",
    "the",
    "a",
    "of",
    "to",
    "and",
    "in",
    "is",
    "it",
    "that",
    "for",
    "on",
    "with",
    "as",
    "was",
    "at",
    "by",
    "this",
    "be",
    "from",
    "or",
    "are",
    "an",
]


def generated_corpus(lines: int, seed: int) -> list[str]:
    """Sentences of words, numbers and punctuation: enough variety for a few thousand merges."""
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        words = [
            rng.choice(_WORDS) if rng.random() < 0.85 else str(rng.randint(0, 9999)) for _ in range(rng.randint(5, 25))
        ]
        out.append(" ".join(words).capitalize() + rng.choice(".?!:;,"))
    return out


def build_tokenizer(vocab_size: int, seed: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    # Byte-level: any prompt text (a load generator's, a user's) tokenizes without unknowns.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(generated_corpus(20000, seed), trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
    )


def build_model(tokenizer, max_positions: int, seed: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=max_positions,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        **SHAPE,
    )
    config.dtype = torch.float32  # recorded in config.json; vLLM is told --dtype float32 anyway
    return LlamaForCausalLM(config).to(torch.float32)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"destination folder (default {DEFAULT_OUT})")
    parser.add_argument("--vocab-size", type=int, default=2048)
    parser.add_argument("--max-positions", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="rebuild even if the folder holds a model")
    args = parser.parse_args(argv)

    out: Path = args.out.resolve()
    if (out / "config.json").is_file() and (out / "tokenizer.json").is_file() and not args.force:
        print(f"make_tiny_model: {out} already holds a model (use --force to rebuild)")
        return 0
    try:
        import tokenizers  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        print(
            f"make_tiny_model: needs torch, transformers and tokenizers ({exc.name} is missing); "
            f"run it with .cache/vllm-venv/bin/python",
            file=sys.stderr,
        )
        return 1

    started = time.monotonic()
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    staging.chmod(0o755)
    try:
        tokenizer = build_tokenizer(args.vocab_size, args.seed)
        model = build_model(tokenizer, args.max_positions, args.seed)
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        params = sum(p.numel() for p in model.parameters())
        (staging / "kvdoctor-tiny-model.json").write_text(
            json.dumps(
                {
                    "built_by": "scripts/make_tiny_model.py",
                    "seed": args.seed,
                    "vocab_size": len(tokenizer),
                    "parameters": params,
                    **SHAPE,
                },
                indent=2,
            )
            + "\n"
        )
        if out.exists():
            shutil.rmtree(out)
        try:
            os.replace(staging, out)
        except OSError:
            # Another builder finished first (the rename target exists and is not empty): use its model.
            if not (out / "config.json").is_file():
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    print(
        f"make_tiny_model: wrote {out} ({params / 1e6:.1f} M parameters, vocab {len(tokenizer)}, "
        f"{time.monotonic() - started:.1f} s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
