"""Rewards: plain functions ``(prompt, completion, **fields) -> float``, named in config by import path
(``package.module:function``) so that users add their own without touching asyncrl, scored by a
:class:`RewardService` that runs them in worker processes with a per-call timeout.

Built-in reward functions: ``asyncrl.reward.math_reward:math_reward`` (math-verify),
``asyncrl.reward.code_reward:code_reward`` (sandboxed test execution),
``asyncrl.reward.gym_reward:gym_reward`` (reasoning-gym scorers) and the arithmetic task's own verifier.
"""

from __future__ import annotations

from typing import Callable

from asyncrl.configlib import ConfigError
from asyncrl.reward.base import (BoundReward, MixtureReward, SourceReward, call_reward, item_fields,
                                 load_reward_fn)
from asyncrl.reward.service import RewardFailure, RewardService

__all__ = ["BoundReward", "MixtureReward", "RewardFailure", "RewardService", "SourceReward", "build_reward_service",
           "call_reward", "item_fields", "load_reward_fn", "reward_function"]


def reward_function(cfg, default_fn: Callable[..., float]) -> Callable[..., float]:
    """The reward function a ``RewardConfig`` selects: ``cfg.fn`` by import path, else the dataset's verifier;
    with ``cfg.kwargs`` bound (they override item fields of the same name). For a training mixture
    (:class:`MixtureReward`), ``cfg.fn`` and ``cfg.kwargs`` stand in for the verifiers of the sources that do
    not name their own ``reward_fn``."""
    cfg.validate()
    try:
        override = load_reward_fn(cfg.fn) if cfg.fn else None
    except ValueError as e:
        raise ConfigError(f"reward.fn: {e}") from e
    if isinstance(default_fn, MixtureReward):
        return default_fn.with_defaults(override, dict(cfg.kwargs))
    fn = override or default_fn
    return BoundReward(fn, dict(cfg.kwargs)) if cfg.kwargs else fn


def build_reward_service(cfg, default_fn: Callable[..., float]) -> RewardService:
    """The service for a ``RewardConfig`` scoring with :func:`reward_function`."""
    return RewardService(reward_function(cfg, default_fn), cfg.default, timeout_s=cfg.timeout_s,
                         workers=cfg.workers)
