"""Reward shaping (asyncrl.algo.shaping): the overlong penalty, bias, scale and clip in AReaL's order, and rewards
placed on the last completion token."""

import pytest
import torch

from asyncrl.algo.shaping import RewardShaping, last_token_index, overlong_penalty, place_at_last_token, shape_rewards


def approx(x, tol=1e-5):
    return pytest.approx(x, rel=tol, abs=tol)


def close(t: torch.Tensor, expected, tol=1e-5) -> bool:
    """``t`` equals the written-out ``expected`` (nested lists) to ``tol``."""
    return torch.allclose(t.double(), torch.tensor(expected, dtype=torch.float64), rtol=tol, atol=tol)


# ---- reward shaping ----------------------------------------------------------------------------------------
def test_overlong_penalty_is_dapo_soft_punishment():
    lengths = torch.tensor([10, 15, 17, 20])
    # L_max = 20, L_cache = 5: free up to 15, then -(len - 15)/5, reaching -1 at 20
    assert close(overlong_penalty(lengths, 20, 5), [0.0, 0.0, -0.4, -1.0])
    assert close(overlong_penalty(lengths, 20, 5, factor=0.5), [0.0, 0.0, -0.2, -0.5])
    with pytest.raises(ValueError, match="overlong_tokens"):
        overlong_penalty(lengths, 20, 0)


def test_shape_rewards_in_areal_order():
    rewards, lengths = torch.tensor([1.0, 0.0, 1.0]), torch.tensor([4, 4, 10])
    truncated = torch.tensor([False, False, True])
    r, _ = shape_rewards(rewards, lengths, truncated, RewardShaping(bias=-0.5, scaling=10.0, clip=3.0))
    assert r.tolist() == approx([3.0, -3.0, 3.0])  # (r - 0.5)·10 = ±5, clipped to ±3
    half = dict(overlong_tokens=4, overlong_penalty_factor=0.5, max_new_tokens=10)
    r, stats = shape_rewards(rewards, lengths, truncated, RewardShaping(**half))
    assert close(r, [1.0, 0.0, 0.5])  # length 10 = L_max: 1 - 0.5
    assert stats["overlong_frac"] == approx(1 / 3) and stats["overlong_penalty_mean"] == approx(-0.5 / 3)
    r, _ = shape_rewards(rewards, lengths, truncated, RewardShaping(zero_truncated=True, **half))
    assert close(r, [1.0, 0.0, 0.0])  # the truncated sample gets 0 whatever its reward
    with pytest.raises(ValueError, match="max_new_tokens"):
        shape_rewards(rewards, lengths, truncated, RewardShaping(overlong_tokens=4))


def test_rewards_go_on_the_last_completion_token():
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    assert last_token_index(mask).tolist() == [2, 3, -1]
    assert place_at_last_token(torch.tensor([2.0, -1.0, 5.0]), mask).tolist() == [
        [0, 0, 2.0, 0],
        [0, 0, 0, -1.0],
        [0, 0, 0, 0],
    ]
