"""Inference engines behind one Protocol (``base.Engine``), built from the ``rollout`` config section.

- ``local``: ``LocalEngine``, the built-in engine in this process.
- ``local_servers``: ``rollout.n_servers`` ``asyncrl serve`` processes on 127.0.0.1, driven by a
  ``RemoteEngine`` (started by ``engine.start()``, ended by ``engine.stop()``).
- ``remote``: a ``RemoteEngine`` over servers already running at ``rollout.server_addrs``.
"""

from __future__ import annotations

import torch

from asyncrl.engine.config import RolloutConfig
from asyncrl.engine.local import LocalEngine
from asyncrl.publish import DiskPublisher, DistPublisher, InProcessPublisher


def build_engine(cfg: RolloutConfig, model, *, model_path: str, dtype: torch.dtype, max_len: int, seed: int,
                 stop_token_ids: tuple[int, ...]):
    """The rollout engine for ``cfg.backend`` (not started). ``model`` is the trainer's live model (for
    in-process engines); ``model_path`` the resolved checkpoint directory it was loaded from (servers load it)."""
    if cfg.backend == "local":
        return LocalEngine(model, max_slots=cfg.max_slots, max_len=max_len, dtype=dtype, seed=seed,
                           interrupt_mode=cfg.interrupt_mode, stop_token_ids=stop_token_ids, threads=cfg.threads,
                           native_kernels=cfg.native_kernels)
    from asyncrl.engine.remote import RemoteEngine

    common = dict(api=cfg.server_api, interrupt_mode=cfg.interrupt_mode, request_timeout_s=cfg.request_timeout_s,
                  startup_timeout_s=cfg.server_startup_timeout_s)
    if cfg.backend == "remote":
        return RemoteEngine(list(cfg.server_addrs), **common)
    if cfg.backend == "local_servers":
        from asyncrl.engine.spawn import asyncrl_server

        args = ["--max-slots", str(cfg.max_slots), "--max-len", str(max_len), "--threads", str(cfg.threads),
                "--dtype", str(dtype).removeprefix("torch."), "--interrupt-mode", cfg.interrupt_mode]
        args += [] if cfg.native_kernels else ["--no-native-kernels"]

        def launch():
            return [asyncrl_server(model_path, *args, "--seed", str(seed + i), wait=False,
                                   startup_timeout_s=cfg.server_startup_timeout_s) for i in range(cfg.n_servers)]

        return RemoteEngine(launch=launch, **common)
    raise ValueError(f"unknown rollout.backend '{cfg.backend}'")


def build_publisher(cfg: RolloutConfig, engines: list):
    """The weight transport (``cfg.weight_transport``) that reaches ``engines``; call ``close()`` at the end."""
    transport = cfg.resolved_transport
    if transport == "inprocess":
        return InProcessPublisher(engines, timeout_s=cfg.weight_sync_timeout_s)
    if transport == "disk":
        return DiskPublisher(engines, cfg.weight_dir or None, timeout_s=cfg.weight_sync_timeout_s)
    if transport == "dist":
        return DistPublisher(engines, backend=cfg.dist_backend, bucket_mb=cfg.dist_bucket_mb,
                             timeout_s=cfg.weight_sync_timeout_s, master_address=cfg.dist_master_addr)
    raise ValueError(f"unknown rollout.weight_transport '{cfg.weight_transport}'")
