"""The formats weights travel in: a version directory of safetensors files (the disk transport, and checkpoints'
weights read back), and buckets of named tensors broadcast over a process group of their own (the
``torch.distributed`` transport: the metadata of a bucket, the group, the broadcast)."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch

WEIGHTS_FILE = "model.safetensors"


# ---- the disk format: a version directory of safetensors files -------------------------------------------
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


def new_group(
    backend: str,
    master_address: str,
    master_port: int,
    rank: int,
    world_size: int,
    group_name: str,
    timeout_s: float,
    store=None,
):
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
