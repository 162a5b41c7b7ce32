"""Held-out evaluation (asyncrl.evaluate): the accuracy is a fraction whatever the reward's scale."""

import pytest

from asyncrl import configlib
from asyncrl.config import TrainConfig
from asyncrl.launch.train import train


def _cfg(tmp_path, model_path, *extra):
    return configlib.load(TrainConfig, None, [
        f"model.path={model_path}", f"output_dir={tmp_path}", "progress_bar=false", "report=false",
        "total_train_steps=4", "train_dataset.batch_size=2", "gconfig.n_samples=2", "gconfig.max_new_tokens=12",
        "valid_dataset.size=4", "evaluator.freq_steps=0", "rollout.max_slots=8", "reward.workers=0",
        "reward.fn=rewards_for_tests:digit_count_reward", *extra,
    ])


@pytest.mark.slow
def test_eval_accuracy_is_a_fraction_whatever_the_reward_scale(tmp_path, tiny_model_dir):
    cfg = _cfg(tmp_path, tiny_model_dir, "reward.fn=rewards_for_tests:huge_reward", "total_train_steps=1")
    last = train(cfg)
    assert last["eval_accuracy"] == 1.0 and last["eval_reward_mean"] == 1e300
