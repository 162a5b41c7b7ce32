"""Advantage estimators: pure functions of rewards (and masks), registered by name.

Signature: ``fn(rewards (N,), group_ids (N,), loss_mask (N, T), **options) -> advantages (N, T)``.
Sequence-level estimators broadcast one value over each row's completion tokens.
"""

from __future__ import annotations

import torch


def group_stats(x: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row (mean, unbiased std, size) of the row's group; std is 0 for groups of one."""
    _, inv, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    x64 = x.double()
    sums = torch.zeros(len(counts), dtype=torch.float64).index_add_(0, inv, x64)
    mean = sums / counts
    dev = (x64 - mean[inv]) ** 2
    var = torch.zeros(len(counts), dtype=torch.float64).index_add_(0, inv, dev) / (counts - 1).clamp(min=1)
    return mean[inv], var.sqrt()[inv], counts[inv]


def grpo(rewards: torch.Tensor, group_ids: torch.Tensor, loss_mask: torch.Tensor, eps: float = 1e-6, **_):
    """GRPO: (r - group mean) / (group std + eps) (Shao et al. 2024, DeepSeekMath)."""
    mean, std, _ = group_stats(rewards, group_ids)
    adv = (rewards.double() - mean) / (std + eps)
    return (adv.float()[:, None] * loss_mask).to(torch.float32)


ADVANTAGES = {"grpo": grpo}
