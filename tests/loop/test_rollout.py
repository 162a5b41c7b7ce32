"""The rollout thread (asyncrl.loop.rollout): a prompt stream that raises, and rollouts failing in a row, stop the run
with their own error at once; failures back off; a wrong return value is a counted failure, not a stall; stop releases
the groups in flight."""

import asyncio
import time

import pytest

from asyncrl.launch.build import assemble
from asyncrl.loop.buffer import RolloutBuffer
from asyncrl.loop.controller import run
from asyncrl.loop.rollout import RolloutFailures, RolloutRunner
from asyncrl.types import Trajectory, TrajectoryGroup

from runs_for_tests import quick_config
from timing_for_tests import loaded


def _cfg(tmp_path, model_path, *extra):
    return quick_config(tmp_path, model_path, "total_train_steps=3", "gconfig.max_new_tokens=16", *extra)


def _three_then_raise(items, raised_at):
    for i, item in enumerate(items):
        if i == 3:
            raised_at.append(time.monotonic())
            raise LookupError("row 4 of the prompt stream is broken")
        yield item


@pytest.mark.slow
def test_a_prompt_stream_that_raises_stops_the_trainer_with_its_own_error(tmp_path, tiny_model_dir):
    """The stream's own exception reaches the trainer thread within seconds (not after the 600 s request
    timeout), and the groups already in flight finish into the buffer: none is lost or left running."""
    cfg = _cfg(tmp_path, tiny_model_dir, "total_train_steps=5", "rollout.max_head_offpolicyness=4")
    with assemble(cfg) as parts:
        raised_at = []
        parts.rollout.items = _three_then_raise(parts.rollout.items, raised_at)
        with pytest.raises(LookupError, match="row 4") as raised:
            run(parts)
        assert time.monotonic() - raised_at[0] < loaded(5)
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


class _NotAGroup:
    async def run(self, item, engine):
        return {"reward": 1.0}


def test_a_workflow_returning_a_wrong_value_is_a_counted_failure_not_a_stall():
    buffer = RolloutBuffer(batch_size=2, max_staleness=0)
    runner = RolloutRunner(
        _Engine(), buffer, _NotAGroup(), ({"id": i} for i in range(10**9)), max_failures_in_a_row=4
    ).start()
    try:
        with pytest.raises(RolloutFailures, match="returned dict, not a TrajectoryGroup"):
            buffer.take(timeout=30)
    finally:
        runner.stop()
    assert runner.failures >= 4 and buffer.running == 0
