"""Config section for the reward service."""

from __future__ import annotations

from dataclasses import dataclass, field

from asyncrl.configlib import ConfigError


@dataclass
class RewardConfig:
    fn: str = ""
    """Reward function as ``package.module:function`` (empty = the dataset's own verifier). Built in:
    asyncrl.reward.math_reward:math_reward, asyncrl.reward.code_reward:code_reward,
    asyncrl.reward.gym_reward:gym_reward. With train_dataset.mixture it replaces the verifier of every source
    that does not name its own reward_fn."""
    default: float = 0.0
    """Reward given when the function raises or times out (counted in reward_errors / reward_timeouts)."""
    timeout_s: float = 30.0
    """Per-call time limit; past it the worker is killed (with any sandbox it started) and the call scores
    the default. Only enforced with workers > 0."""
    workers: int = 2
    """Reward worker processes scoring concurrently (fresh interpreters, not forks of the trainer); 0 = call
    the function in the calling thread (no processes, no timeout)."""
    kwargs: dict = field(default_factory=dict)
    """Keyword arguments for the reward function; they override item fields of the same name. E.g. for the
    code reward {mode: all, cpu_s: 2, sandbox: auto}; for the math reward {timeout_s: 5}. With
    train_dataset.mixture they go to the sources that do not name their own reward_fn (a source's
    reward_kwargs win)."""

    def validate(self) -> None:
        if self.workers < 0:
            raise ConfigError(f"reward.workers must be >= 0, got {self.workers}")
        if self.timeout_s <= 0:
            raise ConfigError(f"reward.timeout_s must be > 0, got {self.timeout_s}")
        if self.fn:
            from asyncrl.reward.base import load_reward_fn

            try:
                load_reward_fn(self.fn)
            except ValueError as e:
                raise ConfigError(f"reward.fn: {e}") from e
