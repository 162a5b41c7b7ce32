"""actor.ppo_epochs: each epoch passes over the batch's minibatches again (one optimizer step each), with the
proximal policy recomputed once, before the first."""

import math

import torch

from asyncrl.trainer import PolicyTrainer

from conftest import make_model
from trainers_for_tests import make_batch, varied_batch

LENGTHS = [9, 12, 14, 16, 20, 25, 30, 41]


def test_epochs_take_one_optimizer_step_per_minibatch_per_epoch(monkeypatch):
    batch = make_batch(LENGTHS)
    steps = {}
    for epochs in (1, 3):
        trainer = PolicyTrainer(make_model(), ppo_n_minibatches=2, ppo_epochs=epochs, lr=1e-3)
        counted, passes = [], []
        original_step, original_logprobs = trainer.optimizer.step, trainer.logprobs
        monkeypatch.setattr(trainer.optimizer, "step", lambda *a, **k: counted.append(1) or original_step(*a, **k))
        monkeypatch.setattr(trainer, "logprobs", lambda b, model=None: passes.append(1) or original_logprobs(b, model))
        stats = trainer.step(batch, version=0)
        assert math.isfinite(stats["loss"]) and len(passes) == 1  # the proximal policy: one pass, before the first
        steps[epochs] = len(counted)
    assert steps == {1: 2, 3: 6}


def test_more_epochs_move_the_policy_further():
    batch = varied_batch()  # rewards that differ within each group
    start = make_model()
    moved = {}
    for epochs in (1, 4):
        model = make_model()
        PolicyTrainer(model, ppo_epochs=epochs, lr=1e-3).step(batch, version=0)
        moved[epochs] = sum(float((a - b).norm()) for a, b in zip(model.parameters(), start.parameters()))
    assert moved[4] > 2 * moved[1] > 0


def test_one_epoch_and_one_minibatch_need_no_proximal_pass(monkeypatch):
    trainer = PolicyTrainer(make_model())
    monkeypatch.setattr(trainer, "logprobs", lambda *a, **k: (_ for _ in ()).throw(AssertionError("no extra pass")))
    assert math.isfinite(trainer.step(make_batch(LENGTHS), version=0)["loss"])
    assert torch.is_grad_enabled()
