"""The reward service: scores completions concurrently in worker processes, with a per-call timeout.

A reward that raises, returns anything but a finite real number (see :func:`asyncrl.reward.base.as_reward`),
kills its worker or runs past ``timeout_s`` costs one sample: it gets the configured default, is counted
(``reward_errors`` / ``reward_timeouts``), is logged the first time with the sample id, and training goes on. A
worker that timed out (a call past ``timeout_s``, or a start-up past ``STARTUP_TIMEOUT_S``) or died (its pipe
closed: ``os._exit``, a segfault, the OOM killer) is killed with everything it started and replaced on the next
call (counted in ``reward_worker_restarts``). How a worker's processes are contained (a pid namespace per
worker, or its process tree) is :mod:`asyncrl.reward.isolation`.

``workers=0`` scores in the calling thread: no processes, but no timeout can be enforced.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from queue import LifoQueue
from typing import Callable

from asyncrl.reward.base import call_reward, facts
from asyncrl.reward.isolation import isolation, kill_descendants
from asyncrl.reward.sandbox_cleanup import sweep_abandoned

log = logging.getLogger(__name__)

COUNTED_KINDS = ("JudgeAmbiguous",)
"""Kinds of reward failure counted apart as well (``reward_errors/KIND``): a judge's answer read as neither of two
scores it gives."""
STARTUP_TIMEOUT_S = 120.0  # importing a reward module (sympy, reasoning-gym) can take seconds on a busy CPU


class RewardFailure(RuntimeError):
    """A reward call that raised, returned a non-number, lost its worker or timed out. ``default`` is the
    reward the service gives instead (``reward.default``), for the caller to score the sample with."""

    def __init__(self, message: str, default: float = 0.0):
        super().__init__(message)
        self.default = default


class _Worker:
    """One worker process and its two pipe ends. ``proc`` is the worker, or in a pid namespace the ``unshare``
    process in front of it (the worker dies with it)."""

    def __init__(self, payload: bytes):
        down_r, down_w = os.pipe()
        up_r, up_w = os.pipe()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # import what we can
        self.isolation, prefix = isolation()
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", "asyncrl.reward.worker", str(down_r), str(up_w)],
            pass_fds=(down_r, up_w),
            stdin=subprocess.DEVNULL,
            process_group=0,
            env=env,
        )
        os.close(down_r)
        os.close(up_w)
        self._lock, self._killed = threading.Lock(), False
        self.outbox = Connection(down_w, readable=False)
        self.inbox = Connection(up_r, writable=False)
        try:
            self.outbox.send(payload)
        except OSError:  # it died before reading its payload (e.g. its namespace was refused): _reply says so
            pass
        self.startup_error = self._reply(STARTUP_TIMEOUT_S)
        if self.startup_error[0] == "ready":
            self.startup_error = None

    def _reply(self, timeout: float) -> tuple[str, object]:
        try:
            if not self.inbox.poll(timeout):
                return "timeout", None
            return self.inbox.recv()
        except (EOFError, OSError):  # the pipe closed: the worker is gone, even if it still looks alive
            try:
                code = self.proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                code = None
            return "died", f"reward worker died (exit code {code})"

    def call(self, item: dict, completion: str, timeout: float) -> tuple[str, object]:
        """('ok', value) | ('error', text) | ('died', text) | ('timeout', None)."""
        try:
            self.outbox.send((item, completion))
        except (OSError, ValueError) as e:
            return "died", f"reward worker unreachable ({e})"
        return self._reply(timeout)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace_s: float = 2.0) -> None:
        """Ask an idle worker to exit; kill its process group if it does not; close the pipes."""
        try:
            self.outbox.send(None)
            self.proc.wait(timeout=grace_s)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            pass
        self.discard()

    def kill(self) -> None:
        """SIGKILL the worker's process group (the worker and every sandbox it started) and reap it. Safe
        from any thread: the pipes stay open, so a thread waiting on this worker simply reads EOF."""
        with self._lock:
            if self._killed:
                return
            self._killed = True
            if self.isolation != "pidns":  # in a namespace the kernel kills them when the worker dies
                kill_descendants(self.proc.pid)  # before the worker: an orphan would leave its tree
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.proc.wait()
        sweep_abandoned()  # sandboxed programs that left the worker's process group (private uids)

    def discard(self) -> None:
        """Kill and close the pipes; only by the thread that holds the worker (nobody else uses its pipes)."""
        self.kill()
        for conn in (self.outbox, self.inbox):
            conn.close()


def item_label(item: dict) -> str:
    """How a message names an item: its id (a file row's own id), else the start of its question."""
    for key in ("id", "source_id"):
        if item.get(key) is not None:
            return str(item[key])
    return repr(str(item.get("question", ""))[:60])


class RewardService:
    """Scores completions with a reward function; a failure costs one sample (the default reward), is
    counted, and is logged once. ``score`` is thread-safe; ``ascore`` awaits it from the rollout loop."""

    def __init__(
        self,
        fn: Callable[..., float],
        default: float = 0.0,
        *,
        timeout_s: float = 30.0,
        workers: int = 0,
        threads: int = 1,
    ):
        self.fn, self.default, self.timeout_s = fn, default, timeout_s
        self.held_out_fn: Callable[..., float] | None = None  # held-out answers' scorer, when not fn (a verifier)
        self.errors = self.timeouts = self.calls = self.restarts = 0
        self.done = 0  # calls that returned (a call in flight is neither a success nor a failure yet)
        self.queue_s = self.run_s = 0.0  # call-seconds waiting (for the executor, for a worker) and running
        self._local = threading.local()  # this thread's wait for a worker in its current call
        self._lock = threading.Lock()
        self._logged: set[str] = set()
        self.errors_by_kind: dict[str, int] = {}  # failures a reward function marks by kind (COUNTED_KINDS)
        self.first_failure = ""  # what the first failed call said, for the watchdog's message
        self._closed = False
        self.closing: list[Callable[[], None]] = []
        self._payload = _payload(fn) if workers > 0 else None
        if workers > 0 and self._payload is None:
            log.warning(
                "reward function %r cannot be pickled for worker processes; scoring in-process "
                "without a timeout (define it at module level to get workers)",
                fn,
            )
            workers = 0
        self.workers = workers
        self._idle: LifoQueue[_Worker | None] = LifoQueue()
        for _ in range(workers):
            self._idle.put(None)  # started on first use
        self._all: set[_Worker] = set()
        # in-process (workers=0), ``threads`` calls at once (a reward model batches them)
        self._executor = ThreadPoolExecutor(max_workers=max(1, workers or threads), thread_name_prefix="reward")
        self._facts = facts(fn)  # constant facts for metrics, e.g. the sandbox mechanism

    # ---- scoring -------------------------------------------------------------------------------------
    def score(self, item: dict, completion: str, submitted: float | None = None) -> float:
        """The reward, or the default (counted and logged once) when the function fails or times out.
        ``submitted`` (``time.perf_counter()``) is when the call was asked for: the time until it starts, and
        until a worker is free, counts as queued (``reward_queue_s``), the rest as running (``reward_run_s``)."""
        start = time.perf_counter()
        with self._lock:
            self.calls += 1
        status, value = self._run(item, completion)
        end = time.perf_counter()
        with self._lock:
            if not self._closed:
                self.done += 1
            waited = self._waited_in_calls()
            self.queue_s += (start - submitted if submitted is not None else 0.0) + waited
            self.run_s += end - start - waited
        if status == "ok":
            return value
        if not self._closed:  # a call cut short by close() is not the reward's fault
            self._count(status, item, value)
        return self.default

    async def ascore(self, item: dict, completion: str) -> float:
        return await asyncio.get_running_loop().run_in_executor(
            self._executor, self.score, item, completion, time.perf_counter()
        )

    def eval_fn(self, prompt: str, completion: str, **fields) -> float:
        """A plain reward function that scores through the service (workers, timeout) for held-out
        evaluation: a failure raises :class:`RewardFailure` (carrying the configured default) for the caller
        to count (``eval_reward_errors``) instead of entering the training counters. With ``held_out_fn`` (a reward
        model's service: raw scores are no accuracy) that function scores them, in this thread."""
        if self.held_out_fn is not None:
            try:
                return call_reward(self.held_out_fn, {"question": prompt, **fields}, completion)
            except Exception as e:  # noqa: BLE001 - counted by the caller
                raise RewardFailure(f"reward error: {type(e).__name__}: {e}", self.default) from e
        status, value = self._run({"question": prompt, **fields}, completion)
        if status != "ok":
            raise RewardFailure(f"reward {status}: {value}" if value else f"reward {status}", self.default)
        return value

    def _run(self, item: dict, completion: str) -> tuple[str, object]:
        """('ok', finite float) | ('error' or 'died', text) | ('timeout', None). In-process and in a worker
        alike, the value goes through :func:`~asyncrl.reward.base.call_reward`, so one rule decides what is a
        reward."""
        if self._closed:
            raise RuntimeError("the reward service is closed")
        if self.workers > 0:
            return self._score_in_worker({k: v for k, v in item.items() if k != "prompt_ids"}, completion)
        try:
            return "ok", call_reward(self.fn, item, completion)
        except Exception as e:  # noqa: BLE001 - a failing reward never stops training
            return "error", f"{type(e).__name__}: {e}"

    def _score_in_worker(self, item: dict, completion: str) -> tuple[str, object]:
        t0 = time.perf_counter()
        worker = self._idle.get()  # this thread now owns the worker (or the empty slot)
        self._local.waited = time.perf_counter() - t0
        try:
            if self._closed:
                return "error", "the reward service is closed"
            if worker is None or not worker.alive():
                worker = self._start_worker(worker)
            status, value = worker.startup_error or worker.call(item, completion, self.timeout_s)
            if status in ("timeout", "died") or (status == "error" and not worker.alive()):
                worker.kill()  # timed out (in a call or at start-up) or died: a fresh one starts next time
            return status, value
        finally:
            if self._closed and worker is not None:
                worker.discard()
                worker = None
            self._idle.put(worker)

    def _start_worker(self, old: _Worker | None) -> _Worker:
        if old is not None:
            old.discard()
            with self._lock:
                self._all.discard(old)
                self.restarts += 1
        worker = _Worker(self._payload)
        with self._lock:
            self._all.add(worker)
        return worker

    def _count(self, status: str, item: dict, detail: object) -> None:
        kind = "timeout" if status == "timeout" else "error"
        with self._lock:
            if kind == "timeout":
                self.timeouts += 1
            else:
                self.errors += 1
                name = str(detail).split(":", 1)[0]
                if name in COUNTED_KINDS:
                    self.errors_by_kind[name] = self.errors_by_kind.get(name, 0) + 1
            first = kind not in self._logged
            self._logged.add(kind)
        if first:
            what = f"timed out after {self.timeout_s}s" if kind == "timeout" else f"failed ({detail})"
            self.first_failure = self.first_failure or f"reward function {what} on item {item_label(item)}"
            log.warning(
                "reward function %s on item %s; using %s (counted in reward_%ss, logged once)",
                what,
                item_label(item),
                self.default,
                kind,
            )

    # ---- reporting and shutdown ----------------------------------------------------------------------
    def _waited_in_calls(self) -> float:
        waited = getattr(self._local, "waited", 0.0)
        self._local.waited = 0.0
        return waited

    def stats(self) -> dict:
        with self._lock:
            return {
                "reward_errors": self.errors,
                "reward_timeouts": self.timeouts,
                "reward_calls": self.calls,
                "reward_calls_done": self.done,
                "reward_worker_restarts": self.restarts,
                "reward_queue_s": self.queue_s,
                "reward_run_s": self.run_s,
                **{f"reward_errors/{k}": n for k, n in self.errors_by_kind.items()},
                **self._facts,
            }

    def close(self) -> None:
        """Stop every worker and the sandboxes they started; a call in flight returns the default, uncounted.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._executor.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            busy = set(self._all)
        while not self._idle.empty():  # idle workers: ask them to exit
            worker = self._idle.get_nowait()
            if worker is not None:
                busy.discard(worker)
                worker.stop()
        for worker in busy:  # in a call: kill; the calling thread reads EOF and closes the pipes
            worker.kill()
        for _ in range(self.workers):
            self._idle.put(None)  # wake any thread waiting for a worker; it sees the service closed
        for close in self.closing:  # what the service was given to end with it (a served judge)
            close()

    def worker_pids(self) -> list[int]:
        """Pids of the live worker processes (for tests and diagnostics)."""
        with self._lock:
            return [w.proc.pid for w in self._all if w.alive()]


def _payload(fn: Callable[..., float]) -> bytes | None:
    """The pickled function for the workers, or None when it cannot travel (a lambda or closure, or a
    function of the ``__main__`` script, which a worker cannot import)."""
    target = getattr(fn, "fn", fn)  # a BoundReward's function
    if getattr(target, "__module__", None) == "__main__":
        return None
    try:
        return pickle.dumps(fn)
    except (pickle.PicklingError, AttributeError, TypeError):
        return None
