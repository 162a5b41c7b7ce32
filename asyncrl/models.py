"""Building the tiny model and tokenizer, and loading any causal LM through the transformers Auto classes."""

from __future__ import annotations

import random
from pathlib import Path

import torch

BUILTIN_DIR = Path(__file__).parent / "assets"
BUILTIN_PREFIX = "builtin:"

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_model_path(path: str) -> str:
    """Map ``builtin:NAME`` to the checkpoint shipped inside the package; other paths pass through."""
    if path.startswith(BUILTIN_PREFIX):
        name = path[len(BUILTIN_PREFIX) :]
        local = BUILTIN_DIR / name
        if not (local / "config.json").exists():
            shipped = sorted(p.name for p in BUILTIN_DIR.iterdir() if (p / "config.json").exists())
            raise FileNotFoundError(f"no built-in model '{name}' (shipped: {shipped})")
        return str(local)
    if not Path(path).exists():
        raise FileNotFoundError(
            f"model path '{path}' does not exist (models are never downloaded; give a local directory "
            f"or one of the built-in names, e.g. '{BUILTIN_PREFIX}tiny-sft')"
        )
    return path


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model_path(path))


def load_model(path: str, dtype: str = "float32"):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(path), dtype=DTYPES[dtype])
    return model


def tokenizer_corpus(task, n_problems: int = 20000, seed: int = 1234) -> list[str]:
    """Text the tokenizer is trained on: problems and solutions of the task plus chat-template words."""
    rng = random.Random(seed)
    lines = ["user", "assistant", "system", "You are a helpful assistant."]
    for _ in range(n_problems):
        item = task.problem(rng)
        lines += [item["question"], item["solution"]]
    return lines


def build_tiny_model(
    tokenizer,
    hidden_size: int = 256,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 768,
    max_positions: int = 512,
    seed: int = 0,
):
    """A randomly initialised Qwen2 causal LM sized for a CPU.

    Input and output embeddings are untied so that vLLM's in-place weight reload also works on it.
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    vocab = (len(tokenizer) + 63) // 64 * 64
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)
