"""Policy losses: pure functions of one :class:`LossInputs` (and their own keyword options) returning a
per-token loss (N, T) and a dict of detached float statistics. The per-token loss is zero outside the mask; the
trainer weights it with an aggregation from :mod:`asyncrl.algo.aggregate` and stays blind to which loss it is.

Every loss but ``ppo`` is *decoupled* (AReaL, arXiv 2505.24298, Eq. 5): its ratio u = π_θ/π_prox is
anchored on the proximal policy and the token's surrogate is multiplied by the behaviour weight
w = π_prox/π_behav, bounded as configured (:mod:`asyncrl.algo.offpolicy`):

    L_t = w_t · S(u_t, A_t).

``importance_sampling_level='sequence'`` replaces u_t by the sequence ratio exp(mean_t log u_t) and A_t by
the sequence's mean advantage (GSPO, Zheng et al. 2025, arXiv 2507.18071). The surrogates S:

- ``decoupled_ppo``: PPO's clip with asymmetric bounds (DAPO clip-higher) and optional dual clip;
- ``sapo``: SAPO's soft gate (Qwen team 2025, arXiv 2511.20347);
- ``cispo``: CISPO's clipped, stop-gradient IS weight on log π_θ (MiniMax-M1, arXiv 2506.13585);
- ``pg``: the unclipped importance-sampled policy gradient (-A·u; REINFORCE when on-policy).

The decoupled losses also take the behaviour-anchored trust terms (``trust``: the dual anchor, DPPO's
probability-difference mask, an M2 budget; :mod:`asyncrl.algo.trust`), which drop a token that has moved too far
from the policy that sampled it, in the direction its advantage pushes.

``ppo`` is the naive baseline: PPO's clip anchored on the behaviour policy, with no correction for its age.
``m2po`` is M2PO as its authors define it: that clip with an adaptive width set by a second-moment budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from asyncrl.algo.offpolicy import BehaviourCorrection, behaviour_weight, safe_log_ratio, sequence_mean
from asyncrl.algo.trust import BehaviourTrust, behaviour_trust, m2_bound

IS_LEVELS = ("token", "sequence")


@dataclass(frozen=True)
class LossInputs:
    """What every policy loss is computed from, one value per target token (N, T)."""

    logprobs: torch.Tensor  # log π_θ, the current policy (with grad)
    prox_logprobs: torch.Tensor  # log π_prox, the proximal policy (recomputed at the step's start, or π_θ detached)
    behav_logprobs: torch.Tensor  # log π_behav, the behaviour policy (the engine's, when the token was sampled)
    advantages: torch.Tensor
    mask: torch.Tensor  # 1 on the tokens trained (completion tokens), else 0


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean of ``x`` over ``mask`` as a float; 0.0 when the mask is empty."""
    n = mask.sum()
    return float((x.detach() * mask).sum() / n) if n > 0 else 0.0


def log_ratio_at_level(logprobs, anchor_logprobs, advantages, mask, level: str = "token"):
    """log u (N, T) of the current policy against ``anchor_logprobs`` and the advantages to pair with it.
    At ``sequence`` level both are each row's mean over its completion tokens (GSPO), broadcast."""
    if level not in IS_LEVELS:
        raise ValueError(f"importance_sampling_level '{level}' is not one of {list(IS_LEVELS)}")
    log_ratio = safe_log_ratio(logprobs, anchor_logprobs.detach())
    if level == "token":
        return log_ratio, advantages
    return sequence_mean(log_ratio, mask), sequence_mean(advantages, mask)


# ---- surrogates S(u, A): per-token losses and their statistics -----------------------------------------
def clip_surrogate(
    log_ratio,
    advantages,
    mask,
    *,
    eps_clip: float = 0.2,
    eps_clip_higher: float | None = None,
    c_clip: float | None = None,
    **_,
):
    """PPO's clipped surrogate (Schulman et al. 2017, Eq. 7) with DAPO's decoupled upper bound
    (arXiv 2503.14476) and dual clip for A < 0 (Ye et al. 2020, arXiv 1912.09729):

        L = max(-A·u, -A·clip(u, 1-ε, 1+ε_high));   if A < 0 and c_clip: L = min(L, c_clip·|A|).
    """
    ratio = log_ratio.exp()
    high = eps_clip if eps_clip_higher is None else eps_clip_higher
    clipped = ratio.clamp(1 - eps_clip, 1 + high)
    unclipped_loss, clipped_loss = -advantages * ratio, -advantages * clipped
    loss = torch.maximum(unclipped_loss, clipped_loss)
    stats = {
        "clip_frac": masked_mean((clipped_loss > unclipped_loss).float(), mask),
        "clip_delta": masked_mean(loss - unclipped_loss, mask),  # what the clip added to the loss, per token
        "ratio_mean": masked_mean(ratio, mask),
    }
    if c_clip is not None:
        bound = c_clip * advantages.abs()
        dual = (advantages < 0) & (loss > bound)
        stats["dual_clip_frac"] = masked_mean(dual.float(), mask)
        stats["dual_clip_delta"] = masked_mean((loss - bound) * dual, mask)
        loss = torch.where(dual, bound, loss)
    return loss, stats


def sapo_surrogate(log_ratio, advantages, mask, *, sapo_tau_pos: float = 1.0, sapo_tau_neg: float = 1.05, **_):
    """SAPO's soft-gated surrogate (arXiv 2511.20347): a sigmoid gate instead of
    a hard clip, with a steeper temperature for negative advantages:

        L = -(4/τ)·σ(τ(u - 1))·A,   τ = τ_pos if A > 0 else τ_neg.

    Its gradient is 4σ(1-σ)·u·A·∇log π, equal to the plain policy gradient at u = 1.
    """
    if sapo_tau_pos <= 0 or sapo_tau_neg <= 0:
        raise ValueError(f"SAPO temperatures must be > 0, got tau_pos={sapo_tau_pos}, tau_neg={sapo_tau_neg}")
    ratio = log_ratio.exp()
    tau = torch.where(advantages > 0, torch.full_like(ratio, sapo_tau_pos), torch.full_like(ratio, sapo_tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1)) * 4.0 / tau
    return -gate * advantages, {"ratio_mean": masked_mean(ratio, mask), "sapo_gate_mean": masked_mean(gate, mask)}


def cispo_surrogate(
    log_ratio, advantages, mask, *, logprobs, eps_clip: float = 0.2, eps_clip_higher: float | None = None, **_
):
    """CISPO (MiniMax-M1, arXiv 2506.13585): clip the importance weight, not the update, and keep
    every token's gradient:

        L = -sg(clip(u, 1-ε, 1+ε_high)) · A · log π_θ.
    """
    ratio = log_ratio.exp()
    high = eps_clip if eps_clip_higher is None else eps_clip_higher
    weight = ratio.clamp(1 - eps_clip, 1 + high).detach()
    clipped = (ratio < 1 - eps_clip) | (ratio > 1 + high)
    # a -inf log-prob (outside the mask, or underflow) contributes neither loss nor gradient
    logp = torch.where(mask.bool() & torch.isfinite(logprobs), logprobs, torch.zeros_like(logprobs))
    return -weight * advantages * logp, {
        "clip_frac": masked_mean(clipped.float(), mask),
        "ratio_mean": masked_mean(ratio, mask),
    }


def pg_surrogate(log_ratio, advantages, mask, **_):
    """Importance-sampled policy gradient without a clip: L = -A·u (∇L = -A·∇log π at u = 1, REINFORCE)."""
    ratio = log_ratio.exp()
    return -advantages * ratio, {"ratio_mean": masked_mean(ratio, mask)}


# ---- objectives (the registry) ------------------------------------------------------------------------
def _decoupled(
    surrogate,
    x: LossInputs,
    *,
    importance_sampling_level: str = "token",
    correction: BehaviourCorrection = BehaviourCorrection(),
    trust: BehaviourTrust = BehaviourTrust(),
    **options,
):
    log_ratio, adv = log_ratio_at_level(x.logprobs, x.prox_logprobs, x.advantages, x.mask, importance_sampling_level)
    loss, stats = surrogate(log_ratio, adv, x.mask, logprobs=x.logprobs, **options)
    weight, keep, weight_stats = behaviour_weight(x.prox_logprobs, x.behav_logprobs, x.mask, correction)
    raw = safe_log_ratio(x.prox_logprobs.detach().float(), x.behav_logprobs.detach().float()).exp() * x.mask
    weight_stats["behav_weight_delta"] = masked_mean((loss * (weight * keep - raw)).abs(), x.mask)
    trusted, trust_stats = behaviour_trust(x.logprobs, x.behav_logprobs, x.advantages, x.mask, loss * weight, trust)
    return loss * weight * keep * trusted, {**stats, **weight_stats, **trust_stats}


def decoupled_ppo(x: LossInputs, **options):
    """Decoupled PPO (AReaL, arXiv 2505.24298, Eq. 5): the clip is anchored on the proximal policy and the
    behaviour policy enters only through the bounded weight w = π_prox/π_behav:

        L_t = w_t · max(-A_t·u_t, -A_t·clip(u_t, 1-ε, 1+ε_high)),   u_t = π_θ/π_prox.
    """
    return _decoupled(clip_surrogate, x, **options)


def sapo(x: LossInputs, **options):
    """SAPO's soft gate, decoupled: L_t = w_t · (-(4/τ)·σ(τ(u_t - 1))·A_t)."""
    return _decoupled(sapo_surrogate, x, **options)


def cispo(x: LossInputs, **options):
    """CISPO, decoupled: L_t = w_t · (-sg(clip(u_t, 1-ε, 1+ε_high))·A_t·log π_θ)."""
    return _decoupled(cispo_surrogate, x, **options)


def pg(x: LossInputs, **options):
    """Plain (importance-sampled) policy gradient, decoupled: L_t = -w_t·A_t·u_t."""
    return _decoupled(pg_surrogate, x, **options)


def m2po(x: LossInputs, *, m2_budget: float = 0.04, **_):
    """M2PO as its authors define it (Zheng et al. 2025, arXiv 2510.01161; their code, the shipped script): PPO's
    clip anchored on the behaviour policy, r = π_θ/π_behav, with bounds [e^-τ, e^τ] set per micro-batch by the
    second-moment budget (:func:`asyncrl.algo.trust.m2_bound`: no bound while the tokens that moved in their
    advantage's direction have mean (log r)² ≤ ``m2_budget``); no behaviour weight:

        L_t = max(-A_t·r_t, -A_t·clip(r_t, e^-τ, e^τ)).
    """
    log_ratio = safe_log_ratio(x.logprobs, x.behav_logprobs.detach())
    tau, m2, m2_after = m2_bound(log_ratio, x.advantages, x.mask, m2_budget)
    ratio = log_ratio.exp()
    unclipped_loss = -x.advantages * ratio
    loss = (
        unclipped_loss
        if math.isinf(tau)
        else torch.maximum(unclipped_loss, -x.advantages * ratio.clamp(math.exp(-tau), math.exp(tau)))
    )
    return loss * x.mask, {
        "m2_clip_frac": masked_mean((loss > unclipped_loss).float(), x.mask),
        "m2_clip_delta": masked_mean(loss - unclipped_loss, x.mask),
        "m2": m2,
        "m2_after": m2_after,
        "ratio_mean": masked_mean(ratio, x.mask),
    }


def ppo(x: LossInputs, *, importance_sampling_level: str = "token", **options):
    """Standard PPO clip anchored on the behaviour policy, with no correction for how old it is: the
    naive baseline that degrades with staleness (AReaL Table 2). Correct only on-policy (η = 0)."""
    log_ratio, adv = log_ratio_at_level(x.logprobs, x.behav_logprobs, x.advantages, x.mask, importance_sampling_level)
    loss, stats = clip_surrogate(log_ratio, adv, x.mask, **options)
    return loss * x.mask, stats


POLICY_LOSSES = {"decoupled_ppo": decoupled_ppo, "ppo": ppo, "sapo": sapo, "cispo": cispo, "pg": pg, "m2po": m2po}
OFF_POLICY_CORRECTED = frozenset({"decoupled_ppo", "sapo", "cispo", "pg", "m2po"})
"""Losses that correct for stale behaviour policies (safe with rollout.max_head_offpolicyness > 0)."""
DECOUPLED = frozenset({"decoupled_ppo", "sapo", "cispo", "pg"})
"""Losses anchored on the proximal policy with the behaviour weight: the behaviour trust terms apply to them."""


def dual_anchor(policy_loss: str, eps_clip, behav_eps_clip):
    """``actor.behav_eps_clip`` as it applies (``auto`` resolved): on a decoupled loss whose ``eps_clip`` is a
    ratio half-width in (0, 1), that width; None on the others (anchored on the behaviour policy already) and
    where ``eps_clip`` is not such a width (the CISPO preset's 1.0 puts no lower bound on the weight)."""
    if behav_eps_clip != "auto":
        return behav_eps_clip
    width = isinstance(eps_clip, (int, float)) and not isinstance(eps_clip, bool) and 0 < eps_clip < 1
    return eps_clip if policy_loss in DECOUPLED and width else None


def clipped_value_loss(values, old_values, returns, mask, *, value_eps_clip: float | None = 0.5):
    """PPO's clipped value loss (AReaL's critic; Schulman et al. 2017 code), per token:

    L = max(½(V - R)², ½(V_old + clip(V - V_old, ±ε_v) - R)²);   ε_v = None: ½(V - R)².
    """
    unclipped = 0.5 * (values - returns) ** 2
    if value_eps_clip is None:
        return unclipped * mask, {"value_clip_frac": 0.0}
    v_clipped = old_values + (values - old_values).clamp(-value_eps_clip, value_eps_clip)
    clipped = 0.5 * (v_clipped - returns) ** 2
    return torch.maximum(unclipped, clipped) * mask, {
        "value_clip_frac": masked_mean((clipped > unclipped).float(), mask)
    }
