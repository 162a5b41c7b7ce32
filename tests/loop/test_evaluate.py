"""Held-out evaluation (asyncrl.loop.evaluate): the accuracy is a fraction whatever the reward's scale."""

import pytest

from asyncrl import configlib
from asyncrl.config import TrainConfig
from asyncrl.launch.train import train
from asyncrl.loop.evaluate import BackgroundEvaluator

from runs_for_tests import quick_config


def _cfg(tmp_path, model_path, *extra):
    return quick_config(tmp_path, model_path, "total_train_steps=4", "gconfig.max_new_tokens=12", *extra)


@pytest.mark.slow
def test_eval_accuracy_is_a_fraction_whatever_the_reward_scale(tmp_path, tiny_model_dir):
    cfg = _cfg(tmp_path, tiny_model_dir, "reward.fn=rewards_for_tests:huge_reward", "total_train_steps=1")
    last = train(cfg)
    assert last["eval_accuracy"] == 1.0 and last["eval_reward_mean"] == 1e300


def _evaluator(model, tokenizer, items, seed=0):
    from asyncrl.engine.local import LocalEngine
    from asyncrl.loop.evaluate import Evaluator
    from asyncrl.types import SamplingParams

    engine = LocalEngine(model, max_slots=8, max_len=64, seed=seed, stop_token_ids=(tokenizer.eos_token_id,)).start()
    params = SamplingParams(max_new_tokens=16, greedy=True, stop_token_ids=(tokenizer.eos_token_id,))
    return Evaluator.single_turn(engine, lambda: dict(model.state_dict()), tokenizer, items, _fingerprint, params)


def _fingerprint(prompt, completion, **_):
    """A reward that tells answers apart: its mean over the items fingerprints every answer."""
    import zlib

    return zlib.crc32(completion.encode()) % 1000 / 1000


def test_a_background_evaluation_scores_the_weights_of_its_version_while_training_changes_them(tokenizer):
    """The evaluation of version 1 runs while the weights move on (to version 2): it equals a synchronous
    evaluation of version 1's weights, answer for answer, not version 2's."""
    import copy
    import threading

    import torch

    from asyncrl.loop.evaluate import BackgroundEvaluator

    from conftest import make_model

    model = make_model(vocab=len(tokenizer), seed=3)
    items = [{"question": f"Compute {i} + 1.", "answer": str(i + 1)} for i in range(12)]
    frozen = copy.deepcopy(model)  # version 1, kept aside
    sync = _evaluator(frozen, tokenizer, items)
    expected = sync(1)
    later = BackgroundEvaluator(_evaluator(model, tokenizer, copy.deepcopy(items)))
    release = threading.Event()
    score = later.evaluator.score
    later.evaluator.score = lambda engine: (release.wait(30), score(engine))[1]
    later.start(1, elapsed_s=5.0)
    with torch.no_grad():  # training goes on: version 2's weights
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    moved = _evaluator(model, tokenizer, items)(2)
    assert later.running and later.finished() == []
    release.set()
    [(version, elapsed_s, got)] = later.finished(wait=True)
    for e in (sync.engine, later.evaluator.engine):
        e.stop()
    keys = ("eval_accuracy", "eval_reward_mean", "eval_len_mean")
    assert version == 1 and elapsed_s == 5.0
    assert {k: got[k] for k in keys} == {k: expected[k] for k in keys}
    assert {k: moved[k] for k in keys} != {k: expected[k] for k in keys}  # the moved weights answer otherwise


def test_evaluations_that_end_later_are_merged_into_their_steps_record():
    from asyncrl.telemetry.record import merge_evaluations

    records = [
        {"step": 0, "eval_accuracy": 0.1},
        {"step": 1, "reward_mean": 0.5},
        {"step": 2, "reward_mean": 0.6},
        {"step": 3, "reward_mean": 0.7},
        {"step": 2, "version": 2, "evaluation": True, "elapsed_s": 9.0, "eval_accuracy": 0.4},
        {"step": 9, "version": 9, "evaluation": True, "elapsed_s": 1.0, "eval_accuracy": 0.9},
    ]
    merged = merge_evaluations(records)
    assert [r["step"] for r in merged] == [0, 1, 2, 3, 9]
    assert merged[2] == {"step": 2, "reward_mean": 0.6, "eval_accuracy": 0.4}
    assert merged[4]["evaluation"] is True  # its step was cut off: kept as it is


@pytest.mark.slow
def test_a_run_with_background_evaluation_logs_each_against_its_version(tmp_path, tiny_model_dir):
    import json

    from asyncrl.launch.resume import truncate_run_files
    from asyncrl.telemetry.metrics import read_metrics

    last = train(
        _cfg(tmp_path, tiny_model_dir, "total_train_steps=6", "evaluator.freq_steps=2", "evaluator.background=true")
    )
    run_dir = tmp_path / "asyncrl" / "default"
    raw = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    later = [r for r in raw if r.get("evaluation")]
    assert [r["step"] for r in later] == [2, 4]  # 6, the last, is evaluated in the foreground
    assert all(raw.index(r) > raw.index(next(x for x in raw if x["step"] == r["step"])) for r in later)
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == list(range(7))
    assert [r["step"] for r in records if "eval_accuracy" in r] == [0, 2, 4, 6]
    assert last["eval_accuracy"] == records[-1]["eval_accuracy"]
    truncate_run_files(run_dir, 3, 1e9)  # a resume from step 3 keeps the evaluation of step 2
    assert [r["step"] for r in read_metrics(run_dir) if "eval_accuracy" in r] == [0, 2]


@pytest.mark.slow
def test_a_run_stopped_by_the_watchdog_logs_the_evaluation_running_beside_it(tmp_path, tiny_model_dir, monkeypatch):
    """evaluator.background: the watchdog stops the run at version 2, whose evaluation is running; it is waited
    for and logged (a resumed run does not evaluate the version it starts from again: it was lost)."""
    import json

    from asyncrl.telemetry.watchdog import TrainingHalted, Watchdog

    check = Watchdog.check

    def halting(self, record):
        check(self, record)
        if record["version"] == 2:
            raise TrainingHalted("halted for the test", 2)

    monkeypatch.setattr(Watchdog, "check", halting)
    run = tmp_path / "asyncrl" / "default"
    saved_before_waiting = []
    finished = BackgroundEvaluator.finished

    def waited(self, wait=False):  # the checkpoint goes first: a second signal may not wait for an evaluation
        if wait:
            saved_before_waiting.append((run / "checkpoints" / "step2").is_dir())
        return finished(self, wait)

    monkeypatch.setattr(BackgroundEvaluator, "finished", waited)
    cfg = configlib.load(
        TrainConfig,
        None,
        [
            f"model.path={tiny_model_dir}",
            f"output_dir={tmp_path}",
            "progress_bar=false",
            "report=false",
            "total_train_steps=4",
            "train_dataset.batch_size=2",
            "gconfig.n_samples=2",
            "gconfig.max_new_tokens=8",
            "valid_dataset.size=4",
            "evaluator.freq_steps=1",
            "evaluator.background=true",
            "rollout.max_slots=8",
            "saver.freq_steps=0",
            "reward.fn=rewards_for_tests:digit_count_reward",
            "reward.workers=0",
        ],
    )
    with pytest.raises(TrainingHalted):
        train(cfg)
    assert saved_before_waiting[-1]  # the wait of the stop
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert (run / "checkpoints" / "step2").is_dir() and 2 in {r["step"] for r in records if "eval_accuracy" in r}
