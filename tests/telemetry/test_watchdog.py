"""Run-health checks (asyncrl.telemetry.watchdog): non-finite updates are skipped, then the run stops with a finite
checkpoint; a reward that always fails stops the run or warns; no learning signal is said once; steps are counted in a
row."""

import logging
import math

import pytest
import torch

from asyncrl.launch.build import assemble
from asyncrl.launch.train import train
from asyncrl.loop.controller import run
from asyncrl.telemetry.metrics import read_metrics
from asyncrl.telemetry.watchdog import TrainingHalted, Watchdog

from runs_for_tests import quick_config


def _cfg(tmp_path, model_path, *extra):
    return quick_config(tmp_path, model_path, "total_train_steps=4", "gconfig.max_new_tokens=12", *extra)


def _nan_loss(x, **kw):
    return torch.full_like(x.logprobs, math.nan) * x.logprobs, {}


@pytest.mark.slow
def test_non_finite_updates_are_skipped_then_the_run_stops_with_a_finite_checkpoint(tmp_path, tiny_model_dir):
    cfg = _cfg(tmp_path, tiny_model_dir, "watchdog.max_nonfinite_steps=2")
    with assemble(cfg) as parts:
        parts.trainer.algo.loss_fn = _nan_loss
        before = {k: v.clone() for k, v in parts.trainer.model.state_dict().items()}
        with pytest.raises(TrainingHalted, match="2 steps in a row had a non-finite loss") as raised:
            run(parts)
        after = parts.trainer.model.state_dict()
        assert all(torch.equal(before[k], after[k]) for k in before)  # NaN never reached the weights
        parts.checkpoints.save(raised.value.version)
    records = read_metrics(tmp_path / "asyncrl" / "default")
    assert [r["nonfinite_skipped"] for r in records[1:]] == [1, 1] and math.isnan(records[1]["loss"])


@pytest.mark.slow
def test_a_reward_that_always_fails_stops_the_run(tmp_path, tiny_model_dir):
    cfg = _cfg(
        tmp_path, tiny_model_dir, "reward.fn=rewards_for_tests:raising_reward", "watchdog.reward_failure_steps=2"
    )
    with pytest.raises(
        TrainingHalted,
        match="every reward call of the run failed .*The first failure: reward "
        "function failed .*this reward always fails.* on item ",
    ):
        train(cfg)  # at the first step: no call ever succeeded, so the reward function is broken
    assert (tmp_path / "asyncrl" / "default" / "checkpoints" / "step1").is_dir()  # something to resume from


@pytest.mark.slow
def test_a_reward_that_always_fails_can_warn_instead(tmp_path, tiny_model_dir, caplog):
    cfg = _cfg(
        tmp_path,
        tiny_model_dir,
        "reward.fn=rewards_for_tests:raising_reward",
        "watchdog.reward_failure_steps=2",
        "watchdog.reward_failure_action=warn",
    )
    with caplog.at_level(logging.WARNING, logger="asyncrl.telemetry.watchdog"):
        assert train(cfg)["version"] == 4
    assert sum("every reward call" in r.message for r in caplog.records) == 4  # steps 1 (the first batch) to 4


@pytest.mark.slow
def test_no_learning_signal_is_said_once(tmp_path, tiny_model_dir, caplog):
    cfg = _cfg(tmp_path, tiny_model_dir, "reward.fn=rewards_for_tests:constant_reward", "watchdog.no_signal_steps=2")
    with caplog.at_level(logging.WARNING, logger="asyncrl.telemetry.watchdog"):
        train(cfg)
    warnings = [r.message for r in caplog.records if "no learning signal" in r.message]
    assert len(warnings) == 1 and "asyncrl sft" in warnings[0] and "temperature" in warnings[0]


def test_watchdog_counts_steps_in_a_row():
    w = Watchdog(no_signal_steps=0, reward_failure_steps=2, max_nonfinite_steps=0)
    w.check({"version": 1, "reward_calls": 4, "reward_errors": 3})
    w.check({"version": 2, "reward_calls": 8, "reward_errors": 7})  # every call of this step failed: 1 in a row
    w.check({"version": 3, "reward_calls": 12, "reward_errors": 10})  # one call succeeded: the count restarts
    w.check({"version": 4, "reward_calls": 16, "reward_errors": 14})
    with pytest.raises(TrainingHalted, match="in the last 2 steps"):
        w.check({"version": 5, "reward_calls": 20, "reward_errors": 16, "reward_timeouts": 2})


def test_a_step_with_no_new_reward_calls_keeps_the_count_and_still_warns(caplog):
    """An asynchronous run can score a step's rollouts before the previous record (CI saw 12, 12, 20, 24 calls):
    that step changes nothing, so warn mode still warns once per step and the count in a row is kept."""
    w = Watchdog(no_signal_steps=0, reward_failure_steps=2, stop_on_reward_failures=False, max_nonfinite_steps=0)
    with caplog.at_level(logging.WARNING, logger="asyncrl.telemetry.watchdog"):
        for version, calls in enumerate([12, 12, 20, 24], start=1):
            w.check({"version": version, "reward_calls": calls, "reward_errors": calls})
    assert sum("every reward call of the run failed" in r.message for r in caplog.records) == 4
    stop = Watchdog(no_signal_steps=0, reward_failure_steps=2, max_nonfinite_steps=0)
    stop.check({"version": 1, "reward_calls": 4, "reward_errors": 3})
    stop.check({"version": 2, "reward_calls": 8, "reward_errors": 7})  # 1 in a row
    stop.check({"version": 3, "reward_calls": 8, "reward_errors": 7})  # no new calls: still 1
    with pytest.raises(TrainingHalted, match="in the last 2 steps"):
        stop.check({"version": 4, "reward_calls": 12, "reward_errors": 11})


def test_a_reward_that_never_succeeded_stops_at_the_first_step_with_its_error():
    """A reward function that fails on every call of the first batch is broken (a wrong argument name, say),
    not unlucky: the run stops at once and says what the first call raised."""
    first = "reward function failed (TypeError: score() missing 1 required positional argument: 'n_vowels') on item 7"
    w = Watchdog(no_signal_steps=0, reward_failure_steps=5, max_nonfinite_steps=0, first_reward_failure=lambda: first)
    with pytest.raises(TrainingHalted, match=r"every reward call of the run failed \(16 calls\).*'n_vowels'"):
        w.check({"version": 1, "reward_calls": 16, "reward_errors": 16})
    off = Watchdog(no_signal_steps=0, reward_failure_steps=0, max_nonfinite_steps=0)  # 0 = never
    off.check({"version": 1, "reward_calls": 16, "reward_errors": 16})


def test_calls_still_in_flight_are_no_successes():
    """Red team 4, finding 5: 16 calls asked, 10 returned (all failed), 6 in flight: every call that returned
    failed, which is a broken reward, not a run with 6 good rewards."""
    w = Watchdog(no_signal_steps=0, reward_failure_steps=5, max_nonfinite_steps=0)
    with pytest.raises(TrainingHalted, match=r"every reward call of the run failed \(10 calls\)"):
        w.check({"version": 1, "reward_calls": 16, "reward_calls_done": 10, "reward_errors": 10})
