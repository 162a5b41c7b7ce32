"""The config tree (asyncrl.config): the defaults validate, values and guardrails are checked, and --help-config
documents the mixture."""

import pytest

from asyncrl import configlib
from asyncrl.config import TrainConfig
from asyncrl.configlib import ConfigError


def test_defaults_validate():
    cfg = configlib.load(TrainConfig)
    assert cfg.rollout.max_head_offpolicyness == 2 and cfg.gconfig.n_samples == 8


def test_values_are_validated():
    with pytest.raises(ConfigError, match="train_dataset.batch_size must be > 0"):
        configlib.load(TrainConfig, None, ["train_dataset.batch_size=0"])
    with pytest.raises(ConfigError, match="max_head_offpolicyness must be >= 0"):
        configlib.load(TrainConfig, None, ["rollout.max_head_offpolicyness=-1"])
    with pytest.raises(ConfigError, match="adv_estimator 'ppo2' is not one of"):
        configlib.load(TrainConfig, None, ["actor.adv_estimator=ppo2"])


def test_guardrails_refuse_unsafe_and_allow_override():
    with pytest.raises(ConfigError, match="no off-policy correction"):
        configlib.load(TrainConfig, None, ["actor.policy_loss=ppo"])
    configlib.load(TrainConfig, None, ["actor.policy_loss=ppo", "rollout.max_head_offpolicyness=0"])
    with pytest.raises(ConfigError, match="n_samples=1"):
        configlib.load(TrainConfig, None, ["gconfig.n_samples=1"])
    cfg = configlib.load(TrainConfig, None, ["actor.policy_loss=ppo", "actor.allow_unsafe=true"])
    assert cfg.actor.policy_loss == "ppo"


def test_help_config_documents_the_mixture():
    text = " ".join(configlib.describe(TrainConfig).split())
    assert "train_dataset.mixture = []" in text and "reward_mean/NAME" in text and "weight: 3" in text
