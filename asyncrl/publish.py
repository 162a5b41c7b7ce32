"""Weight transports: how the trainer's new weights reach the engines."""

from __future__ import annotations

import time
from typing import Protocol

from asyncrl.types import WeightUpdate


class Publisher(Protocol):
    def publish(self, state_dict: dict, version: int) -> float:
        """Deliver ``state_dict`` as ``version`` to every engine; return the seconds it took."""
        ...


class InProcessPublisher:
    """Engines in this process copy the tensors at their next token boundary."""

    def __init__(self, engines: list, timeout_s: float = 60.0):
        self.engines, self.timeout_s = engines, timeout_s

    def publish(self, state_dict: dict, version: int) -> float:
        t0 = time.perf_counter()
        for engine in self.engines:
            engine.update_weights(WeightUpdate(version, state_dict=state_dict), timeout=self.timeout_s)
        return time.perf_counter() - t0
