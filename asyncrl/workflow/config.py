"""Config section for the workflow: what one admitted item runs."""

from __future__ import annotations

from dataclasses import dataclass, field

from asyncrl.configlib import ConfigError


@dataclass
class WorkflowConfig:
    name: str = "rlvr"
    """A registered workflow (rlvr: one prompt, gconfig.n_samples completions, one reward each) or an import
    path package.module:Name of your own: a class or factory called as Name(context, **workflow.kwargs),
    or an object with `async run(item, engine)` (see asyncrl/workflow/__init__.py)."""
    kwargs: dict = field(default_factory=dict)
    """Keyword arguments for the workflow's factory."""

    def validate(self) -> None:
        from asyncrl.workflow import resolve_workflow

        try:
            resolve_workflow(self.name)
        except ValueError as e:
            raise ConfigError(f"workflow.name: {e}") from e
