"""The ``model`` section: which checkpoint, its dtype, LoRA adapters; and the defaults a model asks for."""

from __future__ import annotations

from dataclasses import dataclass, field

from asyncrl.configlib import ConfigError

TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The modules that get adapters by default: every linear layer of a Llama/Qwen decoder block."""


@dataclass
class LoraConfig:
    rank: int = 0
    """LoRA rank r (0 = off: every weight trains)."""
    alpha: float = 16.0
    """LoRA scaling numerator: the update is B @ A * alpha / rank."""
    dropout: float = 0.0
    """Dropout on the adapter's input."""
    target_modules: list[str] = field(default_factory=lambda: list(TARGET_MODULES))
    """Module names that get adapters (matched as peft does: by the last part of the module name)."""

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    def validate(self) -> None:
        if self.rank < 0:
            raise ConfigError(f"model.lora.rank must be >= 0 (0 = off), got {self.rank}")
        if not self.enabled:
            return
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"model.lora.dropout must be in [0, 1), got {self.dropout}")
        if not self.alpha > 0:
            raise ConfigError(f"model.lora.alpha must be > 0, got {self.alpha}")
        if not self.target_modules or not all(isinstance(m, str) and m for m in self.target_modules):
            raise ConfigError(f"model.lora.target_modules must be a list of module names, got {self.target_modules!r}")


@dataclass
class ModelConfig:
    path: str = "builtin:tiny-sft"
    """A Hugging Face model directory, or ``builtin:NAME`` for a checkpoint shipped with asyncrl."""
    dtype: str = "float32"
    """Weights dtype for training and generation: float32 | bfloat16."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters (through peft; rank 0 = off, every weight trains)."""
