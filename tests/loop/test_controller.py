"""The train loop (asyncrl.loop.controller): its order on scripted parts (fast), and end to end on tiny models:
versions advance within the staleness bound, failing rewards are counted, the shipped model's asynchronous run,
the batch timeout, max_train_time_s, and a failed run keeping no checkpoint its logs do not reach."""

import itertools
import json

import pytest
import torch

from asyncrl import configlib
from asyncrl.api.engine import EngineStats
from asyncrl.config import TrainConfig
from asyncrl.launch.train import train
from asyncrl.loop.buffer import RolloutBuffer
from asyncrl.loop.checkpoint import RunState
from asyncrl.loop.controller import LoopPlan, Parts, run
from asyncrl.loop.rollout import RolloutRunner
from asyncrl.loop.staleness import FixedStaleness
from asyncrl.models.hf import load_model
from asyncrl.telemetry.metrics import MetricsLogger, StepMeter, read_metrics
from asyncrl.telemetry.timeline import Timeline
from asyncrl.telemetry.watchdog import Watchdog
from asyncrl.types import Completion, SamplingParams, Trajectory, TrajectoryGroup, WeightUpdate

from runs_for_tests import EVALUATED_RUN, quick_config


def _cfg(tmp_path, model_path, *extra):
    return quick_config(tmp_path, model_path, *extra, base=EVALUATED_RUN)


@pytest.mark.slow
@pytest.mark.parametrize("eta", [0, 2])
def test_async_run_end_to_end(tmp_path, tiny_model_dir, eta):
    cfg = _cfg(tmp_path, tiny_model_dir, f"rollout.max_head_offpolicyness={eta}")
    last = train(cfg)
    run_dir = tmp_path / "asyncrl" / "default"
    records = read_metrics(run_dir)
    steps = [r for r in records if r["step"] > 0]
    assert [r["version"] for r in steps] == [1, 2, 3, 4, 5] and last["version"] == 5
    assert all(r["staleness_max"] <= r["staleness_bound"] == eta for r in steps)
    if eta == 0:
        assert all(r["staleness_max"] == 0 for r in steps)
    for key in ("reward_mean", "staleness_mean", "gen_tokens_per_s", "train_tokens_per_s", "step_time_s"):
        assert all(key in r for r in steps)
    assert "eval_accuracy" in records[0] and "eval_accuracy" in steps[1] and "eval_accuracy" in steps[-1]
    assert (run_dir / "config.yaml").exists()
    machine = json.loads((run_dir / "machine.json").read_text())  # where it ran, for a copy diagnosed elsewhere
    assert machine["device"] == "cpu" and machine["cpu_split"] == "auto" and machine["cores"] >= 1 and machine["cpu"]
    assert machine["eval_background"] is False and machine["eval_background_why"].startswith("auto:")  # shared split
    ckpt = run_dir / "checkpoints" / "step5"
    before, after = load_model(tiny_model_dir), load_model(str(ckpt))
    changed = [k for k, v in before.state_dict().items() if not torch.equal(v, after.state_dict()[k])]
    assert changed, "training did not change any weight"


@pytest.mark.slow
def test_failing_reward_is_counted_and_training_continues(tmp_path, tiny_model_dir):
    cfg = _cfg(
        tmp_path,
        tiny_model_dir,
        "reward.fn=rewards_for_tests:raising_reward",
        "total_train_steps=2",
        "evaluator.freq_steps=0",
        "watchdog.reward_failure_steps=0",
    )  # the watchdog would stop it
    last = train(cfg)
    assert last["version"] == 2 and last["reward_errors"] > 0 and last["reward_mean"] == 0.0


@pytest.mark.slow
def test_shipped_model_async_run_improves_nothing_breaks(tmp_path):
    """The real shipped checkpoint through the real task and verifier, asynchronously (η = 2)."""
    cfg = configlib.load(
        TrainConfig,
        None,
        [
            f"output_dir={tmp_path}",
            "progress_bar=false",
            "report=false",
            "total_train_steps=4",
            "train_dataset.batch_size=4",
            "gconfig.n_samples=4",
            "valid_dataset.size=16",
            "evaluator.freq_steps=0",
            "rollout.max_head_offpolicyness=2",
        ],
    )
    last = train(cfg)
    records = read_metrics(tmp_path / "asyncrl" / "default")
    assert last["version"] == 4 and records[0]["eval_accuracy"] > 0  # the SFT checkpoint already solves some
    assert all(r["staleness_max"] <= 2 for r in records[1:])
    assert max(r["staleness_max"] for r in records[1:]) >= 1  # it really ran ahead of the trainer
    assert all(0 <= r["reward_mean"] <= 1 for r in records[1:])


def _quick_cfg(tmp_path, model_path, *extra):
    return quick_config(tmp_path, model_path, "total_train_steps=3", "gconfig.max_new_tokens=16", *extra)


@pytest.mark.slow
def test_waiting_for_a_batch_has_its_own_timeout(tmp_path, tiny_model_dir):
    cfg = _quick_cfg(
        tmp_path, tiny_model_dir, "rollout.batch_timeout_s=1", "workflow.name=workflows_for_tests:reject_all"
    )
    with pytest.raises(TimeoutError, match="within 1.0s \\(rollout.batch_timeout_s\\)"):
        train(cfg)


@pytest.mark.slow
def test_a_batch_timeout_stops_the_command_with_one_line_and_exit_1(tmp_path, tiny_model_dir, capsys):
    from asyncrl import cli

    code = cli.main(
        [
            "train",
            f"model.path={tiny_model_dir}",
            f"output_dir={tmp_path}",
            "progress_bar=false",
            "report=false",
            "total_train_steps=3",
            "train_dataset.batch_size=2",
            "gconfig.n_samples=2",
            "gconfig.max_new_tokens=16",
            "valid_dataset.size=4",
            "evaluator.freq_steps=0",
            "rollout.max_slots=8",
            "reward.workers=0",
            "rollout.batch_timeout_s=1",
            "workflow.name=workflows_for_tests:reject_all",
        ]
    )
    err = capsys.readouterr().err
    assert code == 1 and "asyncrl train: stopped: no batch of 2 groups within 1.0s" in err and "Traceback" not in err


@pytest.mark.slow
def test_max_train_time_ends_the_run_with_an_evaluation_and_a_checkpoint(tmp_path, tiny_model_dir):
    cfg = _quick_cfg(tmp_path, tiny_model_dir, "max_train_time_s=0.001", "total_train_steps=50")
    last = train(cfg)
    assert last["version"] == 1 and "eval_accuracy" in last
    assert (tmp_path / "asyncrl" / "default" / "checkpoints" / "step1").is_dir()


@pytest.mark.slow
def test_a_step_whose_publish_fails_is_logged_and_saved(tmp_path, tiny_model_dir, monkeypatch):
    """Step 3 is trained but its weights cannot be published (every server lost, red team 4): the step is logged
    (publish_failed), its prompts are in the ledger, and the stopping checkpoint holds its weights, so the run
    resumes at step 3, not from nothing (it stopped without a checkpoint: the logs ended at step 2)."""
    from asyncrl.telemetry.metrics import read_metrics
    from asyncrl.weights.publish import InProcessPublisher

    from runs_for_tests import is_complete

    publish = InProcessPublisher.publish

    def flaky(self, state_dict, version):
        if version == 3:
            raise RuntimeError("publish failed")
        return publish(self, state_dict, version)

    monkeypatch.setattr(InProcessPublisher, "publish", flaky)
    with pytest.raises(RuntimeError, match="publish failed"):
        train(_quick_cfg(tmp_path, tiny_model_dir, "total_train_steps=5"))
    run_dir = tmp_path / "asyncrl" / "default"
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [0, 1, 2, 3] and records[-1]["publish_failed"] == 1
    assert is_complete(run_dir / "checkpoints" / "step3")
    ledger = [json.loads(line)["step"] for line in (run_dir / "ledger.jsonl").read_text().splitlines()]
    assert ledger == [1, 2, 3]


# ---- the loop on scripted parts (fast) ------------------------------------------------------------------------
class _Events(list):
    """What the scripted parts did, in order: ("train", v), ("publish", v), ..."""


class _Engine:
    version = 0

    async def generate(self, prompt_ids, params):
        return [Completion(prompt_ids, [5, 6], [-0.5, -0.5], [self.version] * 2, "stop")]

    def update_weights(self, update, timeout=None):
        self.version = update.version


class _Workflow:
    def __init__(self, engine):
        self.engine = engine

    async def run(self, item, engine):
        (c,) = await engine.generate([1, 2, 3], SamplingParams())
        return TrajectoryGroup([Trajectory(c.prompt_ids, c.output_ids, c.logprobs, c.versions, 1.0)], item["id"])


class _Trainer:
    def __init__(self, events):
        self.events, self.steps_done = events, 0

    def step(self, batch, version=0):
        self.events.append(("train", version))
        self.steps_done += 1
        return {"train_tokens": int(batch.loss_mask.sum()), "train_time_s": 0.01, "loss": 0.0}

    def state_dict(self):
        return {"w": torch.tensor([float(self.steps_done)])}


class _Publisher:
    def __init__(self, events, engine):
        self.events, self.engine = events, engine

    def publish(self, state_dict, version):
        self.events.append(("publish", version))
        self.engine.update_weights(WeightUpdate(version, state_dict=state_dict))
        return 0.0

    def close(self):
        pass


class _Checkpoints:
    def __init__(self, events):
        self.events, self.last = events, None

    def save(self, version, state, background=False):
        self.events.append(("save", version))
        self.last = version

    def wait(self):
        pass


class _Buffer(RolloutBuffer):
    events: _Events

    def take(self, timeout=None):
        groups = super().take(timeout)
        self.events.append(("take", self.version))
        return groups

    def set_version(self, version):
        self.events.append(("gate", version))
        super().set_version(version)


class _Logger(MetricsLogger):
    events: _Events

    def log(self, record):
        self.events.append(("log", record["step"]))
        super().log(record)


def _scripted_parts(tmp_path, steps: int, eval_every: int, save_every: int):
    events = _Events()
    engine = _Engine()
    buffer = _Buffer(batch_size=2, max_staleness=1)
    buffer.events = events
    items = ({"id": i, "question": "q"} for i in itertools.count())
    rollout = RolloutRunner(engine, buffer, _Workflow(engine), items)
    timeline = Timeline(tmp_path / "timeline.jsonl", EngineStats, gate_closed_s=buffer.gate_closed_s)
    logger = _Logger(tmp_path)
    logger.events = events

    def evaluate(version):
        events.append(("eval", version))
        return {"eval_accuracy": 0.5}

    parts = Parts(
        run_dir=tmp_path,
        plan=LoopPlan(steps, 0.0, 30.0, eval_every, save_every, 0.0, True, 0),
        trainer=_Trainer(events),
        engine=engine,
        publisher=_Publisher(events, engine),
        buffer=buffer,
        staleness=FixedStaleness(1),
        rollout=rollout,
        evaluate=evaluate,
        checkpoints=_Checkpoints(events),
        logger=logger,
        timeline=timeline,
        meter=StepMeter(timeline.account, [buffer.stats]),
        watchdog=Watchdog(),
        start=RunState(version=0),
    )
    return parts, events


def test_the_loop_waits_trains_publishes_opens_the_gate_logs_evaluates_and_saves_in_that_order(tmp_path):
    """controller.run on scripted parts: the start's evaluation and weights first, then per step: take a batch,
    train, publish the new version, open the gate for it, log, and evaluate / save when due (the last step always),
    the log before the checkpoint; every trained token at most η = 1 behind."""
    parts, events = _scripted_parts(tmp_path, steps=4, eval_every=2, save_every=3)
    try:
        record = run(parts)
    finally:
        parts.rollout.stop()
        parts.timeline.close()
        parts.logger.close()
    expected = [("eval", 0), ("log", 0), ("publish", 0)]
    for step in range(4):
        v = step + 1
        expected += [("take", step), ("train", step), ("publish", v), ("gate", v)]
        expected += [("eval", v)] if v % 2 == 0 or v == 4 else []
        expected += [("log", v)]
        expected += [("save", v)] if v % 3 == 0 or v == 4 else []
    assert events == expected
    assert record["version"] == 4 and record["eval_accuracy"] == 0.5 and record["staleness_max"] <= 1
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2, 3, 4]


def test_a_failing_step_saves_the_last_version_trained_and_raises(tmp_path):
    """A trainer that fails at its third step: the run ends with its error, after a checkpoint of version 2 (the
    last one trained, logged and not yet saved)."""
    parts, events = _scripted_parts(tmp_path, steps=5, eval_every=0, save_every=0)
    step = parts.trainer.step

    def failing(batch, version=0):
        if version == 2:
            raise RuntimeError("the trainer failed")
        return step(batch, version)

    parts.trainer.step = failing
    try:
        with pytest.raises(RuntimeError, match="the trainer failed"):
            run(parts)
    finally:
        parts.rollout.stop()
        parts.timeline.close()
        parts.logger.close()
    assert events[-1] == ("save", 2) and ("train", 1) in events and ("log", 2) in events
