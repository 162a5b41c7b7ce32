"""Staleness-gated admission and batch assembly, shared by the rollout thread and the trainer.

Admission (AReaL, arXiv 2505.24298 Eq. 3): a new prompt group may start while

    accepted + running < (η + v + 1) · B

with B the batch size in groups, v the current version and η the max staleness (η = 0 is synchronous RL),
given by a ``StalenessPolicy`` (a fixed number, or ``asyncrl.loop.staleness.AutoStaleness``).

Batch assembly: the trainer takes B groups as soon as they are ready, oldest admission version first.
Within one admission version any ready group will do, but a group of an older version is never skipped
while it is still running: the trainer waits for it. Together with the gate this bounds staleness strictly:
a group admitted at version v is trained at a version of at most v + η, so no token is more than η versions
old when it is trained (AReaL's bound holds only when groups finish in order).
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass

from asyncrl.api.staleness import StalenessPolicy
from asyncrl.loop.staleness import FixedStaleness
from asyncrl.types import TrajectoryGroup


def capacity(
    max_staleness: int, version: int, batch_size: int, accepted: int, running: int, max_concurrent: int = 0
) -> int:
    """How many more groups may start now (AReaL's gate, with η = ``max_staleness``); may be negative."""
    cap = (max_staleness + version + 1) * batch_size - (accepted + running)
    if max_concurrent > 0:
        cap = min(cap, max_concurrent - running)
    return cap


class BatchTimeout(TimeoutError):
    """No batch within ``rollout.batch_timeout_s``: the run stops (exit 1) with the buffer's counters."""


@dataclass(frozen=True)
class Ticket:
    """An admitted group: its admission order, the version at admission and the η it was admitted under."""

    seq: int
    version: int
    max_staleness: int = 0


@dataclass(frozen=True)
class BufferSnapshot:
    """What a checkpoint takes from the buffer, read at one moment."""

    ready: list  # [(admit version, TrajectoryGroup, η it was admitted under)], oldest admission first
    inflight: list[dict]  # the items being rolled out
    drawn: int  # items drawn from the prompt stream
    accepted: int
    rejected: int


class RolloutBuffer:
    """Thread-safe counters, the ready groups, and the rules that link them."""

    def __init__(
        self,
        batch_size: int,
        max_staleness: "int | StalenessPolicy",
        max_concurrent: int = 0,
        on_change=None,
        clock=time.perf_counter,
    ):
        self.batch_size, self.max_concurrent = batch_size, max_concurrent
        self.policy = FixedStaleness(max_staleness) if isinstance(max_staleness, int) else max_staleness
        self.max_staleness = self.policy.bound()  # η of the current version
        self._gate_closed_s = 0.0  # time admission was refused by the staleness bound (not by max_concurrent)
        self._taken_bound = self.max_staleness  # the largest η the last batch's groups were admitted under
        self._clock = clock  # what measures it (the planner's simulation passes its own)
        self._closed_since: float | None = None
        self.version = 0
        self.accepted = 0  # groups accepted so far (consumed ones included), as in AReaL
        self.rejected = 0
        self._running: dict[int, Ticket] = {}
        self._items: dict[int, dict] = {}  # the item each running ticket is rolling out (for checkpoints)
        self.drawn = 0  # items drawn from the prompt stream
        self._ready: dict[int, tuple[Ticket, TrajectoryGroup]] = {}
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._error: BaseException | None = None
        self.on_change = on_change  # called (from any thread) when capacity may have grown

    @property
    def running(self) -> int:
        return len(self._running)

    def capacity(self) -> int:
        with self._cv:
            return self._capacity(self.max_staleness)

    def try_admit(self) -> Ticket | None:
        with self._cv:
            max_staleness = self.max_staleness
            if self._capacity(max_staleness) <= 0:
                gated = capacity(max_staleness, self.version, self.batch_size, self.accepted, self.running) <= 0
                if not gated:  # only max_concurrent_rollouts refuses: the staleness gate is open
                    self._gate_opened()
                elif self._closed_since is None:
                    self._closed_since = self._clock()
                return None
            self._gate_opened()
            ticket = Ticket(next(self._seq), self.version, max_staleness)
            self._running[ticket.seq] = ticket
            return ticket

    def gate_closed_s(self) -> float:
        """Seconds so far during which the rollout side had work to admit but the staleness bound kept it out:
        from a refused admission to the next one admitted."""
        with self._cv:
            open_for = self._clock() - self._closed_since if self._closed_since is not None else 0.0
            return self._gate_closed_s + open_for

    def started(self, ticket: Ticket, item: dict) -> None:
        """``ticket`` is rolling out ``item``, the next one drawn from the prompt stream."""
        with self._cv:
            self.drawn += 1
            if ticket.seq in self._running:
                self._items[ticket.seq] = item

    def snapshot(self) -> "BufferSnapshot":
        """A consistent view for a checkpoint: the ready groups with their admission versions and the η each was
        admitted under, the items being rolled out, and the counters."""
        with self._cv:
            ready = [(t.version, g, t.max_staleness) for t, g in sorted(self._ready.values(), key=lambda tg: tg[0].seq)]
            inflight = [self._items[seq] for seq in sorted(self._items)]
            return BufferSnapshot(ready, inflight, self.drawn, self.accepted, self.rejected)

    def restore(self, version: int, ready: list, accepted: int, rejected: int, drawn: int) -> None:
        """After a resume at ``version``: the groups that were ready (trained first, oldest admission first) and
        the counters; the items that were being rolled out are admitted again like new ones."""
        with self._cv:
            self.version, self.accepted, self.rejected, self.drawn = version, accepted, rejected, drawn
            for (
                admit_version,
                group,
                *admitted_under,
            ) in ready:  # checkpoints before the η was kept: at least the gap to now
                bound = admitted_under[0] if admitted_under else max(self.max_staleness, version - admit_version)
                ticket = Ticket(next(self._seq), admit_version, bound)
                self._ready[ticket.seq] = (ticket, group)
            self._cv.notify_all()
        self._changed()

    def finish(self, ticket: Ticket, group: TrajectoryGroup | None) -> None:
        """A rollout ended: ``group`` is accepted, or ``None`` (rejected or failed). A ticket already
        finished is ignored, so releasing one twice is harmless."""
        with self._cv:
            if self._running.pop(ticket.seq, None) is None:
                return
            self._items.pop(ticket.seq, None)
            if group is None:
                self.rejected += 1
            else:
                group.admit_version = ticket.version
                self.accepted += 1
                self._ready[ticket.seq] = (ticket, group)
            self._cv.notify_all()
        self._changed()

    def set_version(self, version: int) -> None:
        max_staleness = self.policy.bound()
        with self._cv:
            self.version, self.max_staleness = version, max_staleness
        self._changed()

    def fail(self, error: BaseException) -> None:
        """The rollout side cannot go on: ``take`` raises ``error`` (the first one reported) at once."""
        with self._cv:
            if self._error is None:
                self._error = error
            self._cv.notify_all()

    @property
    def failed(self) -> bool:
        return self._error is not None

    def try_take(self) -> list[TrajectoryGroup] | None:
        """The next batch if it is ready now (the rule of ``take``), else None; never blocks."""
        with self._cv:
            if self._error is not None:
                raise self._error
            batch = self._pick()
            return None if batch is None else self._pop(batch)

    def take(self, timeout: float | None = None) -> list[TrajectoryGroup]:
        """Block until a batch of B groups is ready (see the module docstring) and return it. Raises the
        rollout side's failure (``fail``) as soon as it is reported, and ``TimeoutError`` after ``timeout``
        seconds without a batch."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            return self._take(deadline, timeout)

    def _take(self, deadline: float | None, timeout: float | None) -> list[TrajectoryGroup]:
        """``take``'s wait (holding the lock, released while waiting)."""
        while True:
            if self._error is not None:
                raise self._error
            batch = self._pick()
            if batch is not None:
                return self._pop(batch)
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise BatchTimeout(
                    f"no batch of {self.batch_size} groups within {timeout}s (rollout.batch_timeout_s): "
                    f"ready={len(self._ready)} running={self.running} accepted={self.accepted} "
                    f"rejected={self.rejected} version={self.version}"
                )
            self._cv.wait(timeout=0.5 if left is None else min(left, 0.5))

    def stats(self) -> dict:
        """The counters; ``max_staleness``: the η the current version admits under; ``staleness_bound``: the
        largest η the last batch's groups were admitted under, which no token of that batch is older than."""
        with self._cv:
            return {
                "buffer_ready": len(self._ready),
                "buffer_running": self.running,
                "groups_accepted": self.accepted,
                "groups_rejected": self.rejected,
                "max_staleness": self.max_staleness,
                "staleness_bound": self._taken_bound,
            }

    # ---- internals (hold the lock) -----------------------------------------------------------------------
    def _capacity(self, max_staleness: int) -> int:
        return capacity(max_staleness, self.version, self.batch_size, self.accepted, self.running, self.max_concurrent)

    def _gate_opened(self) -> None:
        if self._closed_since is not None:
            self._gate_closed_s += self._clock() - self._closed_since
            self._closed_since = None

    def _pop(self, batch: list[int]) -> list[TrajectoryGroup]:
        """The groups of ``batch`` (sequence numbers), out of the ready ones; remembers the largest η they were
        admitted under: no token of the batch is older than that (after η falls, groups admitted before it are
        still trained up to their own η)."""
        taken = [self._ready.pop(seq) for seq in batch]
        self._taken_bound = max(ticket.max_staleness for ticket, _ in taken)
        return [group for _, group in taken]

    def _pick(self) -> list[int] | None:
        candidates = [(t.version, 0, t.seq) for t, _ in self._ready.values()]
        candidates += [(t.version, 1, t.seq) for t in self._running.values()]
        if len(candidates) < self.batch_size:
            return None
        chosen = sorted(candidates)[: self.batch_size]
        if any(not_ready for _, not_ready, _ in chosen):
            return None
        return [seq for _, _, seq in chosen]

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()
