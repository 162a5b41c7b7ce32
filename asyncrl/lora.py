"""LoRA through ``peft``: adapters on chosen modules for SFT and RL (``model.lora.*``).

Only the adapter weights train and go into checkpoints (``adapter_model.safetensors`` +
``adapter_config.json``, loadable with ``peft.PeftModel.from_pretrained``), with a merged Hugging Face export
beside them. Engines get merged weights: the base weights plus ``B @ A * alpha / r`` of every adapter.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from asyncrl.configlib import ConfigError


@dataclass
class LoraConfig:
    rank: int = 0
    """LoRA rank r (0 = off: every weight trains)."""
    alpha: float = 16.0
    """LoRA scaling numerator: the update is B @ A * alpha / rank."""
    dropout: float = 0.0
    """Dropout on the adapter's input."""
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                          "up_proj", "down_proj"])
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
