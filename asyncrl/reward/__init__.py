"""Rewards: plain functions ``(prompt, completion, **fields) -> float``, named in config by import path
(``package.module:function``) so that users add their own without touching asyncrl, scored by a
:class:`RewardService` that runs them in worker processes with a per-call timeout.

Built-in reward functions: ``asyncrl.reward.math_reward:math_reward`` (math-verify),
``asyncrl.reward.code_reward:code_reward`` (sandboxed test execution),
``asyncrl.reward.gym_reward:gym_reward`` (reasoning-gym scorers) and the arithmetic task's own verifier.
"""

from __future__ import annotations

import logging
from typing import Callable

from asyncrl.configlib import ConfigError
from asyncrl.reward.base import BoundReward, MixtureReward, SourceReward, call_reward, item_fields, load_reward_fn
from asyncrl.reward.service import RewardFailure, RewardService

__all__ = [
    "BoundReward",
    "MixtureReward",
    "RewardFailure",
    "RewardService",
    "SourceReward",
    "build_reward_service",
    "call_reward",
    "item_fields",
    "load_reward_fn",
    "reward_function",
]

log = logging.getLogger(__name__)


def reward_function(cfg, default_fn: Callable[..., float], judge_url: str | None = None) -> Callable[..., float]:
    """The reward function a ``RewardConfig`` selects: ``cfg.fn`` by import path, else the dataset's verifier;
    with ``cfg.kwargs`` bound (they override item fields of the same name). For a training mixture
    (:class:`MixtureReward`), ``cfg.fn`` and ``cfg.kwargs`` stand in for the verifiers of the sources that do
    not name their own ``reward_fn``. With ``cfg.judge``, the judge (at ``judge_url`` when the run serves it)
    scores, alone or combined with that function (:class:`asyncrl.reward.judge.JudgedReward`)."""
    fn = _verifier(cfg, default_fn)
    if not cfg.judge.enabled:
        return fn
    from asyncrl.reward.judge import JudgedReward

    return JudgedReward(cfg.judge.build(judge_url), fn, cfg.judge.combine, cfg.judge.weight)


def _verifier(cfg, default_fn: Callable[..., float]) -> Callable[..., float]:
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
    """The service for a ``RewardConfig`` scoring with :func:`reward_function`; with ``reward.judge.serve`` the
    judge's server is started here (``asyncrl serve`` in a child process) and ends with the service."""
    cfg.validate()
    if cfg.model:
        return _model_service(cfg, default_fn)
    server = None
    if cfg.judge.serve:
        from asyncrl.engine.spawn import asyncrl_server

        log.info("reward.judge.serve: starting the judge %s on %s", cfg.judge.serve, cfg.judge.device)
        try:
            server = asyncrl_server(
                cfg.judge.serve,
                "--device",
                cfg.judge.device,
                "--threads",
                str(cfg.judge.threads),
                "--served-model-name",
                cfg.judge.model or "judge",
                startup_timeout_s=300.0,
            )
        except (RuntimeError, TimeoutError) as e:
            raise ConfigError(f"reward.judge.serve: the judge {cfg.judge.serve} did not start ({e})") from e
    if cfg.judge.url:  # a typo in the URL is said now, not as a failure of every reward call of the run
        why = cfg.judge.build().check()
        if why is not None:
            raise ConfigError(f"reward.judge.url={cfg.judge.url}: {why}")
    try:
        service = RewardService(
            reward_function(cfg, default_fn, server and server.url + "/v1"),
            cfg.default,
            timeout_s=cfg.timeout_s,
            workers=cfg.workers,
        )
    except BaseException:
        if server is not None:
            server.close()
        raise
    if server is not None:
        service.closing.append(server.close)
    if cfg.judge.enabled and cfg.judge.combine == "weighted":
        # a mixed score is no verdict: success at the threshold (1.0) would need the judge's full marks as well
        service.held_out_fn = _verifier(cfg, default_fn)
        log.info(
            "held-out accuracy is the verifier's verdict: reward.judge.combine=weighted mixes the judge into the "
            "training reward only"
        )
    return service


def _model_service(cfg, default_fn: Callable[..., float]) -> RewardService:
    """Scoring with a reward model in this process: the service's threads hand it their samples, which it
    scores in batches; the model is released with the service."""
    from asyncrl.reward.model import ModelReward, RewardModel

    model = RewardModel(cfg.model, cfg.model_device, cfg.model_batch_size)
    verifier = _verifier(cfg, default_fn)
    fn = ModelReward(model, verifier if cfg.model_weight < 1.0 else None, cfg.model_weight)
    service = RewardService(fn, cfg.default, timeout_s=cfg.timeout_s, workers=0, threads=cfg.model_batch_size)
    service.held_out_fn = verifier  # held-out accuracy is the verifier's: a reward model's scores are not correctness
    service.closing.append(model.close)
    return service
