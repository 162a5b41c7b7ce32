"""Tasks and datasets: where prompts and their reward functions come from."""

from __future__ import annotations

from asyncrl.data.arith import ArithTask, arith_reward

TASKS = {"arith": (ArithTask, arith_reward)}


def build_task(cfg):
    """The task object and reward function named by a ``TaskConfig``."""
    if cfg.name not in TASKS:
        raise ValueError(f"task.name '{cfg.name}' is not one of {sorted(TASKS)}")
    cls, reward_fn = TASKS[cfg.name]
    if cfg.reward_fn:
        from asyncrl.reward import load_reward_fn

        reward_fn = load_reward_fn(cfg.reward_fn)
    return cls(min_terms=cfg.min_terms, max_terms=cfg.max_terms, max_operand=cfg.max_operand, ops=cfg.ops), reward_fn
