"""The critic for PPO-style advantages (GAE): a value head on a trunk, how it is saved and loaded, and the
optimizer step of a separate critic."""

from __future__ import annotations

import math
import os

import torch

from asyncrl.algo.losses import clipped_value_loss


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


def save_critic(
    path: str,
    value_head: dict[str, torch.Tensor],
    critic_model=None,
    critic_weights: dict[str, torch.Tensor] | None = None,
) -> None:
    """``path/value_head.safetensors`` (the value head's ``state_dict``) and, for a separate critic, its trunk in
    HF format beside it (``critic_weights``, else the model's own)."""
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    if critic_model is not None:
        critic_model.save_pretrained(path, state_dict=critic_weights)
    save_file({k: v.detach().contiguous() for k, v in value_head.items()}, os.path.join(path, VALUE_HEAD_FILE))


def load_value_head(path: str, value_head: ValueHead) -> None:
    """Load ``path/value_head.safetensors`` (written by :func:`save_critic`) into ``value_head``."""
    from safetensors.torch import load_file

    value_head.load_state_dict(load_file(os.path.join(path, VALUE_HEAD_FILE)))


def critic_step(trainer, batch, plan, values, returns, value_weights, totals) -> None:
    """One optimizer step of a separate critic (``actor.critic=separate``) on a minibatch's micro-batches
    ``plan``, its statistics added to ``totals``."""
    for group in trainer.critic_optimizer.param_groups:
        group["lr"] = trainer._lr(trainer.critic_lr)
    trainer.critic_optimizer.zero_grad(set_to_none=True)
    total, clip_frac = 0.0, 0.0
    for mb, ids, packed_rows in plan:
        out = trainer.forward.run(trainer.critic_model, batch, ids, packed_rows, logprobs=False, hidden=True)
        L = out.target_len
        d = trainer.forward.dev
        mask = d(batch.loss_mask[ids, :L])
        vloss, vstats = clipped_value_loss(
            trainer.value_head(out.hidden),
            d(values[ids, :L]),
            d(returns[ids, :L]),
            mask,
            value_eps_clip=trainer.algo.value_eps_clip,
        )
        vloss = (vloss * d(value_weights[mb, :L])).sum()
        vloss.backward()
        total += float(vloss.detach())
        clip_frac += vstats["value_clip_frac"] * float(mask.sum())
    params = [p for g in trainer.critic_optimizer.param_groups for p in g["params"]]
    totals["_per_mb_critic_grad_norm"] = totals.get("_per_mb_critic_grad_norm", 0.0) + trainer._clip_and_step(
        trainer.critic_optimizer, params, loss_finite=math.isfinite(total)
    )
    totals["_per_mb_value_loss"] = totals.get("_per_mb_value_loss", 0.0) + total
    totals["value_clip_frac"] = totals.get("value_clip_frac", 0.0) + clip_frac
