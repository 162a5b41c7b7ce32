"""Weight transports: how the trainer's new weights reach the engines.

Three transports, one ``Publisher`` protocol (``publish(state_dict, version) -> seconds``, ``close()``):

- ``InProcessPublisher``: engines in this process convert the tensors themselves (``LocalEngine``).
- ``DiskPublisher``: safetensors written to ``weight_dir/v{version:06d}`` through a temporary directory and
  an atomic rename (a reader never sees a half-written version), then each engine is told the path
  (``LocalEngine`` reads it; ``RemoteEngine`` makes its servers load it).
- ``DistPublisher``: a ``torch.distributed`` broadcast from the trainer (rank 0) to every server, in buckets
  (gloo on CPU, NCCL on GPU), over a process group of its own (the trainer's default group is untouched). The
  control messages follow SGLang's ``/init_weights_update_group`` and ``/update_weights_from_distributed``.

Every transport is time-bounded and raises ``WeightSyncError`` naming the version it was delivering.
Receivers stage what they get and swap it in whole, so an engine never serves a half-loaded model (the formats:
:mod:`asyncrl.weights.wire`; the broadcast's receiving side: :mod:`asyncrl.weights.receive`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import torch

from asyncrl.api.weights import Publisher, ServerFleet, WeightSyncError
from asyncrl.types import WeightUpdate
from asyncrl.weights.wire import broadcast, buckets, dtype_name, new_group, write_weights

log = logging.getLogger(__name__)


class InProcessPublisher:
    """Engines in this process convert the tensors at call time and swap them in at a token boundary."""

    def __init__(self, engines: list, timeout_s: float = 60.0):
        self.engines, self.timeout_s = engines, timeout_s

    def publish(self, state_dict: dict, version: int) -> float:
        t0 = time.perf_counter()
        for engine in self.engines:
            _deliver(engine, WeightUpdate(version, state_dict=state_dict), self.timeout_s)
        return time.perf_counter() - t0

    def close(self) -> None:
        pass


class DiskPublisher:
    """Writes each version to ``weight_dir/v{version:06d}/model.safetensors`` and points the engines at it.

    ``keep`` versions stay on disk (older ones are removed once every engine has moved on). With no
    ``weight_dir``, a temporary directory (removed on ``close``) in shared memory when it has room for the
    versions kept — same-machine servers then read from RAM, and writes never wait for disk writeback —
    else in the system's temporary directory."""

    def __init__(self, engines: list, weight_dir: str | None = None, timeout_s: float = 60.0, keep: int = 2):
        self.engines, self.timeout_s, self.keep = engines, timeout_s, max(1, keep)
        self._owned = not weight_dir
        self.weight_dir: Path | None = Path(weight_dir) if weight_dir else None
        if self.weight_dir is not None:
            self.weight_dir.mkdir(parents=True, exist_ok=True)

    def publish(self, state_dict: dict, version: int) -> float:
        t0 = time.perf_counter()
        if self.weight_dir is None:
            self.weight_dir = _temporary_weight_dir(state_dict, self.keep + 1)
        try:
            path = write_weights(state_dict, self.weight_dir, version)
        except OSError as e:
            raise WeightSyncError(f"writing weights of version {version} to {self.weight_dir} failed: {e}") from e
        deadline = t0 + self.timeout_s
        for engine in self.engines:
            _deliver(engine, WeightUpdate(version, path=str(path)), max(0.0, deadline - time.perf_counter()))
        for old in sorted(self.weight_dir.glob("v[0-9]*"))[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return time.perf_counter() - t0

    def close(self) -> None:
        if self._owned and self.weight_dir is not None:
            shutil.rmtree(self.weight_dir, ignore_errors=True)


TEMP_PREFIX = "asyncrl-weights-"


def _temporary_weight_dir(state_dict: dict, copies: int) -> Path:
    """A private directory for the weight versions, named after this process so that the next run can remove
    it if this one is killed before it can (``sweep_stale_weight_dirs``)."""
    sweep_stale_weight_dirs()
    size = sum(t.numel() * t.element_size() for t in state_dict.values())
    shm = Path("/dev/shm")
    base = str(shm) if shm.is_dir() and shutil.disk_usage(shm).free > copies * size + (1 << 30) else None
    return Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-", dir=base))


def sweep_stale_weight_dirs() -> list[Path]:
    """Remove the temporary weight directories of runs whose process is gone (killed runs); returns them."""
    removed = []
    for base in {Path("/dev/shm"), Path(tempfile.gettempdir())}:
        for d in base.glob(f"{TEMP_PREFIX}*") if base.is_dir() else ():
            pid = d.name[len(TEMP_PREFIX) :].split("-", 1)[0]
            if pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(d, ignore_errors=True)
                removed.append(d)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _deliver(engine, update: WeightUpdate, timeout: float) -> None:
    try:
        engine.update_weights(update, timeout=timeout)
    except WeightSyncError:
        raise
    except Exception as e:  # noqa: BLE001 - every failure names the version
        raise WeightSyncError(f"weight update to version {update.version} failed: {type(e).__name__}: {e}") from e


class DistPublisher:
    """Broadcasts the weights from this process (rank 0) to the servers behind ``engines`` (``ServerFleet``s,
    ranks 1..N), ``bucket_mb`` at a time: per bucket, one ``/update_weights_from_distributed`` message to every
    server (names, dtypes, shapes) and one broadcast per tensor. The last bucket carries ``weight_version``;
    a server swaps the staged tensors in whole when it arrives.

    The group is built for the servers that take a version, again when they change (one retired or back from a
    cool-down); a failure closes it (the next publish builds a new one) and raises ``WeightSyncError``."""

    def __init__(
        self,
        engines: list[ServerFleet],
        backend: str = "gloo",
        bucket_mb: int = 64,
        timeout_s: float = 60.0,
        master_address: str = "127.0.0.1",
        group_name: str = "asyncrl-weights",
    ):
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"weight broadcast backend must be 'gloo' or 'nccl', got '{backend}'")
        self.engines, self.backend, self.timeout_s = engines, backend, timeout_s
        self.bucket_bytes = bucket_mb << 20
        self.master_address, self.group_name = master_address, group_name
        self._group = None
        self._store = None
        self._servers: list[tuple[ServerFleet, str]] = []  # (engine, address) in rank order
        self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="asyncrl-publish")
        self._lock = threading.Lock()

    def publish(self, state_dict: dict, version: int) -> float:
        t0 = time.perf_counter()
        with self._lock:
            try:
                device = "cuda" if self.backend == "nccl" else "cpu"
                tensors = {k: v.detach().to(device).contiguous() for k, v in state_dict.items()}
                with contextlib.ExitStack() as updating:
                    # pause (if they abort in-flight requests) and learn which servers take this version
                    servers = [
                        (e, a)
                        for e in self.engines
                        for a in updating.enter_context(e.updating(version, self.timeout_s))
                    ]
                    if self._group is None or servers != self._servers:
                        self._close_group()
                        self._connect(servers, version)
                    self._send(tensors, version)
            except Exception as e:  # noqa: BLE001 - every failure names the version and drops the group
                self._drop_group()
                if isinstance(e, WeightSyncError):
                    raise
                raise WeightSyncError(
                    f"broadcasting weights of version {version} failed: {type(e).__name__}: {e}"
                ) from e
        return time.perf_counter() - t0

    def _connect(self, servers: list[tuple[ServerFleet, str]], version: int) -> None:
        import torch.distributed as dist

        self._servers = servers
        if not self._servers:
            raise WeightSyncError(f"no live server to send weights of version {version} to")
        world = len(self._servers) + 1
        self._store = dist.TCPStore(
            self.master_address,
            0,
            world,
            is_master=True,
            timeout=timedelta(seconds=self.timeout_s),
            wait_for_workers=False,
        )
        port = self._store.port
        name = f"{self.group_name}-{os.getpid()}-{time.monotonic_ns()}"
        posts = [
            self._pool.submit(
                e.post,
                a,
                "/init_weights_update_group",
                {
                    "master_address": self.master_address,
                    "master_port": port,
                    "rank_offset": rank,
                    "world_size": world,
                    "group_name": name,
                    "backend": self.backend,
                },
                self.timeout_s,
            )
            for rank, (e, a) in enumerate(self._servers, start=1)
        ]
        self._group = new_group(
            self.backend, self.master_address, port, 0, world, name, self.timeout_s, store=self._store
        )
        for f in posts:
            f.result(timeout=self.timeout_s)
        self._group_name = name

    def _send(self, tensors: dict[str, torch.Tensor], version: int) -> None:
        groups = buckets(tensors, self.bucket_bytes)
        for i, names in enumerate(groups):
            body = {
                "names": names,
                "dtypes": [dtype_name(tensors[n].dtype) for n in names],
                "shapes": [list(tensors[n].shape) for n in names],
                "group_name": self._group_name,
            }
            if i == len(groups) - 1:
                body["weight_version"] = str(version)
            posts = [
                self._pool.submit(e.post, a, "/update_weights_from_distributed", body, self.timeout_s)
                for e, a in self._servers
            ]
            for n in names:
                broadcast(self._group, tensors[n], self.timeout_s)
            for f in posts:
                f.result(timeout=self.timeout_s)

    def _drop_group(self) -> None:
        self._group, self._store = None, None

    def _close_group(self) -> None:
        """Ask the servers of the current group, if any, to leave it (best effort), and forget it."""
        if self._group is not None:
            for e, a in self._servers:
                try:
                    e.post(a, "/destroy_weights_update_group", {"group_name": self._group_name}, 5.0)
                except Exception as err:  # noqa: BLE001 - best effort: the server may be the one that left
                    log.debug("destroying the weight group on %s failed: %s", a, err)
        self._drop_group()

    def close(self) -> None:
        self._close_group()
        self._pool.shutdown(wait=False, cancel_futures=True)


TRANSPORTS = ("inprocess", "disk", "dist")


def build_publisher(
    transport: str,
    engines: list,
    *,
    timeout_s: float = 60.0,
    weight_dir: str | None = None,
    dist_backend: str = "gloo",
    bucket_mb: int = 64,
    master_address: str = "127.0.0.1",
) -> Publisher:
    """The publisher of ``transport`` (one of ``TRANSPORTS``) that reaches ``engines``; call ``close()`` at the
    end. ``weight_dir`` is the disk transport's (None: a temporary one), the ``dist_*`` arguments are the
    broadcast's."""
    if transport == "inprocess":
        return InProcessPublisher(engines, timeout_s=timeout_s)
    if transport == "disk":
        return DiskPublisher(engines, weight_dir, timeout_s=timeout_s)
    if transport == "dist":
        return DistPublisher(
            engines, backend=dist_backend, bucket_mb=bucket_mb, timeout_s=timeout_s, master_address=master_address
        )
    raise ValueError(f"unknown weight transport '{transport}' (one of {list(TRANSPORTS)})")
