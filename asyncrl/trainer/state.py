"""A trainer's state beyond the weights it publishes: what an exact resume needs (optimizer, step count, value
head; under FSDP each rank's optimizer shard) and the checkpoint in HF format (with LoRA: the adapter and the
merged model), written now or from a copy taken now (``snapshot``, for a checkpoint written in the background)."""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from asyncrl.api.trainer import NonFiniteWeights
from asyncrl.models.lora import is_lora, save_lora
from asyncrl.trainer.critic import CRITIC_DIR, save_critic


def finite(t: torch.Tensor) -> bool:
    """Whether every element of ``t`` is finite. A finite sum proves it (NaN and inf propagate through a sum);
    only a sum that overflowed or met one needs the element-wise check. A sum reads the tensor once without
    allocating, which matters at every checkpoint (docs/fault-tolerance.md)."""
    return bool(torch.isfinite(t.sum())) or bool(torch.isfinite(t).all())


OPTIMIZER_SHARDS = "optimizer-shards"
"""Where each FSDP rank writes its shard of the optimizer state in a checkpoint (torch.distributed.checkpoint)."""


def training_state(trainer, directory: str | None = None) -> dict:
    """What an exact resume needs beyond the weights: the optimizers' state, the step count and the value
    head. Under FSDP every rank must call this with the same ``directory``: each rank writes its shard of
    the optimizer state there (``torch.distributed.checkpoint``, subdirectory ``OPTIMIZER_SHARDS``); without
    one it is gathered whole to rank 0."""
    if trainer.dp is not None and trainer.dp.fsdp:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        if directory is not None:
            dcp.save(
                {"optimizer": get_optimizer_state_dict(trainer.model, trainer.optimizer)},
                checkpoint_id=str(Path(directory) / OPTIMIZER_SHARDS),
            )
            optim = OPTIMIZER_SHARDS
        else:
            optim = get_optimizer_state_dict(
                trainer.model, trainer.optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
            )
    else:
        optim = trainer.optimizer.state_dict()
    return {
        "optimizer": optim,
        "steps_done": trainer.steps_done,
        "critic_optimizer": None if trainer.critic_optimizer is None else trainer.critic_optimizer.state_dict(),
        "value_head": None if trainer.value_head is None else trainer.value_head.state_dict(),
    }


def load_training_state(trainer, state: dict, directory: str | None = None) -> None:
    """Restore ``training_state()`` saved in ``directory`` (under FSDP on every rank: each reads the shards
    it needs, whatever the number of ranks that wrote them)."""
    if trainer.dp is not None and trainer.dp.fsdp:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
            set_optimizer_state_dict,
        )

        if state["optimizer"] == OPTIMIZER_SHARDS:
            optim = {"optimizer": get_optimizer_state_dict(trainer.model, trainer.optimizer)}
            dcp.load(optim, checkpoint_id=str(Path(directory) / OPTIMIZER_SHARDS))
            set_optimizer_state_dict(trainer.model, trainer.optimizer, optim_state_dict=optim["optimizer"])
        else:
            set_optimizer_state_dict(
                trainer.model,
                trainer.optimizer,
                optim_state_dict=state["optimizer"],
                options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
            )
    else:
        trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.steps_done = state["steps_done"]
    if state.get("critic_optimizer") is not None and trainer.critic_optimizer is not None:
        trainer.critic_optimizer.load_state_dict(state["critic_optimizer"])
    if state.get("value_head") is not None and trainer.value_head is not None:
        trainer.value_head.load_state_dict(state["value_head"])


def save(trainer, path: str, tokenizer=None) -> None:
    """The policy in HF format at ``path`` (with LoRA: the adapter there, the merged model and the tokenizer
    in ``path/merged/``); a critic (separate model and/or value head) in ``path/critic/``, which
    ``actor.critic_path`` loads back. Non-finite weights are refused."""
    trainer.check_finite()
    if is_lora(trainer.module):
        save_lora(trainer.module, path, tokenizer)
    else:
        trainer.module.save_pretrained(path, state_dict=trainer.state_dict())
        if tokenizer is not None:
            tokenizer.save_pretrained(path)
    if trainer.value_head is not None:
        save_critic(os.path.join(path, CRITIC_DIR), trainer.value_head.state_dict(), trainer.critic_model)


@dataclass(frozen=True)
class WeightsCopy:
    """The policy's (and critic's) weights copied at one moment, to be written in HF format later, from another
    thread, while training goes on: the live models lend only their configs and ``save_pretrained``."""

    module: torch.nn.Module
    policy: dict
    value_head: dict | None = None
    critic_model: torch.nn.Module | None = None
    critic: dict | None = None

    def save(self, path: str, tokenizer=None) -> None:
        self.module.save_pretrained(path, state_dict=dict(self.policy))  # save_pretrained empties the dict it gets
        if tokenizer is not None:
            tokenizer.save_pretrained(path)
        if self.value_head is not None:
            save_critic(
                os.path.join(path, CRITIC_DIR),
                self.value_head,
                self.critic_model,
                None if self.critic is None else dict(self.critic),
            )


def snapshot(trainer) -> WeightsCopy | None:
    """A CPU copy of the trainer's weights now; None where only the trainer itself can write them (sharded
    FSDP weights, a LoRA adapter with its merged export): those checkpoints are written in the foreground."""
    if (trainer.dp is not None and trainer.dp.fsdp) or is_lora(trainer.module):
        return None
    trainer.check_finite()
    critic = trainer.critic_model
    return WeightsCopy(
        trainer.module,
        cpu_copy(trainer.state_dict()),
        None if trainer.value_head is None else cpu_copy(trainer.value_head.state_dict()),
        critic,
        None if critic is None else cpu_copy(critic.state_dict()),
    )


def cpu_copy(obj, memo: dict | None = None):
    """``obj`` (tensors in dicts, lists and tuples, e.g. an optimizer's ``state_dict``) with every tensor copied
    to the CPU; tensors that share storage (tied weights) share it in the copy too, so ``save_pretrained`` still
    sees them tied."""
    memo = {} if memo is None else memo
    if isinstance(obj, torch.Tensor):
        key = (obj.device, obj.untyped_storage().data_ptr(), obj.storage_offset(), tuple(obj.shape), obj.stride())
        if key not in memo:
            memo[key] = obj.detach().to("cpu", copy=True)
        return memo[key]
    if isinstance(obj, dict):
        return type(obj)((k, cpu_copy(v, memo)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(cpu_copy(v, memo) for v in obj)
    return copy.deepcopy(obj)


def check_finite(trainer) -> None:
    """Raise ``NonFiniteWeights`` naming the first weight of ``trainer`` (policy, value head, critic) that holds
    NaN or inf."""
    parts = [
        ("policy", trainer.state_dict().items()),
        ("value head", trainer.value_head),
        ("critic", trainer.critic_model),
    ]
    for what, tensors in parts:
        items = tensors.named_parameters() if isinstance(tensors, torch.nn.Module) else tensors or ()
        for name, p in items:
            if not finite(p):
                raise NonFiniteWeights(f"the {what} weight '{name}' holds NaN or inf values")


def update_norm(optimizer: torch.optim.Optimizer, dp=None) -> float | None:
    """The global norm of the update the (Adam/AdamW) ``optimizer`` step just applied, from its state: per
    parameter lr/(1-β1^t) · m / (sqrt(v/(1-β2^t)) + ε), plus the decoupled weight decay lr·λ·θ (of the weights
    after the step: a second-order difference). Summed over FSDP shards (``dp``). None for another optimizer."""
    if not all("betas" in group for group in optimizer.param_groups):
        return None
    total = torch.zeros((), dtype=torch.float64)
    for group in optimizer.param_groups:
        beta1, beta2 = group["betas"]
        for p in group["params"]:
            st = optimizer.state.get(p)
            if not st or "exp_avg" not in st:
                continue
            step = float(st["step"])
            m, v, w = (_local(x) for x in (st["exp_avg"], st["exp_avg_sq"], p.detach()))  # an FSDP rank's shard
            delta = m / (v / (1 - beta2**step)).sqrt().add_(group["eps"]) * (group["lr"] / (1 - beta1**step))
            if group.get("weight_decay"):
                delta = delta + group["lr"] * group["weight_decay"] * w
            total += delta.double().pow(2).sum().cpu()
    if dp is not None and dp.fsdp:
        from asyncrl.cluster.parallel import all_reduce_cpu

        all_reduce_cpu(total)
    return float(total.sqrt())


def _local(t: torch.Tensor) -> torch.Tensor:
    """A tensor's local part: an FSDP2 ``DTensor``'s shard on this rank, any other tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t
