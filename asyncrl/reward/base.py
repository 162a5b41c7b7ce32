"""The reward-function contract, shared by the service, its workers and evaluation.

A reward function is a plain function ``(prompt, completion, **fields) -> float``: ``prompt`` is the item's
``question``, ``fields`` are the item's other fields (``answer``, ``tests``, ``id``, ...). It is named in
config by import path (``package.module:function``) so users add their own without touching asyncrl.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from asyncrl.plugins import load_object

NOT_FIELDS = ("question", "prompt_ids")


def load_reward_fn(spec: str) -> Callable[..., float]:
    """Import ``package.module:function``; the error names what is missing."""
    try:
        fn = load_object(spec)
    except ValueError as e:
        raise ValueError(f"reward function {e}") from e
    if not callable(fn):
        raise ValueError(f"reward function '{spec}' is not callable")
    return fn


def item_fields(item: dict) -> dict:
    """The dataset fields passed to a reward function as keyword arguments."""
    return {k: v for k, v in item.items() if k not in NOT_FIELDS}


def call_reward(reward_fn: Callable[..., float], item: dict, completion: str) -> float:
    """Call ``reward_fn`` on one completion of ``item``; exceptions propagate to the caller to count, and a
    value that is not a finite real number (``None``, a string such as ``"1.0"``, NaN, inf) raises
    ``ValueError``."""
    return as_reward(reward_fn(item.get("question", ""), completion, **item_fields(item)))


def as_reward(value: Any) -> float:
    """``value`` as a float if it is one finite real scalar (int, float, bool, a NumPy or torch scalar),
    else ``ValueError`` naming what came back. Strings are refused even when they read as numbers."""
    scalar = not isinstance(value, (str, bytes)) and getattr(value, "ndim", 0) == 0
    if scalar and hasattr(type(value), "__float__"):
        number = float(value)
        if math.isfinite(number):
            return number
    raise ValueError(f"the reward function returned {value!r} ({type(value).__name__}), not a finite number")


@dataclass(frozen=True)
class BoundReward:
    """A reward function with keyword arguments from config (``reward.kwargs``), which take precedence over
    item fields of the same name. Picklable whenever ``fn`` is, so it travels to worker processes."""

    fn: Callable[..., float]
    kwargs: dict = field(default_factory=dict)

    def __call__(self, prompt: str, completion: str, **fields: Any) -> float:
        return self.fn(prompt, completion, **{**fields, **self.kwargs})

    def describe(self) -> dict:
        """Constant facts the function reports for metrics (e.g. the sandbox mechanism); {} if none."""
        describe = getattr(self.fn, "describe", None)
        return dict(describe(**self.kwargs)) if callable(describe) else {}
