"""Tasks and datasets: where prompts, held-out items and their default reward function come from.

An item is a dict with at least ``question`` (the user turn) and whatever fields its reward function takes
as keyword arguments (e.g. ``answer``); ``solution`` (a reference answer text) is used by SFT.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Iterator

from asyncrl.data.arith import ArithTask, arith_reward
from asyncrl.data.config import TaskConfig, TrainDatasetConfig, ValidDatasetConfig

TASKS = {"arith": (ArithTask, arith_reward)}


@dataclass
class Dataset:
    train: Iterator[dict]  # endless; every item carries a unique "id"
    valid: list[dict]
    reward_fn: Callable[..., float]  # the data's own verifier, used unless reward.fn names another


def build_task(cfg: TaskConfig):
    """The built-in task object and its verifier."""
    if cfg.name not in TASKS:
        raise ValueError(f"task.name '{cfg.name}' is not one of {sorted(TASKS)}")
    cls, reward_fn = TASKS[cfg.name]
    return cls(min_terms=cfg.min_terms, max_terms=cfg.max_terms, max_operand=cfg.max_operand, ops=cfg.ops), reward_fn


def build_dataset(task: TaskConfig, train: TrainDatasetConfig, valid: ValidDatasetConfig) -> Dataset:
    gen, reward_fn = build_task(task)
    held_out = gen.split(valid.seed, valid.size)
    exclude = {it["question"] for it in held_out}
    stream = ({**it, "id": i} for i, it in zip(itertools.count(), gen.stream(train.seed, exclude)))
    return Dataset(stream, held_out, reward_fn)
