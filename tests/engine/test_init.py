"""The server commands build_engine's placements produce (asyncrl.engine): asyncrl serve --device cuda under its
CUDA_VISIBLE_DEVICES on a GPU, vLLM without --enforce-eager there; on the CPU neither."""

import torch


def test_servers_on_gpus_are_started_on_them(monkeypatch):
    """The server command a GPU placement produces: asyncrl serve --device cuda under its CUDA_VISIBLE_DEVICES,
    vLLM without --enforce-eager; on the CPU neither (nothing is started: the commands are read)."""
    from asyncrl import configlib
    from asyncrl.config import TrainConfig
    from asyncrl.engine import _server, spawn

    made = []
    monkeypatch.setattr(spawn, "ServerProcess", lambda cmd, url, timeout, env=None, **kw: made.append((cmd, env)))
    cfg = configlib.load(TrainConfig, None, ["rollout.interrupt_mode=abort"]).rollout
    _server(cfg, "asyncrl", 1, "m", torch.float32, 64, 0, (2,))
    _server(cfg, "asyncrl", 1, "m", torch.float32, 64, 0, ())
    _server(cfg, "vllm", 1, "m", torch.float32, 64, 0, (), on_gpu=True)  # the Ray launcher's: GPUs set by Ray
    _server(cfg, "vllm", 1, "m", torch.float32, 64, 0, ())
    (gpu, gpu_env), (cpu, _), (vllm_gpu, _), (vllm_cpu, _) = made
    assert gpu[gpu.index("--device") + 1] == "cuda" and gpu_env["CUDA_VISIBLE_DEVICES"] == "2"
    assert "--device" not in cpu
    assert "--enforce-eager" not in vllm_gpu and "--enforce-eager" in vllm_cpu
