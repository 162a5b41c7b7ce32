"""The typed config tree. YAML files hold only overrides; ``asyncrl train --help-config`` lists every key.

Key names follow AReaL where a user would look for them: ``rollout.max_head_offpolicyness`` (η, the max
staleness), ``train_dataset.batch_size`` (B, in prompt groups), ``gconfig.n_samples``,
``gconfig.max_new_tokens``, ``gconfig.temperature``, ``actor.eps_clip``, ``total_train_steps``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from asyncrl.configlib import ConfigError
from asyncrl.data.config import TaskConfig, TrainDatasetConfig, ValidDatasetConfig
from asyncrl.engine.config import RolloutConfig
from asyncrl.reward.config import RewardConfig


@dataclass
class ModelConfig:
    path: str = "builtin:tiny-sft"
    """A Hugging Face model directory, or ``builtin:NAME`` for a checkpoint shipped with asyncrl."""
    dtype: str = "float32"
    """Weights dtype for training and generation: float32 | bfloat16."""


@dataclass
class GenerationConfig:
    n_samples: int = 8
    """Samples per prompt (the group size for GRPO)."""
    max_new_tokens: int = 64
    """Most tokens generated per sample."""
    temperature: float = 1.0
    """Sampling temperature (training log-probs use the same temperature)."""
    top_p: float = 1.0
    """Nucleus sampling mass (1.0 = off)."""
    top_k: int = 0
    """Top-k sampling (0 = off)."""


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


@dataclass
class EvaluatorConfig:
    freq_steps: int = 10
    """Evaluate held-out accuracy every N training steps (0 = only at the start and end)."""
    greedy: bool = True
    """Greedy decoding for evaluation (else sample at gconfig.temperature)."""


@dataclass
class SaverConfig:
    freq_steps: int = 0
    """Save an HF checkpoint every N steps (0 = only at the end)."""


@dataclass
class TrainConfig:
    experiment_name: str = "asyncrl"
    """Run directory: output_dir/experiment_name/trial_name."""
    trial_name: str = "default"
    """Run directory: output_dir/experiment_name/trial_name."""
    output_dir: str = "outputs"
    """Where run directories go."""
    seed: int = 1
    """Seed for sampling and initialisation."""
    total_train_steps: int = 200
    """Training steps (each consumes train_dataset.batch_size groups and advances the version by 1)."""
    max_train_time_s: float = 0.0
    """Stop after this much wall time in seconds (0 = no limit), then evaluate and save."""
    progress_bar: bool = True
    """Show a progress bar on the terminal."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model."""
    task: TaskConfig = field(default_factory=TaskConfig)
    """The built-in task and its difficulty."""
    train_dataset: TrainDatasetConfig = field(default_factory=TrainDatasetConfig)
    """Training prompts."""
    valid_dataset: ValidDatasetConfig = field(default_factory=ValidDatasetConfig)
    """Held-out prompts."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """The reward service."""
    gconfig: GenerationConfig = field(default_factory=GenerationConfig)
    """Sampling for rollouts."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Asynchronous rollout and the built-in engine."""
    actor: ActorConfig = field(default_factory=ActorConfig)
    """Optimisation and the policy loss."""
    evaluator: EvaluatorConfig = field(default_factory=EvaluatorConfig)
    """Held-out evaluation."""
    saver: SaverConfig = field(default_factory=SaverConfig)
    """Checkpoints."""

    def validate(self) -> None:
        _positive(self, ["train_dataset.batch_size", "gconfig.n_samples", "gconfig.max_new_tokens",
                         "total_train_steps", "actor.lr", "actor.ppo_n_minibatches", "rollout.max_slots",
                         "rollout.threads", "actor.threads", "actor.mb_max_tokens", "valid_dataset.size"])
        _non_negative(self, ["rollout.max_head_offpolicyness", "rollout.max_concurrent_rollouts",
                             "max_train_time_s", "evaluator.freq_steps", "saver.freq_steps",
                             "actor.max_grad_norm", "actor.warmup_steps", "gconfig.top_k"])
        if self.gconfig.temperature <= 0:
            raise ConfigError("gconfig.temperature must be > 0 (training log-probs are divided by it)")
        if not 0 < self.gconfig.top_p <= 1:
            raise ConfigError(f"gconfig.top_p must be in (0, 1], got {self.gconfig.top_p}")
        self.rollout.validate()
        if self.model.dtype not in ("float32", "bfloat16"):
            raise ConfigError(f"model.dtype must be float32 or bfloat16, got '{self.model.dtype}'")
        if self.gconfig.n_samples > self.rollout.max_slots:
            raise ConfigError(f"gconfig.n_samples ({self.gconfig.n_samples}) exceeds rollout.max_slots "
                              f"({self.rollout.max_slots}): one group must fit in the engine at once")
        from asyncrl.algo import ADVANTAGES, POLICY_LOSSES

        for key, value, registry in [("actor.adv_estimator", self.actor.adv_estimator, ADVANTAGES),
                                     ("actor.policy_loss", self.actor.policy_loss, POLICY_LOSSES)]:
            if value not in registry:
                raise ConfigError(f"{key} '{value}' is not one of {sorted(registry)}")
        if self.reward.fn:
            from asyncrl.reward import load_reward_fn

            try:
                load_reward_fn(self.reward.fn)
            except ValueError as e:
                raise ConfigError(f"reward.fn: {e}") from e
        self._guardrails()

    def _guardrails(self) -> None:
        """Refuse configurations that silently train wrong; ``actor.allow_unsafe=true`` overrides."""
        problems = []
        if self.gconfig.n_samples == 1 and self.actor.adv_estimator == "grpo":
            problems.append("GRPO with gconfig.n_samples=1 gives every sample advantage 0 (nothing is learnt); "
                            "set gconfig.n_samples >= 2")
        if (self.rollout.max_head_offpolicyness > 0 and self.actor.policy_loss == "decoupled_ppo"
                and self.actor.behav_imp_weight_cap is None):
            problems.append("η > 0 with an uncapped behaviour importance weight lets one stale token dominate "
                            "the gradient; set actor.behav_imp_weight_cap (e.g. 5.0)")
        if self.rollout.max_head_offpolicyness > 0 and self.actor.policy_loss not in OFF_POLICY_SAFE:
            problems.append(f"rollout.max_head_offpolicyness={self.rollout.max_head_offpolicyness} trains on "
                            f"stale samples, but actor.policy_loss='{self.actor.policy_loss}' has no "
                            f"off-policy correction; use one of {sorted(OFF_POLICY_SAFE)} or set "
                            "rollout.max_head_offpolicyness=0")
        if problems and not self.actor.allow_unsafe:
            raise ConfigError("unsafe configuration:\n  - " + "\n  - ".join(problems)
                              + "\n(set actor.allow_unsafe=true to run it anyway)")


OFF_POLICY_SAFE = {"decoupled_ppo"}


@dataclass
class SFTConfig:
    model: ModelConfig = field(default_factory=lambda: ModelConfig(path="builtin:tiny-init"))
    """The model to fine-tune."""
    task: TaskConfig = field(default_factory=TaskConfig)
    """The built-in task whose reference solutions are the training targets."""
    output: str = "outputs/sft"
    """Directory of the resulting HF checkpoint."""
    seed: int = 0
    """Seed of the training stream and initialisation."""
    steps: int = 1000
    """Optimizer steps."""
    batch_size: int = 64
    """Examples per step."""
    lr: float = 2e-3
    """Peak learning rate (linear warm-up, cosine decay to 10 %)."""
    warmup_steps: int = 50
    """Warm-up steps."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    threads: int = 2
    """Torch threads."""
    eval_every: int = 0
    """Evaluate held-out accuracy every N steps (0 = only at the end)."""
    valid_dataset: ValidDatasetConfig = field(default_factory=ValidDatasetConfig)
    """Held-out prompts."""

    def validate(self) -> None:
        _positive(self, ["steps", "batch_size", "lr", "threads", "valid_dataset.size"])


@dataclass
class EvalConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    """The checkpoint to evaluate."""
    task: TaskConfig = field(default_factory=TaskConfig)
    """The built-in task."""
    valid_dataset: ValidDatasetConfig = field(default_factory=ValidDatasetConfig)
    """Held-out prompts."""
    greedy: bool = True
    """Greedy decoding (else sample at temperature)."""
    temperature: float = 1.0
    """Sampling temperature when not greedy."""
    max_new_tokens: int = 64
    """Most tokens generated per answer."""
    threads: int = 2
    """Torch threads."""
    seed: int = 0
    """Sampling seed."""

    def validate(self) -> None:
        _positive(self, ["max_new_tokens", "threads", "valid_dataset.size"])


def _get(cfg, dotted: str):
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _positive(cfg, keys: list[str]) -> None:
    for key in keys:
        if not _get(cfg, key) > 0:
            raise ConfigError(f"{key} must be > 0, got {_get(cfg, key)!r}")


def _non_negative(cfg, keys: list[str]) -> None:
    for key in keys:
        if _get(cfg, key) < 0:
            raise ConfigError(f"{key} must be >= 0, got {_get(cfg, key)!r}")
