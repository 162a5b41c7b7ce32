"""A run asked to stop by a signal: ``StopRequested`` (what the command line reports, with the checkpoint saved and
the exit status 128 + the signal), and ``StopAtStep``, which turns SIGINT/SIGTERM into a flag that a loop reads at
its next step boundary (``asyncrl sft``; ``asyncrl train`` has its own, asyncrl.launch.signals.GracefulStop)."""

from __future__ import annotations

import os
import signal
import threading


class StopRequested(Exception):
    """The run was asked to stop by ``signum``."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum
        self.checkpoint: str | None = None  # the checkpoint the run saved (set by the launcher)

    def advice(self) -> str:
        """What the command line says: the checkpoint saved, and how to go on."""
        if self.checkpoint:
            return f"{self}; checkpoint {self.checkpoint} saved: run the same command again to go on from it"
        return f"{self} before its first checkpoint: the same command again starts the run afresh"

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class StopAtStep:
    """Within the block, the first SIGINT/SIGTERM sets ``signum`` for the loop to stop at its next step boundary
    (with a checkpoint); a second one exits at once. Only in the main thread; elsewhere it does nothing."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.signum: int | None = None
        self._previous: dict = {}

    def __enter__(self) -> "StopAtStep":
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame) -> None:
        if self.signum is not None:  # the second signal: no more waiting
            os._exit(128 + signum)
        self.signum = signum
