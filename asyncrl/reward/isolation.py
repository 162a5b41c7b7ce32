"""How reward worker processes are contained, so that nothing a reward function starts outlives its worker.

- ``pidns``: each worker is pid 1 of a pid namespace of its own (util-linux ``unshare --pid --fork
  --kill-child --mount-proc``; inside a user namespace when not root). When the worker dies, however it dies
  (killed after a timeout, ``os._exit``, the service closing), the kernel kills every process left in the
  namespace, whatever session or process group it moved to (``os.setsid`` does not escape it). The worker gets
  a mount namespace with its own ``/proc`` too, so the pids it reads there are the namespace's.
- ``subreaper``: no namespace (``unshare`` missing or refused). The worker is a child subreaper, so an orphaned
  descendant comes back to it instead of leaving its tree, and the tree is walked and killed
  (``kill_descendants``) before the worker is killed and when it exits. A fork bomb could outrun the walk.

The sandbox of the code reward (:mod:`asyncrl.reward.sandbox`) isolates the untrusted program itself; this
contains the reward function's own processes. docs/rewards.md says what each mode gives.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

PID_NAMESPACE = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--"]
"""The worker as pid 1 of a pid namespace (and a mount namespace with its own /proc, so that pids read from /proc
inside, by the sandbox's cleanup, are the namespace's)."""
USER_PID_NAMESPACE = ["unshare", "--user", "--map-current-user", *PID_NAMESPACE[1:]]
"""The same for a user who is not root, where unprivileged user namespaces are allowed."""

_isolation: tuple[str, list[str]] | None = None


def isolation() -> tuple[str, list[str]]:
    """(name, command prefix) of the containment of worker processes on this machine, probed once per process:
    ``pidns`` (a pid namespace per worker), else ``subreaper`` (no prefix; the process tree is walked)."""
    global _isolation
    if _isolation is None:
        _isolation = ("subreaper", [])
        for prefix in (PID_NAMESPACE, USER_PID_NAMESPACE) if shutil.which("unshare") else ():
            try:
                ok = (
                    subprocess.run(
                        prefix + [sys.executable, "-S", "-c", "import os; assert os.getpid() == 1"],
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        timeout=30,
                    ).returncode
                    == 0
                )
            except (OSError, subprocess.TimeoutExpired):
                ok = False
            if ok:
                _isolation = ("pidns", prefix)
                break
    return _isolation


def descendants(pid: int) -> list[int]:
    """Every live (non-zombie) process below ``pid`` in the process tree (one read of ``/proc/*/stat``)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                state, parent = f.read().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue
        if state not in ("Z", "X"):
            children.setdefault(int(parent), []).append(int(name))
    found, frontier = [], [pid]
    while frontier:
        frontier = [c for p in frontier for c in children.get(p, ())]
        found += frontier
    return found


def kill_descendants(pid: int, rounds: int = 50) -> None:
    """SIGKILL every descendant of ``pid`` until none is left (at most ``rounds`` walks). Meant for a subreaper's
    tree (this worker's): an orphan comes back to it instead of leaving the tree, so the walk finds it."""
    for _ in range(rounds):
        alive = descendants(pid)
        if not alive:
            return
        for child in alive:
            try:
                os.kill(child, signal.SIGKILL)
            except OSError:
                pass
        if pid == os.getpid():
            reap_orphans()


def reap_orphans() -> None:
    """Collect exited children; every child the reward function started itself has been waited for."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
