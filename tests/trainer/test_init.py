"""build_trainer (asyncrl.trainer) loads the reference and the critic from the model path."""

from asyncrl.trainer import build_trainer
from asyncrl.trainer.config import ActorConfig


def test_build_trainer_loads_reference_and_critic_from_the_model_path(tiny_model_dir):
    from asyncrl.models.hf import load_model

    cfg = ActorConfig(ref_model="init", kl_ctl=0.01, critic="separate", adv_estimator="gae")
    trainer = build_trainer(
        cfg,
        load_model(tiny_model_dir),
        model_path=tiny_model_dir,
        temperature=1.0,
        autocast_dtype=None,
        max_new_tokens=16,
    )
    assert trainer.ref_model is not None and not any(p.requires_grad for p in trainer.ref_model.parameters())
    assert trainer.critic_model is not None and trainer.critic_optimizer is not None
    assert trainer.forward.pack_sequences
