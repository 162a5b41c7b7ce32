"""One worker thread that runs the smallest waiting job first: the proxy's templating and tokenising.

The proxy tokenises on one thread (a fast tokenizer used by two threads at once can fail). In arrival order, a
session that sends a few messages of a million characters held every other session's short calls behind all of
them (a 4-token call waited 11.8 s behind three; red team 4). Run smallest first, a short call waits for the
one long job already running at most; a long job waits only while shorter ones keep arriving, and those are
quick by definition."""

from __future__ import annotations

import heapq
import itertools
import threading
from concurrent.futures import Future
from typing import Callable


class ShortestFirst:
    """``submit(size, fn)`` runs ``fn()`` on the worker thread, the waiting job of least ``size`` first (ties
    in arrival order); the returned Future holds its result or its exception."""

    def __init__(self, name: str = "asyncrl-shortest-first"):
        self._waiting: list[tuple[int, int, Callable, Future]] = []
        self._order = itertools.count()
        self._ready = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def submit(self, size: int, fn: Callable) -> Future:
        future: Future = Future()
        with self._ready:
            if self._closed:
                raise RuntimeError("the worker is shut down")
            heapq.heappush(self._waiting, (size, next(self._order), fn, future))
            self._ready.notify()
        return future

    def shutdown(self) -> None:
        """Cancel the waiting jobs and end the thread after the running one."""
        with self._ready:
            self._closed = True
            for *_, future in self._waiting:
                future.cancel()
            self._waiting.clear()
            self._ready.notify()

    def _work(self) -> None:
        while True:
            with self._ready:
                while not self._waiting and not self._closed:
                    self._ready.wait()
                if self._closed:
                    return
                *_, fn, future = heapq.heappop(self._waiting)
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - the caller's to see
                future.set_exception(e)
