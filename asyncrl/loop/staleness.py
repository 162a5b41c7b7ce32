"""η as a policy: the max staleness the gate admits under, fixed or tuned online from the run's accounting
(``rollout.max_head_offpolicyness``: a number, or ``auto`` with ``rollout.max_staleness_limit``).

The loop hands the policy each step's metrics record (``observe``); the buffer reads ``bound()`` once per
version, when the version is set, so η is constant while a version admits. Whatever the policy says, the gate
enforces it: a group admitted at version v is trained by version v + η(v) (``asyncrl.loop.buffer``), so every
trained token is at most the η of its group's version behind, and never more than the limit.

The control law of ``AutoStaleness`` (docs/report.md "η that tunes itself" has it in full, with what it was
measured against): η starts at the limit (speed first), rises at once when the trainer waited behind a closed gate
(the work in flight grows by the trainer's shortfall), falls by one when the trainer did not wait for two windows
(never to a value that made it wait), and skips the steps a change, an evaluation or a checkpoint makes
unrepresentative. So η settles at the smallest value that keeps the trainer from waiting; where waiting comes from
slow generation that a larger η cannot hide (the gate was open), η does not grow.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass


@dataclass
class FixedStaleness:
    """A fixed η."""

    max_staleness: int

    def bound(self) -> int:
        return self.max_staleness

    def observe(self, record: dict) -> None:
        pass

    def state(self) -> dict:
        return {}

    def restore(self, state: dict) -> None:
        pass


class AutoStaleness:
    """η tuned from the accounting of the last ``window`` steps, between 0 and ``limit`` (module docstring)."""

    def __init__(
        self, limit: int, start: int | None = None, window: int = 2, wait_high: float = 0.05, wait_low: float = 0.01
    ):
        if limit < 0 or window < 1 or not 0 <= wait_low <= wait_high:
            raise ValueError(
                f"AutoStaleness needs limit >= 0, window >= 1 and 0 <= wait_low <= wait_high, got "
                f"{limit}, {window}, {wait_low}, {wait_high}"
            )
        self.limit, self.window, self.wait_high, self.wait_low = limit, window, wait_high, wait_low
        self._max_staleness = limit if start is None else min(start, limit)  # from the limit down: speed first
        self._floor = 0  # the smallest η not known to make the trainer wait
        self._recent: list[dict] = []
        self._skip = 0  # steps not to read after a change
        self._lock = threading.Lock()  # bound() is read by the rollout thread
        self._warm = False

    def bound(self) -> int:
        with self._lock:
            return self._max_staleness

    def observe(self, record: dict) -> None:
        if not self._warm:  # the first step waits for the first batch whatever η is: not a signal
            self._warm = True
            return
        if _away(record) > 0.5 * _num(record, "step_time_s"):  # evaluating or saving: the buffer filled meanwhile
            self._skip = 2
            return
        if self._skip:  # the two steps after a change train groups admitted before the new η took hold
            self._skip -= 1
            return
        self._recent = (self._recent + [record])[-2 * self.window :]
        if len(self._recent) < self.window:
            return
        wait = _wait_share(self._recent[-self.window :])
        gate_closed = sum(_num(r, "gate_closed_s") for r in self._recent[-self.window :])
        with self._lock:
            now = self._max_staleness
            if wait > self.wait_high and gate_closed > 0 and now < self.limit:
                self._floor = max(self._floor, now + 1)
                self._max_staleness = raised(now, wait, self.limit)
            elif (
                len(self._recent) == 2 * self.window and _wait_share(self._recent) < self.wait_low and now > self._floor
            ):
                self._max_staleness = now - 1
            if self._max_staleness != now:  # judge the new η on a window of its own
                self._recent, self._skip = [], 2

    def state(self) -> dict:
        """Where the law stands (η, the floor, the steps it is reading or skipping), so that a resumed run goes
        on from there instead of starting again at the limit."""
        with self._lock:
            return {
                "max_staleness": self._max_staleness,
                "floor": self._floor,
                "skip": self._skip,
                "recent": [{k: _num(r, k) for k in READ} for r in self._recent],
            }

    def restore(self, state: dict) -> None:
        if not state:  # a checkpoint written before η was saved: start over from the limit
            return
        with self._lock:
            self._max_staleness = min(self.limit, max(0, int(state.get("max_staleness", state.get("eta", 0)))))
            self._floor = min(self._max_staleness, max(0, int(state["floor"])))
            self._skip = int(state["skip"])  # not warm: a resumed run's first step waits for generation to restart
            self._recent = [dict(r) for r in state["recent"]][-2 * self.window :]


READ = ("step_time_s", "trainer_wait_s", "gate_closed_s", "trainer_eval_s", "trainer_save_s")
"""The keys of a step's record that the law reads."""


def raised(max_staleness: int, wait: float, limit: int) -> int:
    """The η after a window in which the trainer waited ``wait`` of the time behind a closed gate: where
    generation is latency-bound (episodes waiting on tools, a gate holding back work the generator could run),
    throughput grows with the work in flight, (η + 1)·B groups, so (η + 1) grows by 1 / (1 − wait); at least
    η + 1, at most three times the work in flight, never above ``limit``."""
    grown = math.ceil((max_staleness + 1) / max(1.0 - wait, 1 / 3) - 1e-9) - 1
    return min(limit, max(max_staleness + 1, grown))


def _away(record: dict) -> float:
    """Seconds of the step the trainer spent evaluating or checkpointing."""
    return _num(record, "trainer_eval_s") + _num(record, "trainer_save_s")


def _wait_share(records: list[dict]) -> float:
    """The share of the trainer's time, evaluation and checkpoints aside, spent waiting for batches."""
    wall = sum(max(0.0, _num(r, "step_time_s") - _away(r)) for r in records)
    return sum(_num(r, "trainer_wait_s") for r in records) / wall if wall > 0 else 0.0


def _num(record: dict, key: str) -> float:
    value = record.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0
