"""Where an engine loop's time goes: every moment of it is counted to one phase (an ``EngineStats`` field:
prefill, decode, re-prefill, paused, idle) from the moment the loop enters it, and the counters can be read at any
moment from any thread, the current phase counted up to that moment."""

from __future__ import annotations

import threading
import time

from asyncrl.api.engine import EngineStats


class PhaseClock:
    def __init__(self):
        self._stats = EngineStats()  # replaced whole under the lock, so a reader gets one snapshot
        self._phase: tuple[str, float] | None = None  # (EngineStats field, since): where the loop's time goes now
        self._lock = threading.Lock()

    @property
    def phase(self) -> str | None:
        """The phase the loop is in now (None: not counted, the loop is not running)."""
        phase = self._phase
        return None if phase is None else phase[0]

    def read(self) -> EngineStats:
        """The counters now, the current phase counted up to this moment: two readings a window apart differ by
        exactly the window's time, however the loop's iterations straddle its edges."""
        with self._lock:
            if self._phase is None:
                return self._stats
            kind, since = self._phase
            return self._stats.plus(**{kind: time.perf_counter() - since})

    def enter(self, kind: str | None) -> None:
        """The loop's time goes to phase ``kind`` (None: not counted) from now on; the time since the last change
        goes to the phase it was in."""
        with self._lock:  # the clock read under the lock: no reading falls between it and the change
            now = time.perf_counter()
            if self._phase is not None:
                was, since = self._phase
                self._stats = self._stats.plus(**{was: now - since})
            self._phase = None if kind is None else (kind, now)

    def count(self, **deltas) -> None:
        """Add ``deltas`` to the counters (``EngineStats`` field names)."""
        with self._lock:
            self._stats = self._stats.plus(**deltas)
