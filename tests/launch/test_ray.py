"""The Ray launcher (asyncrl.launch.ray): the placement group's bundles (no Ray started), CPU requests scaled to the
machine, and a run on a local Ray of 2 CPUs (one `asyncrl serve`, two trainer ranks) that advances the version
within the staleness bound and leaves no process behind."""

import os
import signal
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("ray")

from asyncrl import configlib  # noqa: E402
from asyncrl.config import TrainConfig  # noqa: E402
from asyncrl.launch.ray import Bundle, bundle_plan  # noqa: E402


def _cfg(*extra):
    return configlib.load(TrainConfig, None, ["train_dataset.batch_size=4", *extra])


def test_bundles_hold_trainer_ranks_then_servers():
    cfg = _cfg("actor.backend=ddp:d2", "rollout.backend=asyncrl:d3", "actor.threads=2", "rollout.threads=1")
    assert bundle_plan(cfg) == [
        Bundle("trainer", 0, {"CPU": 2.0}),
        Bundle("trainer", 1, {"CPU": 2.0}),
        Bundle("server", 0, {"CPU": 1.0}),
        Bundle("server", 1, {"CPU": 1.0}),
        Bundle("server", 2, {"CPU": 1.0}),
    ]
    gpu = bundle_plan(
        _cfg("actor.backend=fsdp:d4", "rollout.backend=vllm:d2t2", "rollout.interrupt_mode=abort"), "cuda"
    )
    assert [b.resources for b in gpu] == [{"CPU": 1.0, "GPU": 1.0}] * 4 + [{"CPU": 1.0, "GPU": 2.0}] * 2


def test_in_process_engine_shares_rank_0s_bundle_and_remote_servers_take_none():
    local = bundle_plan(_cfg("actor.backend=ddp:d2", "rollout.threads=3"))
    assert [(b.role, b.resources["CPU"]) for b in local] == [("trainer", 4.0), ("trainer", 1.0)]
    remote = bundle_plan(_cfg("rollout.backend=remote", "rollout.server_addrs=[h:1]"))
    assert remote == [Bundle("trainer", 0, {"CPU": 1.0})]


def test_cpu_requests_are_scaled_to_fit_the_machine():
    cfg = _cfg("actor.backend=ddp:d2", "rollout.backend=asyncrl:d1")
    plan = bundle_plan(cfg, cpus=2)
    assert [b.resources["CPU"] for b in plan] == [0.66] * 3 and sum(b.resources["CPU"] for b in plan) <= 2
    assert [b.resources["CPU"] for b in bundle_plan(cfg, cpus=8)] == [1.0] * 3  # fits: unchanged


def _tagged(tag: str) -> list[str]:
    """Live processes whose environment carries ``tag`` (every process the launcher's Ray started inherits it)."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if tag.encode() in (d / "environ").read_bytes():
                cmdline = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{d.name}: {cmdline[:100]}")
        except OSError:
            pass
    return found


@pytest.mark.slow
def test_ray_run_two_ranks_one_server(tmp_path, tiny_model_dir, monkeypatch):
    from asyncrl.launch.train import train
    from asyncrl.telemetry.metrics import read_metrics

    tag = f"asyncrl-ray-test-{uuid.uuid4().hex}"
    monkeypatch.setenv("ASYNCRL_TEST_TAG", tag)  # Ray's processes and everything under them inherit it
    eta = 1
    cfg = configlib.load(
        TrainConfig,
        None,
        [
            f"model.path={tiny_model_dir}",
            f"output_dir={tmp_path}",
            "progress_bar=false",
            "report=false",
            "launcher=ray",
            "actor.backend=ddp:d2",
            "rollout.backend=asyncrl:d1",
            "rollout.weight_transport=disk",
            f"rollout.max_head_offpolicyness={eta}",
            "total_train_steps=3",
            "train_dataset.batch_size=2",
            "gconfig.n_samples=4",
            "gconfig.max_new_tokens=16",
            "valid_dataset.size=4",
            "evaluator.freq_steps=0",
            "rollout.max_slots=16",
            "actor.lr=1e-3",
            "reward.fn=rewards_for_tests:digit_count_reward",
        ],
    )
    start = time.monotonic()
    try:
        last = train(cfg)
    finally:
        deadline = time.monotonic() + 30  # Ray's own processes exit a moment after ray.shutdown returns
        while _tagged(tag) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = _tagged(tag)
    print(f"ray run: {time.monotonic() - start:.1f} s")
    assert not left, f"processes left behind: {left}"
    ignored = int(next(ln for ln in open("/proc/self/status") if ln.startswith("SigIgn")).split()[1], 16)
    assert not ignored & (1 << (signal.SIGCHLD - 1)), "Ray's SIGCHLD disposition outlived the run"
    run_dir = tmp_path / "asyncrl" / "default"
    steps = [r for r in read_metrics(run_dir) if r["step"] > 0]
    assert [r["version"] for r in steps] == [1, 2, 3] and last["version"] == 3
    assert all(r["staleness_max"] <= eta for r in steps)
    ran = configlib.load(TrainConfig, str(run_dir / "config.yaml"))  # what rank 0 ran: the servers Ray placed
    assert ran.rollout.backend == "remote" and len(ran.rollout.server_addrs) == 1 and ran.launcher == "ray"
