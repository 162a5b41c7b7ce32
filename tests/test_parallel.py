"""Several trainer ranks give the update of one: DDP and FSDP2 over gloo, 2 processes, against one process on the
whole batch, including a batch that does not split evenly; placement strings and allocations; the local
launcher end to end (two ranks, then a resume)."""

import os

import pytest
import torch
import torch.multiprocessing as mp

from asyncrl.placement import PlacementError, allocate, parse
from asyncrl.launch.ranks import split
from asyncrl.parallel import shard_groups
from conftest import TESTS
from trainers_for_tests import free_port, rank_step, ranked_trainer, varied_batch


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
@pytest.mark.parametrize("kw", [{}, {"ppo_n_minibatches": 2, "sgd": True}, {"pack": False, "mb_max_tokens": 24}],
                         ids=["one-minibatch", "two-minibatches", "padded-micro-batches"])
def test_two_ranks_give_the_update_of_one(mode, kw):
    torch.manual_seed(0)
    single = ranked_trainer(**dict(kw))
    before = {k: v.clone() for k, v in single.state_dict().items()}
    stats = single.step(varied_batch())
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=rank_step, args=(r, 2, port, mode, kw, out)) for r in range(2)]
    for p in procs:
        p.start()
    weights, parallel_stats = out.get(timeout=180)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    moved = 0.0
    for name, w in single.state_dict().items():
        got = torch.from_numpy(weights[name])
        assert torch.allclose(got, w, atol=1e-5, rtol=1e-4), (name, float((got - w).abs().max()), float((w - before[name]).abs().max()))
        moved = max(moved, float((w - before[name]).abs().max()))
    assert moved > 1e-6  # the update was not empty
    assert parallel_stats["loss"] == pytest.approx(stats["loss"], abs=1e-5)
    assert parallel_stats["train_tokens"] == stats["train_tokens"]


def test_shards_are_whole_groups_balanced_by_tokens():
    loads = [sum([10, 1, 1, 1, 9][i] for i in s) for s in shard_groups([10, 1, 1, 1, 9], 2)]
    assert sorted(loads) == [11, 11]
    with pytest.raises(ValueError, match="cannot feed"):
        shard_groups([1], 2)
    batch = varied_batch()
    shards = split(batch, 2)
    assert sum(s.input_ids.shape[0] for s in shards) == batch.input_ids.shape[0]
    for s in shards:
        assert s.loss_mask.shape[1] == s.input_ids.shape[1] - 1 == s.behav_logprobs.shape[1]
        assert int(s.attention_mask.sum(-1).max()) == s.input_ids.shape[1]  # trimmed to its own longest row
        for g in s.group_ids.unique():  # whole groups
            assert int((s.group_ids == g).sum()) == int((batch.group_ids == g).sum())


@pytest.mark.parametrize("spec, key, kind, dp, tp", [
    ("local", "rollout.backend", "local", 1, 1), ("local:d1", "rollout.backend", "local", 1, 1),
    ("sglang:d4t2", "rollout.backend", "sglang", 4, 2), ("vllm:d2", "rollout.backend", "vllm", 2, 1),
    ("remote", "rollout.backend", "remote", 1, 1), ("ddp:d2", "actor.backend", "ddp", 2, 1),
    ("fsdp:d8", "actor.backend", "fsdp", 8, 1),
])
def test_placement_strings_parse(spec, key, kind, dp, tp):
    kinds = ("ddp", "fsdp") if key == "actor.backend" else ("local", "asyncrl", "sglang", "vllm", "remote")
    b = parse(spec, key, kinds)
    assert (b.kind, b.dp, b.tp) == (kind, dp, tp)


@pytest.mark.parametrize("rollout, actor, n, match", [
    ("sglang:d4t2", "fsdp:d8", 8, "needs 8 device\\(s\\) and rollout.backend=sglang:d4t2 8: 16 in all"),
    ("tgi:d2", "ddp:d1", 8, "must start with one of"),
    ("local:d2", "ddp:d1", 8, "one engine"),
    ("vllm:d2x", "ddp:d1", 8, "cannot read the dimensions"),
    ("remote", "ddp:d2t2", 8, "no tensor parallelism"),
    ("remote:d2", "ddp:d1", 8, "takes no dimensions"),
])
def test_impossible_allocations_are_refused_with_the_reason(rollout, actor, n, match):
    with pytest.raises(PlacementError, match=match):
        allocate(rollout, actor, "cuda", n)


def test_allocation_places_trainer_first_then_servers():
    a = allocate("sglang:d2t2", "fsdp:d4", "cuda", 8)
    assert a.trainer_devices == ((0,), (1,), (2,), (3,)) and a.server_devices == ((4, 5), (6, 7))
    cpu = allocate("asyncrl:d2", "ddp:d2", "cpu", 0)
    assert cpu.world_size == 2 and cpu.server_devices == ((), ())


def test_device_falls_back_to_cpu_without_a_gpu(monkeypatch):
    from asyncrl.configlib import ConfigError
    from asyncrl.placement import ClusterConfig

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert ClusterConfig().resolved_device() == "cpu"
    with pytest.raises(ConfigError, match="no CUDA device"):
        ClusterConfig(device="cuda").resolved_device()


def test_a_run_refuses_an_allocation_its_gpus_cannot_hold_and_pins_servers(monkeypatch):
    from asyncrl import configlib
    from asyncrl.config import TrainConfig
    from asyncrl.configlib import ConfigError
    from asyncrl.launch.build import _allocation

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    cfg = configlib.load(TrainConfig, None, ["actor.backend=ddp:d2", "rollout.backend=asyncrl:d3"])
    with pytest.raises(ConfigError, match="needs 2 device.* 3: 5 in all, but this machine has 4 cuda"):
        _allocation(cfg, "cuda:0")
    ok = configlib.load(TrainConfig, None, ["actor.backend=ddp:d2", "rollout.backend=asyncrl:d2"])
    assert _allocation(ok, "cuda:0").server_devices == ((2,), (3,))
    assert _allocation(cfg, "cpu").server_devices == ((), (), ())  # CPU: process counts only


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


def test_a_bad_backend_is_one_line(tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "asyncrl.cli", "train", "actor.backend=ddp:d2t2"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("asyncrl train: error: actor.backend: 'ddp:d2t2'")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["ddp:d2", "fsdp:d2"])
def test_the_local_launcher_runs_two_ranks_end_to_end(tmp_path, tiny_model_dir, backend):
    """`asyncrl train actor.backend=...:d2` starts the second rank itself; the versions advance, both ranks
    exit, and a resume of the finished run with more steps continues from its checkpoint on both ranks."""
    import subprocess
    import sys

    from asyncrl.metrics import read_metrics

    args = [sys.executable, "-m", "asyncrl.cli", "train", f"model.path={tiny_model_dir}", f"output_dir={tmp_path}",
            "progress_bar=false", "report=false", f"actor.backend={backend}", "train_dataset.batch_size=2",
            "gconfig.n_samples=4", "gconfig.max_new_tokens=16", "valid_dataset.size=4", "evaluator.freq_steps=0",
            "rollout.max_slots=16", "actor.lr=1e-3", "reward.fn=rewards_for_tests:digit_count_reward"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    for steps in (2, 4):
        done = subprocess.run(args + [f"total_train_steps={steps}"], capture_output=True, text=True, env=env,
                              timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    run_dir = tmp_path / "asyncrl" / "default"
    assert [r["step"] for r in read_metrics(run_dir)] == [0, 1, 2, 3, 4]
    assert "resuming from" in done.stderr and (run_dir / "checkpoints" / "step4").is_dir()
    if backend.startswith("fsdp"):  # each rank wrote its shard of the optimizer state
        assert len(list((run_dir / "checkpoints" / "step4" / "optimizer-shards").glob("*.distcp"))) == 2


def test_context_is_the_models_own_on_vllm_and_sglang_and_capped_on_the_built_in_engine():
    from asyncrl import configlib
    from asyncrl.config import TrainConfig
    from asyncrl.configlib import ConfigError
    from asyncrl.launch.build import context_len

    def rollout(*extra):
        return configlib.load(TrainConfig, None, ["rollout.interrupt_mode=abort", *extra]).rollout

    assert context_len(rollout(), 32768) == 1024 and context_len(rollout(), 512) == 512
    assert context_len(rollout("rollout.backend=vllm:d1"), 32768) == 32768
    assert context_len(rollout("rollout.backend=remote", "rollout.server_addrs=[h:1]",
                               "rollout.max_context=8192"), 32768) == 8192
    with pytest.raises(ConfigError, match="rollout.max_context=9000 exceeds the model's max_position_embeddings"):
        context_len(rollout("rollout.max_context=9000"), 4096)


@pytest.mark.slow
def test_a_trainer_rank_that_dies_ends_the_run_with_a_checkpoint_to_resume_from(tmp_path, tiny_model_dir):
    import json
    import signal
    import subprocess
    import sys
    import time

    args = [sys.executable, "-m", "asyncrl.cli", "train", f"model.path={tiny_model_dir}", f"output_dir={tmp_path}",
            "progress_bar=false", "report=false", "actor.backend=ddp:d2", "train_dataset.batch_size=2",
            "gconfig.n_samples=4", "gconfig.max_new_tokens=16", "valid_dataset.size=4", "evaluator.freq_steps=0",
            "rollout.max_slots=16", "actor.lr=1e-3", "reward.fn=rewards_for_tests:digit_count_reward",
            "saver.freq_steps=1", "max_train_time_s=0"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(args + ["total_train_steps=500"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    run_dir = tmp_path / "asyncrl" / "default"
    deadline = time.monotonic() + 180
    while not (run_dir / "metrics.jsonl").exists() or len((run_dir / "metrics.jsonl").read_text().splitlines()) < 4:
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-3000:]
        time.sleep(0.2)
    ps = subprocess.run(["ps", "-ww", "-o", "pid=,args=", "--ppid", str(proc.pid)], capture_output=True,
                        text=True).stdout
    ranks = [int(line.split()[0]) for line in ps.splitlines() if "asyncrl-rank-config" in line]
    assert len(ranks) == 1, ps
    rank1 = ranks[0]
    os.kill(rank1, signal.SIGKILL)
    rc = proc.wait(timeout=120)
    err = proc.stderr.read()
    assert rc == 1 and "a trainer rank died" in err, err[-3000:]
    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    done = int(latest[4:])
    resumed = subprocess.run(args + [f"total_train_steps={done + 1}"], env=env, capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(done + 2))
