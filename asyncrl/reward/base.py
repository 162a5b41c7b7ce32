"""The reward-function contract, shared by the service, its workers and evaluation.

A reward function is a plain function ``(prompt, completion, **fields) -> float``: ``prompt`` is the item's
``question``, ``fields`` are the item's other fields (``answer``, ``tests``, ``id``, ...). It is named in
config by import path (``package.module:function``) so users add their own without touching asyncrl.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from asyncrl.api.reward import Described
from asyncrl.plugins import load_object

UNTEMPLATED = "question_before_template"
"""An item's question as its row gave it (a chat row: its prompt turns), kept when ``prompt_template`` rewrote it:
what tells two items apart as the same problem (a held-out one and a training one worded by different templates).
Not a reward field."""

NOT_FIELDS = ("question", "prompt_ids", UNTEMPLATED)


def facts(fn, **kwargs) -> dict:
    """The constant facts ``fn`` reports about itself for metrics (``Described``: e.g. the code reward's sandbox
    mechanism), called with its bound keyword arguments; {} for a function that reports none."""
    return dict(fn.describe(**kwargs)) if isinstance(fn, Described) and callable(fn.describe) else {}


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
        return facts(self.fn, **self.kwargs)


@dataclass(frozen=True)
class SourceReward:
    """The reward of one source of a training mixture: ``fn`` with ``kwargs`` bound (over item fields).
    ``named``: the source names its function (``train_dataset.mixture[i].reward_fn``), which ``reward.fn``
    does not replace."""

    fn: Callable[..., float]
    kwargs: dict = field(default_factory=dict)
    named: bool = False


@dataclass(frozen=True)
class MixtureReward:
    """Scores an item with the reward function of its source: the item's ``source`` field names an entry of
    ``sources`` (name -> :class:`SourceReward`). ``source`` is passed on like any other field. Picklable
    whenever the functions are, so it travels to worker processes."""

    sources: dict

    def __call__(self, prompt: str, completion: str, source: str | None = None, **fields: Any) -> float:
        try:
            chosen = self.sources[source]
        except (KeyError, TypeError):
            raise ValueError(f"the item's source {source!r} is none of the mixture's {sorted(self.sources)}") from None
        return chosen.fn(prompt, completion, source=source, **{**fields, **chosen.kwargs})

    def with_defaults(self, fn: Callable[..., float] | None, kwargs: dict | None = None) -> "MixtureReward":
        """``reward.fn`` and ``reward.kwargs`` applied: ``fn`` (if given) replaces the own verifier of every
        source that does not name a function, and ``kwargs`` are bound for those sources under their own
        ``reward_kwargs``. A source that names its function keeps it, with its own kwargs only."""
        return MixtureReward(
            {
                name: s if s.named else SourceReward(fn or s.fn, {**(kwargs or {}), **s.kwargs})
                for name, s in self.sources.items()
            }
        )

    def describe(self) -> dict:
        """The constant facts of every source's function (e.g. the code reward's sandbox), merged."""
        merged: dict = {}
        for s in self.sources.values():
            merged.update(facts(s.fn, **s.kwargs))
        return merged
