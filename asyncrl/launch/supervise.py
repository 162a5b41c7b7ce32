"""One asyncrl process on a node of the Ray launcher's placement group (``asyncrl.launch.ray``): an inference
server or a trainer rank, started by the actor that supervises it, its output forwarded to the driver, stopped by
signals in turn. Ray itself stays in ``asyncrl.launch.ray``: the actor is given the function that tells its
node's address."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Callable

RANK_0_STOP = ((signal.SIGINT, 600.0), (signal.SIGTERM, 10.0), (signal.SIGKILL, 30.0))
"""How rank 0 is stopped: SIGINT ends its run at the next step boundary with a checkpoint (launch.signals; the
step in hand and the save may take minutes on a large model); a second signal ends it at once."""
RANK_STOP = ((None, 10.0), (signal.SIGTERM, 10.0), (signal.SIGKILL, 30.0))
"""The other ranks (they ignore SIGINT) end when rank 0 tells them to; else SIGTERM."""


class Supervisor:
    """Supervises one asyncrl process (a server or a trainer rank) on the node Ray placed this actor on. Its
    methods run one at a time in the actor's main thread, so the process it starts dies with it (the parent-death
    signal is the starting thread's)."""

    def __init__(self, role: str, index: int, node_address: Callable[[], str]):
        self.role, self.index, self.node_address = role, index, node_address
        # Ray's workers ignore SIGCHLD (children reaped unasked), which makes every exit status read as 0 and is
        # inherited by the children: the processes supervised here are waited for
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        self.server = None  # asyncrl.engine.spawn.ServerProcess
        self.proc: subprocess.Popen | None = None
        self.config_file: str | None = None
        self.cwd: str | None = None
        self.lines: collections.deque = collections.deque(maxlen=50)
        self.reader: threading.Thread | None = None

    def __repr__(self) -> str:  # the prefix of this actor's output lines on the driver
        return f"asyncrl-{self.role}-{self.index}"

    def node(self) -> tuple[str, int]:
        """This node's address and a free port on it (rank 0's: the rendezvous; a server's: its own)."""
        from asyncrl.engine.spawn import free_port

        return self.node_address(), free_port()

    def start_server(
        self,
        rollout,
        kind: str,
        tp: int,
        model_path: str,
        dtype: str,
        max_len: int,
        seed: int,
        port: int,
        on_gpu: bool = False,
    ) -> str:
        """Start the server bound to this node's address and ``port`` (on the GPUs Ray gave this actor if
        ``on_gpu``); its URL once it answers /health."""
        from asyncrl.engine import _server
        from asyncrl.models.hf import DTYPES

        # the GPUs are the ones Ray gave this actor (CUDA_VISIBLE_DEVICES, inherited by the server)
        self.server = _server(
            rollout,
            kind,
            tp,
            model_path,
            DTYPES[dtype],
            max_len,
            seed,
            (),
            host=self.node_address(),
            port=port,
            on_gpu=on_gpu,
        )
        self.server.wait_healthy()
        return self.server.url

    def start_rank(self, config_text: str, env: dict, cwd: str) -> None:
        """Start ``asyncrl train`` with this config and environment (in ``cwd`` if this node has it)."""
        fd, self.config_file = tempfile.mkstemp(prefix="asyncrl-ray-rank-", suffix=".yaml")
        with os.fdopen(fd, "w") as f:
            f.write(config_text)
        self.cwd = cwd if os.path.isdir(cwd) else None
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "asyncrl.cli", "train", "--config", self.config_file],
            env={**os.environ, **env},
            cwd=self.cwd,
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=_child_of_actor,
        )
        self.reader = threading.Thread(target=self._forward, args=(self.proc.stderr,), daemon=True)
        self.reader.start()

    def _forward(self, stream) -> None:
        """The rank's stderr goes on to the driver (through Ray's log stream); the last lines are kept."""
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            self.lines.append(line)
            print(line, file=sys.stderr, flush=True)

    def wait(self, timeout_s: float) -> int | None:
        """The rank's exit code, or None if it still runs after ``timeout_s``."""
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None
        if self.reader is not None:
            self.reader.join(timeout=5)
        return code

    def tail(self) -> list[str]:
        if self.reader is not None:
            self.reader.join(timeout=5)
        return list(self.lines)

    def result(self, run_dir: str) -> dict:
        """Rank 0's last metrics record (what ``train`` returned there)."""
        from asyncrl.telemetry.metrics import read_metrics

        records = read_metrics(Path(self.cwd or ".") / run_dir)
        return records[-1] if records else {}

    def stop(self, sequence=RANK_0_STOP) -> None:
        """End the process: each (signal or None, seconds) in turn until it exits; a server: its close."""
        if self.server is not None:
            self.server.close()
            self.server = None
        proc = self.proc
        for sig, wait_s in sequence:
            if proc is None or proc.poll() is not None:
                break
            if sig is not None:
                proc.send_signal(sig)
            try:
                proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                pass
        if self.config_file is not None:
            try:
                os.unlink(self.config_file)
            except OSError:
                pass
            self.config_file = None


def _child_of_actor() -> None:
    """In the child before exec: SIGINT unblocked and default (Ray's workers block it; a rank stops gracefully on
    it) and death with the actor's thread."""
    from asyncrl.engine.spawn import die_with_parent

    signal.pthread_sigmask(signal.SIG_SETMASK, ())
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    die_with_parent(signal.SIGKILL)()
