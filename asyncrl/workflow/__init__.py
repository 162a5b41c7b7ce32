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

from typing import Any

from asyncrl.api.workflow import Workflow, WorkflowContext
from asyncrl.plugins import load_object

WORKFLOWS = {"rlvr": "asyncrl.workflow.rlvr:RLVRWorkflow", "agent": "asyncrl.agent.workflow:AgentWorkflow"}
"""Registered workflow names and where they live (imported only when chosen)."""


def resolve_workflow(name: str) -> Any:
    """The class, factory or object that ``name`` (registered or ``package.module:Name``) stands for."""
    spec = WORKFLOWS.get(name, name)
    if ":" not in spec:
        raise ValueError(
            f"'{name}' is neither a registered workflow {sorted(WORKFLOWS)} nor an import path package.module:Name"
        )
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
