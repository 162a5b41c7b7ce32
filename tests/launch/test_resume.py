"""Resuming (asyncrl.launch.resume): a run killed at any moment and resumed loses nothing, trains nothing twice, never
names a half-written checkpoint and logs each step once; a synchronous run stopped and resumed replays the
uninterrupted losses; a changed run is refused and resume=fresh moves it aside; every trained token stays within
the staleness bound across resumes (a resumed engine once started at version 0)."""

import json
import random
import subprocess
import time

import pytest

from asyncrl import configlib
from asyncrl.config import TrainConfig
from asyncrl.launch.build import assemble
from asyncrl.launch.resume import resume_point
from asyncrl.launch.train import train
from asyncrl.telemetry.metrics import read_metrics

from runs_for_tests import is_complete, last_logged_step, latest_checkpoint, prompt_files, train_command, train_env


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_killed_at_any_moment_and_resumed_every_prompt_is_trained_once(tmp_path, tiny_model_dir):
    """SIGKILL 12 times, each time 0-0.5 s after the restarted run has logged a new step (so the kills land
    in generation, training, weight sync, checkpoint writing and evaluation, not in start-up), then let it
    finish: every prompt of the epoch trained exactly once (ledger), each step logged once, and ``latest``
    never names a half-written checkpoint."""
    n_prompts, steps = 200, 100  # one epoch: 100 steps of 2 prompts (a step takes ~0.1-0.3 s here; with 60, a
    # fast CPU finished the epoch after 9 kills)
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
def test_synchronous_run_stopped_and_resumed_replays_the_uninterrupted_losses(tmp_path, tiny_model_dir):
    """η = 0, fixed seed: 6 steps in one go against 3 steps, a stop (its next batch in flight, recorded) and a
    resume to 6. Rollouts are seeded per prompt (counter-based draws), so the resumed run samples the same
    tokens and every step's loss matches to 1e-6."""
    train, valid = prompt_files(tmp_path, 60)

    def run(out, steps):
        args = train_command(
            tmp_path,
            tiny_model_dir,
            train,
            valid,
            steps,
            "rollout.max_head_offpolicyness=0",
            "saver.freq_steps=0",
            "evaluator.freq_steps=0",
            f"output_dir={out}",
        )
        done = subprocess.run(args, env=train_env(), capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stderr

    run(tmp_path / "once", 6)
    run(tmp_path / "twice", 3)
    assert "resuming from" in run(tmp_path / "twice", 6)

    def losses(out):
        records = [
            json.loads(line) for line in (out / "asyncrl" / "default" / "metrics.jsonl").read_text().splitlines()
        ]
        return [(r["step"], r["loss"], r["reward_mean"]) for r in records if r["step"] > 0]

    once, twice = losses(tmp_path / "once"), losses(tmp_path / "twice")
    assert [s for s, *_ in twice] == [1, 2, 3, 4, 5, 6]
    for (step, a, ra), (_, b, rb) in zip(once, twice):
        assert abs(a - b) <= 1e-6 and ra == rb, (step, a, b, ra, rb)


@pytest.mark.slow
def test_resume_refuses_a_changed_run_and_fresh_moves_it_aside(tmp_path, tiny_model_dir, capsys, monkeypatch):
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
    # the same directory spelt another way (a job requeued from another working directory) resumes too
    relative = [a if not a.startswith("output_dir=") else "output_dir=out" for a in args]
    monkeypatch.chdir(tmp_path)
    assert cli.main(relative + ["total_train_steps=4"]) == 0
    assert [json.loads(l)["step"] for l in (run / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2, 3, 4]
    assert cli.main(relative + ["actor.lr=1e-3", "resume=fresh"]) == 0
    assert len(list((tmp_path / "out" / "asyncrl").glob("default.replaced-*"))) == 1
    assert [json.loads(l)["step"] for l in (run / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2]


ETA = 1


def _overrides(tmp_path, model, steps: int) -> list[str]:
    train_file, valid_file = tmp_path / "prompts.jsonl", tmp_path / "valid.jsonl"
    train_file.write_text(
        "".join(json.dumps({"question": f"Compute {i} + 7.", "answer": str(i + 7)}) + "\n" for i in range(200))
    )
    valid_file.write_text(
        "".join(json.dumps({"question": f"Compute {i} + 1.", "answer": str(i + 1)}) + "\n" for i in range(100, 104))
    )
    return [
        f"model.path={model}",
        f"output_dir={tmp_path / 'out'}",
        f"train_dataset.path={train_file}",
        f"valid_dataset.path={valid_file}",
        "train_dataset.type=qa",
        "reward.fn=rewards_for_tests:digit_count_reward",
        "reward.workers=0",
        f"total_train_steps={steps}",
        "train_dataset.batch_size=2",
        "gconfig.n_samples=2",
        "gconfig.max_new_tokens=12",
        "rollout.max_slots=8",
        f"rollout.max_head_offpolicyness={ETA}",
        "saver.freq_steps=1",
        "evaluator.freq_steps=0",
        "max_train_time_s=0",
        "progress_bar=false",
        "report=false",
    ]


@pytest.mark.slow
def test_every_trained_token_is_within_the_bound_after_each_resume(tmp_path, tiny_model_dir):
    for steps in (2, 3, 4, 6, 8):  # a run stopped after step 2, resumed four times
        train(configlib.load(TrainConfig, None, _overrides(tmp_path, tiny_model_dir, steps)))
        cfg = configlib.load(TrainConfig, None, _overrides(tmp_path, tiny_model_dir, steps + 1))
        with assemble(cfg, resume=resume_point(cfg)) as parts:  # what the next resume starts with
            assert parts.start.version == steps and parts.engine.version == steps
    records = [r for r in read_metrics(tmp_path / "out" / "asyncrl" / "default") if r["step"] > 0]
    assert [r["step"] for r in records] == list(range(1, 9))
    for r in records:  # the histogram counts every trained token by its staleness (index 0 = current version)
        assert sum(r["staleness_hist"]) == r["n_samples"] * r["response_len_mean"], r
        assert r["staleness_max"] <= ETA and len(r["staleness_hist"]) <= ETA + 1, r


@pytest.mark.slow
def test_a_resumed_auto_eta_goes_on_where_it_stood(tmp_path, tiny_model_dir, monkeypatch):
    """η = auto lowered to 1 before the checkpoint: the resumed run admits under 1, not again at the limit."""
    from asyncrl.loop.staleness import AutoStaleness

    def overrides(steps):
        return [o for o in _overrides(tmp_path, tiny_model_dir, steps) if "offpolicyness" not in o] + [
            "rollout.max_head_offpolicyness=auto",
            "rollout.max_staleness_limit=4",
        ]

    real = AutoStaleness.observe

    def lowered(self, record):  # stands in for the law having brought η down (a trainer that never waited)
        real(self, record)
        with self._lock:
            self._max_staleness = 1

    monkeypatch.setattr(AutoStaleness, "observe", lowered)
    train(configlib.load(TrainConfig, None, overrides(3)))
    monkeypatch.setattr(AutoStaleness, "observe", real)
    train(configlib.load(TrainConfig, None, overrides(5)))
    records = {r["step"]: r for r in read_metrics(tmp_path / "out" / "asyncrl" / "default")}
    assert records[1]["max_staleness"] == 4 and records[2]["max_staleness"] == 1  # admitting under the limit, then 1
    assert records[4]["max_staleness"] == 1  # the first step after the resume admits under the η it stood at
