"""Building the tiny model and tokenizer, and loading any causal LM through the transformers Auto classes."""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

from asyncrl.configlib import ConfigError

BUILTIN_DIR = Path(__file__).parent.parent / "assets"
BUILTIN_PREFIX = "builtin:"

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_model_path(path: str) -> str:
    """The checkpoint directory ``path`` names: ``builtin:NAME`` (shipped inside the package), a run directory
    or its ``checkpoints/latest`` (the latest checkpoint of an ``asyncrl train`` run), a Hugging Face hub name
    already in the local cache (``Qwen/Qwen2.5-0.5B-Instruct``; never downloaded); other paths pass through."""
    if path.startswith(BUILTIN_PREFIX):
        name = path[len(BUILTIN_PREFIX) :]
        local = BUILTIN_DIR / name
        if not (local / "config.json").exists():
            shipped = sorted(p.name for p in BUILTIN_DIR.iterdir() if (p / "config.json").exists())
            raise FileNotFoundError(f"no built-in model '{name}' (shipped: {shipped})")
        return str(local)
    run_checkpoint = latest_of_run(Path(path))
    if run_checkpoint is not None:
        return str(run_checkpoint)
    if not Path(path).exists():
        cached = hub_cache_dir(path)
        if cached is not None:
            return cached
        raise FileNotFoundError(
            f"model path '{path}' does not exist (models are never downloaded; give a local directory, a hub name "
            f"already in the local Hugging Face cache, or one of the built-in names, e.g. '{BUILTIN_PREFIX}tiny-sft')"
        )
    return path


def latest_of_run(path: Path) -> Path | None:
    """The checkpoint that ``RUN_DIR`` or ``RUN_DIR/checkpoints/latest`` names (``latest`` holds a step directory's
    name), or None when ``path`` is neither."""
    pointer = path if path.name == "latest" and path.is_file() else path / "checkpoints" / "latest"
    if (path / "config.json").exists() or not pointer.is_file():
        return None
    try:
        name = pointer.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    step = pointer.parent / name
    return step if name.startswith("step") and name[4:].isdigit() and step.is_dir() else None


def hub_cache_dir(name: str) -> str | None:
    """The local snapshot of hub model ``name`` (``org/model``) in the Hugging Face cache, without any download;
    None when it is not there (or not a hub name)."""
    if name.count("/") != 1 or name.startswith((".", "/", "~")):
        return None
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(name, local_files_only=True)
    except Exception:  # noqa: BLE001 - not cached, not a valid name, or no huggingface_hub: not a hub model here
        return None


SMALL_MODEL_PARAMETERS = 50_000_000
"""Below this many parameters a model gets the small-model recipe (asyncrl's tiny models: 3.3M)."""


def is_small_model(path: str) -> bool:
    """True for a model of fewer than ``SMALL_MODEL_PARAMETERS`` (estimated from its config.json: embeddings,
    attention and MLP weights), or one whose config cannot be read here (a missing model is refused later, with
    its key). A LoRA adapter directory is its base model's size."""
    from asyncrl.models.lora import ADAPTER_CONFIG

    try:
        directory = Path(resolve_model_path(path))
        if not (directory / "config.json").exists() and (directory / ADAPTER_CONFIG).exists():
            base = json.loads((directory / ADAPTER_CONFIG).read_text())["base_model_name_or_path"]
            return is_small_model(
                base if base.startswith(BUILTIN_PREFIX) or Path(base).exists() else str(directory / base)
            )
        c = json.loads((directory / "config.json").read_text())
        h, layers, vocab = int(c["hidden_size"]), int(c["num_hidden_layers"]), int(c["vocab_size"])
        inner = int(c.get("intermediate_size") or 4 * h)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return True
    return vocab * h + layers * (4 * h * h + 3 * h * inner) < SMALL_MODEL_PARAMETERS


RECIPE_FILE = "asyncrl_recipe.json"
"""A model directory's own defaults, per command, for the keys the user leaves unset:
``{"train": {"actor.lr": 1e-05}}`` (the shipped ``tiny-sft`` has one; a checkpoint saved from it does not)."""


def own_recipe(path: str, command: str) -> dict:
    """The defaults ``path``'s directory asks for when ``command`` runs it (its ``RECIPE_FILE``), or none."""
    try:
        file = Path(resolve_model_path(path)) / RECIPE_FILE
    except FileNotFoundError:
        return {}  # a missing model is refused later, with its key
    if not file.is_file():
        return {}
    try:
        data = json.loads(file.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"model.path: {file} is not JSON ({e})") from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ConfigError(
            f'model.path: {file} must map each command to its keys and values, e.g. {{"train": {{"actor.lr": 1e-05}}}}'
        )
    return data.get(command, {})


SMALL_MODEL_RECIPE = {
    "train": {"gconfig.max_new_tokens": 64},
    "eval": {"gconfig.max_new_tokens": 64},
    "sft": {"gconfig.max_new_tokens": 96, "actor.lr": 2e-3},
}
"""Defaults for a model under 50M parameters (asyncrl's tiny models), in place of those that suit a real model,
for each key the user leaves unset (a file or the command line sets it otherwise)."""


def model_recipe(model_path: str, command: str) -> dict:
    """The defaults ``model_path`` gets for ``command``, for each key the user leaves unset: ``SMALL_MODEL_RECIPE``
    when it is a small model, then what its directory asks for (``RECIPE_FILE``: the shipped
    ``tiny-sft`` trains RL at ``actor.lr=1e-5``, docs/algorithms.md "The learning rate")."""
    return {**(SMALL_MODEL_RECIPE[command] if is_small_model(model_path) else {}), **own_recipe(model_path, command)}


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def check_model_dir(path: str, key: str = "model.path") -> str:
    """The resolved checkpoint directory of ``path``, or a ``ConfigError`` naming ``key`` and what is wrong
    (missing, a file, no or an unusable config.json, no tokenizer) before any loader gets to guess."""
    try:
        resolved = Path(resolve_model_path(path))
    except FileNotFoundError as e:
        raise ConfigError(f"{key}: {e}") from None
    if not resolved.is_dir():
        raise ConfigError(f"{key}: '{path}' is a file; give the checkpoint directory (with config.json)")
    config = resolved / "config.json"
    if not config.is_file():
        raise ConfigError(
            f"{key}: '{path}' has no config.json, so it is not a Hugging Face model directory "
            "(save one with save_pretrained, or make one with `asyncrl init-model --out DIR`)"
        )
    try:
        model_type = json.loads(config.read_text()).get("model_type")
    except (ValueError, AttributeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{key}: {config} is not a JSON object ({e})") from None
    if not model_type:
        raise ConfigError(f"{key}: {config} has no 'model_type', so no model class can be chosen for it")
    if not any((resolved / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(
            f"{key}: '{path}' has no tokenizer ({', '.join(TOKENIZER_FILES)}); save the tokenizer "
            "with the model (tokenizer.save_pretrained)"
        )
    return str(resolved)


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    path = resolve_model_path(path)
    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"model.path: cannot load the tokenizer of '{path}': {type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}"
        ) from e


def architectures(path: str) -> list[str]:
    """The model classes a checkpoint directory's ``config.json`` names ([] when it names none or cannot be read)."""
    try:
        names = json.loads((Path(path) / "config.json").read_text()).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return []
    return [str(n) for n in names] if isinstance(names, list) else []


def is_reward_model(path: str) -> bool:
    """Whether the checkpoint is a sequence classifier (a reward model, e.g. from ``asyncrl rm``)."""
    names = architectures(path)
    return bool(names) and all(n.endswith("ForSequenceClassification") for n in names)


def load_model(path: str, dtype: str = "float32"):
    from transformers import AutoModelForCausalLM

    path = resolve_model_path(path)
    if is_reward_model(path):
        raise ConfigError(
            f"model.path: '{path}' is a reward model ({', '.join(architectures(path))}, from asyncrl rm "
            "say), not a language model to generate with: give its base model, or use it as reward.model"
        )
    try:
        return AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype])
    except (OSError, ValueError, KeyError) as e:
        raise ConfigError(
            f"model.path: cannot load the model in '{path}': {type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}"
        ) from e


def load_checkpoint(path: str, key: str = "model.path", dtype: str = "float32"):
    """(tokenizer, model) of ``path`` for inference: a Hugging Face model directory (or ``builtin:NAME``), or a
    LoRA adapter directory (``adapter_config.json``), whose base model (its ``base_model_name_or_path``) is
    loaded and the adapter merged into it through peft. The adapter directory's tokenizer is used when it has
    one, else the base model's. Anything wrong is a ConfigError naming ``key``."""
    try:
        resolved = Path(resolve_model_path(path))
    except FileNotFoundError as e:
        raise ConfigError(f"{key}: {e}") from None
    from asyncrl.models.lora import is_adapter_dir

    if not is_adapter_dir(resolved):
        resolved = check_model_dir(path, key)
        return load_tokenizer(resolved), load_model(resolved, dtype)
    base = adapter_base(resolved, key)
    has_tokenizer = any((resolved / name).is_file() for name in TOKENIZER_FILES)
    tokenizer = load_tokenizer(str(resolved) if has_tokenizer else base)
    return tokenizer, merge_adapter(load_model(base, dtype), resolved, key)


def adapter_base(adapter_dir: Path, key: str = "model.path") -> str:
    """The checkpoint directory an adapter was trained on: its ``base_model_name_or_path`` as given (a
    directory, ``builtin:NAME``), else relative to the adapter directory."""
    from asyncrl.models.lora import ADAPTER_CONFIG

    config = adapter_dir / ADAPTER_CONFIG
    try:
        base = json.loads(config.read_text()).get("base_model_name_or_path")
    except (OSError, ValueError, AttributeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{key}: {config} is not a readable JSON object ({e})") from None
    if not isinstance(base, str) or not base:
        raise ConfigError(
            f"{key}: {config} names no base model (base_model_name_or_path); it is needed to evaluate the adapter"
        )
    if not base.startswith(BUILTIN_PREFIX) and not Path(base).exists() and (adapter_dir / base).exists():
        base = str(adapter_dir / base)
    return check_model_dir(base, f"{key} (the base model of the adapter in '{adapter_dir}')")


def merge_adapter(model, adapter_dir: Path, key: str = "model.path"):
    """``model`` with the LoRA adapter of ``adapter_dir`` merged into its weights (a plain transformers model
    again: what engines and save_pretrained take)."""
    try:
        from peft import PeftModel
    except ImportError:
        raise ConfigError(
            f"{key}: '{adapter_dir}' is a LoRA adapter; loading it needs peft: pip install 'asyncrl[lora]'"
        ) from None
    try:
        return PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise ConfigError(
            f"{key}: cannot load the LoRA adapter in '{adapter_dir}' onto its base model: "
            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        ) from e


def tokenizer_corpus(task, n_problems: int = 20000, seed: int = 1234) -> list[str]:
    """Text the tokenizer is trained on: problems and solutions of the task plus chat-template words."""
    from asyncrl.data.tokenizer import TEMPLATE_WORDS

    rng = random.Random(seed)
    lines = list(TEMPLATE_WORDS)
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
