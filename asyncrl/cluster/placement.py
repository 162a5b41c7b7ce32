"""Placement strings, AReaL's per-engine form, parsed into one allocation of devices to processes.

- ``rollout.backend``: ``local`` / ``local:d1`` (the built-in engine in the trainer's process, rank 0),
  ``asyncrl:dN`` (N ``asyncrl serve`` processes), ``sglang:dNtM`` / ``vllm:dNtM`` (N servers of M devices each),
  ``remote`` (servers already running at ``rollout.server_addrs``);
- ``actor.backend``: ``ddp:dN`` (N data-parallel trainer processes, replicated weights) or ``fsdp:dN`` (FSDP2,
  weights sharded over N processes).

``d`` is data parallelism (processes or servers), ``t`` tensor parallelism inside one server. On a machine
with GPUs each trainer rank takes one device and each server ``t`` devices, trainer first; without GPUs every
process is a CPU process and the numbers are process counts. An allocation that does not fit the devices
is refused with the reason.

Also the ``cluster`` config section (``ClusterConfig``: which device kind, the Ray address, the rendezvous
port) and the launcher names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ROLLOUT_KINDS = ("local", "asyncrl", "sglang", "vllm", "remote")
ACTOR_KINDS = ("ddp", "fsdp")
DIMS = re.compile(r"([a-z]+)(\d+)")


class PlacementError(ValueError):
    """A placement string that cannot be parsed or placed (the message names the key and why)."""


@dataclass(frozen=True)
class Backend:
    kind: str
    dp: int = 1
    tp: int = 1

    @property
    def devices(self) -> int:
        return self.dp * self.tp


def resolve_transport(transport: str, backend_kind: str) -> str:
    """``rollout.weight_transport`` as a run uses it: ``auto`` is inprocess for the built-in engine in the
    process (``local``), disk for servers."""
    if transport != "auto":
        return transport
    return "inprocess" if backend_kind == "local" else "disk"


def parse(spec: str, key: str, kinds: tuple[str, ...]) -> Backend:
    """``kind[:dims]`` with dims like ``d4t2``: the kind and its data/tensor parallel sizes."""
    kind, _, dims = spec.strip().partition(":")
    if kind not in kinds:
        raise PlacementError(f"{key}: '{spec}' must start with one of {list(kinds)}")
    sizes = {"d": 1, "t": 1}
    if dims:
        pos = 0
        for m in DIMS.finditer(dims):
            if m.start() != pos or m.group(1) not in sizes:
                break
            sizes[m.group(1)] = int(m.group(2))
            pos = m.end()
        if pos != len(dims) or not dims:
            raise PlacementError(
                f"{key}: cannot read the dimensions '{dims}' of '{spec}': write e.g. d2 or d4t2 "
                "(d = data parallel, t = tensor parallel)"
            )
    if sizes["d"] < 1 or sizes["t"] < 1:
        raise PlacementError(f"{key}: sizes in '{spec}' must be at least 1")
    if kind in ACTOR_KINDS and sizes["t"] != 1:
        raise PlacementError(f"{key}: '{spec}': the trainer has no tensor parallelism here (use fsdp:dN to shard)")
    if kind in ("local", "asyncrl", "remote") and sizes["t"] != 1:
        raise PlacementError(f"{key}: '{spec}': the built-in engine runs on one device per process (no t)")
    if kind == "local" and sizes["d"] != 1:
        raise PlacementError(f"{key}: '{spec}': the in-process engine is one engine; for several, asyncrl:dN")
    if kind == "remote" and dims:
        raise PlacementError(f"{key}: 'remote' takes no dimensions (the servers are already placed)")
    return Backend(kind, sizes["d"], sizes["t"])


@dataclass(frozen=True)
class Allocation:
    """Which process gets which device: trainer ranks first, then engine servers."""

    device: str  # "cuda" or "cpu"
    actor: Backend
    rollout: Backend
    trainer_devices: tuple[tuple[int, ...], ...]  # per rank ((),) on CPU
    server_devices: tuple[tuple[int, ...], ...]  # per server

    @property
    def world_size(self) -> int:
        return self.actor.dp


def allocate(rollout: str, actor: str, device: str, n_devices: int) -> Allocation:
    """Place ``rollout`` and ``actor`` on ``n_devices`` devices of kind ``device`` (``cpu``: no device ids;
    then the sizes are process counts and only have to be positive)."""
    r = parse(rollout, "rollout.backend", ROLLOUT_KINDS)
    a = parse(actor, "actor.backend", ACTOR_KINDS)
    if device == "cpu":
        return Allocation(
            "cpu",
            a,
            r,
            tuple(() for _ in range(a.dp)),
            tuple(() for _ in range(r.dp if r.kind not in ("local", "remote") else 0)),
        )
    server_devices = r.devices if r.kind not in ("local", "remote") else 0
    need = a.devices + server_devices
    if need > n_devices:
        raise PlacementError(
            f"actor.backend={actor} needs {a.devices} device(s) and rollout.backend={rollout} "
            f"{server_devices}: {need} in all, but this machine has {n_devices} {device} "
            "device(s); lower d or t, or use more machines (launcher=ray)"
        )
    trainer = tuple((i,) for i in range(a.dp))
    first = a.dp
    servers = (
        tuple(tuple(range(first + s * r.tp, first + (s + 1) * r.tp)) for s in range(r.dp)) if server_devices else ()
    )
    return Allocation(device, a, r, trainer, servers)
