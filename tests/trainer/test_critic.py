"""Critics (asyncrl.trainer.critic): a value head learns and stays out of the published weights, a separate critic has
its own model and optimizer, and a saved critic loads back through critic_path."""

import copy

import pytest
import torch

from asyncrl.algo.advantages import gae
from asyncrl.algo.algorithm import Algorithm
from asyncrl.trainer import PolicyTrainer, build_trainer
from asyncrl.trainer.config import ActorConfig

from conftest import make_model
from trainers_for_tests import make_batch


def test_value_head_critic_learns_and_stays_out_of_the_published_weights():
    batch = make_batch([12, 14, 10, 16], group_size=2)
    model = make_model()
    trainer = PolicyTrainer(model, Algorithm(adv_fn=gae, gamma=1.0, lam=0.95), critic="value_head", pack_sequences=True)
    assert torch.equal(trainer.values(batch), torch.zeros_like(batch.behav_logprobs))  # zero-initialised head
    stats = trainer.step(batch)
    assert stats["value_loss"] > 0 and "value_clip_frac" in stats
    assert trainer.value_head.proj.weight.abs().sum() > 0
    assert set(trainer.state_dict()) == set(model.state_dict())
    assert (trainer.values(batch) * batch.loss_mask).abs().sum() > 0


def test_separate_critic_has_its_own_model_and_optimizer():
    from transformers import Qwen2Model

    batch = make_batch([12, 14, 10, 16], group_size=2)
    critic = Qwen2Model(make_model(seed=3).config)
    before = copy.deepcopy(critic.state_dict())
    trainer = PolicyTrainer(make_model(), Algorithm(adv_fn=gae), critic="separate", critic_model=critic, critic_lr=1e-3)
    stats = trainer.step(batch)  # the zero-initialised head gives the trunk no gradient on the first step
    assert stats["critic_grad_norm"] > 0 and stats["value_loss"] > 0
    trainer.step(batch)
    assert any(not torch.equal(v, critic.state_dict()[k]) for k, v in before.items())


@pytest.mark.parametrize("kind", ["value_head", "separate"])
def test_a_saved_critic_loads_back_through_critic_path(tiny_model_dir, tmp_path, kind):
    from asyncrl.models.hf import load_model
    from asyncrl.trainer.critic import CRITIC_DIR

    batch = make_batch([12, 14, 10, 16], group_size=2)
    cfg = ActorConfig(critic=kind, adv_estimator="gae", lr=1e-2, critic_lr=1e-2)
    trainer = build_trainer(
        cfg,
        load_model(tiny_model_dir),
        model_path=tiny_model_dir,
        temperature=1.0,
        autocast_dtype=None,
        max_new_tokens=16,
    )
    for _ in range(2):
        trainer.step(batch)
    values = trainer.values(batch)
    assert (values * batch.loss_mask).abs().sum() > 0  # the critic learned something worth keeping
    trainer.save(str(tmp_path / "ckpt"))
    critic_dir = tmp_path / "ckpt" / CRITIC_DIR
    assert (critic_dir / "value_head.safetensors").is_file()
    assert (critic_dir / "config.json").is_file() == (kind == "separate")

    cfg.critic_path = str(critic_dir)
    policy = trainer.model if kind == "value_head" else load_model(tiny_model_dir)
    restored = build_trainer(
        cfg, policy, model_path=tiny_model_dir, temperature=1.0, autocast_dtype=None, max_new_tokens=16
    )
    assert torch.allclose(restored.values(batch), values, atol=1e-6)
    with pytest.raises(FileNotFoundError, match="critic_path"):
        build_trainer(
            ActorConfig(critic=kind, critic_path=str(tmp_path)),
            load_model(tiny_model_dir),
            model_path=tiny_model_dir,
            temperature=1.0,
            autocast_dtype=None,
        )
