"""Policy losses: pure functions returning a per-token loss (N, T) and a dict of detached statistics.

All take the same keyword arguments: ``logprobs`` (current policy, with grad), ``prox_logprobs`` (the
proximal policy, recomputed), ``behav_logprobs`` (from the engine), ``advantages`` and ``mask``, plus their
own options. The trainer aggregates the per-token loss (token mean over the batch) and stays blind to
which loss it is.
"""

from __future__ import annotations

import torch

LOG_RATIO_LIMIT = 20.0  # log-ratios are clamped so that a -inf log-prob can never produce inf/NaN


def _log_ratio(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nan_to_num(a - b, nan=0.0).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    n = mask.sum()
    return float((x * mask).sum() / n) if n > 0 else 0.0


def _clipped_surrogate(log_ratio, advantages, eps_clip, eps_clip_higher):
    ratio = log_ratio.exp()
    high = eps_clip if eps_clip_higher is None else eps_clip_higher
    clipped = ratio.clamp(1 - eps_clip, 1 + high)
    loss = torch.maximum(-advantages * ratio, -advantages * clipped)
    clip_frac = (-advantages * clipped > -advantages * ratio).float()
    return loss, ratio, clip_frac


def decoupled_ppo(
    *,
    logprobs: torch.Tensor,
    prox_logprobs: torch.Tensor,
    behav_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_clip: float = 0.2,
    eps_clip_higher: float | None = None,
    behav_imp_weight_cap: float | None = None,
    **_,
):
    """Decoupled PPO (AReaL, arXiv 2505.24298, Eq. 5): the clip is anchored on the proximal policy and the
    behaviour policy enters as the importance weight w = π_prox/π_behav, truncated at ``behav_imp_weight_cap``:

        L_t = w_t · max(-A_t·u_t, -A_t·clip(u_t, 1-ε, 1+ε_high)),   u_t = π_θ/π_prox.
    """
    loss, ratio, clip_frac = _clipped_surrogate(_log_ratio(logprobs, prox_logprobs), advantages, eps_clip,
                                                eps_clip_higher)
    behav_log_w = _log_ratio(prox_logprobs, behav_logprobs).detach()
    weight = behav_log_w.exp()
    capped = torch.zeros_like(weight)
    if behav_imp_weight_cap is not None:
        capped = (weight > behav_imp_weight_cap).float()
        weight = weight.clamp(max=behav_imp_weight_cap)
    stats = {
        "clip_frac": _masked_mean(clip_frac, mask),
        "ratio_mean": _masked_mean(ratio.detach(), mask),
        "behav_weight_mean": _masked_mean(weight, mask),
        "behav_weight_max": float((weight * mask).max()) if mask.any() else 0.0,
        "behav_weight_capped_frac": _masked_mean(capped, mask),
        "behav_kl": _masked_mean(-behav_log_w, mask),  # k1 estimate of KL(π_behav || π_prox)
    }
    return loss * weight * mask, stats


def ppo(*, logprobs, behav_logprobs, advantages, mask, eps_clip: float = 0.2,
        eps_clip_higher: float | None = None, **_):
    """Standard PPO clip anchored on the behaviour policy (no off-policy correction): the naive baseline
    that degrades with staleness (AReaL Table 2)."""
    loss, ratio, clip_frac = _clipped_surrogate(_log_ratio(logprobs, behav_logprobs), advantages, eps_clip,
                                                eps_clip_higher)
    stats = {"clip_frac": _masked_mean(clip_frac, mask), "ratio_mean": _masked_mean(ratio.detach(), mask)}
    return loss * mask, stats


POLICY_LOSSES = {"decoupled_ppo": decoupled_ppo, "ppo": ppo}
