"""Config sections for where a run's processes go."""

from __future__ import annotations

from dataclasses import dataclass

from asyncrl.configlib import ConfigError

DEVICES = ("auto", "cpu", "cuda")
LAUNCHERS = ("local", "ray")


@dataclass
class ClusterConfig:
    device: str = "auto"
    """auto (cuda when a GPU is visible, else cpu) | cpu | cuda. Training, the built-in engine and weight
    hand-over use it; CPU runs are unchanged."""
    ray_address: str = ""
    """launcher=ray: the address of an existing Ray cluster (e.g. ray://head:10001 or auto); empty = start a
    local Ray with this machine's cores."""
    master_port: int = 0
    """The rendezvous port of the trainer ranks (0 = a free one)."""

    def validate(self) -> None:
        if self.device not in DEVICES:
            raise ConfigError(f"cluster.device must be one of {list(DEVICES)}, got '{self.device}'")
        if not 0 <= self.master_port <= 65535:
            raise ConfigError(f"cluster.master_port must lie in 0..65535, got {self.master_port}")

    def resolved_device(self) -> str:
        import torch

        if self.device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("cluster.device=cuda, but torch sees no CUDA device (cluster.device=auto falls back "
                              "to the CPU)")
        return self.device
