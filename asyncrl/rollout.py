"""The rollout side of the loop: an asyncio event loop in its own thread that admits items through the
staleness gate and runs a workflow coroutine for each, putting finished groups into the buffer."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Callable, Iterator

from asyncrl.buffer import RolloutBuffer, Ticket
from asyncrl.types import TrajectoryGroup

log = logging.getLogger(__name__)


class RolloutRunner:
    def __init__(self, engine, buffer: RolloutBuffer, workflow, items: Iterator[dict], timeout_s: float = 600.0,
                 accept: Callable[[TrajectoryGroup], bool] | None = None):
        self.engine, self.buffer, self.workflow, self.items = engine, buffer, workflow, items
        self.timeout_s = timeout_s
        self.accept = accept  # e.g. DAPO dynamic sampling: drop groups whose rewards are all equal
        self.failures = 0  # rollouts that raised or timed out (counted in the metrics, logged once each kind)
        self.filtered = 0  # groups the accept predicate dropped
        self.exhausted = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._logged: set[str] = set()

    def start(self) -> "RolloutRunner":
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run_loop, args=(ready,), name="asyncrl-rollout", daemon=True)
        self._thread.start()
        ready.wait()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._poke()
        if self._thread is not None:
            self._thread.join(timeout=30)

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def _poke(self) -> None:
        if self._loop is not None and self._wake is not None and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(self._wake.set)
            except RuntimeError:  # loop closed between the check and the call
                pass

    def _run_loop(self, ready: threading.Event) -> None:
        self._loop = asyncio.new_event_loop()
        self._wake = asyncio.Event()
        self.buffer.on_change = self._poke
        ready.set()
        try:
            self._loop.run_until_complete(self._admit_forever())
        finally:
            self._loop.close()

    async def _admit_forever(self) -> None:
        tasks: set[asyncio.Task] = set()
        while not self._stop.is_set():
            self._wake.clear()
            ticket = self.buffer.try_admit()
            if ticket is None:
                await self._wake.wait()
                continue
            try:
                item = next(self.items)
            except StopIteration:
                self.exhausted = True
                self.buffer.finish(ticket, None)
                break
            task = asyncio.create_task(self._rollout(ticket, item))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if self.exhausted and not self._stop.is_set():
            while tasks and not self._stop.is_set():  # let in-flight groups finish
                await asyncio.wait(list(tasks), timeout=0.5)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _rollout(self, ticket: Ticket, item: dict) -> None:
        group = None
        try:
            group = await asyncio.wait_for(self.workflow.run(item, self.engine), self.timeout_s)
            if group is not None and self.accept is not None and not self.accept(group):
                self.filtered += 1
                group = None
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - one failed rollout costs one group, never the run
            self.failures += 1
            kind = type(e).__name__
            if kind not in self._logged:
                self._logged.add(kind)
                log.warning("rollout of item %s failed (%s: %s); the group is dropped and counted in "
                            "rollout_failures", item.get("id"), kind, e)
        finally:
            self.buffer.finish(ticket, group)
