"""What the trainer computes, as plain functions and values, and how the actor config section chooses them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from asyncrl.algo.advantages import grpo
from asyncrl.algo.aggregate import token_mean
from asyncrl.algo.losses import decoupled_ppo
from asyncrl.algo.shaping import RewardShaping


@dataclass
class Algorithm:
    """What the trainer computes, as plain functions and values (``build_trainer`` fills it from the config).
    The defaults are GRPO advantages with the decoupled PPO loss and a token-mean."""

    adv_fn: Callable = grpo
    loss_fn: Callable = decoupled_ppo
    agg_fn: Callable = token_mean
    loss_options: dict = field(default_factory=dict)
    agg_options: dict = field(default_factory=dict)
    shaping: RewardShaping = field(default_factory=RewardShaping)
    gamma: float = 1.0
    lam: float = 1.0
    adv_norm: bool = False
    kl_fn: Callable | None = None  # KL estimator against the reference model, if there is one
    kl_ctl: float = 0.0
    kl_in_loss: bool = False
    prox_method: str = "recompute"  # recompute | loglinear (AReaL's) | loglinear_ahead (from the 2nd minibatch)
    ess_lr: bool = False  # VCPO: each step's learning rate times the ESS of its behaviour weights
    value_eps_clip: float | None = 0.5
    value_loss_coef: float = 0.5


def build_algorithm(cfg, max_new_tokens: int | None = None) -> Algorithm:
    """The plain ``Algorithm`` for an ``ActorConfig`` (registry look-ups; the config stops here)."""
    from asyncrl.algo import ADVANTAGES, AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES
    from asyncrl.algo.offpolicy import BehaviourCorrection
    from asyncrl.algo.trust import BehaviourTrust

    needs_length = cfg.overlong_reward_penalty or (
        cfg.loss_agg_mode == "seq-mean-token-sum-norm" and not cfg.loss_norm_tokens
    )
    if needs_length and max_new_tokens is None:
        raise ValueError(
            "actor.overlong_reward_penalty and Dr.GRPO's seq-mean-token-sum-norm without "
            "actor.loss_norm_tokens need gconfig.max_new_tokens: pass max_new_tokens to build_trainer"
        )
    correction = BehaviourCorrection(
        upper=cfg.behav_imp_weight_cap,
        lower=cfg.behav_imp_weight_floor,
        mode=cfg.behav_imp_weight_mode,
        level=cfg.behav_imp_weight_level,
        metric=cfg.behav_imp_weight_metric,
        agg=cfg.behav_imp_weight_agg,
    )
    return Algorithm(
        adv_fn=ADVANTAGES[cfg.adv_estimator],
        loss_fn=POLICY_LOSSES[cfg.policy_loss],
        agg_fn=AGGREGATIONS[cfg.loss_agg_mode],
        loss_options={
            "eps_clip": cfg.eps_clip,
            "eps_clip_higher": cfg.eps_clip_higher,
            "c_clip": cfg.c_clip,
            "importance_sampling_level": cfg.importance_sampling_level,
            "correction": correction,
            "sapo_tau_pos": cfg.sapo_tau_pos,
            "sapo_tau_neg": cfg.sapo_tau_neg,
            **(
                {"m2_budget": cfg.behav_m2_budget or 0.04}
                if cfg.policy_loss == "m2po"
                else {"trust": BehaviourTrust(cfg.dual_anchor(), cfg.behav_prob_delta, cfg.behav_m2_budget)}
            ),
        },
        agg_options={"norm_tokens": cfg.loss_norm_tokens or max_new_tokens},
        shaping=RewardShaping(
            scaling=cfg.reward_scaling,
            bias=cfg.reward_bias,
            clip=cfg.reward_clip,
            overlong_tokens=cfg.overlong_tokens if cfg.overlong_reward_penalty else 0,
            overlong_penalty_factor=cfg.overlong_penalty_factor,
            max_new_tokens=max_new_tokens,
            zero_truncated=cfg.mask_no_eos_with_zero,
        ),
        gamma=cfg.discount,
        lam=cfg.gae_lambda,
        adv_norm=cfg.adv_norm,
        kl_fn=KL_ESTIMATORS[cfg.kl_estimator],
        kl_ctl=cfg.kl_ctl,
        kl_in_loss=cfg.use_kl_loss,
        prox_method=cfg.prox_logp_method,
        ess_lr=cfg.ess_lr_scale,
        value_eps_clip=cfg.value_eps_clip,
        value_loss_coef=cfg.value_loss_coef,
    )
