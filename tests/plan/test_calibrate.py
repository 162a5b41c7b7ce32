"""The hardware profile measured on this machine (asyncrl/plan/calibrate.py ``measure``): with the shared split it
also measures how much faster training runs with the engine's borrowed core; without it, that stays 1. Either
way it times decode and training side by side (the slowdowns are timings: only their presence is checked)."""

import random

import pytest

from asyncrl.plan.calibrate import measure
from asyncrl.trainer import PolicyTrainer
from conftest import make_model


@pytest.mark.parametrize("trainer_most", [0, 2])
def test_the_profile_measures_the_borrowed_core_only_for_the_shared_split(trainer_most):
    rng = random.Random(0)
    prompts = [[rng.randrange(1, 300) for _ in range(rng.randrange(4, 12))] for _ in range(16)]
    fitted = measure(make_model(), None, prompts, max_slots=8, max_len=64, max_new_tokens=16, n_samples=2,
                     temperature=1.0, stop_token_ids=(), engine_threads=1, trainer_threads=1,
                     make_trainer=lambda m: PolicyTrainer(m), trainer_most=trainer_most)
    costs = fitted.profile.costs
    assert costs.train_per_token_s > 0 and costs.decode_per_seq_s + costs.decode_base_s > 0
    assert costs.decode_overlap_x > 0 and costs.train_overlap_x > 0
    assert any(n.startswith("side by side (each in its own thread)") for n in fitted.profile.notes)
    if trainer_most:
        assert costs.train_borrow_x > 0
        assert any("the shared split: training on 2 threads" in n for n in fitted.profile.notes)
    else:
        assert costs.train_borrow_x == 1.0
