"""Reward for reasoning-gym tasks: the task's own scorer (``score_answer``) on the completion's final answer.

reasoning-gym (optional extra ``gym``) ships offline procedural generators, each with a scorer that takes
the answer string and the generated entry (question, answer, metadata). Items made by
``asyncrl.data`` for ``gym:NAME`` carry ``gym_task`` and ``metadata`` so the scorer can be rebuilt in any
reward worker process from the task name alone.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from asyncrl.reward.math_reward import final_answer


@functools.lru_cache(maxsize=None)
def scorer(task: str) -> Callable[[str | None, dict], float]:
    """reasoning-gym's ``score_answer`` for ``task`` (built once per process)."""
    import reasoning_gym

    return reasoning_gym.get_score_answer_fn(task)


def extract_gym_answer(completion: str) -> str | None:
    """The marked final answer (:func:`asyncrl.reward.math_reward.final_answer`: the last ``\\boxed{}``
    first, then ``<answer>...</answer>`` (reasoning-gym's convention), '####', 'answer is'), else the last
    non-empty line."""
    marked = final_answer(completion)
    if marked is not None:
        return marked
    lines = [line.strip() for line in completion.strip().splitlines() if line.strip()]
    return lines[-1] if lines else None


def gym_reward(
    prompt: str, completion: str, gym_task: str = "", metadata: Any = None, answer: Any = None, **_
) -> float:
    """The task's score (0..1) for the completion's final answer; 0.0 when there is none."""
    if not gym_task:
        raise ValueError("gym_reward needs a 'gym_task' field on the item (the reasoning-gym task name)")
    extracted = extract_gym_answer(completion)
    if extracted is None:
        return 0.0
    entry = {"question": prompt, "answer": answer, "metadata": metadata if metadata is not None else {}}
    return float(scorer(gym_task)(extracted, entry))
