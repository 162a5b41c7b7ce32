"""The engine seams. Workflows and the loop see three members (``Engine``); starting and stopping
(``Lifecycle``, used by the launcher) and generating in the caller's thread (``InlineGenerating``, used by
evaluation) are separate small Protocols, used only by what needs them. ``EngineStats`` are the counters an
engine's ``stats()`` returns (read by the timeline)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from asyncrl.types import Completion, SamplingParams, WeightUpdate


@runtime_checkable
class Engine(Protocol):
    """An inference engine: generates with per-token versions and takes new weights mid-flight.

    ``generate`` returns ``params.n`` finished samples (finish reason ``stop`` or ``length``): a sample cut
    short by a weight update is continued by the engine itself, never by its caller. ``update_weights``
    returns once the new weights serve every later token (in-flight requests continue under them)."""

    @property
    def version(self) -> int: ...

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[Completion]: ...

    def update_weights(self, update: WeightUpdate, timeout: float | None = None) -> None: ...


@runtime_checkable
class Lifecycle(Protocol):
    """Something that runs threads, processes or connections between ``start`` and ``stop``."""

    def start(self): ...

    def stop(self) -> None: ...


@runtime_checkable
class InlineGenerating(Protocol):
    """An engine that can also generate in the calling thread while its own loop is not running (the built-in
    engine before ``start``: ``asyncrl eval`` and SFT's held-out scoring run it on their own thread)."""

    @property
    def started(self) -> bool: ...

    def generate_batch(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]: ...


@dataclass(frozen=True)
class EngineStats:
    """An engine's cumulative counters, read together as one snapshot. Its time splits into generating
    (``busy_s`` = ``prefill_s`` + ``decode_s`` + ``reprefill_s``), held for a weight update (``paused_s``),
    waiting for work (``idle_s``): the built-in engine counts every moment of its loop as one of them, up to the
    moment they are read. Remote engines see requests, not the servers' steps: their generating time is all
    ``decode_s``."""

    generated_tokens: int = 0
    busy_s: float = 0.0  # time spent generating
    interruptions: int = 0  # weight updates (or aborts) that hit in-flight requests
    prefill_s: float = 0.0  # admitting requests: their prompts' forward pass and first token
    decode_s: float = 0.0  # one token for every running sequence
    reprefill_s: float = 0.0  # recomputing running sequences' KV caches under new weights
    paused_s: float = 0.0  # held: paused, or installing new weights
    idle_s: float = 0.0  # no request to serve

    def plus(self, **deltas) -> "EngineStats":
        """These counters with ``deltas`` added (``busy_s`` follows the three phases it is made of)."""
        unknown = set(deltas) - {f.name for f in dataclasses.fields(self)} - {"busy_s"}
        if unknown or "busy_s" in deltas:
            raise TypeError(f"not EngineStats phases: {sorted(unknown | ({'busy_s'} & set(deltas)))}")
        busy = sum(deltas.get(k, 0.0) for k in ("prefill_s", "decode_s", "reprefill_s"))
        return EngineStats(
            **{
                f.name: getattr(self, f.name) + deltas.get(f.name, 0)
                for f in dataclasses.fields(self)
                if f.name != "busy_s"
            },
            busy_s=self.busy_s + busy,
        )
