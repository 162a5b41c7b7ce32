"""Stopping a run by signal: the first SIGINT or SIGTERM stops admission and ends the run at the next step
boundary with a checkpoint (exit status 130 or 143, the shell's convention for a run ended by the signal);
a second one exits at once. Processes the run started end with it (they are tied to it by a parent-death
signal or their process group), so nothing is left behind either way."""

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


class GracefulStop:
    """Within the block, SIGINT/SIGTERM stop the run: before the parts exist by raising ``StopRequested`` at
    once, afterwards through ``buffer.fail`` (the trainer raises it when it next waits for a batch, after the
    step in hand). Only in the main thread; elsewhere it does nothing."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.buffer = None
        self.signum: int | None = None
        self._previous: dict = {}

    def __enter__(self) -> "GracefulStop":
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
        if self.buffer is None:
            raise StopRequested(signum)
        self.buffer.fail(StopRequested(signum))
