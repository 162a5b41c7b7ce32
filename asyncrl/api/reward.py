"""The reward seams: what a workflow scores samples with (``Scorer``), and a reward function that reports
constant facts about itself for the run's metrics (``Described``: the code reward's sandbox mechanism, a
judge's model)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class Scorer(Protocol):
    """What workflows score samples with: the run's ``RewardService`` (worker processes, timeouts, counters), or
    any object with this method."""

    async def ascore(self, item: dict, completion: str) -> float:
        """The reward of ``completion`` for ``item``; never raises (a failure scores the configured default)."""


@runtime_checkable
class Described(Protocol):
    """A reward function (or a function with a ``describe`` attribute) that reports constant facts for metrics;
    it is called with the function's bound keyword arguments (``reward.kwargs``)."""

    def describe(self, **kwargs) -> dict: ...
