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
Receivers stage what they get and swap it in whole, so an engine never serves a half-loaded model.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch

from asyncrl.api.weights import Publisher, ServerFleet, WeightSyncError
from asyncrl.types import WeightUpdate

log = logging.getLogger(__name__)

WEIGHTS_FILE = "model.safetensors"


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
            pid = d.name[len(TEMP_PREFIX):].split("-", 1)[0]
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


# ---- the disk format -------------------------------------------------------------------------------------
def write_weights(state_dict: dict[str, torch.Tensor], weight_dir: Path, version: int) -> Path:
    """Write ``weight_dir/v{version:06d}/model.safetensors`` atomically; return the version directory."""
    from safetensors.torch import save_file

    final = Path(weight_dir) / f"v{version:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-v{version:06d}-", dir=weight_dir))
    try:
        save_file(_contiguous_unshared(state_dict), str(tmp / WEIGHTS_FILE), metadata={"version": str(version)})
        if final.exists():  # a retry of the same version replaces it whole
            shutil.rmtree(final)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def read_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of the ``*.safetensors`` files in directory ``path`` (or of that one file). Raises
    FileNotFoundError if there are none, ValueError naming a file that cannot be read."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    p = Path(path)
    files = [p] if p.is_file() else sorted(p.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors files in '{path}'")
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            sd.update(load_file(str(f)))
        except (SafetensorError, OSError) as e:  # truncated, corrupt or unreadable: the file's fault, say which
            raise ValueError(f"'{f}' is not a readable safetensors file: {e}") from e
    return sd


def _contiguous_unshared(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses tensors that share memory (tied embeddings): later ones are cloned."""
    out, seen = {}, set()
    for name, t in sd.items():
        t = t.detach()
        ptr = t.untyped_storage().data_ptr() if t.numel() else None
        out[name] = t.clone().contiguous() if ptr in seen else t.contiguous()
        if ptr is not None:
            seen.add(ptr)
    return out


# ---- torch.distributed broadcast ---------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorMeta:
    name: str
    dtype: str  # "float32", "bfloat16", ...
    shape: tuple[int, ...]


def buckets(state_dict: dict[str, torch.Tensor], bucket_bytes: int) -> list[list[str]]:
    """Tensor names in order, grouped so that each group holds at most ``bucket_bytes`` (or one tensor)."""
    groups, current, size = [], [], 0
    for name, t in state_dict.items():
        n = t.numel() * t.element_size()
        if current and size + n > bucket_bytes:
            groups.append(current)
            current, size = [], 0
        current.append(name)
        size += n
    if current:
        groups.append(current)
    return groups


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_of(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype '{name}'")
    return dtype


def new_group(backend: str, master_address: str, master_port: int, rank: int, world_size: int, group_name: str,
              timeout_s: float, store=None):
    """A process group of its own (not the default group): every rank calls this; rank 0 passes the
    ``store`` it created as master. Blocks until all ``world_size`` ranks have joined or ``timeout_s``."""
    import torch.distributed as dist

    timeout = timedelta(seconds=timeout_s)
    if store is None:
        store = dist.TCPStore(master_address, master_port, world_size, is_master=False, timeout=timeout)
    prefixed = dist.PrefixStore(group_name, store)
    if backend == "gloo":
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = timeout
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname=_gloo_host(master_address))]
        return dist.ProcessGroupGloo(prefixed, rank, world_size, opts)
    if backend == "nccl":
        return dist.ProcessGroupNCCL(prefixed, rank, world_size, timeout=timeout)
    raise ValueError(f"weight broadcast backend must be 'gloo' or 'nccl', got '{backend}'")


def _gloo_host(master_address: str) -> str:
    """The local address gloo binds: loopback when the master is local, else this host's name."""
    return "127.0.0.1" if master_address in ("127.0.0.1", "localhost") else socket.gethostname()


def broadcast(group, tensor: torch.Tensor, timeout_s: float) -> None:
    group.broadcast(tensor, 0, timedelta(seconds=timeout_s)).wait()


class DistPublisher:
    """Broadcasts the weights from this process (rank 0) to the servers behind ``engines`` (``ServerFleet``s,
    ranks 1..N), ``bucket_mb`` at a time: per bucket, one ``/update_weights_from_distributed`` message to every
    server (names, dtypes, shapes) and one broadcast per tensor. The last bucket carries ``weight_version``;
    a server swaps the staged tensors in whole when it arrives.

    The group is built for the servers that take a version, again when they change (one retired or back from a
    cool-down); a failure closes it (the next publish builds a new one) and raises ``WeightSyncError``."""

    def __init__(self, engines: list[ServerFleet], backend: str = "gloo", bucket_mb: int = 64, timeout_s: float = 60.0,
                 master_address: str = "127.0.0.1", group_name: str = "asyncrl-weights"):
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
                    servers = [(e, a) for e in self.engines
                               for a in updating.enter_context(e.updating(version, self.timeout_s))]
                    if self._group is None or servers != self._servers:
                        self._close_group()
                        self._connect(servers, version)
                    self._send(tensors, version)
            except Exception as e:  # noqa: BLE001 - every failure names the version and drops the group
                self._drop_group()
                if isinstance(e, WeightSyncError):
                    raise
                raise WeightSyncError(f"broadcasting weights of version {version} failed: "
                                      f"{type(e).__name__}: {e}") from e
        return time.perf_counter() - t0

    def _connect(self, servers: list[tuple[ServerFleet, str]], version: int) -> None:
        import torch.distributed as dist

        self._servers = servers
        if not self._servers:
            raise WeightSyncError(f"no live server to send weights of version {version} to")
        world = len(self._servers) + 1
        self._store = dist.TCPStore(self.master_address, 0, world, is_master=True,
                                    timeout=timedelta(seconds=self.timeout_s), wait_for_workers=False)
        port = self._store.port
        name = f"{self.group_name}-{os.getpid()}-{time.monotonic_ns()}"
        posts = [self._pool.submit(e.post, a, "/init_weights_update_group", {
            "master_address": self.master_address, "master_port": port, "rank_offset": rank, "world_size": world,
            "group_name": name, "backend": self.backend}, self.timeout_s)
            for rank, (e, a) in enumerate(self._servers, start=1)]
        self._group = new_group(self.backend, self.master_address, port, 0, world, name, self.timeout_s,
                                store=self._store)
        for f in posts:
            f.result(timeout=self.timeout_s)
        self._group_name = name

    def _send(self, tensors: dict[str, torch.Tensor], version: int) -> None:
        groups = buckets(tensors, self.bucket_bytes)
        for i, names in enumerate(groups):
            body = {"names": names, "dtypes": [dtype_name(tensors[n].dtype) for n in names],
                    "shapes": [list(tensors[n].shape) for n in names], "group_name": self._group_name}
            if i == len(groups) - 1:
                body["weight_version"] = str(version)
            posts = [self._pool.submit(e.post, a, "/update_weights_from_distributed", body, self.timeout_s)
                     for e, a in self._servers]
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


class DistReceiver:
    """The server side of ``DistPublisher``: joins the group, stages each bucket, and hands the complete
    state dict to ``apply(state_dict, version)`` when the bucket carrying the version arrives. ``apply`` must
    copy what it keeps: the receive buffers are reused by the next update. ``timeout_s`` bounds each
    broadcast.

    Nothing waits on a slow peer while holding the state lock: a join (``init_group``) runs outside it and
    installs its group only if no ``destroy`` (or newer join) came meanwhile, and buckets are received under a
    lock of their own, so ``destroy`` always returns at once."""

    def __init__(self, apply, timeout_s: float = 60.0, shapes: dict[str, tuple[int, ...]] | None = None):
        """``shapes``: the name and shape of every tensor the served model takes; a bucket naming another tensor,
        or one of another shape, is refused before anything is allocated for it."""
        self.apply, self.shapes = apply, shapes
        self._timeout_s = timeout_s
        self._lock = threading.Lock()  # the group fields below; held only briefly
        self._group = None
        self._name: str | None = None
        self._joining: str | None = None  # the group a join under way is for
        self._epoch = 0  # raised by every join and destroy: a join or update that finds it changed is abandoned
        self._receiving = threading.Lock()  # one bucket at a time; guards the staging fields below
        self._staged: dict[str, torch.Tensor] = {}
        self._staged_epoch = 0
        self._buffers: dict[str, torch.Tensor] = {}  # receive buffers, reused by every update (``apply`` copies)

    def init_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                   group_name: str, backend: str = "gloo", timeout_s: float = 60.0) -> None:
        """Join the group (blocks until every rank has joined, or about ``timeout_s``), replacing any group
        joined before. Raises ValueError if a ``destroy`` or another join came meanwhile."""
        if backend != "gloo":
            raise ValueError(f"this server receives weights over gloo (CPU), not '{backend}'")
        with self._lock:
            self._epoch += 1
            epoch, self._joining = self._epoch, group_name
        try:
            group = new_group(backend, master_address, master_port, rank_offset, world_size, group_name, timeout_s)
        except BaseException:
            with self._lock:
                if epoch == self._epoch:
                    self._joining = None
            raise
        with self._lock:
            if epoch != self._epoch:
                raise ValueError(f"joining weight update group '{group_name}' was abandoned (destroyed or "
                                 "replaced while it waited for the other ranks)")
            self._group, self._name, self._joining = group, group_name, None

    def receive(self, names: list[str], dtypes: list[str], shapes: list[list[int]], group_name: str | None,
                weight_version: int | str | None) -> int | None:
        """Receive one bucket; returns the version applied, if this bucket completed one."""
        if not (len(names) == len(dtypes) == len(shapes)):
            raise ValueError("names, dtypes and shapes must have the same length")
        metas = [TensorMeta(n, d, tuple(int(x) for x in s)) for n, d, s in zip(names, dtypes, shapes)]
        for m in metas:
            self._check(m)
        version = None if weight_version is None else int(weight_version)
        with self._receiving:
            group, epoch = self._current(group_name)
            if epoch != self._staged_epoch:  # tensors staged in an earlier group are never applied
                self._staged, self._staged_epoch = {}, epoch
            try:
                for m in metas:
                    buf = self._buffers.get(m.name)
                    if buf is None or tuple(buf.shape) != m.shape or buf.dtype != dtype_of(m.dtype):
                        buf = self._buffers[m.name] = torch.empty(m.shape, dtype=dtype_of(m.dtype))
                    broadcast(group, buf, self._timeout_s)
                    self._staged[m.name] = buf
            except Exception:
                self._staged = {}  # never apply a partial set
                raise
            if version is None:
                return None
            staged, self._staged = self._staged, {}
            if self._current(group_name)[1] != epoch:
                raise ValueError(f"the weight update group was destroyed while version {version} arrived")
            self.apply(staged, version)
        return version

    def _check(self, m: TensorMeta) -> None:
        """ValueError for a tensor the served model does not take: an unknown name, another shape, a dtype that
        is not a floating-point one."""
        dtype = dtype_of(m.dtype)
        if not dtype.is_floating_point:
            raise ValueError(f"tensor '{m.name}': dtype {m.dtype} is not a floating-point dtype")
        if self.shapes is None:
            return
        if m.name not in self.shapes:
            raise ValueError(f"tensor '{m.name[:100]}' is not a weight of the served model")
        if m.shape != self.shapes[m.name]:
            raise ValueError(f"tensor '{m.name}' has shape {list(m.shape)[:8]}, the served model's has "
                             f"{list(self.shapes[m.name])}")

    def _current(self, group_name: str | None):
        """The joined group and the epoch it belongs to; ValueError if there is none, or another one."""
        with self._lock:
            if self._group is None:
                raise ValueError("no weight update group: call /init_weights_update_group first")
            if group_name and group_name != self._name:
                raise ValueError(f"unknown weight update group '{group_name}' (this server joined '{self._name}')")
            return self._group, self._epoch

    def destroy(self, group_name: str | None = None) -> None:
        """Leave the group ``group_name`` (None: whichever) and abandon a join of it under way. Never waits."""
        with self._lock:
            if group_name not in (None, self._name, self._joining):
                return
            self._epoch += 1
            self._joining = None
            if group_name in (None, self._name):
                self._group, self._name = None, None
                self._buffers = {}  # the receive buffers go with the group (a model's worth of memory)


TRANSPORTS = ("inprocess", "disk", "dist")


def build_publisher(transport: str, engines: list, *, timeout_s: float = 60.0, weight_dir: str | None = None,
                    dist_backend: str = "gloo", bucket_mb: int = 64, master_address: str = "127.0.0.1") -> Publisher:
    """The publisher of ``transport`` (one of ``TRANSPORTS``) that reaches ``engines``; call ``close()`` at the
    end. ``weight_dir`` is the disk transport's (None: a temporary one), the ``dist_*`` arguments are the
    broadcast's."""
    if transport == "inprocess":
        return InProcessPublisher(engines, timeout_s=timeout_s)
    if transport == "disk":
        return DiskPublisher(engines, weight_dir, timeout_s=timeout_s)
    if transport == "dist":
        return DistPublisher(engines, backend=dist_backend, bucket_mb=bucket_mb, timeout_s=timeout_s,
                             master_address=master_address)
    raise ValueError(f"unknown weight transport '{transport}' (one of {list(TRANSPORTS)})")
