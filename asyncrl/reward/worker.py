"""A reward worker process: ``python -m asyncrl.reward.worker READ_FD WRITE_FD``.

Started by :class:`asyncrl.reward.service.RewardService` as a fresh interpreter (not a fork of the trainer,
which holds torch and running threads), in its own process group so the service can kill it together with
any sandbox it started. Protocol over two pipes (``multiprocessing.connection`` framing):

- first message in: the pickled reward function (importable: the service passes its ``sys.path`` as
  ``PYTHONPATH``); reply ``("ready", None)`` or ``("error", text)``;
- then ``(item, completion)`` -> ``("ok", value)`` or ``("error", text)``; ``None`` or EOF ends the worker.
  ``value`` has passed :func:`asyncrl.reward.base.call_reward`, the same check as in-process scoring: a
  finite real number, as a float; anything else (a string such as ``"1.0"``, ``None``, NaN, inf) is an error.

Reward functions run in the main thread, so signal-based timeouts inside them (math-verify's) work.
The worker is a child subreaper: processes that a reward function's children orphaned come back to it and
are reaped after every call, instead of piling up as zombies under a container init that may not reap.
The sandbox reaps everything it starts itself, but in its rlimits fallback (no pid namespace) a program
can detach processes. They are killed by uid or tag, and this is where they end up.

Containment: the worker runs where :func:`asyncrl.reward.isolation.isolation` says (a pid namespace of its own
where the machine allows it); without one, what the reward function started is killed by walking this
subreaper's process tree when the worker ends (``kill_descendants``).
"""

from __future__ import annotations

import ctypes
import os
import pickle
import sys
from multiprocessing.connection import Connection

from asyncrl.reward.isolation import kill_descendants, reap_orphans

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: orphans go to init as usual
        pass


def serve(inbox: Connection, outbox: Connection) -> None:
    try:
        fn = pickle.loads(inbox.recv())
    except Exception as e:  # noqa: BLE001 - reported to the service, which counts every call as an error
        outbox.send(("error", f"cannot load the reward function in a worker: {type(e).__name__}: {e}"))
        return
    from asyncrl.reward.base import call_reward

    outbox.send(("ready", None))
    while True:
        try:
            msg = inbox.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        item, completion = msg
        try:
            reply = ("ok", call_reward(fn, item, completion))
        except BaseException as e:  # noqa: BLE001 - any failure costs one sample, never the worker
            reply = ("error", f"{type(e).__name__}: {e}")
        reap_orphans()
        outbox.send(reply)


def main() -> None:
    become_subreaper()
    try:
        serve(Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]), readable=False))
    finally:  # nothing the reward function started outlives the worker (in a pid namespace, the kernel does it)
        kill_descendants(os.getpid())
        reap_orphans()


if __name__ == "__main__":
    main()
