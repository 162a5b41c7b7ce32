"""Log-probs (asyncrl.trainer.logprobs): the padded API, and behaviour weights of exactly 1 on-policy under top-p and
top-k, because the trainer scores the filtered distribution the engine sampled from."""

import pytest
import torch

from asyncrl.trainer.logprobs import token_logprobs
from asyncrl.types import Trajectory, TrajectoryGroup

from conftest import make_model
from trainers_for_tests import make_batch


@pytest.mark.parametrize("top_p, top_k", [(0.7, 0), (1.0, 5), (0.8, 8)])
def test_on_policy_behaviour_weight_is_one_under_top_p_and_top_k(top_p, top_k):
    """The engine samples from the filtered distribution; the trainer scores under the same filter, so on the
    same weights π_prox/π_behav = 1. Scoring the unfiltered distribution gives the kept mass instead."""
    from asyncrl.algo.offpolicy import behaviour_weight
    from asyncrl.data.collate import collate
    from asyncrl.engine.local import LocalEngine
    from asyncrl.trainer import PolicyTrainer
    from asyncrl.types import SamplingParams

    from conftest import make_model

    model = make_model(320, seed=3)
    engine = LocalEngine(model, max_slots=16, max_len=64, seed=5)
    params = SamplingParams(n=4, max_new_tokens=12, temperature=1.3, top_p=top_p, top_k=top_k)
    groups = [
        TrajectoryGroup(
            [Trajectory(c.prompt_ids, c.output_ids, c.logprobs, c.versions, 0.0, c.finish_reason) for c in group]
        )
        for group in engine.generate_batch([[1, 2, 3], [7, 8]], params)
    ]
    batch = collate(groups, pad_id=0)
    for trainer_top_p, trainer_top_k, on_policy in ((top_p, top_k, True), (1.0, 0, False)):
        trainer = PolicyTrainer(model, temperature=1.3, top_p=trainer_top_p, top_k=trainer_top_k)
        prox = trainer.logprobs(batch)
        weight, _, _ = behaviour_weight(prox, batch.behav_logprobs, batch.loss_mask)
        w = weight[batch.loss_mask.bool()]
        if on_policy:
            assert torch.allclose(w, torch.ones_like(w), atol=1e-4)
        else:
            assert (w < 1 - 1e-3).any()  # the unfiltered score is the kept mass: a weight below 1


def test_token_logprobs_keeps_the_padded_api():
    model = make_model()
    batch = make_batch([8, 5])
    logp, entropy = token_logprobs(model, batch.input_ids, batch.attention_mask, with_entropy=True)
    assert logp.shape == (2, 7) and entropy.shape == (2, 7) and (logp <= 0).all()
