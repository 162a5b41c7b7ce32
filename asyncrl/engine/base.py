"""The engine seam: what the controller and workflows need from an inference engine, and nothing more."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from asyncrl.types import Completion, SamplingParams, WeightUpdate


@runtime_checkable
class Engine(Protocol):
    """An inference engine: generates with per-token versions and takes new weights mid-flight.

    ``update_weights`` returns once the new weights serve every later token (in-flight requests continue
    under them); ``pause``/``resume`` stop and restart decoding at a token boundary.
    """

    @property
    def version(self) -> int: ...

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[Completion]: ...

    def update_weights(self, update: WeightUpdate, timeout: float | None = None) -> None: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def start(self) -> "Engine":
        """Begin serving (start threads, connect to servers); returns self."""
        ...

    def stop(self) -> None: ...

    def stats(self) -> dict:
        """Cumulative counters: ``generated_tokens``, ``busy_s`` (time spent generating), ``interruptions``
        (weight updates that hit in-flight requests)."""
        ...
