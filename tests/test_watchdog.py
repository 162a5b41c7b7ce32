"""Runs that would train on garbage stop or say so: non-finite updates, failing rewards, no learning signal,
non-finite metrics written as such, start-up refusals in one line before anything is created."""

import json
import logging
import math

import pytest
import torch

from asyncrl import cli, configlib
from asyncrl.config import TrainConfig
from asyncrl.controller import run
from asyncrl.launch.train import train
from asyncrl.launch.build import assemble
from asyncrl.metrics import MetricsLogger, read_metrics
from asyncrl.watchdog import TrainingHalted, Watchdog


def _cfg(tmp_path, model_path, *extra):
    return configlib.load(TrainConfig, None, [
        f"model.path={model_path}", f"output_dir={tmp_path}", "progress_bar=false", "report=false",
        "total_train_steps=4", "train_dataset.batch_size=2", "gconfig.n_samples=2", "gconfig.max_new_tokens=12",
        "valid_dataset.size=4", "evaluator.freq_steps=0", "rollout.max_slots=8", "reward.workers=0",
        "reward.fn=rewards_for_tests:digit_count_reward", *extra,
    ])


def test_non_finite_metrics_are_written_as_such_and_read_back(tmp_path):
    logger = MetricsLogger(tmp_path)
    logger.log({"step": 1, "loss": math.nan, "grad_norm": math.inf, "x": -math.inf, "ok": 0.5})
    logger.close()
    raw = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert raw == {"step": 1, "loss": "nan", "grad_norm": "inf", "x": "-inf", "ok": 0.5}  # never null
    (record,) = read_metrics(tmp_path)
    assert math.isnan(record["loss"]) and record["grad_norm"] == math.inf and record["x"] == -math.inf


def _nan_loss(**kw):
    return torch.full_like(kw["logprobs"], math.nan) * kw["logprobs"], {}


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


def test_a_checkpoint_of_non_finite_weights_is_refused(tmp_path, tiny_model_dir):
    from asyncrl.trainer import NonFiniteWeights

    cfg = _cfg(tmp_path, tiny_model_dir)
    with assemble(cfg) as parts:
        with torch.no_grad():
            next(parts.trainer.model.parameters())[0, 0] = math.nan
        with pytest.raises(NonFiniteWeights, match="NaN or inf"):
            parts.checkpoints.save(1)
    assert not (tmp_path / "asyncrl" / "default" / "checkpoints" / "step1").exists()


def test_a_reward_that_always_fails_stops_the_run(tmp_path, tiny_model_dir):
    cfg = _cfg(tmp_path, tiny_model_dir, "reward.fn=rewards_for_tests:raising_reward", "watchdog.reward_failure_steps=2")
    with pytest.raises(TrainingHalted, match="every reward call failed in the last 2 steps"):
        train(cfg)
    assert (tmp_path / "asyncrl" / "default" / "checkpoints" / "step2").is_dir()  # something to resume from


def test_a_reward_that_always_fails_can_warn_instead(tmp_path, tiny_model_dir, caplog):
    cfg = _cfg(tmp_path, tiny_model_dir, "reward.fn=rewards_for_tests:raising_reward",
               "watchdog.reward_failure_steps=2", "watchdog.reward_failure_action=warn")
    with caplog.at_level(logging.WARNING, logger="asyncrl.watchdog"):
        assert train(cfg)["version"] == 4
    assert sum("every reward call failed" in r.message for r in caplog.records) == 3  # steps 2, 3 and 4


def test_no_learning_signal_is_said_once(tmp_path, tiny_model_dir, caplog):
    cfg = _cfg(tmp_path, tiny_model_dir, "reward.fn=rewards_for_tests:constant_reward", "watchdog.no_signal_steps=2")
    with caplog.at_level(logging.WARNING, logger="asyncrl.watchdog"):
        train(cfg)
    warnings = [r.message for r in caplog.records if "no learning signal" in r.message]
    assert len(warnings) == 1 and "asyncrl sft" in warnings[0] and "temperature" in warnings[0]


def test_watchdog_counts_steps_in_a_row():
    w = Watchdog(no_signal_steps=0, reward_failure_steps=2, max_nonfinite_steps=0)
    w.check({"version": 1, "reward_calls": 4, "reward_errors": 4})
    w.check({"version": 2, "reward_calls": 8, "reward_errors": 7})  # one call succeeded: the count restarts
    w.check({"version": 3, "reward_calls": 12, "reward_errors": 11})
    with pytest.raises(TrainingHalted):
        w.check({"version": 4, "reward_calls": 16, "reward_errors": 13, "reward_timeouts": 2})


def test_eval_accuracy_is_a_fraction_whatever_the_reward_scale(tmp_path, tiny_model_dir):
    cfg = _cfg(tmp_path, tiny_model_dir, "reward.fn=rewards_for_tests:huge_reward", "total_train_steps=1")
    last = train(cfg)
    assert last["eval_accuracy"] == 1.0 and last["eval_reward_mean"] == 1e300


def _refusal(capsys, args, match):
    code = cli.main(args)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert match in err, err


def test_start_up_refusals_are_one_line_and_create_nothing(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "out"
    common = [f"output_dir={out}", "progress_bar=false", "report=false"]
    empty = tmp_path / "empty"
    empty.mkdir()
    notmodel = tmp_path / "notmodel"
    notmodel.mkdir()
    (notmodel / "README.md").write_text("hi")
    afile = tmp_path / "afile"
    afile.write_text("x")
    emptycfg = tmp_path / "emptycfg"
    emptycfg.mkdir()
    (emptycfg / "config.json").write_text("{}")
    _refusal(capsys, ["train", f"model.path={empty}", *common], "has no config.json")
    _refusal(capsys, ["train", f"model.path={notmodel}", *common], "has no config.json")
    _refusal(capsys, ["train", f"model.path={afile}", *common], "is a file")
    _refusal(capsys, ["train", f"model.path={emptycfg}", *common], "has no 'model_type'")
    _refusal(capsys, ["train", f"model.path={tiny_model_dir}", "rollout.backend=remote",
                      "rollout.server_addrs=[127.0.0.1:9]", "rollout.server_startup_timeout_s=1", *common],
             "inference servers did not start")
    assert not out.exists()  # nothing was created for a run that could not start
    _refusal(capsys, ["train", f"model.path={tiny_model_dir}", f"output_dir={afile}", "progress_bar=false"],
             "output_dir: cannot create the run directory")
    _refusal(capsys, ["train", "actor.lr=1e9"], "above 1")
    _refusal(capsys, ["train", "gconfig.temperature=.nan"], "finite")
    _refusal(capsys, ["eval", "--model", str(empty)], "has no config.json")


def test_a_non_finite_minibatch_ends_the_step_and_earlier_minibatches_stay_applied():
    from asyncrl.algo.algorithm import Algorithm
    from asyncrl.algo.losses import decoupled_ppo
    from asyncrl.data.collate import collate
    from asyncrl.trainer import PolicyTrainer
    from asyncrl.types import Trajectory, TrajectoryGroup
    from conftest import make_model

    calls = []

    def nan_after_first(**kw):
        calls.append(1)
        per_token, stats = decoupled_ppo(**kw)
        return (per_token if len(calls) == 1 else per_token * math.nan), stats

    model = make_model(320)
    trainer = PolicyTrainer(model, Algorithm(loss_fn=nan_after_first), ppo_n_minibatches=3, lr=1e-2)
    groups = [TrajectoryGroup([Trajectory([1, 2, 3], [4, 5, 6], [-1.0] * 3, [0] * 3, float(r)) for r in (0, 1, 0)])
              for _ in range(2)]
    batch = collate(groups, pad_id=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    stats = trainer.step(batch)
    assert stats["nonfinite_skipped"] == 1 and len(calls) == 2  # the third minibatch never ran
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())  # the first one applied
    assert all(torch.isfinite(p).all() for p in model.parameters())
