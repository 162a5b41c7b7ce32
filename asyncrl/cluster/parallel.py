"""Data-parallel training over processes: the process group, the model wrapped in DDP or FSDP2, and the few
collectives the trainer needs.

The trainer ranks run the same step on their shard of each batch. The loss is aggregated over the whole
batch (``algo.aggregate`` divides by counts summed over ranks), so the gradient summed over ranks is the
gradient of the global loss. DDP and FSDP2 average gradients over ranks, so each rank's loss is multiplied by
the world size (FSDP2 cannot be told to sum on gloo: its divide factor needs PREMUL_SUM, which gloo lacks). A
gloo that sums where it should average (pytorch#162338) would double the update: the parity test would see it.
Every rank runs the same number of forward and backward passes (ranks with fewer micro-batches run empty ones),
because FSDP gathers parameters in every forward and DDP reduces gradients in the last backward.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

MODES = ("ddp", "fsdp")
_cpu_group = None  # the gloo group of CPU-tensor collectives where the default group is NCCL (None: default)


def all_reduce_cpu(*xs: torch.Tensor) -> None:
    """Sum CPU tensors in place over the trainer ranks (a no-op in one process). The loss's statistics live on
    the CPU whatever the device, and NCCL takes CUDA tensors only: they go through the gloo group."""
    if dist.is_available() and dist.is_initialized():
        for x in xs:
            dist.all_reduce(x, group=_cpu_group)


@dataclass
class DataParallel:
    mode: str  # ddp | fsdp
    rank: int
    world: int
    device: torch.device
    control: object = None  # a gloo group for Python objects (batches, statistics), whatever the device backend

    @property
    def fsdp(self) -> bool:
        return self.mode == "fsdp"

    def wrap(self, model):
        """The model as it trains: DDP around it, or FSDP2 sharding of each decoder layer and the root."""
        if self.mode == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            return DistributedDataParallel(model, device_ids=None if self.device.type == "cpu" else [self.device])
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(self.device.type, (self.world,))  # explicit: never inferred from the accelerator
        for layer in _decoder_layers(model):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model

    @property
    def loss_scale(self) -> float:
        """Both DDP and FSDP2 average gradients over ranks; the losses are shares of one global loss, so
        each is scaled by the world size to make the average the sum."""
        return float(self.world)

    def accumulate(self, model, last: bool):
        """Around one micro-batch's backward: gradients are reduced over ranks only in the last one."""
        if self.mode == "ddp":
            return contextlib.nullcontext() if last else model.no_sync()
        model.set_requires_gradient_sync(last)
        return contextlib.nullcontext()

    def max(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.long)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.control)
        return int(t)

    def all(self, flag: bool) -> bool:
        return self.max(0 if flag else 1) == 0

    def scatter(self, shards: list | None):
        """Rank 0 hands ``shards[r]`` to rank r; every rank returns its own."""
        out = [None]
        dist.scatter_object_list(out, shards if self.rank == 0 else None, src=0, group=self.control)
        return out[0]

    def gather(self, obj) -> list | None:
        """Every rank's ``obj`` on rank 0 (None elsewhere)."""
        out = [None] * self.world if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0, group=self.control)
        return out

    def full_state_dict(self, model) -> dict[str, torch.Tensor]:
        """The full weights on rank 0, on the CPU (every rank must call; the others get {})."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def _decoder_layers(model) -> list:
    inner = getattr(model, "model", model)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(
            f"FSDP wrapping needs the decoder layers at model.model.layers ({type(model).__name__} has "
            "none); use actor.backend=ddp:dN"
        )
    return list(layers)


def from_env(mode: str, device: torch.device, timeout_s: float = 1800.0) -> DataParallel | None:
    """The process group of this trainer rank from the standard ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/
    ``MASTER_PORT`` environment (asyncrl's local launcher, torchrun and the Ray launcher set it); None for a
    single process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return None
    if mode not in MODES:
        raise ValueError(f"data-parallel mode must be one of {MODES}, got '{mode}'")
    rank = int(os.environ["RANK"])
    backend = "nccl" if device.type == "cuda" else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))
    control = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s)) if backend != "gloo" else None
    global _cpu_group
    _cpu_group = control
    return DataParallel(mode, rank, world, device, control)


def shard_groups(token_counts: list[int], world: int) -> list[list[int]]:
    """Group indices split over ``world`` ranks, balanced by tokens (longest first onto the lightest rank);
    whole groups stay on one rank, so group baselines need no communication. Each rank gets at least one."""
    if len(token_counts) < world:
        raise ValueError(f"{len(token_counts)} groups cannot feed {world} trainer ranks")
    loads, shards = [0] * world, [[] for _ in range(world)]
    for g in sorted(range(len(token_counts)), key=lambda i: -token_counts[i]):
        r = min(range(world), key=lambda k: (len(shards[k]) > 0, loads[k]))
        shards[r].append(g)
        loads[r] += token_counts[g]
    return [sorted(s) for s in shards]
