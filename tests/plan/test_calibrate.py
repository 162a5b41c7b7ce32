"""The hardware profile measured on this machine (asyncrl/plan/calibrate.py ``measure``): with the shared split it
also measures how much faster training and decoding run on every core; without it, those stay 1."""

import random

import pytest

from asyncrl.plan.calibrate import measure
from asyncrl.trainer import PolicyTrainer
from conftest import make_model


@pytest.mark.parametrize("all_cores", [0, 2])
def test_the_profile_measures_the_all_core_speedups_only_for_the_shared_split(all_cores):
    rng = random.Random(0)
    prompts = [[rng.randrange(1, 300) for _ in range(rng.randrange(4, 12))] for _ in range(16)]
    fitted = measure(make_model(), None, prompts, max_slots=8, max_len=64, max_new_tokens=16, n_samples=2,
                     temperature=1.0, stop_token_ids=(), engine_threads=1, trainer_threads=1,
                     make_trainer=lambda m: PolicyTrainer(m), all_cores=all_cores)
    costs = fitted.profile.costs
    assert costs.train_per_token_s > 0 and costs.decode_per_seq_s + costs.decode_base_s > 0
    if all_cores:
        assert costs.train_all_cores_x > 0 and costs.decode_all_cores_x > 0
        assert any("on all 2 cores (the shared split)" in n for n in fitted.profile.notes)
    else:
        assert costs.train_all_cores_x == costs.decode_all_cores_x == 1.0
