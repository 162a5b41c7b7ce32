"""Inference engines behind one Protocol (``base.Engine``), built from the ``rollout`` config section.

``rollout.backend`` (``asyncrl.cluster.placement``):
- ``local`` (= ``local:d1``): ``LocalEngine``, the built-in engine in this process;
- ``asyncrl:dN``: N ``asyncrl serve`` processes on 127.0.0.1, driven by a ``RemoteEngine`` (started by
  ``engine.start()``, ended by ``engine.stop()``);
- ``vllm:dNtM`` / ``sglang:dNtM``: N vLLM / SGLang servers of M devices each, started the same way (their
  interpreter is ``rollout.server_python``);
- ``remote``: a ``RemoteEngine`` over servers already running at ``rollout.server_addrs``.
"""

from __future__ import annotations

import os
import sys

import torch

from asyncrl.engine.config import RolloutConfig
from asyncrl.engine.local import LocalEngine


def build_engine(
    cfg: RolloutConfig,
    model,
    *,
    model_path: str,
    dtype: torch.dtype,
    max_len: int,
    seed: int,
    stop_token_ids: tuple[int, ...],
    server_devices: tuple[tuple[int, ...], ...] = (),
    device: str = "cpu",
    version: int = 0,
    threads=None,
):
    """The rollout engine for ``cfg.backend`` (not started), serving ``model`` as weight ``version`` (a resumed
    run's: every token it generates is stamped with it). ``model`` is the trainer's live model (for in-process
    engines, which run on ``device``); ``model_path`` the resolved checkpoint directory it was loaded from (servers
    load it); ``server_devices`` the GPU ids of each server (none on the CPU). ``threads`` (the built-in engine only)
    replaces ``cfg.threads``: a number, or a callable asked before each step (``asyncrl.cluster.cores.CoreShare``)."""
    backend = cfg.placement
    if backend.kind == "local":
        return LocalEngine(
            model,
            max_slots=cfg.max_slots,
            max_len=max_len,
            dtype=dtype,
            seed=seed,
            interrupt_mode=cfg.interrupt_mode,
            stop_token_ids=stop_token_ids,
            threads=threads or cfg.threads,
            native_kernels=cfg.native_kernels,
            device=device,
            version=version,
        )
    from asyncrl.engine.remote import RemoteEngine

    common = dict(
        api=cfg.resolved_api,
        interrupt_mode=cfg.interrupt_mode,
        request_timeout_s=cfg.request_timeout_s,
        startup_timeout_s=cfg.server_startup_timeout_s,
        version=version,
    )
    if backend.kind == "remote":
        key = os.environ.get(cfg.server_key_env) if cfg.server_key_env else None
        return RemoteEngine(list(cfg.server_addrs), **common, api_key=key)
    devices = list(server_devices) or [()] * backend.dp

    def launch():
        return [
            _server(cfg, backend.kind, backend.tp, model_path, dtype, max_len, seed + i, devices[i])
            for i in range(backend.dp)
        ]

    return RemoteEngine(launch=launch, **common)


def _server(
    cfg: RolloutConfig,
    kind: str,
    tp: int,
    model_path: str,
    dtype: torch.dtype,
    max_len: int,
    seed: int,
    devices: tuple[int, ...],
    host: str = "127.0.0.1",
    port: int | None = None,
    on_gpu: bool = False,
):
    """One server process of ``kind`` bound to ``host`` (not yet healthy), on ``devices`` if any, else on the
    GPUs visible to this process if ``on_gpu`` (the Ray launcher binds its servers to their node's address, on
    ports it chose, and Ray sets the visible GPUs)."""
    from asyncrl.engine import spawn

    env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, devices))} if devices else {}
    on_gpu = on_gpu or bool(devices)
    dtype_name = str(dtype).removeprefix("torch.")
    timeout = cfg.server_startup_timeout_s
    if kind == "asyncrl":
        args = [
            "--max-slots",
            str(cfg.max_slots),
            "--max-len",
            str(max_len),
            "--threads",
            str(cfg.threads),
            "--dtype",
            dtype_name,
            "--interrupt-mode",
            cfg.interrupt_mode,
            "--seed",
            str(seed),
        ]
        args += [] if cfg.native_kernels else ["--no-native-kernels"]
        args += ["--device", "cuda"] if on_gpu else []
        return spawn.asyncrl_server(
            model_path, *args, wait=False, startup_timeout_s=timeout, env=env, host=host, port=port
        )
    if kind == "vllm":
        return spawn.vllm_server(
            cfg.server_python or sys.executable,
            model_path,
            "--seed",
            str(seed),
            "--tensor-parallel-size",
            str(tp),
            threads=cfg.threads,
            max_model_len=max_len,
            startup_timeout_s=timeout,
            wait=False,
            env=env,
            dtype=dtype_name,
            host=host,
            port=port,
            on_gpu=on_gpu,
        )
    return spawn.sglang_server(
        cfg.server_python or sys.executable,
        model_path,
        "--random-seed",
        str(seed),
        "--tp-size",
        str(tp),
        "--context-length",
        str(max_len),
        "--dtype",
        dtype_name,
        startup_timeout_s=timeout,
        wait=False,
        env=env,
        host=host,
        port=port,
    )
