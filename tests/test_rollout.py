"""The seams and failure paths of the train loop: assembly, workflows by config, failures that surface at once,
per-thread tokenizers, the off-policy guardrails and the top-p/top-k scoring."""

import asyncio
import time

import pytest
import torch

from asyncrl import configlib
from asyncrl.buffer import RolloutBuffer
from asyncrl.config import TrainConfig
from asyncrl.configlib import ConfigError
from asyncrl.controller import run
from asyncrl.launch.train import train
from asyncrl.launch.build import assemble
from asyncrl.metrics import read_metrics
from asyncrl.rollout import RolloutFailures, RolloutRunner
from asyncrl.types import Trajectory, TrajectoryGroup


def _cfg(tmp_path, model_path, *extra):
    return configlib.load(TrainConfig, None, [
        f"model.path={model_path}", f"output_dir={tmp_path}", "progress_bar=false", "report=false",
        "total_train_steps=3", "train_dataset.batch_size=2", "gconfig.n_samples=2", "gconfig.max_new_tokens=16",
        "valid_dataset.size=4", "evaluator.freq_steps=0", "rollout.max_slots=8",
        "reward.fn=rewards_for_tests:digit_count_reward", "reward.workers=0", *extra,
    ])


def _three_then_raise(items, raised_at):
    for i, item in enumerate(items):
        if i == 3:
            raised_at.append(time.monotonic())
            raise LookupError("row 4 of the prompt stream is broken")
        yield item


def test_a_prompt_stream_that_raises_stops_the_trainer_with_its_own_error(tmp_path, tiny_model_dir):
    """The stream's own exception reaches the trainer thread within seconds (not after the 600 s request
    timeout), and the groups already in flight finish into the buffer: none is lost or left running."""
    cfg = _cfg(tmp_path, tiny_model_dir, "total_train_steps=5", "rollout.max_head_offpolicyness=4")
    with assemble(cfg) as parts:
        raised_at = []
        parts.rollout.items = _three_then_raise(parts.rollout.items, raised_at)
        with pytest.raises(LookupError, match="row 4") as raised:
            run(parts)
        assert time.monotonic() - raised_at[0] < 5
        assert any("prompt stream" in note for note in raised.value.__notes__)
        deadline = time.monotonic() + 30
        while parts.buffer.running and time.monotonic() < deadline:
            time.sleep(0.05)
        stats = parts.buffer.stats()
        assert stats["buffer_running"] == 0 and stats["groups_accepted"] == 3  # the in-flight groups finished


class _Engine:
    version = 0

    async def generate(self, prompt_ids, params):
        await asyncio.sleep(0.01)
        return []


class _FailingWorkflow:
    def __init__(self):
        self.calls = 0

    async def run(self, item, engine):
        self.calls += 1
        raise ValueError(f"prompt {item['id']} is too long for the engine")


def test_rollouts_failing_in_a_row_stop_the_run_with_the_last_error():
    buffer = RolloutBuffer(batch_size=4, max_staleness=8)
    workflow = _FailingWorkflow()
    runner = RolloutRunner(_Engine(), buffer, workflow, ({"id": i} for i in range(10**9)), max_failures_in_a_row=6)
    runner.start()
    try:
        with pytest.raises(RolloutFailures, match="6 rollouts in a row failed.*too long") as raised:
            buffer.take(timeout=30)
        assert isinstance(raised.value.__cause__, ValueError)
        calls = workflow.calls
        time.sleep(0.3)
        assert workflow.calls == calls  # admission stopped with the run
    finally:
        runner.stop()
    assert buffer.running == 0


def test_rollouts_failing_in_a_row_back_off():
    """Every prompt fails (e.g. all too long): admission slows down exponentially instead of re-admitting
    without limit (791,233 failed rollouts in 45 s before)."""
    buffer = RolloutBuffer(batch_size=4, max_staleness=0)
    workflow = _FailingWorkflow()
    runner = RolloutRunner(_Engine(), buffer, workflow, ({"id": i} for i in range(10**9)), max_failures_in_a_row=10**6)
    runner.start()
    time.sleep(1.0)
    runner.stop()
    assert 4 <= workflow.calls < 30 and runner.failures == workflow.calls


class _SlowWorkflow:
    async def run(self, item, engine):
        await asyncio.sleep(0.2)
        return TrajectoryGroup([Trajectory([1], [2], [0.0], [0], 1.0)], item_id=item["id"])


def test_stop_releases_the_groups_in_flight():
    buffer = RolloutBuffer(batch_size=2, max_staleness=1)
    runner = RolloutRunner(_Engine(), buffer, _SlowWorkflow(), ({"id": i} for i in range(100))).start()
    while buffer.running < 4:
        time.sleep(0.01)
    runner.stop()
    assert buffer.running == 0 and buffer.stats()["groups_rejected"] == 4


def test_each_thread_has_its_own_tokenizer(tmp_path, tiny_model_dir):
    """Fast tokenizers can fail with 'Already borrowed' when two threads use one at once: the rollout thread
    (prompt stream, workflow) and the trainer thread (evaluation, checkpoints) each get their own, and
    evaluation uses the prompt ids computed when the held-out set was built. Evaluating at every step runs
    both paths side by side."""
    cfg = _cfg(tmp_path, tiny_model_dir, "evaluator.freq_steps=1", "total_train_steps=4")
    with assemble(cfg) as parts:
        assert parts.rollout.workflow.tokenizer is not parts.evaluate.tokenizer
        assert parts.checkpoints.tokenizer is parts.evaluate.tokenizer
        assert all("prompt_ids" in item for item in parts.evaluate.items)
        record = run(parts)
    assert record["version"] == 4 and "eval_accuracy" in record


def test_a_user_workflow_named_by_import_path_runs_end_to_end(tmp_path, tiny_model_dir):
    import workflows_for_tests

    workflows_for_tests.ShortAnswerWorkflow.runs = 0
    cfg = _cfg(tmp_path, tiny_model_dir, "workflow.name=workflows_for_tests:ShortAnswerWorkflow",
               "workflow.kwargs={bonus: 2.0}")
    last = train(cfg)
    steps = [r for r in read_metrics(tmp_path / "asyncrl" / "default") if r["step"] > 0]
    assert last["version"] == 3 and len(steps) == 3
    assert workflows_for_tests.ShortAnswerWorkflow.runs >= 6
    assert all(0 < r["reward_mean"] <= 2.0 for r in steps) and last["reward_calls"] == 0


@pytest.mark.parametrize("name, match", [
    ("workflows_for_tests:Nope", "has no 'Nope'"),
    ("no_such_module:Flow", "cannot import module"),
    ("agentic", "neither a registered workflow"),
])
def test_bad_workflow_names_are_config_errors(name, match):
    with pytest.raises(ConfigError, match=f"workflow.name: .*{match}"):
        configlib.load(TrainConfig, None, [f"workflow.name={name}"])


@pytest.mark.parametrize("overrides, match", [
    (["actor.behav_imp_weight_cap=0.5", "actor.behav_imp_weight_mode=mask"], "drops every on-policy token"),
    (["actor.behav_imp_weight_cap=0"], "zeroes all learning"),
    (["actor.behav_imp_weight_cap=1.0"], "shrinks the weight of every on-policy token"),
    (["actor.behav_imp_weight_floor=1.0"], "floor at or above 1"),
    (["actor.lr=2"], "above 1"),
])
def test_off_policy_guardrails(overrides, match):
    with pytest.raises(ConfigError, match=match):
        configlib.load(TrainConfig, None, overrides)


def test_a_kl_cap_below_one_is_fine():
    configlib.load(TrainConfig, None, ["actor.behav_imp_weight_metric=kl_k3", "actor.behav_imp_weight_mode=mask",
                                       "actor.behav_imp_weight_cap=0.05"])


@pytest.mark.parametrize("top_p, top_k", [(0.7, 0), (1.0, 5), (0.8, 8)])
def test_on_policy_behaviour_weight_is_one_under_top_p_and_top_k(top_p, top_k):
    """The engine samples from the filtered distribution; the trainer scores under the same filter, so on the
    same weights π_prox/π_behav = 1. Scoring the unfiltered distribution gives the kept mass instead."""
    from asyncrl.algo.offpolicy import behaviour_weight
    from asyncrl.data.collate import collate
    from asyncrl.engine.local import LocalEngine
    from asyncrl.trainer import PolicyTrainer
    from asyncrl.types import SamplingParams
    from conftest import make_model

    model = make_model(320, seed=3)
    engine = LocalEngine(model, max_slots=16, max_len=64, seed=5)
    params = SamplingParams(n=4, max_new_tokens=12, temperature=1.3, top_p=top_p, top_k=top_k)
    groups = [TrajectoryGroup([Trajectory(c.prompt_ids, c.output_ids, c.logprobs, c.versions, 0.0, c.finish_reason)
                               for c in group]) for group in engine.generate_batch([[1, 2, 3], [7, 8]], params)]
    batch = collate(groups, pad_id=0)
    for trainer_top_p, trainer_top_k, on_policy in ((top_p, top_k, True), (1.0, 0, False)):
        trainer = PolicyTrainer(model, temperature=1.3, top_p=trainer_top_p, top_k=trainer_top_k)
        prox = trainer.logprobs(batch)
        weight, _, _ = behaviour_weight(prox, batch.behav_logprobs, batch.loss_mask)
        w = weight[batch.loss_mask.bool()]
        if on_policy:
            assert torch.allclose(w, torch.ones_like(w), atol=1e-4)
        else:
            assert (w < 1 - 1e-3).any()  # the unfiltered score is the kept mass: a weight below 1


class _NotAGroup:
    async def run(self, item, engine):
        return {"reward": 1.0}


def test_a_workflow_returning_a_wrong_value_is_a_counted_failure_not_a_stall():
    buffer = RolloutBuffer(batch_size=2, max_staleness=0)
    runner = RolloutRunner(_Engine(), buffer, _NotAGroup(), ({"id": i} for i in range(10**9)),
                           max_failures_in_a_row=4).start()
    try:
        with pytest.raises(RolloutFailures, match="returned dict, not a TrajectoryGroup"):
            buffer.take(timeout=30)
    finally:
        runner.stop()
    assert runner.failures >= 4 and buffer.running == 0


def test_workflow_kwargs_it_refuses_are_a_one_line_refusal_before_anything_is_created(tmp_path, tiny_model_dir,
                                                                                       capsys):
    from asyncrl import cli

    code = cli.main(["train", f"model.path={tiny_model_dir}", f"output_dir={tmp_path / 'out'}",
                     "workflow.name=workflows_for_tests:ShortAnswerWorkflow", "workflow.kwargs={bogus: 1}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "workflow: cannot build" in err[0] and "bogus" in err[0]
    assert not (tmp_path / "out").exists()


def test_waiting_for_a_batch_has_its_own_timeout(tmp_path, tiny_model_dir):
    cfg = _cfg(tmp_path, tiny_model_dir, "rollout.batch_timeout_s=1", "workflow.name=workflows_for_tests:reject_all")
    with pytest.raises(TimeoutError, match="within 1.0s \\(rollout.batch_timeout_s\\)"):
        train(cfg)


def test_max_train_time_ends_the_run_with_an_evaluation_and_a_checkpoint(tmp_path, tiny_model_dir):
    cfg = _cfg(tmp_path, tiny_model_dir, "max_train_time_s=0.001", "total_train_steps=50")
    last = train(cfg)
    assert last["version"] == 1 and "eval_accuracy" in last
    assert (tmp_path / "asyncrl" / "default" / "checkpoints" / "step1").is_dir()


def test_a_failed_run_keeps_no_checkpoint_its_logs_do_not_reach(tmp_path, tiny_model_dir, monkeypatch):
    """Step 3 is trained but fails before it is logged: a checkpoint of it would resume past a step the logs
    and the ledger lack, so none is written (a failure after the log keeps one: test_run_hardening)."""
    from asyncrl.metrics import read_metrics
    from asyncrl.publish import InProcessPublisher

    publish = InProcessPublisher.publish

    def flaky(self, state_dict, version):
        if version == 3:
            raise RuntimeError("publish failed")
        return publish(self, state_dict, version)

    monkeypatch.setattr(InProcessPublisher, "publish", flaky)
    with pytest.raises(RuntimeError, match="publish failed"):
        train(_cfg(tmp_path, tiny_model_dir, "total_train_steps=5"))
    run_dir = tmp_path / "asyncrl" / "default"
    assert [r["step"] for r in read_metrics(run_dir)] == [0, 1, 2]
    assert not (run_dir / "checkpoints" / "step3").exists()
