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


@pytest.mark.parametrize(
    "override, problem",
    [
        ("trial_name=", "trial_name must name one directory"),  # output_dir/asyncrl itself, among the trials
        ("experiment_name=../../outside/esc", "experiment_name must name one directory"),  # outside output_dir
        ("trial_name=..", "trial_name must name one directory"),
        ("experiment_name=" + "x" * 2_000_000, "experiment_name is 2000000 characters long"),  # a traceback once
    ],
)
def test_run_names_are_one_directory_under_output_dir(override, problem):
    with pytest.raises(ConfigError, match=problem):
        configlib.load(TrainConfig, None, [override])
    configlib.load(TrainConfig, None, ["experiment_name=gsm8k-η2.v1", "trial_name=seed_3"])


def test_guardrails_refuse_unsafe_and_allow_override():
    with pytest.raises(ConfigError, match="no off-policy correction"):
        configlib.load(TrainConfig, None, ["actor.policy_loss=ppo"])
    configlib.load(TrainConfig, None, ["actor.policy_loss=ppo", "rollout.max_head_offpolicyness=0"])
    with pytest.raises(ConfigError, match="n_samples=1"):
        configlib.load(TrainConfig, None, ["gconfig.n_samples=1"])
    with pytest.raises(ConfigError, match="every group would be dropped"):  # the run stalled until its timeout
        configlib.load(
            TrainConfig,
            None,
            ["gconfig.n_samples=1", "actor.adv_estimator=reinforce_pp", "actor.dynamic_sampling=true"],
        )
    cfg = configlib.load(TrainConfig, None, ["actor.policy_loss=ppo", "actor.allow_unsafe=true"])
    assert cfg.actor.policy_loss == "ppo"


def test_help_config_documents_the_mixture():
    text = " ".join(configlib.describe(TrainConfig).split())
    assert "train_dataset.mixture = []" in text and "reward_mean/NAME" in text and "weight: 3" in text


def test_a_small_model_gets_the_small_recipe_and_a_real_one_the_real_defaults(tmp_path):
    """Defaults that suit only the 3.3M models (64 new tokens, SFT at lr 2e-3) come from a recipe for models under
    50M parameters; a real model's config gets the real defaults; what the user sets always wins."""
    import json

    from asyncrl.config import EvalConfig, SFTConfig

    real = tmp_path / "real"
    real.mkdir()
    (real / "config.json").write_text(
        json.dumps(
            {
                "model_type": "qwen2",
                "hidden_size": 896,
                "num_hidden_layers": 24,
                "intermediate_size": 4864,
                "vocab_size": 151936,
            }
        )
    )
    tiny = configlib.load(TrainConfig, None, [])
    assert tiny.gconfig.max_new_tokens == 64
    assert configlib.load(TrainConfig, None, [f"model.path={real}"]).gconfig.max_new_tokens == 1024
    assert (
        configlib.load(TrainConfig, None, [f"model.path={real}", "gconfig.max_new_tokens=300"]).gconfig.max_new_tokens
        == 300
    )
    assert configlib.load(TrainConfig, None, ["gconfig.max_new_tokens=1024"]).gconfig.max_new_tokens == 1024
    sft_tiny, sft_real = (configlib.load(SFTConfig, None, [f"model.path={p}"]) for p in ("builtin:tiny-sft", real))
    assert (sft_tiny.actor.lr, sft_tiny.gconfig.max_new_tokens) == (2e-3, 96)
    assert (sft_real.actor.lr, sft_real.gconfig.max_new_tokens) == (2e-5, 1024)
    assert configlib.load(SFTConfig, None, [f"model.path={real}", "lr=1e-4"]).actor.lr == 1e-4  # an old key is set
    assert configlib.load(EvalConfig, None, [f"model.path={real}"]).gconfig.max_new_tokens == 1024
    assert configlib.load(EvalConfig, None, []).gconfig.max_new_tokens == 64
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"model:\n  path: {real}\ngconfig:\n  max_new_tokens: 64\n")
    assert configlib.load(TrainConfig, str(cfg), []).gconfig.max_new_tokens == 64  # set in a file: kept


def test_a_model_directory_can_carry_its_own_defaults(tmp_path):
    """The shipped tiny-sft asks for RL at actor.lr=1e-5 (asyncrl_recipe.json; docs/algorithms.md "The learning
    rate"); a directory without one (an SFT output made from it) keeps the default 5e-5; a value the user sets wins;
    a recipe's keys and values are checked like a file's, and a broken recipe is refused with its path."""
    import json
    import shutil

    from asyncrl.config import SFTConfig
    from asyncrl.models.hf import BUILTIN_DIR, RECIPE_FILE

    assert configlib.load(TrainConfig).actor.lr == 1e-5
    assert configlib.load(TrainConfig, None, ["actor.lr=5e-5"]).actor.lr == 5e-5
    assert configlib.load(SFTConfig).actor.lr == 2e-3  # the recipe names train only
    own = tmp_path / "own"
    shutil.copytree(BUILTIN_DIR / "tiny-sft", own)
    (own / RECIPE_FILE).unlink()
    assert configlib.load(TrainConfig, None, [f"model.path={own}"]).actor.lr == 5e-5
    (own / RECIPE_FILE).write_text(json.dumps({"train": {"actor.lr": 3e-5, "gconfig.temperature": 0.8}}))
    cfg = configlib.load(TrainConfig, None, [f"model.path={own}"])
    assert (cfg.actor.lr, cfg.gconfig.temperature, cfg.gconfig.max_new_tokens) == (3e-5, 0.8, 64)
    (own / RECIPE_FILE).write_text(json.dumps({"train": {"actor.lrr": 3e-5}}))
    with pytest.raises(
        ConfigError, match=f"the recipe of model.path={own}: unknown config key 'actor.lrr'; did you mean 'actor.lr'"
    ):
        configlib.load(TrainConfig, None, [f"model.path={own}"])
    (own / RECIPE_FILE).write_text(json.dumps({"train": {"actor.lr": "fast"}}))
    with pytest.raises(ConfigError, match="the recipe of model.path=.*actor.lr"):
        configlib.load(TrainConfig, None, [f"model.path={own}"])
    (own / RECIPE_FILE).write_text("{train: 1")
    with pytest.raises(ConfigError, match=f"model.path: {own / RECIPE_FILE} is not JSON"):
        configlib.load(TrainConfig, None, [f"model.path={own}"])
    (own / RECIPE_FILE).write_text('{"train": 1}')
    with pytest.raises(ConfigError, match="must map each command to its keys and values"):
        configlib.load(TrainConfig, None, [f"model.path={own}"])


def test_the_overlong_penalty_is_refused_on_concatenated_agent_samples():
    """DAPO's overlong penalty compares a sample's length with max_new_tokens, a budget per call: a concat sample
    holds a chain of calls (3 x 40 tokens under max_new_tokens=64 lost the whole penalty with no call cut)."""
    agent = [
        "workflow.name=agent",
        "agent.episode=agents_for_tests:three_turns",
        "actor.overlong_reward_penalty=true",
        "actor.overlong_tokens=8",
    ]
    with pytest.raises(ConfigError, match="agent.export=concat holds every call"):
        configlib.load(TrainConfig, None, agent + ["agent.export=concat"])
    configlib.load(TrainConfig, None, agent + ["agent.export=individual"])


def test_warmup_that_outlasts_the_run_is_warned(caplog):
    import logging

    from asyncrl import configlib
    from asyncrl.config import SFTConfig

    with caplog.at_level(logging.WARNING):
        configlib.load(SFTConfig, None, ["total_train_steps=40", "actor.warmup_steps=50"])
    assert any("actor.warmup_steps=50 is above total_train_steps=40" in r.message for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # step 40 of a 40-step warm-up is at actor.lr: nothing to say
        configlib.load(SFTConfig, None, ["total_train_steps=40", "actor.warmup_steps=40"])
    assert not any("warmup_steps" in r.message for r in caplog.records)
    with pytest.raises(configlib.ConfigError, match="log_every"):
        configlib.load(SFTConfig, None, ["log_every=0"])
