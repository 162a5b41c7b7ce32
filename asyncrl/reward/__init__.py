"""Reward functions: plain functions ``(prompt, completion, **fields) -> float``, named in config by import
path (``package.module:function``) so that users add their own without touching asyncrl."""

from __future__ import annotations

import importlib
from typing import Callable


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


def item_fields(item: dict) -> dict:
    """The dataset fields passed to a reward function as keyword arguments."""
    return {k: v for k, v in item.items() if k not in ("question", "prompt_ids")}


def call_reward(reward_fn: Callable[..., float], item: dict, completion: str) -> float:
    """Call ``reward_fn`` on one completion of ``item``; exceptions propagate to the caller to count."""
    return float(reward_fn(item.get("question", ""), completion, **item_fields(item)))
