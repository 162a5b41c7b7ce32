"""The workflow seam: how one dataset item becomes a trajectory group (``Workflow``), the optional capabilities
a workflow may declare (``Closable``, ``Counted``, ``Evaluating``), what it gets to work with
(``WorkflowContext``), and the built-in problem generators it may run (``Task``, ``AgenticTask``).

A workflow is any object with ``async run(item, engine) -> TrajectoryGroup | None`` (``None`` rejects the item:
it is not trained on, and its admission is released). Workflows run on the rollout thread's event loop: they
must await, never block."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

from asyncrl.api.engine import Engine
from asyncrl.api.reward import Scorer
from asyncrl.types import SamplingParams, TrajectoryGroup


@runtime_checkable
class Workflow(Protocol):
    async def run(self, item: dict, engine: Engine) -> TrajectoryGroup | None: ...


@runtime_checkable
class Closable(Protocol):
    """A workflow that holds resources (a server, connections): closed when the run ends."""

    def close(self) -> None: ...


@runtime_checkable
class Counted(Protocol):
    """A workflow with counters of its own, added to every step's metrics record."""

    def stats(self) -> dict: ...


@runtime_checkable
class Evaluating(Protocol):
    """A workflow that evaluates held-out items its own way (an agent runs its episodes), instead of one
    answer per item scored by the reward function."""

    def evaluate(
        self, engine: Engine, items: list[dict], tokenizer, params: SamplingParams, success_threshold: float = 1.0
    ) -> dict: ...


@dataclass(frozen=True)
class WorkflowContext:
    """What a workflow gets to work with."""

    tokenizer: Any  # the rollout thread's own tokenizer (fast tokenizers must not be shared across threads)
    reward: Scorer  # the run's RewardService: ``await reward.ascore(item, completion_text) -> float``
    params: SamplingParams  # gconfig's sampling: n samples per item, max_new_tokens, temperature, ...
    max_len: int = 0  # the engine's context per sequence (prompt + completion tokens)
    stop_token_ids: tuple[int, ...] = ()  # what ends a reply (the end-of-turn token first)
    seed: int | None = None  # the run's seed: a workflow may seed each item's sampling from it and the item id


@runtime_checkable
class Task(Protocol):
    """A built-in problem generator (``asyncrl.data.arith.ArithTask``): a problem from a random generator, as an
    item (``question``, ``answer``, ``solution``, ...)."""

    def problem(self, rng: random.Random) -> dict: ...


@runtime_checkable
class AgenticTask(Task, Protocol):
    """A built-in task whose problems are solved by an agent with tools (``asyncrl.data.lookup.LookupTask``):
    ``episode`` is the import path of the episode function that runs and scores one, ``tools`` the tools it
    offers (the reference transcripts are rendered with them)."""

    episode: ClassVar[str]
    tools: ClassVar[list[dict]]
