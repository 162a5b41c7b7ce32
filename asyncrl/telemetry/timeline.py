"""The run's one clock and account: ``timeline.jsonl`` in the run directory, and the running totals the step
meter, the η policy and the verdict read (``Timeline.account``).

Two kinds of records, times in seconds since the run started:
- ``{"type": "span", "kind": "wait" | "train" | "sync" | "eval" | "save" | "log", "t0": .., "t1": ..,
  "step": ..}`` for the trainer thread (``log``: building, logging and checking the step's record);
- ``{"type": "gen", "t": .., "busy_s": .., "generated_tokens": .., "prefill_s": .., "decode_s": ..,
  "reprefill_s": .., "paused_s": .., "idle_s": .., "gate_closed_s": .., "idle_gate_s": ..}``: the engine's
  cumulative counters (``EngineStats``) and the staleness gate's, sampled every ``period_s``, so any phase's
  share over a window is a difference. ``idle_gate_s`` is the engine's idle time while the gate kept work out:
  per sampling interval, the smaller of the engine's idle time and the gate's closed time (an upper bound of
  their overlap, exact when either fills the interval).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from asyncrl.api.engine import EngineStats


@dataclass
class _Span:
    t0: float
    seconds: float = 0.0


class Timeline:
    def __init__(
        self,
        path: str | Path,
        engine_stats: Callable[[], "EngineStats"],
        period_s: float = 0.25,
        start_s: float = 0.0,
        gate_closed_s: Callable[[], float] = lambda: 0.0,
    ):
        self._file = Path(path).open("a")
        self._lock = threading.Lock()
        self._broken = False  # a write failed: no more lines
        self._engine_stats, self._gate_closed_s = engine_stats, gate_closed_s
        self._period = period_s
        self._t0 = time.perf_counter() - start_s  # a resumed run's timeline continues its clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._spans: Counter = Counter()  # seconds per span kind
        self._last = (engine_stats(), gate_closed_s())  # the previous sample's counters
        self._idle_gate = 0.0

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
            with self._lock:
                self._spans[kind] += span.seconds
            self._write({"type": "span", "kind": kind, "t0": round(span.t0, 4), "t1": round(t1, 4), "step": step})

    def account(self) -> dict:
        """The totals so far: ``span_<kind>_s`` per trainer span kind, the engine's counters, ``gate_closed_s``
        and ``idle_gate_s`` (a fresh sample, so a window's differences end now)."""
        gen = self._take_sample()
        with self._lock:
            return {**{f"span_{k}_s": v for k, v in self._spans.items()}, **gen}

    def start(self) -> "Timeline":
        self._thread = threading.Thread(target=self._sample, name="asyncrl-timeline", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            try:
                self._file.close()
            except OSError:  # what a full disk left unwritten was said when it failed
                pass

    def _sample(self) -> None:
        while not self._stop.wait(self._period):
            gen = self._take_sample()
            self._write(
                {
                    "type": "gen",
                    "t": round(self.now(), 4),
                    **{k: round(v, 4) if isinstance(v, float) else v for k, v in gen.items()},
                }
            )

    def _take_sample(self) -> dict:
        """The engine's and the gate's counters now, with the idle time spent behind the closed gate added up
        since the previous sample."""
        stats, closed = self._engine_stats(), self._gate_closed_s()
        with self._lock:
            before, closed_before = self._last
            self._idle_gate += max(0.0, min(stats.idle_s - before.idle_s, closed - closed_before))
            self._last = (stats, closed)
            return {**asdict(stats), "gate_closed_s": closed, "idle_gate_s": self._idle_gate}

    def _write(self, record: dict) -> None:
        """One line of timeline.jsonl; once a write fails (a full disk) the timeline stops, said once, and the run
        goes on (metrics.jsonl, which a resume needs, stops the run when it cannot be written)."""
        with self._lock:
            if self._file.closed or self._broken:
                return
            try:
                self._file.write(json.dumps(record) + "\n")
                self._file.flush()
            except OSError as e:
                self._broken = True
                logging.getLogger(__name__).warning(
                    "timeline.jsonl: cannot write (%s): the timeline stops here, the run goes on", e.strerror or e
                )
