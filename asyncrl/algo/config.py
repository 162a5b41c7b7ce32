"""Config section for the actor: optimisation and the RL algorithm, with guardrails against silent mistakes."""

from __future__ import annotations

from dataclasses import dataclass

from asyncrl.configlib import ConfigError

# losses that correct for stale behaviour policies (safe with max_head_offpolicyness > 0)
OFF_POLICY_SAFE = {"decoupled_ppo"}


@dataclass
class ActorConfig:
    lr: float = 2e-4
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.99
    """AdamW beta2."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up steps (then constant)."""
    max_grad_norm: float = 1.0
    """Gradient clipping by global norm (0 = off)."""
    mb_max_tokens: int = 8192
    """Micro-batch budget in tokens (padded length x rows); gradients accumulate across micro-batches."""
    ppo_n_minibatches: int = 1
    """Optimizer steps per training batch; with 1, the proximal policy equals the current one (no extra
    forward pass)."""
    adv_estimator: str = "grpo"
    """Advantage estimator (a registry name in asyncrl.algo.advantages)."""
    policy_loss: str = "decoupled_ppo"
    """Policy loss (a registry name in asyncrl.algo.losses)."""
    eps_clip: float = 0.2
    """PPO clip range around the proximal policy."""
    eps_clip_higher: float | None = None
    """Upper clip range (DAPO clip-higher); None = eps_clip."""
    behav_imp_weight_cap: float | None = 5.0
    """Cap on the behaviour importance weight π_prox/π_behav (None = uncapped)."""
    threads: int = 1
    """Torch threads for training."""
    allow_unsafe: bool = False
    """Run configurations the guardrails refuse (experts only)."""

    def validate(self, max_staleness: int, n_samples: int) -> None:
        """Check values, then refuse configurations that silently train wrong (``allow_unsafe`` overrides)."""
        from asyncrl.algo import ADVANTAGES, POLICY_LOSSES

        for key in ("lr", "ppo_n_minibatches", "threads", "mb_max_tokens"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"actor.{key} must be > 0, got {getattr(self, key)!r}")
        for key in ("max_grad_norm", "warmup_steps"):
            if getattr(self, key) < 0:
                raise ConfigError(f"actor.{key} must be >= 0, got {getattr(self, key)!r}")
        for key, registry in (("adv_estimator", ADVANTAGES), ("policy_loss", POLICY_LOSSES)):
            if getattr(self, key) not in registry:
                raise ConfigError(f"actor.{key} '{getattr(self, key)}' is not one of {sorted(registry)}")
        problems = []
        if n_samples == 1 and self.adv_estimator == "grpo":
            problems.append("GRPO with gconfig.n_samples=1 gives every sample advantage 0 (nothing is learnt); "
                            "set gconfig.n_samples >= 2")
        if max_staleness > 0 and self.policy_loss == "decoupled_ppo" and self.behav_imp_weight_cap is None:
            problems.append("η > 0 with an uncapped behaviour importance weight lets one stale token dominate "
                            "the gradient; set actor.behav_imp_weight_cap (e.g. 5.0)")
        if max_staleness > 0 and self.policy_loss not in OFF_POLICY_SAFE:
            problems.append(f"rollout.max_head_offpolicyness={max_staleness} trains on stale samples, but "
                            f"actor.policy_loss='{self.policy_loss}' has no off-policy correction; use one of "
                            f"{sorted(OFF_POLICY_SAFE)} or set rollout.max_head_offpolicyness=0")
        if problems and not self.allow_unsafe:
            raise ConfigError("unsafe configuration:\n  - " + "\n  - ".join(problems)
                              + "\n(set actor.allow_unsafe=true to run it anyway)")
