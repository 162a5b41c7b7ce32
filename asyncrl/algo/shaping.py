"""Reward shaping: pure functions of sequence rewards, applied before advantages are estimated.

The order follows AReaL's advantage pipeline (arXiv 2505.24298 code, ``_compute_advantages``):

1. DAPO's soft overlong penalty is added to the reward (Yu et al. 2025, arXiv 2503.14476);
2. ``r = clip((r + bias) * scaling, -clip, clip)``;
3. optionally, samples that hit ``max_new_tokens`` without an end-of-sequence token get reward 0
   (``mask_no_eos_with_zero``: the reward of a cut-off answer says nothing about the answer).

Then ``place_at_last_token`` turns sequence rewards into per-token rewards for token-level estimators
(REINFORCE++ returns, GAE): the reward is credited to the last completion token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RewardShaping:
    """Plain reward-shaping settings (built from ``ActorConfig``; see its keys of the same names)."""

    scaling: float = 1.0
    bias: float = 0.0
    clip: float | None = 20.0
    overlong_tokens: int = 0  # DAPO's L_cache; 0 = no overlong penalty
    overlong_penalty_factor: float = 1.0
    max_new_tokens: int | None = None  # DAPO's L_max
    zero_truncated: bool = False


def overlong_penalty(
    lengths: torch.Tensor, max_new_tokens: int, overlong_tokens: int, factor: float = 1.0
) -> torch.Tensor:
    """DAPO's soft overlong punishment (arXiv 2503.14476) for completion ``lengths`` (N,):

        R_len(y) = 0                                  if |y| <= L_max - L_cache
                 = ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
                 = -1                                 if |y| > L_max

    scaled by ``factor``; L_max = ``max_new_tokens``, L_cache = ``overlong_tokens``.
    """
    if not 0 < overlong_tokens <= max_new_tokens:
        raise ValueError(f"overlong_tokens must be in (0, max_new_tokens={max_new_tokens}], got {overlong_tokens}")
    excess = lengths.double() - (max_new_tokens - overlong_tokens)
    penalty = (-excess / overlong_tokens).clamp(min=-1.0, max=0.0)
    return (penalty * factor).to(torch.float32)


def shape_rewards(
    rewards: torch.Tensor, lengths: torch.Tensor, truncated: torch.Tensor, shaping: RewardShaping
) -> tuple[torch.Tensor, dict]:
    """Shaped sequence rewards (N,) and statistics. ``lengths`` are completion lengths (N,); ``truncated``
    (N,) bool marks samples stopped by ``max_new_tokens`` (no end-of-sequence token)."""
    r = rewards.to(torch.float32)
    stats = {}
    if shaping.overlong_tokens > 0:
        if shaping.max_new_tokens is None:
            raise ValueError("the overlong penalty needs max_new_tokens (DAPO's L_max)")
        pen = overlong_penalty(
            lengths, shaping.max_new_tokens, shaping.overlong_tokens, shaping.overlong_penalty_factor
        )
        r = r + pen
        stats["overlong_penalty_mean"] = float(pen.mean()) if len(pen) else 0.0
        stats["overlong_frac"] = float((pen < 0).float().mean()) if len(pen) else 0.0
    r = (r + shaping.bias) * shaping.scaling
    if shaping.clip is not None:
        r = r.clamp(-shaping.clip, shaping.clip)
    if shaping.zero_truncated:
        r = torch.where(truncated.bool(), torch.zeros_like(r), r)
    stats["reward_shaped_mean"] = float(r.mean()) if len(r) else 0.0
    return r, stats


def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """Index (N,) of the last position where ``mask`` (N, T) is set; -1 for rows with no set position."""
    T = mask.shape[-1]
    positions = torch.arange(T, device=mask.device).expand_as(mask)
    return torch.where(mask.bool(), positions, torch.full_like(positions, -1)).max(dim=-1).values


def place_at_last_token(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token rewards (N, T): each sequence reward on its last completion token, 0 elsewhere."""
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    idx = last_token_index(mask)
    rows = torch.nonzero(idx >= 0).squeeze(-1)
    out[rows, idx[rows]] = rewards[rows].to(torch.float32)
    return out
