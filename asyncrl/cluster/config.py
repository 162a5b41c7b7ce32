"""The ``cluster`` section: the device, the launcher's cluster, the trainer ranks' rendezvous and the CPU split."""

from __future__ import annotations

from dataclasses import dataclass

from asyncrl.configlib import ConfigError

DEVICES = ("auto", "cpu", "cuda")
CPU_SPLITS = ("fixed", "auto")
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
    cpu_split: str = "auto"
    """auto: where the built-in engine runs in this process beside one trainer rank on the CPU, the two share
    the process's cores: the engine keeps half of them, the trainer the rest and one of the engine's while the
    engine idles (its micro-batches then hold at most 1024 tokens, so that it takes that core within a fraction of
    a step; on 2 cores: 1 + 1 threads, the trainer 2 while the engine idles); at η = 0 the trainer always takes it,
    as the turns alternate; evaluations in the trainer's thread (asyncrl/cluster/cores.py says why) | fixed: the trainer
    uses actor.threads and the built-in engine rollout.threads."""

    def validate(self) -> None:
        if self.device not in DEVICES:
            raise ConfigError(f"cluster.device must be one of {list(DEVICES)}, got '{self.device}'")
        if self.cpu_split not in CPU_SPLITS:
            raise ConfigError(f"cluster.cpu_split must be one of {list(CPU_SPLITS)}, got '{self.cpu_split}'")
        if not 0 <= self.master_port <= 65535:
            raise ConfigError(f"cluster.master_port must lie in 0..65535, got {self.master_port}")

    def resolved_device(self) -> str:
        import torch

        if self.device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError(
                "cluster.device=cuda, but torch sees no CUDA device (cluster.device=auto falls back to the CPU)"
            )
        return self.device
