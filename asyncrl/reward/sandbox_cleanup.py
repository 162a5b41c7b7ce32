"""The processes of sandbox runs: finding what a run left behind, killing it, and the private uids that make
that possible when running as root (a small pool of uids, each leased to one run at a time through a lock
file, and swept when the run that held it died mid-run).

Split from :mod:`asyncrl.reward.sandbox` (which starts and waits for the runs) so that each file keeps to
one job; nothing here starts an untrusted program.
"""

from __future__ import annotations

import fcntl
import logging
import os
import pwd
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)

TAG_VAR = "ASYNCRL_SANDBOX_TAG"
"""Environment variable carrying each run's random tag, to find its processes without a private uid."""
UID_BASE, UID_COUNT = 61000, 64
UID_LOCK_DIR = Path(tempfile.gettempdir()) / "asyncrl-sandbox-uids"


def default_python() -> str:
    """The interpreter for untrusted code and for killing as a private uid: the system one (readable by any
    uid, no site-packages), else ours."""
    return "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else os.path.realpath(sys.executable)


def kill_leftovers(uid: int | None, tag: str, grace_s: float = 0.05, rounds: int = 20) -> None:
    """Make sure nothing the run started is still alive. Processes of a namespace are killed by the kernel
    when its init exits, a moment after the front process returns, so first wait ``grace_s``; then kill:
    all processes of the private uid (``kill(-1)`` as that uid, which no fork bomb can outrun), or, without a
    private uid, every process that carries the run's tag."""

    def alive():
        return processes_of_uid(uid) if uid is not None else leftover_processes(tag)

    deadline = time.monotonic() + grace_s
    while alive():
        if time.monotonic() < deadline:
            time.sleep(0.002)
            continue
        if rounds == 0:
            log.warning("sandbox: processes of uid %s / tag %s survive repeated SIGKILL", uid, tag)
            return
        rounds -= 1
        if uid is not None:
            subprocess.run(
                [default_python(), "-I", "-S", "-c", "import os; os.kill(-1, 9)"],
                user=uid,
                group=uid,
                extra_groups=[],
                env={},
                check=False,
            )
        else:
            for pid in leftover_processes(tag):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        time.sleep(0.01)


def children_of(pid: int) -> list[int]:
    """Pids whose parent is ``pid`` (one read of ``/proc/*/stat``; the ``children`` file needs a kernel
    option)."""
    found = []
    for child in _live_pids():
        try:
            with open(f"/proc/{child}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(child)
        except (OSError, IndexError, ValueError):
            pass
    return found


def processes_of_uid(uid: int) -> list[int]:
    """Live (non-zombie) processes owned by ``uid`` (``/proc/PID`` ownership: one ``stat`` per process)."""
    out = []
    for pid in _live_pids():
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
        except OSError:
            continue
        if not _status(pid).get("State", "Z").strip().startswith(("Z", "X")):
            out.append(pid)
    return out


def leftover_processes(tag: str) -> list[int]:
    """Live processes started by the sandbox run tagged ``tag`` (found through their environment)."""
    needle = f"{TAG_VAR}={tag}".encode()
    out = []
    for pid in _live_pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read():
                    if not _status(pid).get("State", "").strip().startswith(("Z", "X")):
                        out.append(pid)
        except OSError:
            pass
    return out


def _live_pids():
    for name in os.listdir("/proc"):
        if name.isdigit():
            yield int(name)


def _status(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/status") as f:
            return dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
        return {}


# ---- private uids ---------------------------------------------------------------------------------------
class UidLease:
    """A private uid held through an exclusive ``flock`` (released by the kernel if the holder dies); a uid
    whose previous holder died mid-run is swept before reuse."""

    def __init__(self, uid: int, fd: int):
        self.uid, self.fd = uid, fd

    @classmethod
    def acquire(cls, timeout_s: float = 60.0) -> "UidLease":
        _check_lock_dir()
        deadline = time.monotonic() + timeout_s
        while True:
            for uid in range(UID_BASE, UID_BASE + UID_COUNT):
                if _uid_taken_by_account(uid):
                    continue
                fd = os.open(UID_LOCK_DIR / str(uid), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                if os.pread(fd, 1, 0) == b"1":  # the previous holder died during a run
                    kill_leftovers(uid, "")
                os.pwrite(fd, b"1", 0)
                return cls(uid, fd)
            if time.monotonic() > deadline:
                raise RuntimeError(f"no free sandbox uid in {UID_BASE}..{UID_BASE + UID_COUNT - 1}")
            time.sleep(0.05)

    def release(self) -> None:
        os.pwrite(self.fd, b"0", 0)
        os.close(self.fd)


def _check_lock_dir() -> None:
    """The lock directory lives in the shared temp dir: refuse one that someone else made or can write."""
    UID_LOCK_DIR.mkdir(mode=0o700, exist_ok=True)
    st = os.lstat(UID_LOCK_DIR)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise RuntimeError(
            f"{UID_LOCK_DIR} must be a directory owned by uid {os.geteuid()} and writable only "
            "by it (remove it and retry)"
        )


def sweep_abandoned() -> int:
    """Kill what runs under pool uids whose holder died mid-run (lock free, marker still '1'), e.g. after the
    reward service killed a timed-out worker; returns how many uids were swept. Cheap when there is
    nothing to do (one non-blocking flock per uid file)."""
    if os.geteuid() != 0 or not UID_LOCK_DIR.is_dir():
        return 0
    _check_lock_dir()
    swept = 0
    for path in UID_LOCK_DIR.iterdir():
        if not path.name.isdigit():
            continue
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            if os.pread(fd, 1, 0) == b"1":
                kill_leftovers(int(path.name), "")
                os.pwrite(fd, b"0", 0)
                swept += 1
        finally:
            os.close(fd)
    return swept


def _uid_taken_by_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False
