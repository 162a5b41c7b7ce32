"""The launcher's own words (asyncrl.launch.train): the start -> end lines a run ends with, and a rerun of a run
that has trained all its steps."""

import logging

from asyncrl import configlib
from asyncrl.config import TrainConfig
from asyncrl.launch import train as launch_train

from reports_for_tests import synthetic_run


def test_a_run_ends_with_its_outcome_and_where_its_checkpoint_is(tmp_path, caplog):
    run = synthetic_run(tmp_path)
    (run / "checkpoints" / "step24").mkdir(parents=True)
    (run / "checkpoints" / "step24" / "run.json").write_text("{}")
    (run / "checkpoints" / "latest").write_text("step24")
    with caplog.at_level(logging.INFO, logger="asyncrl.launch.train"):
        launch_train._say_outcome(run)
    text = "\n".join(r.message for r in caplog.records)
    assert f"done: step 24, 48 s of training (median step 2.00 s); run directory {run}" in text
    assert "held-out accuracy 0.200 -> 0.600 (best 0.600 at step 24)" in text
    assert f"checkpoint: {run}/checkpoints/step24" in text and "reward 0." in text


def test_rerunning_a_complete_run_says_so_and_trains_nothing(tmp_path, caplog, monkeypatch):
    cfg = configlib.load(TrainConfig, None, [f"output_dir={tmp_path}", "total_train_steps=5"])
    checkpoint = tmp_path / "asyncrl" / "default" / "checkpoints" / "step5"
    monkeypatch.setattr(launch_train, "_resume_point", lambda cfg: checkpoint)
    monkeypatch.setattr(launch_train, "run_version", lambda path: 5)
    monkeypatch.setattr(launch_train, "assemble", None)  # building anything would fail
    with caplog.at_level(logging.INFO, logger="asyncrl.launch.train"):
        record = launch_train.train(cfg)
    assert record == {
        "version": 5,
        "complete": True,
        "run_dir": str(checkpoint.parent.parent),
        "checkpoint": str(checkpoint),
    }
    assert any(
        "is complete: it trained 5 of total_train_steps=5" in r.message and "resume=fresh" in r.message
        for r in caplog.records
    )
    monkeypatch.setattr(launch_train, "run_version", lambda path: 4)
    assert launch_train._complete(cfg, checkpoint) is None  # one step to go: it trains
