"""Runs that are killed at any moment and resumed: nothing lost, nothing trained twice, no half checkpoint,
each step logged once; graceful stops by signal; a full disk while saving."""

import json
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from runs_for_tests import (alive, descendants, is_complete, last_logged_step, latest_checkpoint, prompt_files,
                            train_command, train_env)


@pytest.mark.slow
def test_killed_at_any_moment_and_resumed_every_prompt_is_trained_once(tmp_path, tiny_model_dir):
    """SIGKILL 12 times, each time 0-0.5 s after the restarted run has logged a new step (so the kills land
    in generation, training, weight sync, checkpoint writing and evaluation, not in start-up), then let it
    finish: every prompt of the epoch trained exactly once (ledger), each step logged once, and ``latest``
    never names a half-written checkpoint."""
    n_prompts, steps = 120, 60  # one epoch: 60 steps of 2 prompts (a step takes ~0.1-0.3 s here)
    train, valid = prompt_files(tmp_path, n_prompts)
    args = train_command(tmp_path, tiny_model_dir, train, valid, steps)
    run = tmp_path / "out" / "asyncrl" / "default"
    rng, kills, moments, finished = random.Random(3), 0, [], False
    for attempt in range(60):
        base = last_logged_step(run)  # the restarted run logs steps beyond this one once it has made progress
        proc = subprocess.Popen(args, env=train_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while kills < 12 and proc.poll() is None and last_logged_step(run) <= base and time.monotonic() < deadline:
            time.sleep(0.02)
        if kills < 12 and proc.poll() is None:
            time.sleep(rng.uniform(0.0, 0.5))
        if kills < 12 and proc.poll() is None:
            proc.kill()
            proc.wait()
            kills += 1
            latest = latest_checkpoint(run)
            moments.append((base, last_logged_step(run), latest.name if latest else None))
            assert latest is None or is_complete(latest), f"latest names a half-written checkpoint {latest}"
            continue
        rc = proc.wait(timeout=600)
        assert rc == 0, proc.stderr.read()[-3000:]
        finished = True
        break
    print(f"\nkills (last step logged at restart, then at the kill, latest checkpoint after it): {moments}")
    assert finished and kills >= 10, (kills, moments)
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in metrics] == list(range(steps + 1)), [r["step"] for r in metrics]
    trained = [item for line in (run / "ledger.jsonl").read_text().splitlines() for item in json.loads(line)["items"]]
    first_epoch = sorted(i for i in trained if i < n_prompts)
    assert first_epoch == sorted(list(range(n_prompts)) * 2), (moments, first_epoch)  # 2 samples per prompt, once


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_with_a_checkpoint_and_leaves_no_process(tmp_path, tiny_model_dir, sig):
    train, valid = prompt_files(tmp_path, 200)
    args = train_command(tmp_path, tiny_model_dir, train, valid, 500, "saver.freq_steps=0", "reward.workers=1",
                 "rollout.backend=asyncrl:d1", "rollout.max_slots=8")
    proc = subprocess.Popen(args, env=train_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
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
    time.sleep(1.0)
    assert not [p for p in children if alive(p)], "processes of the run outlived it"
    resumed = subprocess.run(args + ["total_train_steps=" + str(int(latest.name[4:]) + 1)], env=train_env(),
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)) and steps[-1] == int(latest.name[4:]) + 1


@pytest.mark.slow
def test_what_a_run_started_dies_with_it_even_by_sigkill(tmp_path, tiny_model_dir):
    """The engine server (its own session, so no group signal reaches it) and the reward worker end when the
    trainer is SIGKILLed: parent-death signal and the worker's closed pipe."""
    train, valid = prompt_files(tmp_path, 200)
    args = train_command(tmp_path, tiny_model_dir, train, valid, 500, "saver.freq_steps=0", "reward.workers=1",
                 "rollout.backend=asyncrl:d1", "rollout.max_slots=8")
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


@pytest.mark.slow
def test_synchronous_run_stopped_and_resumed_replays_the_uninterrupted_losses(tmp_path, tiny_model_dir):
    """η = 0, fixed seed: 6 steps in one go against 3 steps, a stop (its next batch in flight, recorded) and a
    resume to 6. Rollouts are seeded per prompt (counter-based draws), so the resumed run samples the same
    tokens and every step's loss matches to 1e-6."""
    train, valid = prompt_files(tmp_path, 60)

    def run(out, steps):
        args = train_command(tmp_path, tiny_model_dir, train, valid, steps, "rollout.max_head_offpolicyness=0",
                     "saver.freq_steps=0", "evaluator.freq_steps=0", f"output_dir={out}")
        done = subprocess.run(args, env=train_env(), capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stderr

    run(tmp_path / "once", 6)
    run(tmp_path / "twice", 3)
    assert "resuming from" in run(tmp_path / "twice", 6)

    def losses(out):
        records = [json.loads(line) for line in (out / "asyncrl" / "default" / "metrics.jsonl").read_text().splitlines()]
        return [(r["step"], r["loss"], r["reward_mean"]) for r in records if r["step"] > 0]

    once, twice = losses(tmp_path / "once"), losses(tmp_path / "twice")
    assert [s for s, *_ in twice] == [1, 2, 3, 4, 5, 6]
    for (step, a, ra), (_, b, rb) in zip(once, twice):
        assert abs(a - b) <= 1e-6 and ra == rb, (step, a, b, ra, rb)


def test_a_full_disk_while_saving_is_one_line_and_the_previous_checkpoint_stays(tmp_path, tiny_model_dir,
                                                                                   monkeypatch, capsys):
    import errno

    from asyncrl import cli
    from asyncrl.trainer import PolicyTrainer

    train, valid = prompt_files(tmp_path, 40)
    args = train_command(tmp_path, tiny_model_dir, train, valid, 4)[3:]
    save = PolicyTrainer.save

    def fills_the_disk(self, path, tokenizer=None):
        if self.steps_done == 3:
            (Path(path) / "config.json").write_text("{")  # half written when the disk filled up
            raise OSError(errno.ENOSPC, "No space left on device")
        return save(self, path, tokenizer)

    monkeypatch.setattr(PolicyTrainer, "save", fills_the_disk)
    code = cli.main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "the disk is full" in err[0] and "step2" in err[0], err
    run = tmp_path / "out" / "asyncrl" / "default"
    assert latest_checkpoint(run).name == "step2" and is_complete(latest_checkpoint(run))
    assert not list((run / "checkpoints").glob("step3")) and not list((run / "checkpoints").glob(".tmp-*"))


def test_resume_refuses_a_changed_run_and_fresh_moves_it_aside(tmp_path, tiny_model_dir, capsys):
    from asyncrl import cli

    train, valid = prompt_files(tmp_path, 20)
    args = train_command(tmp_path, tiny_model_dir, train, valid, 2)[3:]
    assert cli.main(args) == 0
    capsys.readouterr()
    assert cli.main(args + ["actor.lr=1e-3"]) == 2
    err = capsys.readouterr().err
    assert "actor.lr" in err and "resume=fresh" in err
    assert cli.main(args + ["actor.backend=fsdp:d2"]) == 2  # the optimizer state of DDP does not load into FSDP
    assert "actor.backend (ddp or fsdp)" in capsys.readouterr().err
    assert cli.main(args + ["total_train_steps=3", "evaluator.freq_steps=1"]) == 0  # settable keys may change
    run = tmp_path / "out" / "asyncrl" / "default"
    assert [json.loads(l)["step"] for l in (run / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2, 3]
    assert cli.main(args + ["actor.lr=1e-3", "resume=fresh"]) == 0
    assert len(list((tmp_path / "out" / "asyncrl").glob("default.replaced-*"))) == 1
    assert [json.loads(l)["step"] for l in (run / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2]


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["generation", "weight-sync", "evaluation"])
def test_a_run_with_two_servers_survives_losing_one(tmp_path, tiny_model_dir, moment):
    """kill -9 of one of two engine servers while generating, during a weight update or during evaluation:
    the server is retired, its requests move to the other, and the run trains every step."""
    import threading

    from asyncrl import configlib
    from asyncrl.config import TrainConfig
    from asyncrl.controller import run
    from asyncrl.launch.build import assemble
    from asyncrl.publish import DiskPublisher

    cfg = configlib.load(TrainConfig, None, [
        f"model.path={tiny_model_dir}", f"output_dir={tmp_path}", "progress_bar=false", "report=false",
        "total_train_steps=6", "train_dataset.batch_size=2", "gconfig.n_samples=2", "gconfig.max_new_tokens=24",
        "valid_dataset.size=8", "evaluator.freq_steps=2", "rollout.backend=asyncrl:d2", "rollout.max_slots=8",
        "reward.fn=rewards_for_tests:digit_count_reward", "reward.workers=0", "max_train_time_s=0"])
    with assemble(cfg) as parts:
        victim = parts.engine._procs[0]
        if moment == "generation":
            def kill_while_generating():
                while parts.engine.stats().generated_tokens < 100:
                    time.sleep(0.005)
                victim.kill()

            threading.Thread(target=kill_while_generating, daemon=True).start()
        elif moment == "weight-sync":
            publish = parts.publisher.publish

            def publish_and_kill(state_dict, version):
                if version == 3:
                    victim.kill()
                return publish(state_dict, version)

            parts.publisher.publish = publish_and_kill
            assert isinstance(parts.publisher, DiskPublisher)
        else:
            evaluate = parts.evaluate

            def evaluate_and_kill(version):
                if version == 2:
                    victim.kill()
                return evaluate(version)

            parts.evaluate = evaluate_and_kill
        last = run(parts)
        retired = [s for s in parts.engine._servers if s.retired]
    assert last["version"] == 6 and len(retired) == 1, (last.get("version"), retired)
