"""Reward functions: plain functions ``(prompt, completion, **fields) -> float``, named in config by import
path (``package.module:function``) so that users add their own without touching asyncrl."""

from __future__ import annotations

import importlib
import logging
from typing import Callable

log = logging.getLogger(__name__)


def load_reward_fn(spec: str) -> Callable[..., float]:
    """Import ``package.module:function``; the error names what is missing."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"reward function '{spec}' must look like package.module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"reward function '{spec}': cannot import module '{module_name}' ({e})") from e
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"reward function '{spec}': module '{module_name}' has no callable '{attr}'")
    return fn


class RewardService:
    """Scores completions with a reward function; a failure costs one sample (the default reward), is
    counted, and is logged once."""

    def __init__(self, fn: Callable[..., float], default: float = 0.0):
        self.fn, self.default = fn, default
        self.errors = 0
        self.timeouts = 0

    def score(self, item: dict, completion: str) -> float:
        try:
            return call_reward(self.fn, item, completion)
        except Exception as e:  # noqa: BLE001 - a failing reward never stops training
            self.errors += 1
            if self.errors == 1:
                log.warning("reward function failed on item %s (%r); using %s (counted in reward_errors)",
                            item.get("id"), e, self.default)
            return self.default

    async def ascore(self, item: dict, completion: str) -> float:
        return self.score(item, completion)

    def stats(self) -> dict:
        return {"reward_errors": self.errors, "reward_timeouts": self.timeouts}

    def close(self) -> None:
        pass


def build_reward_service(cfg, default_fn: Callable[..., float]) -> RewardService:
    """The service for a ``RewardConfig``: ``cfg.fn`` by import path, else the dataset's verifier."""
    return RewardService(load_reward_fn(cfg.fn) if cfg.fn else default_fn, cfg.default)


def item_fields(item: dict) -> dict:
    """The dataset fields passed to a reward function as keyword arguments."""
    return {k: v for k, v in item.items() if k not in ("question", "prompt_ids")}


def call_reward(reward_fn: Callable[..., float], item: dict, completion: str) -> float:
    """Call ``reward_fn`` on one completion of ``item``; exceptions propagate to the caller to count."""
    return float(reward_fn(item.get("question", ""), completion, **item_fields(item)))
