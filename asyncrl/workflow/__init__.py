"""Workflows: how one dataset item becomes a trajectory group, chosen by config (``workflow.name``).

A workflow is any object with ``async run(item, engine) -> TrajectoryGroup | None`` (``None`` rejects the
item: it is not trained on, and its admission is released); it may also be ``Closable``, ``Counted`` (metrics)
or ``Evaluating`` (its own held-out evaluation). ``workflow.name`` is a registered name
(``rlvr``) or an import path ``package.module:Name`` of a user's own: a class or factory, called as
``Name(context, **workflow.kwargs)`` with a :class:`WorkflowContext`, or a ready object with ``run``.
``agent`` (``asyncrl.agent``) runs your OpenAI-client agent through a recording proxy; it is configured by
the ``agent`` section.
Workflows run on the rollout thread's event loop: they must await, never block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from asyncrl.engine.base import Engine
from asyncrl.plugins import load_object
from asyncrl.reward.base import Scorer
from asyncrl.types import SamplingParams, TrajectoryGroup

WORKFLOWS = {"rlvr": "asyncrl.workflow.rlvr:RLVRWorkflow", "agent": "asyncrl.agent.workflow:AgentWorkflow"}
"""Registered workflow names and where they live (imported only when chosen)."""


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

    def evaluate(self, engine: Engine, items: list[dict], tokenizer, params: SamplingParams,
                 success_threshold: float = 1.0) -> dict: ...


@dataclass(frozen=True)
class WorkflowContext:
    """What a workflow gets to work with."""

    tokenizer: Any  # the rollout thread's own tokenizer (fast tokenizers must not be shared across threads)
    reward: Scorer  # the run's RewardService: ``await reward.ascore(item, completion_text) -> float``
    params: SamplingParams  # gconfig's sampling: n samples per item, max_new_tokens, temperature, ...
    max_len: int = 0  # the engine's context per sequence (prompt + completion tokens)
    stop_token_ids: tuple[int, ...] = ()  # what ends a reply (the end-of-turn token first)
    seed: int | None = None  # the run's seed: a workflow may seed each item's sampling from it and the item id


def resolve_workflow(name: str) -> Any:
    """The class, factory or object that ``name`` (registered or ``package.module:Name``) stands for."""
    spec = WORKFLOWS.get(name, name)
    if ":" not in spec:
        raise ValueError(f"'{name}' is neither a registered workflow {sorted(WORKFLOWS)} nor an import path "
                         "package.module:Name")
    return load_object(spec)


def build_workflow(name: str, context: WorkflowContext, kwargs: dict | None = None) -> Workflow:
    """The workflow ``name`` for ``context``; ``kwargs`` go to its factory."""
    target = resolve_workflow(name)
    if isinstance(target, type) or not hasattr(target, "run"):
        if not callable(target):
            raise ValueError(f"workflow '{name}' is neither callable nor an object with run(item, engine)")
        workflow = target(context, **(kwargs or {}))
    elif kwargs:
        raise ValueError(f"workflow '{name}' is a ready object: it takes no workflow.kwargs")
    else:
        workflow = target
    if not callable(getattr(workflow, "run", None)):
        raise ValueError(f"workflow '{name}' built {type(workflow).__name__}, which has no run(item, engine)")
    return workflow
