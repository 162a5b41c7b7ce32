"""The local launcher (asyncrl.launch.ranks): `asyncrl train actor.backend=ddp:d2` and `fsdp:d2` run two ranks end to
end and resume, and a rank that dies ends the run with a checkpoint to resume from."""

import os

import pytest

from conftest import TESTS


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["ddp:d2", "fsdp:d2"])
def test_the_local_launcher_runs_two_ranks_end_to_end(tmp_path, tiny_model_dir, backend):
    """`asyncrl train actor.backend=...:d2` starts the second rank itself; the versions advance, both ranks
    exit, and a resume of the finished run with more steps continues from its checkpoint on both ranks."""
    import subprocess
    import sys

    from asyncrl.telemetry.metrics import read_metrics

    args = [
        sys.executable,
        "-m",
        "asyncrl.cli",
        "train",
        f"model.path={tiny_model_dir}",
        f"output_dir={tmp_path}",
        "progress_bar=false",
        "report=false",
        f"actor.backend={backend}",
        "train_dataset.batch_size=2",
        "gconfig.n_samples=4",
        "gconfig.max_new_tokens=16",
        "valid_dataset.size=4",
        "evaluator.freq_steps=0",
        "rollout.max_slots=16",
        "actor.lr=1e-3",
        "reward.fn=rewards_for_tests:digit_count_reward",
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    for steps in (2, 4):
        done = subprocess.run(
            args + [f"total_train_steps={steps}"], capture_output=True, text=True, env=env, timeout=300
        )
        assert done.returncode == 0, done.stderr[-3000:]
    run_dir = tmp_path / "asyncrl" / "default"
    assert [r["step"] for r in read_metrics(run_dir)] == [0, 1, 2, 3, 4]
    assert "resuming from" in done.stderr and (run_dir / "checkpoints" / "step4").is_dir()
    if backend.startswith("fsdp"):  # each rank wrote its shard of the optimizer state
        assert len(list((run_dir / "checkpoints" / "step4" / "optimizer-shards").glob("*.distcp"))) == 2


@pytest.mark.slow
def test_a_trainer_rank_that_dies_ends_the_run_with_a_checkpoint_to_resume_from(tmp_path, tiny_model_dir):
    import json
    import signal
    import subprocess
    import sys
    import time

    args = [
        sys.executable,
        "-m",
        "asyncrl.cli",
        "train",
        f"model.path={tiny_model_dir}",
        f"output_dir={tmp_path}",
        "progress_bar=false",
        "report=false",
        "actor.backend=ddp:d2",
        "train_dataset.batch_size=2",
        "gconfig.n_samples=4",
        "gconfig.max_new_tokens=16",
        "valid_dataset.size=4",
        "evaluator.freq_steps=0",
        "rollout.max_slots=16",
        "actor.lr=1e-3",
        "reward.fn=rewards_for_tests:digit_count_reward",
        "saver.freq_steps=1",
        "max_train_time_s=0",
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        args + ["total_train_steps=500"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    run_dir = tmp_path / "asyncrl" / "default"
    deadline = time.monotonic() + 180
    while not (run_dir / "metrics.jsonl").exists() or len((run_dir / "metrics.jsonl").read_text().splitlines()) < 4:
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-3000:]
        time.sleep(0.2)
    ps = subprocess.run(
        ["ps", "-ww", "-o", "pid=,args=", "--ppid", str(proc.pid)], capture_output=True, text=True
    ).stdout
    ranks = [int(line.split()[0]) for line in ps.splitlines() if "asyncrl-rank-config" in line]
    assert len(ranks) == 1, ps
    rank1 = ranks[0]
    os.kill(rank1, signal.SIGKILL)
    rc = proc.wait(timeout=120)
    err = proc.stderr.read()
    assert rc == 1 and "asyncrl train: stopped: a trainer rank died" in err, err[-3000:]
    assert "Traceback" not in err, err[-3000:]  # one line says what happened
    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    done = int(latest[4:])
    resumed = subprocess.run(
        args + [f"total_train_steps={done + 1}"], env=env, capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(done + 2))
