"""The machine's cores shared by the trainer thread and the built-in engine's thread (``cluster.cpu_split=auto``):
each side uses all of them while the other waits, and its share while both work. torch's intra-op thread count
is per thread, so each side sets its own before each piece of work (a decode step, a micro-batch)."""

from __future__ import annotations

from typing import Callable

# The trainer's micro-batches hold at most this many tokens while it shares the cores: it reads its share
# before each, so when the engine goes idle mid-step (the staleness gate closed) the trainer takes its core
# within a fraction of the step, not at the next step. Measured on the default run (2 cores, Intel Xeon
# AVX-512, steps 11-60): one micro-batch a step 2.58 s, at most 2048 tokens 2.13 s, 1024 tokens 2.06 s.
SHARED_MB_TOKENS = 1024


class CoreShare:
    def __init__(self, cores: int, trainer_waiting: Callable[[], bool] = lambda: False,
                 engine_idle: Callable[[], bool] = lambda: False, alternating: bool = False):
        self.cores = max(1, cores)
        self.trainer_waiting, self.engine_idle = trainer_waiting, engine_idle
        # A synchronous run (η = 0): generation and training take turns, so each side takes every core, always; the
        # thread counts never depend on timing (a replay stays exact) and need no re-reading within a step.
        self.alternating = alternating

    def trainer_threads(self) -> int:
        """All cores while the engine has nothing to do, else the cores the engine does not take."""
        if self.alternating or self.engine_idle():
            return self.cores
        return max(1, self.cores - self.cores // 2)

    def engine_threads(self) -> int:
        """All cores while the trainer waits for a batch, else half of them."""
        return self.cores if self.alternating or self.trainer_waiting() else max(1, self.cores // 2)


def process_cores() -> int:
    """The cores this process may run on (its CPU affinity, else the machine's), at most ``OMP_NUM_THREADS``
    where that is set (torch's own cap: two runs on one machine can each be given half)."""
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    cap = os.environ.get("OMP_NUM_THREADS", "")
    return min(cores, int(cap)) if cap.isdigit() and int(cap) > 0 else cores
