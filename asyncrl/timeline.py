"""When the trainer and the generator were busy: ``timeline.jsonl`` in the run directory.

Two kinds of records, times in seconds since the run started:
- ``{"type": "span", "kind": "wait" | "train" | "sync" | "eval" | "save", "t0": .., "t1": .., "step": ..}``
  for the trainer thread;
- ``{"type": "gen", "t": .., "busy_s": .., "generated_tokens": ..}``: the engine's cumulative counters,
  sampled every ``period_s``, so the generator's busy fraction over any window is a difference.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from asyncrl.engine.base import EngineStats


@dataclass
class _Span:
    t0: float
    seconds: float = 0.0


class Timeline:
    def __init__(self, path: str | Path, engine_stats: Callable[[], "EngineStats"], period_s: float = 0.25,
                 start_s: float = 0.0):
        self._file = Path(path).open("a")
        self._lock = threading.Lock()
        self._engine_stats = engine_stats
        self._period = period_s
        self._t0 = time.perf_counter() - start_s  # a resumed run's timeline continues its clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def now(self) -> float:
        return time.perf_counter() - self._t0

    @contextlib.contextmanager
    def span(self, kind: str, step: int):
        """Record the block as a span; the yielded object's ``seconds`` is its duration once it has ended."""
        span = _Span(self.now())
        try:
            yield span
        finally:
            t1 = self.now()
            span.seconds = t1 - span.t0
            self._write({"type": "span", "kind": kind, "t0": round(span.t0, 4), "t1": round(t1, 4), "step": step})

    def start(self) -> "Timeline":
        self._thread = threading.Thread(target=self._sample, name="asyncrl-timeline", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            self._file.close()

    def _sample(self) -> None:
        while not self._stop.wait(self._period):
            stats = self._engine_stats()
            self._write({"type": "gen", "t": round(self.now(), 4), "busy_s": round(stats.busy_s, 4),
                         "generated_tokens": stats.generated_tokens})

    def _write(self, record: dict) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.write(json.dumps(record) + "\n")
                self._file.flush()
