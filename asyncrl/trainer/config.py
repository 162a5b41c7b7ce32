"""Config section for the actor: optimisation and the RL algorithm, with guardrails against silent mistakes.

Key names follow AReaL (``eps_clip``, ``c_clip``, ``kl_ctl``, ``reward_scaling``, ``overlong_*``,
``discount``, ``gae_lambda``, ``importance_sampling_level``, ``prox_logp_method``) and verl
(``loss_agg_mode``, ``use_kl_loss``) where a user would look for them. docs/algorithms.md maps every
algorithm to its keys; ``examples/<algo>.yaml`` are the presets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from asyncrl.configlib import ConfigError

CRITICS = ("none", "value_head", "separate")
PROX_LOGP_METHODS = ("recompute", "loglinear", "loglinear_ahead")


@dataclass
class ActorConfig:
    lr: float = 5e-5
    """AdamW learning rate. RL moves a converged model with a noisy gradient: Adam turns noise into
    lr-sized steps, so keep this ~10-100x below the SFT rate (2e-4 collapses the built-in model). The shipped
    builtin:tiny-sft asks for 1e-5 (its asyncrl_recipe.json: its held-out accuracy holds there and drifts down at
    5e-5); a model of your own gets 5e-5, which lifted fresh tasks fastest (docs/algorithms.md "The learning
    rate")."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.99
    """AdamW beta2."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up steps; then constant in asyncrl train, a cosine decay to 10% of actor.lr
    in asyncrl sft and asyncrl rm."""
    max_grad_norm: float = 1.0
    """Gradient clipping by global norm (0 = off)."""
    mb_max_tokens: int = 8192
    """Micro-batch budget in token positions (rows x width, padding included); gradients accumulate across
    micro-batches, so this bounds memory, not the result."""
    pack_sequences: bool = True
    """Pack samples into shared rows (first-fit-decreasing, position ids restarting per sample, attention kept
    within each sample) so that padding becomes real tokens; same loss as the padded layout to 1e-6."""
    shared_prefix: bool = True
    """Compute each shared token prefix once (a group's prompt, an agent's history, any identical leading
    tokens): the samples of a micro-batch are laid out as prefix trees under a tree attention mask, and the
    gradient through a shared position is the sum of its continuations'; the same loss, gradient and log-probs
    as without (to 1e-5), in every pass (policy, proximal, reference, critic). Turned off, said at start-up,
    where the model's attention takes no tree mask (FlashAttention). docs/algorithms.md "Shared prefixes"."""
    ppo_n_minibatches: int = 1
    """Optimizer steps per training batch, each on a share of its groups (whole groups, dealt in a random order
    fixed by the step number); with 1, the proximal policy equals the current one (no extra forward pass)."""
    ppo_epochs: int = 1
    """Passes over each training batch (each pass: ppo_n_minibatches optimizer steps); more than one reuses the
    batch, with the proximal policy recomputed once before the first."""
    threads: int = 1
    """Torch threads for training (per trainer rank), where the cores are not shared (cluster.cpu_split)."""
    backend: str = "ddp:d1"
    """Trainer processes: ddp:dN (N data-parallel ranks, replicated weights, gradients all-reduced) | fsdp:dN
    (FSDP2: weights, gradients and optimizer state sharded over N ranks). One rank per device on GPUs, one
    process per rank on the CPU; the result does not depend on N (the loss is aggregated over all ranks)."""

    # ---- advantages and rewards ------------------------------------------------------------------------
    adv_estimator: str = "grpo"
    """Advantage estimator (asyncrl.algo.advantages): grpo | dr_grpo | rloo | liteppo | reinforce_pp |
    reinforce_pp_baseline | gae (needs actor.critic)."""
    adv_norm: bool = False
    """Whiten the advantages over every completion token of the batch after the estimator (AReaL's
    adv_norm with batch mean and std)."""
    discount: float = 1.0
    """γ, the discount over completion tokens (reinforce_pp returns, gae)."""
    gae_lambda: float = 1.0
    """λ of generalised advantage estimation (gae)."""
    reward_scaling: float = 1.0
    """Rewards become clip((r + reward_bias) * reward_scaling, ±reward_clip)."""
    reward_bias: float = 0.0
    """Added to every reward before scaling."""
    reward_clip: float = 20.0
    """Rewards are clipped to ±reward_clip after bias and scaling."""
    overlong_reward_penalty: bool = False
    """DAPO's soft overlong penalty: completions longer than gconfig.max_new_tokens - overlong_tokens lose
    up to overlong_penalty_factor reward, linearly in the excess."""
    overlong_tokens: int = 0
    """DAPO's L_cache: the length of the penalised zone before gconfig.max_new_tokens."""
    overlong_penalty_factor: float = 1.0
    """The penalty at gconfig.max_new_tokens."""
    mask_no_eos_with_zero: bool = False
    """Reward 0 for samples cut off at gconfig.max_new_tokens (no end-of-sequence token)."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling: drop groups whose rewards are all equal (they carry no signal under a group
    baseline) and admit more prompts, so every batch keeps train_dataset.batch_size informative groups."""

    # ---- KL to a frozen reference model ------------------------------------------------------------------
    kl_ctl: float = 0.0
    """β, the coefficient of the KL penalty to the reference model (0 = none)."""
    kl_estimator: str = "k1"
    """Per-token KL estimator: k1 (log-ratio) | k2 (squared, /2) | k3 (exp(-Δ) - 1 + Δ), each clamped to ±10."""
    use_kl_loss: bool = False
    """Where the KL goes: false = subtracted from the reward of each token (AReaL, REINFORCE++); true =
    added to the loss (GRPO, on the current policy's log-probs)."""
    ref_model: str = "none"
    """The reference model: 'none', 'init' (a frozen copy of the starting checkpoint, model.path) or a
    checkpoint directory. Without kl_ctl its KL is only logged (ref_kl)."""

    # ---- policy loss --------------------------------------------------------------------------------------
    policy_loss: str = "decoupled_ppo"
    """Policy loss (asyncrl.algo.losses): decoupled_ppo | sapo | cispo | pg (all anchored on the proximal
    policy with the behaviour weight) | m2po (M2PO: PPO's clip on the behaviour policy, its width set by a
    second-moment budget, actor.behav_m2_budget) | ppo (naive: anchored on the behaviour policy, η = 0 only)."""
    eps_clip: float = 0.2
    """PPO clip range around the proximal policy: u is clipped to [1 - eps_clip, 1 + eps_clip_higher]
    (CISPO: the range of its importance weight)."""
    eps_clip_higher: float | None = None
    """Upper clip range (DAPO clip-higher); None = eps_clip."""
    c_clip: float | None = None
    """Dual clip (> 1): the loss of a token with A < 0 is capped at c_clip·|A|; None = off."""
    importance_sampling_level: str = "token"
    """token (PPO/GRPO) | sequence (GSPO: the ratio is the geometric mean over the sample's tokens and the
    advantage the sample's mean)."""
    sapo_tau_pos: float = 1.0
    """SAPO gate temperature for positive advantages."""
    sapo_tau_neg: float = 1.05
    """SAPO gate temperature for negative advantages."""
    loss_agg_mode: str = "token-mean"
    """token-mean (every token of the minibatch counts the same) | seq-mean-token-mean (GRPO's 1/|o|) |
    seq-mean-token-sum-norm (Dr.GRPO: divide by samples x loss_norm_tokens)."""
    loss_norm_tokens: int = 0
    """Dr.GRPO's constant normaliser for seq-mean-token-sum-norm, in tokens (0 = gconfig.max_new_tokens)."""

    # ---- off-policy correction --------------------------------------------------------------------------
    behav_imp_weight_cap: float | None = 5.0
    """Upper bound on the behaviour importance weight π_prox/π_behav (ratio metric; must be > 1, since an
    on-policy token has weight 1) or on the KL estimate (kl_* metrics); None = unbounded.
    AReaL: rejection_sampling.upper."""
    behav_imp_weight_floor: float | None = None
    """Lower bound on the same metric (None = none). AReaL: rejection_sampling.lower."""
    behav_imp_weight_mode: str = "clamp"
    """clamp: truncate the weight into [floor, cap], the tokens still train (truncated importance sampling)
    | mask: drop the tokens (or samples) out of bounds from the loss (rejection sampling).
    AReaL: rejection_sampling.action, whose default drops (mask); asyncrl clamps by default. Measured on the
    default run (docs/algorithms.md): no token reached the cap at η = 2, so both give the same curve; clamp is
    kept because it never throws away a sample's learning signal."""
    behav_imp_weight_level: str = "token"
    """token: bound each token | sequence: aggregate over the sample (for the ratio, the geometric mean,
    which also becomes the weight of its tokens). AReaL: rejection_sampling.level."""
    behav_imp_weight_metric: str = "ratio"
    """ratio | kl_k1 | kl_k2 | kl_k3 (KL estimates of π_prox against π_behav; mask mode only)."""
    behav_imp_weight_agg: str = "mean"
    """How a sequence aggregates the metric: mean | sum | max (ratio: in log space)."""
    prox_logp_method: str = "recompute"
    """How the proximal log-probs are obtained: recompute (with ppo_n_minibatches or ppo_epochs > 1, a forward
    pass with the weights being trained; at one step per batch they are those weights, u = 1) | loglinear
    (AReaL's A-3PO: interpolated from behaviour toward the current log-probs by token version, the proximal
    policy one version behind the one trained; no extra pass, and the clip binds on stale tokens at one step
    per batch too: at staleness s, u = (π_θ/π_behav)^(1/s)) | loglinear_ahead (interpolated toward the version
    after the step; acts from the second minibatch on)."""
    behav_eps_clip: float | Literal["auto"] | None = "auto"
    """The dual anchor (decoupled losses): besides the clip on the proximal policy, drop a token from the loss
    once π_θ/π_behav has moved past 1 ± behav_eps_clip since it was sampled, in the direction its advantage
    pushes (naive PPO's clip, anchored on the behaviour policy): a trust region across versions, which the
    proximal clip is not at one step per batch. auto = actor.eps_clip on the decoupled losses (decoupled_ppo,
    cispo, sapo, pg) where it is below 1, off on the others, which are anchored on the behaviour policy
    already, and where eps_clip is 1 or more (the CISPO preset: set it there); null = off
    (AReaL's decoupled loss as it ships). Chosen by measurement: docs/algorithms.md "Which correction at which
    staleness"."""
    behav_prob_delta: float | None = None
    """DPPO's trust region (arXiv 2602.04879; prime-rl's default), on decoupled losses: drop a token once
    p_θ - p_behav > delta with a positive advantage, or < -delta with a negative one. None = off."""
    behav_m2_budget: float | None = None
    """M2PO's second-moment budget (arXiv 2510.01161): on decoupled losses, drop the tokens that moved in their
    advantage's direction past the bound that brings their mean (log π_θ/π_behav)² to the budget (none while
    under it); with policy_loss=m2po, that loss's budget (null there = 0.04, the authors'). None = off."""
    ess_lr_scale: bool = False
    """VCPO's step scaling (arXiv 2602.17616): each optimizer step's learning rate times the normalised
    effective sample size of its behaviour weights (Kish: (Σw)²/(nΣw²), 1 on-policy), so steps on data a few
    tokens dominate are smaller."""

    # ---- critic (PPO) -------------------------------------------------------------------------------------
    critic: str = "none"
    """none | value_head (a linear head on the policy's last hidden state, trained with it) | separate (a
    second model initialised from model.path with a value head and its own optimizer)."""
    critic_lr: float | None = None
    """Learning rate of a separate critic (None = lr)."""
    critic_path: str = ""
    """Start the critic from a saved one: a checkpoint's critic/ directory (value head, and the trunk of a
    separate critic). Empty = a fresh value head (and a separate critic initialised from model.path)."""
    value_eps_clip: float | None = 0.5
    """Clip of the value update around the values before the step (None = unclipped)."""
    value_loss_coef: float = 0.5
    """Weight of the value loss added to the policy loss (value_head only; a separate critic has its own
    optimizer)."""

    allow_unsafe: bool = False
    """Run configurations the guardrails refuse (experts only)."""

    @property
    def world_size(self) -> int:
        from asyncrl.cluster.placement import ACTOR_KINDS, parse

        return parse(self.backend, "actor.backend", ACTOR_KINDS).dp

    @property
    def parallel_mode(self) -> str:
        return self.backend.partition(":")[0]

    def validate(self, max_staleness: int, n_samples: int, max_new_tokens: int | None = None) -> None:
        """Check values, then refuse configurations that silently train wrong (``allow_unsafe`` overrides)."""
        from asyncrl.algo import ADVANTAGES, AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES
        from asyncrl.algo.advantages import CRITIC_ESTIMATORS, GROUP_BASELINES
        from asyncrl.algo.losses import DECOUPLED, IS_LEVELS, OFF_POLICY_CORRECTED
        from asyncrl.algo.offpolicy import AGGS, LEVELS, METRICS, MODES

        for key in ("lr", "ppo_n_minibatches", "ppo_epochs", "threads", "mb_max_tokens"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"actor.{key} must be > 0, got {getattr(self, key)!r}")
        for key in (
            "max_grad_norm",
            "warmup_steps",
            "kl_ctl",
            "reward_clip",
            "overlong_tokens",
            "overlong_penalty_factor",
            "loss_norm_tokens",
            "value_loss_coef",
        ):
            if getattr(self, key) < 0:
                raise ConfigError(f"actor.{key} must be >= 0, got {getattr(self, key)!r}")
        for key in ("eps_clip_higher", "behav_imp_weight_cap", "behav_imp_weight_floor", "value_eps_clip", "critic_lr"):
            if getattr(self, key) is not None and getattr(self, key) < 0:
                raise ConfigError(f"actor.{key} must be >= 0 or null, got {getattr(self, key)!r}")
        for key in ("discount", "gae_lambda"):
            if not 0 <= getattr(self, key) <= 1:
                raise ConfigError(f"actor.{key} must be in [0, 1], got {getattr(self, key)!r}")
        if not self.eps_clip > 0:
            raise ConfigError(f"actor.eps_clip must be > 0, got {self.eps_clip!r}")
        if self.c_clip is not None and not self.c_clip > 1:
            raise ConfigError(f"actor.c_clip (dual clip) must be > 1 or null, got {self.c_clip!r}")
        if not (self.sapo_tau_pos > 0 and self.sapo_tau_neg > 0):
            raise ConfigError("actor.sapo_tau_pos and actor.sapo_tau_neg must be > 0")
        from asyncrl.cluster.placement import ACTOR_KINDS, PlacementError, parse

        try:
            parse(self.backend, "actor.backend", ACTOR_KINDS)
        except PlacementError as e:
            raise ConfigError(str(e)) from None
        if self.world_size > 1 and self.critic != "none":
            raise ConfigError(
                f"actor.backend={self.backend} trains the policy only; actor.critic={self.critic} "
                "needs one rank (actor.backend=ddp:d1) or GRPO-family advantages without a critic"
            )
        choices = [
            ("adv_estimator", ADVANTAGES),
            ("policy_loss", POLICY_LOSSES),
            ("loss_agg_mode", AGGREGATIONS),
            ("kl_estimator", KL_ESTIMATORS),
            ("importance_sampling_level", IS_LEVELS),
            ("behav_imp_weight_mode", MODES),
            ("behav_imp_weight_level", LEVELS),
            ("behav_imp_weight_metric", METRICS),
            ("behav_imp_weight_agg", AGGS),
            ("critic", CRITICS),
            ("prox_logp_method", PROX_LOGP_METHODS),
        ]
        for key, allowed in choices:
            if getattr(self, key) not in allowed:
                raise ConfigError(f"actor.{key} '{getattr(self, key)}' is not one of {sorted(allowed)}")
        if self.behav_imp_weight_metric != "ratio" and self.behav_imp_weight_mode != "mask":
            raise ConfigError(
                f"actor.behav_imp_weight_metric='{self.behav_imp_weight_metric}' bounds a KL "
                "estimate, which has no weight to clamp; set actor.behav_imp_weight_mode=mask"
            )
        if (
            self.behav_imp_weight_level == "sequence"
            and self.behav_imp_weight_agg != "mean"
            and self.behav_imp_weight_mode == "clamp"
        ):
            raise ConfigError(
                f"actor.behav_imp_weight_agg='{self.behav_imp_weight_agg}' bounds a sum or maximum, "
                "but a sequence's weight is the geometric mean of its ratios: clamping it changes "
                "nothing; set actor.behav_imp_weight_mode=mask (or behav_imp_weight_agg=mean)"
            )
        if self.behav_imp_weight_metric == "ratio":
            cap = self.behav_imp_weight_cap
            if cap is not None and not cap > 1:
                effect = (
                    "zeroes all learning"
                    if cap <= 0
                    else "drops every on-policy token"
                    if self.behav_imp_weight_mode == "mask"
                    else "shrinks the weight of every on-policy token"
                )
                raise ConfigError(
                    f"actor.behav_imp_weight_cap={cap} must be > 1: an on-policy token has weight "
                    f"π_prox/π_behav = 1, so this cap {effect} (usual values 2-5; null = unbounded)"
                )
            if self.behav_imp_weight_floor is not None and not self.behav_imp_weight_floor < 1:
                raise ConfigError(
                    f"actor.behav_imp_weight_floor={self.behav_imp_weight_floor} must be < 1: an "
                    "on-policy token has weight 1, so a floor at or above 1 bounds every on-policy "
                    "token (null = no floor)"
                )
        if self.lr > 1 and not self.allow_unsafe:
            raise ConfigError(
                f"actor.lr={self.lr} is above 1, which diverges with AdamW (RL usually runs at "
                "1e-6..1e-4); set actor.allow_unsafe=true to run it anyway"
            )
        if (
            self.behav_imp_weight_cap is not None
            and self.behav_imp_weight_floor is not None
            and self.behav_imp_weight_floor > self.behav_imp_weight_cap
        ):
            raise ConfigError("actor.behav_imp_weight_floor exceeds actor.behav_imp_weight_cap")
        if self.overlong_reward_penalty:
            if self.overlong_tokens <= 0:
                raise ConfigError(
                    "actor.overlong_reward_penalty=true needs actor.overlong_tokens > 0 (the "
                    "length of the penalised zone before gconfig.max_new_tokens)"
                )
            if max_new_tokens is not None and self.overlong_tokens > max_new_tokens:
                raise ConfigError(
                    f"actor.overlong_tokens={self.overlong_tokens} exceeds gconfig.max_new_tokens={max_new_tokens}"
                )
        if self.ref_model not in ("none", "init"):
            from pathlib import Path

            if not Path(self.ref_model).exists():
                raise ConfigError(
                    f"actor.ref_model '{self.ref_model}' is not 'none', 'init' or an existing checkpoint directory"
                )

        problems = []
        if n_samples == 1 and self.dynamic_sampling:
            raise ConfigError(
                "actor.dynamic_sampling=true keeps only groups whose rewards differ, and a group of "
                "gconfig.n_samples=1 never differs: every group would be dropped; set n_samples >= 2 "
                "or dynamic_sampling=false"
            )
        if n_samples == 1 and self.adv_estimator in GROUP_BASELINES:
            problems.append(
                f"actor.adv_estimator={self.adv_estimator} with gconfig.n_samples=1 gives every sample "
                "advantage 0 (its baseline is its own group); set gconfig.n_samples >= 2 or use "
                "reinforce_pp"
            )
        self._check_corrections()
        if max_staleness > 0 and self.policy_loss in DECOUPLED and self.behav_imp_weight_cap is None:
            problems.append(
                "η > 0 with an unbounded behaviour importance weight lets one stale token dominate "
                "the gradient; set actor.behav_imp_weight_cap (e.g. 5.0)"
            )
        if max_staleness > 0 and self.policy_loss not in OFF_POLICY_CORRECTED:
            problems.append(
                f"rollout.max_head_offpolicyness={max_staleness} trains on stale samples, but "
                f"actor.policy_loss='{self.policy_loss}' has no off-policy correction; use one of "
                f"{sorted(OFF_POLICY_CORRECTED)} or set rollout.max_head_offpolicyness=0"
            )
        if self.kl_ctl > 0 and self.ref_model == "none":
            problems.append(
                f"actor.kl_ctl={self.kl_ctl} asks for a KL penalty, but there is no reference model to "
                "measure it against; set actor.ref_model=init (a frozen copy of model.path) or a "
                "checkpoint directory, or actor.kl_ctl=0"
            )
        if self.critic_path and self.critic == "none":
            raise ConfigError(
                "actor.critic_path is set but actor.critic is 'none': set actor.critic to the kind "
                "that was saved (value_head or separate)"
            )
        if self.adv_estimator in CRITIC_ESTIMATORS and self.critic == "none":
            problems.append(
                f"actor.adv_estimator={self.adv_estimator} without a critic uses V = 0: the advantages "
                "are raw returns with no baseline; set actor.critic=value_head or separate"
            )
        if self.critic != "none" and self.adv_estimator not in CRITIC_ESTIMATORS:
            problems.append(
                f"actor.critic={self.critic} trains a critic that actor.adv_estimator="
                f"{self.adv_estimator} never uses; set actor.adv_estimator=gae or actor.critic=none"
            )
        if problems and not self.allow_unsafe:
            raise ConfigError(
                "unsafe configuration:\n  - "
                + "\n  - ".join(problems)
                + "\n(set actor.allow_unsafe=true to run it anyway)"
            )

    def dual_anchor(self) -> float | None:
        """``behav_eps_clip`` as it applies to this loss (``auto`` resolved: asyncrl.algo.losses.dual_anchor)."""
        from asyncrl.algo.losses import dual_anchor

        return dual_anchor(self.policy_loss, self.eps_clip, self.behav_eps_clip)

    def _check_corrections(self) -> None:
        """The behaviour trust terms: in range, and on the losses they apply to (the decoupled ones)."""
        from asyncrl.algo.losses import DECOUPLED

        for key, low, high in (("behav_eps_clip", 0, 1), ("behav_prob_delta", 0, 1), ("behav_m2_budget", 0, None)):
            value = self.dual_anchor() if key == "behav_eps_clip" else getattr(self, key)
            if value is not None and not (value > low and (high is None or value < high)):
                bound = f"in ({low}, {high})" if high is not None else f"> {low}"
                raise ConfigError(f"actor.{key} must be {bound} or null, got {value!r}")
        trust = [k for k in ("behav_eps_clip", "behav_prob_delta") if getattr(self, k) not in (None, "auto")]
        if self.behav_m2_budget is not None and self.policy_loss != "m2po":
            trust.append("behav_m2_budget")
        if trust and self.policy_loss not in DECOUPLED:
            raise ConfigError(
                f"actor.{trust[0]} bounds the drift from the behaviour policy in the decoupled losses "
                f"({', '.join(sorted(DECOUPLED))}); actor.policy_loss={self.policy_loss} is anchored on the "
                "behaviour policy already: leave it null"
            )

    def inert_terms(self, max_staleness: int) -> list[str]:
        """One line for each configured term that cannot change the gradient here (said at start-up)."""
        from asyncrl.algo.losses import DECOUPLED

        one_step = self.ppo_n_minibatches * self.ppo_epochs == 1
        if not (max_staleness > 0 and one_step and self.policy_loss in DECOUPLED):
            return []
        if self.prox_logp_method == "loglinear" or self.policy_loss in ("sapo", "pg"):
            return []
        if self.trusted():
            return []  # the trust region across versions is in force: nothing configured is idle
        return [
            f"actor.eps_clip is inert here: with ppo_n_minibatches=1 and ppo_epochs=1 the proximal policy is the "
            f"policy being trained (u = 1), so the decoupled clip never binds; stale tokens are bounded only by "
            f"the behaviour weight cap (actor.behav_imp_weight_cap={self.behav_imp_weight_cap}) - a trust region "
            f"across versions: actor.behav_eps_clip={'auto' if self.eps_clip < 1 else 0.2} (docs/algorithms.md)"
        ]

    def trusted(self) -> bool:
        """Whether a behaviour-anchored trust term bounds the drift across versions."""
        return any(v is not None for v in (self.dual_anchor(), self.behav_prob_delta, self.behav_m2_budget))
