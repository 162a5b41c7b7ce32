"""Per-token KL estimators between a policy and a base policy (a frozen reference model, or the behaviour
policy for rejection sampling), from log-probabilities of the sampled tokens only.

With Δ = log π(y_t) - log π_base(y_t) for y_t sampled from π (Schulman, "Approximating KL divergence", 2020):

    k1 = Δ                      unbiased, can be negative, high variance
    k2 = Δ² / 2                 biased, always >= 0, low variance
    k3 = exp(-Δ) - 1 + Δ        unbiased, always >= 0, low variance (GRPO's choice, DeepSeekMath arXiv 2402.03300)

Each is clamped to ±``KL_CLAMP`` (as AReaL and verl do) so that one token with a near-zero base
probability cannot dominate. -inf log-probs are sanitised (Δ = 0 where it is not finite).
"""

from __future__ import annotations

import torch

KL_CLAMP = 10.0


def _delta(logprobs: torch.Tensor, base_logprobs: torch.Tensor) -> torch.Tensor:
    d = logprobs.float() - base_logprobs.float()
    return torch.where(torch.isfinite(d), d, torch.zeros_like(d))


def k1(logprobs: torch.Tensor, base_logprobs: torch.Tensor) -> torch.Tensor:
    """k1 = log π - log π_base."""
    return _delta(logprobs, base_logprobs).clamp(-KL_CLAMP, KL_CLAMP)


def k2(logprobs: torch.Tensor, base_logprobs: torch.Tensor) -> torch.Tensor:
    """k2 = (log π - log π_base)² / 2."""
    return (0.5 * _delta(logprobs, base_logprobs) ** 2).clamp(-KL_CLAMP, KL_CLAMP)


def k3(logprobs: torch.Tensor, base_logprobs: torch.Tensor) -> torch.Tensor:
    """k3 = π_base/π - 1 - log(π_base/π) = exp(-Δ) - 1 + Δ."""
    d = _delta(logprobs, base_logprobs).clamp(-2 * KL_CLAMP, 2 * KL_CLAMP)  # exp(-Δ) finite; k3 > 10 beyond anyway
    return (torch.exp(-d) - 1 + d).clamp(-KL_CLAMP, KL_CLAMP)


KL_ESTIMATORS = {"k1": k1, "k2": k2, "k3": k3}
