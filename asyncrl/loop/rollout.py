"""The rollout side of the loop: an asyncio event loop in its own thread that admits items through the
staleness gate and runs a workflow coroutine for each, putting finished groups into the buffer.

Failures never make the rollout side look merely slow:
- an exception from the prompt stream (a bad row, a template or tokenizer error) stops admission and is
  handed to the trainer at once through ``buffer.fail``; groups already in flight still finish into the
  buffer (or are released when the runner stops), none is left counted as running;
- a failed rollout costs its group (counted in ``failures``; the first of each kind is logged with its
  traceback); consecutive failures slow admission down (exponential back-off) and
  ``max_failures_in_a_row`` of them stop the run with the last error.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Callable, Iterator

from asyncrl.loop.buffer import RolloutBuffer, Ticket
from asyncrl.types import TrajectoryGroup

log = logging.getLogger(__name__)

BACKOFF_START_S = 0.05
BACKOFF_MAX_S = 5.0


class RolloutFailures(RuntimeError):
    """Too many rollouts in a row failed; the last error is the ``__cause__``."""


class RolloutRunner:
    def __init__(
        self,
        engine,
        buffer: RolloutBuffer,
        workflow,
        items: Iterator[dict],
        timeout_s: float = 600.0,
        accept: Callable[[TrajectoryGroup], bool] | None = None,
        max_failures_in_a_row: int = 16,
    ):
        self.engine, self.buffer, self.workflow, self.items = engine, buffer, workflow, items
        self.timeout_s = timeout_s
        self.accept = accept  # e.g. DAPO dynamic sampling: drop groups whose rewards are all equal
        self.max_failures_in_a_row = max_failures_in_a_row
        self.failures = 0  # rollouts that raised or timed out
        self.failures_in_a_row = 0
        self.filtered = 0  # groups the accept predicate dropped
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
        """Stop admitting, cancel the rollouts in flight (their admissions are released) and join."""
        self._stop.set()
        self._poke()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def stats(self) -> dict:
        return {"rollout_failures": self.failures, "groups_filtered": self.filtered}

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
        except BaseException as e:  # noqa: BLE001 - a dead rollout thread must never look like a slow one
            log.exception("the rollout loop failed")
            self.buffer.fail(e)
        finally:
            self._loop.close()

    def _admitting(self) -> bool:
        return not (self._stop.is_set() or self.buffer.failed)

    async def _admit_forever(self) -> None:
        tasks: dict[asyncio.Task, Ticket] = {}
        try:
            while self._admitting():
                self._wake.clear()
                if self.failures_in_a_row:
                    await self._back_off(min(BACKOFF_MAX_S, BACKOFF_START_S * 2 ** (self.failures_in_a_row - 1)))
                    if not self._admitting():
                        break
                ticket = self.buffer.try_admit()
                if ticket is None:
                    await self._wake.wait()
                    continue
                item = self._next_item(ticket)
                if item is None:
                    break
                task = asyncio.create_task(self._rollout(ticket, item))
                tasks[task] = ticket
                task.add_done_callback(lambda t: tasks.pop(t, None))
            while tasks and not self._stop.is_set():  # admission ended: the groups in flight finish into the buffer
                await asyncio.wait(list(tasks), timeout=0.5)
        finally:
            pending = dict(tasks)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            for ticket in pending.values():  # a task cancelled before it started never released its ticket
                self.buffer.finish(ticket, None)

    async def _back_off(self, delay: float) -> None:
        """Wait ``delay`` seconds before the next admission, or less if the runner stops meanwhile."""
        deadline = time.monotonic() + delay
        while self._admitting() and time.monotonic() < deadline:
            await asyncio.sleep(min(0.1, deadline - time.monotonic()))

    def _next_item(self, ticket: Ticket) -> dict | None:
        """The next item, or None when the stream ended or failed (the ticket is released either way)."""
        try:
            item = next(self.items)
            self.buffer.started(ticket, item)
            return item
        except StopIteration:  # datasets are endless (epochs); a stream that ends is a bug to report
            self.buffer.fail(RuntimeError("the prompt stream ended; admission stopped"))
        except Exception as e:  # noqa: BLE001 - handed to the trainer thread with its traceback
            e.add_note("raised by the prompt stream in the rollout thread; admission stopped")
            self.buffer.fail(e)
        self.buffer.finish(ticket, None)
        return None

    async def _rollout(self, ticket: Ticket, item: dict) -> None:
        group = None
        try:
            group = _checked(await asyncio.wait_for(self.workflow.run(item, self.engine), self.timeout_s))
            self.failures_in_a_row = 0
            if group is not None and self.accept is not None and not self.accept(group):
                self.filtered += 1
                group = None
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - one failed rollout costs one group, never the run
            group = None
            self._failed(item, e)
        finally:
            self.buffer.finish(ticket, group)

    def _failed(self, item: dict, error: Exception) -> None:
        self.failures += 1
        self.failures_in_a_row += 1
        kind = type(error).__name__
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning(
                "rollout of item %s failed; the group is dropped and counted in rollout_failures "
                "(logged once per kind of error)",
                item.get("id") if isinstance(item, dict) else item,
                exc_info=error,
            )
        if self.failures_in_a_row >= self.max_failures_in_a_row:
            stop = RolloutFailures(
                f"{self.failures_in_a_row} rollouts in a row failed "
                f"(rollout.max_failures_in_a_row); the last one: {kind}: {error}"
            )
            stop.__cause__ = error
            self.buffer.fail(stop)


def _checked(group) -> TrajectoryGroup | None:
    """A workflow's result, or ``TypeError``/``ValueError`` naming what is wrong with it (counted as a failed
    rollout, like an exception): ``None`` or a ``TrajectoryGroup`` of consistent trajectories."""
    if group is None:
        return None
    if not isinstance(group, TrajectoryGroup):
        raise TypeError(f"the workflow returned {type(group).__name__}, not a TrajectoryGroup or None")
    if not group.trajectories:
        raise ValueError("the workflow returned a TrajectoryGroup without trajectories (return None to reject)")
    for i, t in enumerate(group.trajectories):
        if not t.prompt_ids or not t.output_ids:
            raise ValueError(f"trajectory {i} of the workflow's group has no prompt or no output tokens")
        if not len(t.output_ids) == len(t.behav_logprobs) == len(t.versions):
            raise ValueError(
                f"trajectory {i}: {len(t.output_ids)} output ids, {len(t.behav_logprobs)} log-probs "
                f"and {len(t.versions)} versions; they must be one per output token"
            )
        if t.loss_mask is not None and (len(t.loss_mask) != len(t.output_ids) or not any(t.loss_mask)):
            raise ValueError(f"trajectory {i}: loss_mask needs one 0/1 per output token and at least one 1")
        if not isinstance(t.reward, (int, float)) or t.reward != t.reward or abs(t.reward) == float("inf"):
            raise ValueError(f"trajectory {i} has reward {t.reward!r}, not a finite number")
    return group
