"""build_algorithm (asyncrl.algo.algorithm) maps the actor section to the algorithm's functions."""

import pytest

from asyncrl.algo.algorithm import build_algorithm
from asyncrl.trainer.config import ActorConfig


def test_build_algorithm_maps_the_config():
    algo = build_algorithm(
        ActorConfig(
            loss_agg_mode="seq-mean-token-sum-norm", overlong_reward_penalty=True, overlong_tokens=8, c_clip=3.0
        ),
        max_new_tokens=32,
    )
    assert algo.agg_options["norm_tokens"] == 32 and algo.shaping.max_new_tokens == 32
    assert algo.shaping.overlong_tokens == 8 and algo.loss_options["c_clip"] == 3.0
    assert build_algorithm(ActorConfig(loss_norm_tokens=100)).agg_options["norm_tokens"] == 100
    with pytest.raises(ValueError, match="max_new_tokens"):
        build_algorithm(ActorConfig(overlong_reward_penalty=True, overlong_tokens=8))
