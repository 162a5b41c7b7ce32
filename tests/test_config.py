import pytest

from asyncrl import configlib
from asyncrl.config import TrainConfig
from asyncrl.configlib import ConfigError


def _yaml(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return str(path)


def test_defaults_validate():
    cfg = configlib.load(TrainConfig)
    assert cfg.rollout.max_head_offpolicyness == 2 and cfg.gconfig.n_samples == 8


def test_yaml_then_overrides(tmp_path):
    path = _yaml(tmp_path, "gconfig:\n  n_samples: 4\nactor:\n  lr: 1.0e-5\n")
    cfg = configlib.load(TrainConfig, path, ["actor.lr=3e-4", "rollout.max_head_offpolicyness=0"])
    assert cfg.gconfig.n_samples == 4 and cfg.actor.lr == 3e-4 and cfg.rollout.max_head_offpolicyness == 0


def test_unknown_key_names_file_line_and_nearest_key(tmp_path):
    path = _yaml(tmp_path, "gconfig:\n  n_samples: 4\n  temprature: 0.7\n")
    with pytest.raises(ConfigError) as e:
        configlib.load(TrainConfig, path)
    msg = str(e.value)
    assert f"{path}:3" in msg and "gconfig.temprature" in msg and "gconfig.temperature" in msg


def test_unknown_override_suggests_key():
    with pytest.raises(ConfigError, match="rollout.max_head_offpolicyness"):
        configlib.load(TrainConfig, None, ["rollout.max_head_offpolicy=2"])


def test_wrong_type_names_key_and_source(tmp_path):
    path = _yaml(tmp_path, "train_dataset:\n  batch_size: many\n")
    with pytest.raises(ConfigError, match=r"c.yaml:2.*train_dataset.batch_size.*int"):
        configlib.load(TrainConfig, path)
    with pytest.raises(ConfigError, match="command line.*actor.lr"):
        configlib.load(TrainConfig, None, ["actor.lr=fast"])
    with pytest.raises(ConfigError, match="progress_bar.*bool"):
        configlib.load(TrainConfig, None, ["progress_bar=3"])


def test_section_given_a_scalar(tmp_path):
    with pytest.raises(ConfigError, match="'actor' is a section"):
        configlib.load(TrainConfig, _yaml(tmp_path, "actor: 3\n"))


def test_malformed_override_and_missing_file():
    with pytest.raises(ConfigError, match="key.sub=value"):
        configlib.load(TrainConfig, None, ["actor.lr"])
    with pytest.raises(ConfigError, match="does not exist"):
        configlib.load(TrainConfig, "/nonexistent.yaml")


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


def test_describe_documents_every_key():
    text = configlib.describe(TrainConfig)
    for key in configlib.all_keys(TrainConfig):
        assert key in text
    assert "max staleness" in text


def test_dump_round_trips(tmp_path):
    cfg = configlib.load(TrainConfig, None, ["gconfig.temperature=0.8"])
    configlib.dump(cfg, tmp_path / "out.yaml")
    again = configlib.load(TrainConfig, str(tmp_path / "out.yaml"))
    assert again == cfg


def test_eval_command_scores_a_file_with_the_configured_reward(tmp_path, tiny_model_dir, capsys):
    """``asyncrl eval --model M valid_dataset.path=F reward.fn=...``: the file alone (no training source) is
    evaluated with reward.fn, and a failing reward scores reward.default; the built-in task stays the default."""
    import json

    from asyncrl.cli import main

    path = tmp_path / "test.jsonl"
    path.write_text("".join(json.dumps({"question": f"Compute {i} + 1.", "answer": str(i + 1)}) + "\n"
                            for i in range(5)))
    common = ["eval", "--model", tiny_model_dir, "max_new_tokens=4", "threads=1"]
    assert main(common + [f"valid_dataset.path={path}", "valid_dataset.size=3",
                          "reward.fn=data_fixtures.reward_fns:raising", "reward.default=0.25",
                          "reward.workers=0"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["n"] == 3 and record["eval_reward_errors"] == 3 and record["eval_reward_mean"] == 0.25
    assert record["eval_accuracy"] == 0.0  # reward.default=0.25 is below evaluator's success threshold of 1.0
    assert main(common + ["valid_dataset.size=2", "reward.workers=1"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["n"] == 2 and record["eval_reward_errors"] == 0 and 0.0 <= record["eval_accuracy"] <= 1.0
    assert main(common + [f"valid_dataset.path={tmp_path / 'missing.jsonl'}"]) == 2
    assert "valid_dataset.path" in capsys.readouterr().err
