"""The server side of the broadcast transport (``asyncrl.weights.publish.DistPublisher``): join the trainer's
weight group, receive each bucket, and hand over the complete state dict when the bucket carrying the version
arrives (``asyncrl serve``'s ``/init_weights_update_group`` and ``/update_weights_from_distributed``)."""

from __future__ import annotations

import threading

import torch

from asyncrl.weights.wire import TensorMeta, broadcast, dtype_name, dtype_of, new_group

SENDABLE = frozenset({torch.float32, torch.float16, torch.bfloat16, torch.float64})
"""The weight dtypes a broadcast carries (gloo and NCCL both send these)."""


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

    def init_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str,
        backend: str = "gloo",
        timeout_s: float = 60.0,
    ) -> None:
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
                raise ValueError(
                    f"joining weight update group '{group_name}' was abandoned (destroyed or "
                    "replaced while it waited for the other ranks)"
                )
            self._group, self._name, self._joining = group, group_name, None

    def receive(
        self,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        group_name: str | None,
        weight_version: int | str | None,
    ) -> int | None:
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
        the group cannot send (float8 is floating-point, and gloo's broadcast of it failed after the group had
        begun, leaving it out of step)."""
        dtype = dtype_of(m.dtype)
        if dtype not in SENDABLE:
            raise ValueError(
                f"tensor '{m.name}': dtype {m.dtype} is not one the weight-update group sends "
                f"({', '.join(sorted(dtype_name(d) for d in SENDABLE))})"
            )
        if self.shapes is None:
            return
        if m.name not in self.shapes:
            raise ValueError(f"tensor '{m.name[:100]}' is not a weight of the served model")
        if m.shape != self.shapes[m.name]:
            raise ValueError(
                f"tensor '{m.name}' has shape {list(m.shape)[:8]}, the served model's has {list(self.shapes[m.name])}"
            )

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
