"""Stopping by signal (asyncrl.launch.signals): SIGINT and SIGTERM stop a run with a checkpoint and leave no process,
and what a run started dies with it even by SIGKILL."""

import json
import signal
import subprocess
import time

import pytest

from runs_for_tests import alive, descendants, is_complete, latest_checkpoint, prompt_files, train_command, train_env


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_with_a_checkpoint_and_leaves_no_process(tmp_path, tiny_model_dir, sig):
    train, valid = prompt_files(tmp_path, 200)
    args = train_command(
        tmp_path,
        tiny_model_dir,
        train,
        valid,
        500,
        "saver.freq_steps=0",
        "reward.workers=1",
        "rollout.backend=asyncrl:d1",
        "rollout.max_slots=8",
    )
    proc = subprocess.Popen(
        args, env=train_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    run = tmp_path / "out" / "asyncrl" / "default"
    deadline = time.monotonic() + 120
    while not (run / "metrics.jsonl").exists() or len((run / "metrics.jsonl").read_text().splitlines()) < 3:
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-3000:]
        time.sleep(0.2)
    children = descendants(proc.pid)
    assert children  # the engine server and the reward worker
    proc.send_signal(sig)
    rc = proc.wait(timeout=60)
    err = proc.stderr.read()
    assert rc == 128 + sig, err[-2000:]
    assert f"stopped by {signal.Signals(sig).name}" in err
    latest = latest_checkpoint(run)
    assert latest is not None and is_complete(latest)
    assert f"checkpoint {latest} saved: run the same command again" in err  # the message names it
    time.sleep(1.0)
    assert not [p for p in children if alive(p)], "processes of the run outlived it"
    resumed = subprocess.run(
        args + ["total_train_steps=" + str(int(latest.name[4:]) + 1)],
        env=train_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)) and steps[-1] == int(latest.name[4:]) + 1
    assert f"checkpoint: {run}/checkpoints/step{steps[-1]}" in resumed.stderr  # the end says where it is


@pytest.mark.slow
def test_what_a_run_started_dies_with_it_even_by_sigkill(tmp_path, tiny_model_dir):
    """The engine server (its own session, so no group signal reaches it) and the reward worker end when the
    trainer is SIGKILLed: parent-death signal and the worker's closed pipe."""
    train, valid = prompt_files(tmp_path, 200)
    args = train_command(
        tmp_path,
        tiny_model_dir,
        train,
        valid,
        500,
        "saver.freq_steps=0",
        "reward.workers=1",
        "rollout.backend=asyncrl:d1",
        "rollout.max_slots=8",
    )
    proc = subprocess.Popen(args, env=train_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    run = tmp_path / "out" / "asyncrl" / "default"
    deadline = time.monotonic() + 120
    while not (run / "metrics.jsonl").exists() or len((run / "metrics.jsonl").read_text().splitlines()) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-3000:]
        time.sleep(0.2)
    children = descendants(proc.pid)
    assert len(children) >= 2, children  # the engine server and the reward worker
    proc.kill()
    proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while [p for p in children if alive(p)] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in children if alive(p)], "processes of a SIGKILLed run outlived it"
