"""Stopping a run by signal: the first SIGINT or SIGTERM stops admission and ends the run at the next step
boundary with a checkpoint (exit status 130 or 143, the shell's convention for a run ended by the signal);
a second one exits at once. Processes the run started end with it (they are tied to it by a parent-death
signal or their process group), so nothing is left behind either way."""

from __future__ import annotations

from asyncrl.loop.stop import StopAtStep, StopRequested

__all__ = ["GracefulStop", "StopRequested"]


class GracefulStop(StopAtStep):
    """Within the block, SIGINT/SIGTERM stop the run: before the parts exist by raising ``StopRequested`` at
    once, afterwards through ``buffer.fail`` (the trainer raises it when it next waits for a batch, after the
    step in hand). Only in the main thread; elsewhere it does nothing."""

    def __init__(self):
        super().__init__()
        self.buffer = None

    def _handle(self, signum: int, frame) -> None:
        super()._handle(signum, frame)
        if self.buffer is None:
            raise StopRequested(signum)
        self.buffer.fail(StopRequested(signum))
