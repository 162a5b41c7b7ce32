"""One run per run directory: a run holds an exclusive lock on its directory from the moment it writes there until
its process ends, and a second run of the same directory (a command typed twice, a scheduler's requeue while the
first job lives) is refused in one line before it writes anything.

The lock is ``flock`` on ``.NAME.lock`` beside the directory (it stays there when ``resume=fresh`` moves the
directory aside). The operating system releases it when the holder's process ends, however it ends (kill -9
included), so a lock file left by a dead process never blocks: it names the process that held it, for the
message, and is taken over."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from asyncrl.configlib import ConfigError


class RunDirLock:
    """The held lock of ``run_dir``; ``release`` (or the end of the process) lets another run in."""

    def __init__(self, run_dir: Path, key: str = "output_dir"):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir.parent / f".{self.run_dir.name}.lock"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:  # e.g. a file where a directory should be
            raise ConfigError(f"{key}: cannot create the run directory '{self.run_dir}': {e.strerror or e}") from e
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise ConfigError(f"{key}: cannot lock the run directory '{self.run_dir}': {e.strerror or e}") from e
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._holder()
            os.close(self._fd)
            raise ConfigError(
                f"{key}: the run directory '{self.run_dir}' is in use by another run"
                f"{f' (pid {holder})' if holder else ''}: wait for it to end or stop it, or give this run its own "
                "directory (trial_name, output_dir)"
            ) from None
        os.ftruncate(self._fd, 0)
        os.write(self._fd, f"{os.getpid()}\n".encode())

    def _holder(self) -> str:
        try:
            return os.pread(self._fd, 32, 0).decode(errors="replace").strip()
        except OSError:
            return ""

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None
