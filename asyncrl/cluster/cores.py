"""The machine's cores shared by the trainer thread and the built-in engine's thread (``cluster.cpu_split=auto``):
the engine keeps a fixed share; the trainer takes the rest, and one core of the engine's while the engine idles
(always at η = 0). torch's intra-op thread count is per thread, so each side sets its own before each piece of
work (a decode step, a micro-batch).

Why only the trainer borrows: torch runs its operators on OpenMP (libgomp), where every thread that has once run
an operator on more than one thread keeps its own pool of worker threads, and a pool never shrinks below two.
Once the process holds more of those workers (plus one) than it has cores, libgomp makes every worker sleep
between operators instead of waiting briefly for the next, and each operator then pays a wake-up: two sides each
borrowing every core made decode steps 3x slower on 2 cores (docs/report.md, "The shared split"). So the shares
keep ``trainer's most + engine's - 1 <= cores``; a foreground evaluation generates in the trainer's own thread (on
its threads and pool), one in a thread of its own on one thread."""

from __future__ import annotations

from typing import Callable

# The trainer's micro-batches hold at most this many tokens while it shares the cores: it reads its share
# before each, so when the engine goes idle mid-step (the staleness gate closed) the trainer takes its core
# within a fraction of the step, not at the next step (docs/report.md, "The shared split", has the sizes tried).
SHARED_MB_TOKENS = 1024


class CoreShare:
    def __init__(self, cores: int, engine_idle: Callable[[], bool] = lambda: False, alternating: bool = False):
        self.cores = max(1, cores)
        self.engine_idle = engine_idle
        # A synchronous run (η = 0): generation and training take turns, so the trainer always takes its most; the
        # thread counts never depend on timing (a replay stays exact) and need no re-reading within a step.
        self.alternating = alternating
        self.engine = max(1, self.cores // 2)
        self.most = self.cores - self.engine + 1 if self.cores > 1 else 1

    def trainer_threads(self) -> int:
        """Every core but the engine's, and one of the engine's while the engine has nothing to do."""
        if self.alternating or self.engine_idle():
            return self.most
        return max(1, self.cores - self.engine)

    def engine_threads(self) -> int:
        """Half the cores (at least one), always."""
        return self.engine

    def eval_threads(self) -> int:
        """The evaluation engine's: what the trainer's most and the engine's share leave (one on 2 cores)."""
        return spare_threads(self.cores, self.most, self.engine)


def use_threads(n: int) -> None:
    """Run this thread's torch operators on ``n`` threads (0: leave it). Compared with the thread's own count, not
    a cache: the trainer and an evaluation engine may both set it in one thread."""
    import torch

    if n and n != torch.get_num_threads():
        torch.set_num_threads(n)


def spare_threads(cores: int, *threads: int) -> int:
    """The most threads one more thread may run torch on beside threads running on ``threads`` each, before the
    process holds more OpenMP workers than ``cores`` (at least 1: one thread keeps no workers)."""
    return max(1, cores - sum(max(0, n - 1) for n in threads))


def cpu_model() -> str:
    """The CPU's model name and its widest vector extensions (``/proc/cpuinfo``), e.g. ``AMD EPYC (avx2
    avx512f)``: what a speed figure needs beside it."""
    import platform

    model, flags = platform.processor() or platform.machine(), []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                elif key.strip() in ("flags", "Features"):
                    flags = value.split()
                    break
    except OSError:
        pass
    wide = [f for f in ("avx2", "avx512f", "amx_tile") if f in flags]
    return f"{model} ({' '.join(wide)})" if wide else model


def process_cores() -> int:
    """The cores this process may run on (its CPU affinity, else the machine's), at most ``OMP_NUM_THREADS``
    where that is set (torch's own cap: two runs on one machine can each be given half)."""
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    cap = os.environ.get("OMP_NUM_THREADS", "")
    return min(cores, int(cap)) if cap.isdigit() and int(cap) > 0 else cores
