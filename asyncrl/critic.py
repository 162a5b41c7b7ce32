"""The critic for PPO-style advantages (GAE): a value head on a trunk, and how it is saved and loaded."""

from __future__ import annotations

import os

import torch


class ValueHead(torch.nn.Module):
    """V(s_t) = w·h_t + b on the last hidden state; zero-initialised, so the first values are 0."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.proj = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.proj.weight)
        torch.nn.init.zeros_(self.proj.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.proj(hidden.float()).squeeze(-1)


CRITIC_DIR = "critic"
VALUE_HEAD_FILE = "value_head.safetensors"


def save_critic(path: str, value_head: ValueHead, critic_model=None) -> None:
    """``path/value_head.safetensors`` and, for a separate critic, its trunk in HF format beside it."""
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    if critic_model is not None:
        critic_model.save_pretrained(path)
    save_file({k: v.detach().contiguous() for k, v in value_head.state_dict().items()},
              os.path.join(path, VALUE_HEAD_FILE))


def load_value_head(path: str, value_head: ValueHead) -> None:
    """Load ``path/value_head.safetensors`` (written by :func:`save_critic`) into ``value_head``."""
    from safetensors.torch import load_file

    value_head.load_state_dict(load_file(os.path.join(path, VALUE_HEAD_FILE)))
