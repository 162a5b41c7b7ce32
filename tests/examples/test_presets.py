"""Every algorithm preset in examples/ loads, holds only overrides, and trains a few steps end to end."""

import math

import pytest
import torch
import yaml

from asyncrl import configlib
from asyncrl.config import TrainConfig
from asyncrl.launch.train import train
from asyncrl.models.hf import load_model
from asyncrl.telemetry.metrics import read_metrics

from conftest import ROOT

EXAMPLES = ROOT / "examples"
ALGORITHMS = [
    "grpo",
    "dr_grpo",
    "rloo",
    "liteppo",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "ppo",
    "gspo",
    "dapo",
    "sapo",
    "cispo",
    "pg",
]
TINY_RUN = [
    "progress_bar=false",
    "report=false",
    "total_train_steps=2",
    "train_dataset.batch_size=2",
    "gconfig.n_samples=4",
    "gconfig.max_new_tokens=24",
    "valid_dataset.size=4",
    "evaluator.freq_steps=0",
    "rollout.max_slots=16",
    "actor.lr=1e-3",
    "reward.fn=rewards_for_tests:digit_count_reward",
]


def _leaves(tree: dict, prefix=""):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


@pytest.mark.parametrize("name", ALGORITHMS)
def test_preset_holds_only_overrides(name):
    path = EXAMPLES / f"{name}.yaml"
    default = TrainConfig()
    cfg = configlib.load(TrainConfig, str(path))
    for key, value in _leaves(yaml.safe_load(path.read_text())):
        obj = default
        for part in key.split("."):
            obj = getattr(obj, part)
        assert obj != value, f"{path.name}: {key}={value!r} repeats the default"
    assert cfg.experiment_name == name


@pytest.mark.slow
@pytest.mark.parametrize("name", ALGORITHMS)
def test_preset_trains_end_to_end(tmp_path, tiny_model_dir, name):
    cfg = configlib.load(
        TrainConfig,
        str(EXAMPLES / f"{name}.yaml"),
        [f"model.path={tiny_model_dir}", f"output_dir={tmp_path}", *TINY_RUN],
    )
    last = train(cfg)
    records = [r for r in read_metrics(tmp_path / name / "default") if r["step"] > 0]
    assert [r["version"] for r in records] == [1, 2] and last["version"] == 2
    for key in ("loss", "grad_norm", "entropy", "adv_abs_mean", "pack_efficiency"):
        assert all(r[key] is not None and math.isfinite(r[key]) for r in records), key
    after = load_model(str(tmp_path / name / "default" / "checkpoints" / "step2"))
    before = load_model(tiny_model_dir)
    assert any(not torch.equal(v, after.state_dict()[k]) for k, v in before.state_dict().items())
    assert set(after.state_dict()) == set(before.state_dict())  # no critic or value head leaks into it
    if cfg.actor.critic != "none":
        assert all("value_loss" in r for r in records)
    if cfg.actor.ref_model != "none":
        assert all("ref_kl" in r for r in records)
    if cfg.actor.overlong_reward_penalty:
        assert all("overlong_frac" in r for r in records)
