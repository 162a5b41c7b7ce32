"""Trust regions anchored on the behaviour policy, for the decoupled objective at any staleness.

The decoupled objective's clip bounds how far the policy moves *within* a step (u = π_θ/π_prox); at one optimizer
step per batch the proximal policy is the policy being trained, so that clip never binds and nothing bounds how far
π_θ has moved from the policy that sampled a token several versions ago, but the cap on the behaviour weight
(docs/algorithms.md, "Which correction at which staleness"). These terms bound that drift, on r = π_θ/π_behav, only
where the token moved in the direction its advantage pushes it further ("harmful": A > 0 and r > 1, or A < 0 and
r < 1), and drop such a token from the loss once it is past the bound (the gradient of naive PPO's clip there):

- ``eps_clip`` (the dual anchor, ``actor.behav_eps_clip``): past r = 1 ± ε_b, as naive PPO's clip anchored on the
  behaviour policy; at one step per batch the decoupled loss with it is naive PPO with the behaviour weight capped;
- ``prob_delta`` (DPPO, arXiv 2602.04879, ``actor.behav_prob_delta``): past a difference of δ in probability,
  p_θ - p_behav > δ (A > 0) or < -δ (A < 0): a total-variation trust region, loose on rare tokens;
- ``m2_budget`` (``actor.behav_m2_budget``): M2PO's adaptive bound (arXiv 2510.01161) on the decoupled loss: none
  while the harmful tokens' mean (log r)² is within the budget, else the bound τ on |log r| that brings it there
  (:func:`m2_bound`); ``policy_loss=m2po`` is M2PO as its authors define it (asyncrl.algo.losses).

Each returns the kept-token mask and what it changed: the fraction of tokens dropped and the loss those tokens
carried (``*_frac``, ``*_delta``), which the run's correction audit reports every step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from asyncrl.algo.offpolicy import safe_log_ratio


@dataclass(frozen=True)
class BehaviourTrust:
    """The behaviour-anchored trust terms in force (None: off), from ``actor.behav_eps_clip``,
    ``actor.behav_prob_delta`` and ``actor.behav_m2_budget``."""

    eps_clip: float | None = None
    prob_delta: float | None = None
    m2_budget: float | None = None

    def __post_init__(self):
        if self.eps_clip is not None and not 0 < self.eps_clip < 1:
            raise ValueError(f"the behaviour clip ε_b must lie in (0, 1), got {self.eps_clip}")
        if self.prob_delta is not None and not 0 < self.prob_delta < 1:
            raise ValueError(f"the probability-difference bound δ must lie in (0, 1), got {self.prob_delta}")
        if self.m2_budget is not None and not self.m2_budget > 0:
            raise ValueError(f"the M2 budget must be > 0, got {self.m2_budget}")

    @property
    def active(self) -> bool:
        return any(v is not None for v in (self.eps_clip, self.prob_delta, self.m2_budget))


def harmful(log_ratio: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """Tokens that moved in the direction their advantage pushes them: A > 0 and r > 1, or A < 0 and r < 1."""
    return ((advantages > 0) & (log_ratio > 0)) | ((advantages < 0) & (log_ratio < 0))


def m2_bound(log_ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, budget: float) -> tuple:
    """M2PO's bound: (τ, M2 before, M2 after) over the harmful tokens of ``mask``. M2 is their mean (log r)²; when
    it exceeds ``budget``, τ is the bound on |log r| such that capping every harmful token's |log r| at τ brings the
    mean to ``budget`` (water-filling over the sorted squares); else τ = inf (no bound)."""
    sq = (log_ratio.detach().double() ** 2)[harmful(log_ratio, advantages) & mask.bool()]
    n = sq.numel()
    if n == 0:
        return math.inf, 0.0, 0.0
    m2 = float(sq.mean())
    if m2 <= budget:
        return math.inf, m2, m2
    s, _ = torch.sort(sq)
    k = torch.arange(n, dtype=s.dtype)
    below = torch.cumsum(s, 0) - s  # below[k]: the sum of the k smallest
    tau_sq = (budget * n - below) / (n - k)  # the k smallest stay, the n - k largest are capped at τ²
    first = int(torch.nonzero(tau_sq <= s)[0])  # the k whose τ² falls between s[k-1] and s[k] (the sum is monotone)
    return math.sqrt(max(float(tau_sq[first]), 0.0)), m2, budget


def behaviour_trust(
    logprobs: torch.Tensor,
    behav_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    token_loss: torch.Tensor,
    trust: BehaviourTrust,
) -> tuple[torch.Tensor, dict]:
    """The kept-token mask (N, T) of the trust terms in ``trust`` and their statistics: for each term the fraction
    of ``mask``'s tokens it dropped and the mean |loss| those tokens carried in ``token_loss`` (no gradient)."""
    m = mask.bool()
    keep = torch.ones_like(m)
    if not trust.active:
        return keep, {}
    log_r = safe_log_ratio(logprobs.detach().float(), behav_logprobs.detach().float())
    pos, neg = advantages > 0, advantages < 0
    n = m.sum().clamp(min=1)
    stats = {}

    def drop(name: str, out: torch.Tensor) -> None:
        nonlocal keep
        out = out & m
        stats[f"{name}_frac"] = float(out.sum() / n)
        stats[f"{name}_delta"] = float((token_loss.detach().abs() * out).sum() / n)
        keep = keep & ~out

    if trust.eps_clip is not None:
        drop("behav_clip", (pos & (log_r > math.log1p(trust.eps_clip))) | (neg & (log_r < math.log1p(-trust.eps_clip))))
    if trust.prob_delta is not None:
        dp = logprobs.detach().float().exp() - behav_logprobs.detach().float().exp()
        drop("prob_mask", (pos & (dp > trust.prob_delta)) | (neg & (dp < -trust.prob_delta)))
    if trust.m2_budget is not None:
        tau, m2, m2_after = m2_bound(log_r, advantages, m, trust.m2_budget)
        drop("m2_mask", harmful(log_r, advantages) & (log_r.abs() > tau))
        stats.update(m2=m2, m2_after=m2_after)
    return keep, stats
