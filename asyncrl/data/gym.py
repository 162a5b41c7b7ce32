"""reasoning-gym tasks as datasets: ``train_dataset.path=gym:NAME`` (optional extra ``gym``).

reasoning-gym ships offline procedural generators (gsm_symbolic, countdown, chain_sum, basic_arithmetic,
...) with scorers. Training items come from successive seeded chunks of the generator, so the stream is
endless; the held-out split is generated from its own seed and its questions never appear in training
(:mod:`asyncrl.data` skips them).
"""

from __future__ import annotations

import difflib
import itertools
from typing import Iterator

from asyncrl.configlib import ConfigError

PREFIX = "gym:"
CHUNK = 1000  # items generated per training seed


def _module(key: str):
    try:
        import reasoning_gym
    except ImportError:
        raise ConfigError(f"{key}: reasoning-gym tasks need the package: pip install 'asyncrl[gym]'") from None
    return reasoning_gym


def task_names(key: str = "train_dataset.path") -> list[str]:
    return sorted(_module(key).factory.DATASETS)


def gym_items(name: str, seed: int, size: int, options: dict, key: str = "train_dataset.path") -> Iterator[dict]:
    """``size`` items of task ``name`` generated from ``seed``; errors name the config key."""
    rg = _module(key)
    if name not in rg.factory.DATASETS:
        near = difflib.get_close_matches(name, rg.factory.DATASETS, n=3)
        raise ConfigError(
            f"{key}: reasoning-gym has no task '{name}'"
            + (f"; did you mean {near}?" if near else "; see asyncrl.data.gym.task_names()")
        )
    try:
        dataset = rg.create_dataset(name, seed=seed, size=size, **options)
    except (TypeError, ValueError, AssertionError) as e:
        raise ConfigError(f"train_dataset.gym_options: invalid for reasoning-gym task '{name}' ({e})") from e
    return _items(dataset, name)


def _items(dataset, name: str) -> Iterator[dict]:
    """Items generated one at a time (a chunk can be slow to generate all at once)."""
    for i in range(len(dataset)):
        e = dataset[i]
        yield {"question": e["question"], "answer": e["answer"], "metadata": e.get("metadata", {}), "gym_task": name}


def gym_stream(name: str, seed: int, options: dict) -> Iterator[dict]:
    """Endless training items: chunk k comes from seed ``seed * 1_000_003 + k``."""
    for k in itertools.count():
        yield from gym_items(name, seed * 1_000_003 + k, CHUNK, options)
