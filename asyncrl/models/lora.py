"""LoRA through ``peft``: adapters on chosen modules for SFT and RL (``model.lora.*``).

Only the adapter weights train and go into checkpoints (``adapter_model.safetensors`` +
``adapter_config.json``, loadable with ``peft.PeftModel.from_pretrained``), with a merged Hugging Face export
beside them. Engines get merged weights: the base weights plus ``B @ A * alpha / r`` of every adapter.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from asyncrl.configlib import ConfigError
from asyncrl.models.config import TARGET_MODULES

MERGED_DIR = "merged"
"""Where ``save_lora`` writes the merged Hugging Face export, inside the adapter's directory."""
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_ADAPTER_PARTS = frozenset(("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "lora_magnitude_vector"))


def _peft():
    """``peft``, imported on first use: the core runs without it."""
    try:
        import peft
    except ImportError as e:
        raise ConfigError(
            f"model.lora.rank > 0 needs peft, which is not installed ({e}); install the lora extra: "
            'pip install -e ".[lora]"'
        ) from None
    return peft


def is_lora(model) -> bool:
    """Whether ``model`` is a peft model (never imports peft: a model cannot be one if peft was never imported)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def apply_lora(
    model,
    rank: int,
    alpha: float = 16.0,
    dropout: float = 0.0,
    target_modules: list[str] | tuple[str, ...] = TARGET_MODULES,
):
    """``model`` with LoRA adapters of ``rank`` on the modules ``target_modules`` names (a ``peft`` model in which
    only the adapters train; the update is ``B @ A * alpha / rank``), or ``model`` unchanged when ``rank`` is 0.
    peft injects the adapters into ``model`` itself: take what it needs from the plain model (e.g. an engine's
    copy of the weights) before. A name that matches no module, or a module peft cannot adapt, is a
    ``ConfigError`` naming ``model.lora.target_modules``."""
    if rank <= 0:
        return model
    peft = _peft()
    _check_targets(model, target_modules)
    config = peft.LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=list(target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        return peft.get_peft_model(model, config)
    except (ValueError, TypeError) as e:  # e.g. a target that is not a layer type peft adapts
        why = " ".join(str(e).split())[:200] or type(e).__name__
        raise ConfigError(f"model.lora.target_modules={list(target_modules)}: peft cannot adapt them: {why}") from None


def _check_targets(model, targets: list[str]) -> None:
    """Each target must match a module as peft matches it (the whole name, or its last dotted parts): a typo
    would otherwise leave part of the model without adapters, silently."""
    modules = [(n, m) for n, m in model.named_modules() if n]
    linear = ", ".join(sorted({n.rsplit(".", 1)[-1] for n, m in modules if isinstance(m, torch.nn.Linear)}))
    for target in targets:
        matched = [m for n, m in modules if n == target or n.endswith("." + target)]
        if not matched:
            raise ConfigError(
                f"model.lora.target_modules: '{target}' matches no module of {type(model).__name__} "
                f"(its linear layers: {linear})"
            )
        odd = next((m for m in matched if not _adaptable(m)), None)
        if odd is not None:
            raise ConfigError(
                f"model.lora.target_modules: '{target}' is a {type(odd).__name__}, not a layer LoRA "
                f"adapts (linear, embedding, convolution); its linear layers: {linear}"
            )


def _adaptable(module) -> bool:
    return (
        isinstance(module, (torch.nn.Linear, torch.nn.Embedding, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d))
        or type(module).__name__ == "Conv1D"
    )  # transformers' GPT-2 layer


def trainable_summary(model) -> dict:
    """Trainable and total parameter counts (adapters included in the total) and the trainable fraction."""
    total = trainable = 0
    for p in model.parameters():
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    return {"trainable": trainable, "total": total, "fraction": trainable / max(total, 1)}


@torch.no_grad()
def merged_state_dict(model) -> dict[str, torch.Tensor]:
    """The full weights with every active adapter merged, ``W + B @ A * alpha / r``, under the plain Hugging Face
    names of the base model (the keys of its own ``state_dict()``), for engines and exports. The model is not
    changed: merged weights are new tensors, the others are the live (frozen) base tensors. A model without
    adapters: its ``state_dict()``."""
    if not is_lora(model):
        return model.state_dict()
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    active = model.active_adapters
    merged = {}
    for name, module in base.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        adapters = [a for a in active if a in module.lora_A or a in module.lora_embedding_A]
        if any(module.use_dora.get(a) or module.lora_bias.get(a) for a in adapters):
            raise NotImplementedError(f"{name}: merging DoRA or LoRA-bias adapters is not supported")
        weight = module.get_base_layer().weight.detach()
        for a in adapters:
            weight = _plus_delta(module, a, weight)
        merged[f"{name}.weight"] = weight
    out = {}
    for key, tensor in base.state_dict().items():
        parts = key.split(".")
        if _ADAPTER_PARTS.intersection(parts):
            continue
        plain = ".".join(p for p in parts if p != "base_layer")
        out[plain] = merged.get(plain, tensor)
    return out


def _plus_delta(module, adapter: str, weight: torch.Tensor) -> torch.Tensor:
    """A new tensor: ``weight`` plus the adapter's ``B @ A * scaling`` (one fused ``addmm`` for a plain linear
    layer; peft's own ``get_delta_weight`` for the others: embeddings, convolutions, transposed layouts)."""
    if (
        adapter in module.lora_A
        and not getattr(module, "fan_in_fan_out", False)
        and isinstance(module.get_base_layer(), torch.nn.Linear)
    ):
        A, B = module.lora_A[adapter].weight, module.lora_B[adapter].weight
        if A.dtype == B.dtype == weight.dtype:
            return torch.addmm(weight, B, A, alpha=module.scaling[adapter])
    return weight + module.get_delta_weight(adapter).to(weight.dtype)


def save_lora(model, path: str | Path, tokenizer=None) -> None:
    """The adapter at ``path`` (peft's ``save_pretrained``: adapter_model.safetensors + adapter_config.json,
    loadable with ``peft.PeftModel.from_pretrained(base_model, path)``) and the merged model as a Hugging Face
    checkpoint in ``path/merged`` (with the tokenizer). A model without adapters: a plain ``save_pretrained``."""
    path = Path(path)
    if not is_lora(model):
        model.save_pretrained(path)
        if tokenizer is not None:
            tokenizer.save_pretrained(path)
        return
    model.save_pretrained(str(path))
    merged = path / MERGED_DIR
    model.get_base_model().save_pretrained(str(merged), state_dict=merged_state_dict(model))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(merged))


def is_adapter_dir(path: str | Path) -> bool:
    """Whether ``path`` holds a saved adapter (``save_lora`` of a peft model)."""
    return (Path(path) / ADAPTER_CONFIG).is_file()


def load_adapter(model, path: str | Path) -> None:
    """Load the adapter weights ``save_lora`` wrote at ``path`` into ``model`` (made by ``apply_lora`` with the
    same rank and targets); a file that does not fit is a ``ValueError`` naming what differs."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors.torch import load_file

    file = Path(path) / ADAPTER_WEIGHTS
    saved = load_file(str(file))
    expected = get_peft_model_state_dict(model)
    if set(saved) != set(expected):
        odd = sorted(set(saved) ^ set(expected))[:3]
        raise ValueError(f"the adapter in {file} does not fit this model's model.lora (rank and targets): {odd}")
    for key, tensor in saved.items():
        if tensor.shape != expected[key].shape:
            raise ValueError(
                f"the adapter in {file} does not fit this model's model.lora: {key} has shape "
                f"{tuple(tensor.shape)}, expected {tuple(expected[key].shape)}"
            )
    set_peft_model_state_dict(model, saved)


class AdaptersOff:
    """The base model under a peft model: calling it runs ``model`` with its adapters disabled and in eval mode
    (a frozen reference policy without a second copy of the weights). Not a module, so that freezing it cannot
    freeze the policy's adapters."""

    def __init__(self, model):
        self.model = model

    def __call__(self, *args, **kwargs):
        training = self.model.training
        self.model.eval()
        try:
            with self.model.disable_adapter():
                return self.model(*args, **kwargs)
        finally:
            self.model.train(training)
