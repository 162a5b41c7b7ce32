"""Advantage estimators (asyncrl.algo.advantages) against hand-computed values."""

import math

import pytest
import torch

from asyncrl.algo.advantages import (
    ADVANTAGES,
    GROUP_BASELINES,
    discounted_returns,
    dr_grpo,
    gae,
    grpo,
    liteppo,
    masked_whiten,
    reinforce_pp,
    reinforce_pp_baseline,
    rloo,
)

# two groups: [1, 0, 0, 1] and [1, 1]
REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
GROUPS = torch.tensor([0, 0, 0, 0, 1, 1])
MASK = torch.tensor([[0.0, 1.0, 1.0]] * 6)


def close(t: torch.Tensor, expected, tol=1e-5) -> bool:
    """``t`` equals the written-out ``expected`` (nested lists) to ``tol``."""
    return torch.allclose(t.double(), torch.tensor(expected, dtype=torch.float64), rtol=tol, atol=tol)


def test_dr_grpo_subtracts_the_group_mean_only():
    adv = dr_grpo(REWARDS, GROUPS, MASK)
    assert close(adv[:, 1], [0.5, -0.5, -0.5, 0.5, 0.0, 0.0])
    assert adv[:, 0].tolist() == [0.0] * 6  # the masked prompt position


def test_rloo_uses_the_mean_of_the_other_samples():
    adv = rloo(REWARDS, GROUPS, MASK)
    # sample 0: 1 - (0 + 0 + 1)/3 = 2/3; sample 1: 0 - (1 + 0 + 1)/3 = -2/3
    assert close(adv[:, 2], [2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.0, 0.0])


def test_liteppo_divides_by_the_batch_std():
    adv = liteppo(REWARDS, GROUPS, MASK)
    # batch mean 2/3; squared deviations sum to 4/3; unbiased var = (4/3)/5; group-centred values ±0.5
    std = math.sqrt(4 / 15)
    assert close(adv[:, 1], [0.5 / std, -0.5 / std, -0.5 / std, 0.5 / std, 0.0, 0.0])


def test_grpo_by_hand_with_masked_tokens():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    adv = grpo(torch.tensor([2.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 0, 0]), mask)
    std = math.sqrt(2 / 3)  # mean 1, deviations 1, -1, 0, 0
    assert close(adv, [[1 / std, 1 / std, 0], [-1 / std, 0, 0], [0, 0, 0], [0, 0, 0]])


@pytest.mark.parametrize("name", sorted(GROUP_BASELINES))
def test_group_of_one_gets_zero_advantage(name):
    adv = ADVANTAGES[name](torch.tensor([3.0, 1.0, 0.0]), torch.tensor([0, 1, 1]), torch.ones(3, 2))
    assert adv[0].tolist() == [0.0, 0.0]
    assert torch.isfinite(adv).all()


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_all_masked_batch_gives_zeros_without_nan(name):
    mask = torch.zeros(3, 4)
    adv = ADVANTAGES[name](
        torch.tensor([1.0, 0.0, 2.0]),
        torch.tensor([0, 0, 1]),
        mask,
        token_rewards=torch.zeros(3, 4),
        values=torch.zeros(3, 4),
    )
    assert adv.shape == (3, 4) and torch.equal(adv, torch.zeros(3, 4))


def test_discounted_returns_skip_masked_positions():
    token_rewards = torch.tensor([[0.0, 5.0, 0.0, 1.0]])  # the 5 sits on a masked position and is ignored
    mask = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
    assert close(discounted_returns(token_rewards, mask, gamma=0.5), [[0.25, 0.0, 0.5, 1.0]])


def test_reinforce_pp_whitens_returns_over_the_batch():
    mask = torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 1.0]])
    adv = reinforce_pp(torch.tensor([1.0, -1.0]), torch.tensor([0, 1]), mask, gamma=0.5)
    # returns: row 0 [0.25, 0.5, 1], row 1 [-, -0.5, -1]; mean 0.05; unbiased var 2.55/4
    std = math.sqrt(2.55 / 4)
    expected = [[0.2 / std, 0.45 / std, 0.95 / std], [0.0, -0.55 / std, -1.05 / std]]
    assert close(adv, expected)


def test_reinforce_pp_takes_per_token_kl_rewards():
    # token rewards carry -β·KL on every token and the reward on the last: returns 0.9, 1.0 with γ = 1
    adv = reinforce_pp(
        torch.tensor([0.9]), torch.tensor([0]), torch.ones(1, 2), token_rewards=torch.tensor([[-0.1, 1.0]])
    )
    # whitened: mean 0.95, unbiased std of (0.9, 1.0) = 0.0707
    std = math.sqrt(0.005)
    assert close(adv, [[-0.05 / std, 0.05 / std]], tol=1e-4)


def test_reinforce_pp_baseline_centres_on_the_group_then_whitens():
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    adv = reinforce_pp_baseline(torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1]), mask)
    # centred: [0.5, -0.5, 0, 0]; over tokens [0.5, 0.5, -0.5, 0, 0]: mean 0.1, unbiased var 0.7/4
    std = math.sqrt(0.175)
    assert close(adv, [[0.4 / std, 0.4 / std], [-0.6 / std, 0], [0, -0.1 / std], [-0.1 / std, 0]])


def test_gae_by_hand():
    # prompt position masked; reward 1 on the last token; γ = 0.9, λ = 0.8
    token_rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    values = torch.tensor([[9.0, 0.5, 0.6, 0.7]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0]])
    adv = gae(
        torch.tensor([1.0]), torch.tensor([0]), mask, token_rewards=token_rewards, values=values, gamma=0.9, lam=0.8
    )
    a3 = 1.0 - 0.7  # δ_3 = r + γ·0 - V_3
    a2 = (0.9 * 0.7 - 0.6) + 0.72 * a3
    a1 = (0.9 * 0.6 - 0.5) + 0.72 * a2
    assert close(adv, [[0.0, a1, a2, a3]])


def test_gae_bootstraps_across_masked_gaps_and_without_critic_gives_returns():
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    values = torch.tensor([[0.2, 99.0, 0.5]])  # the masked value is never used
    adv = gae(
        torch.tensor([1.0]),
        torch.tensor([0]),
        mask,
        token_rewards=torch.tensor([[0.0, 0.0, 1.0]]),
        values=values,
        gamma=1.0,
        lam=1.0,
    )
    assert close(adv, [[1.0 - 0.2, 0.0, 1.0 - 0.5]])
    plain = gae(torch.tensor([2.0]), torch.tensor([0]), torch.ones(1, 3))  # V = 0, γ = λ = 1: the return
    assert close(plain, [[2.0, 2.0, 2.0]])


def test_masked_whiten_ignores_masked_elements():
    x = torch.tensor([[1.0, 3.0, 100.0]])
    out = masked_whiten(x, torch.tensor([[1.0, 1.0, 0.0]]), eps=0.0)
    assert close(out, [[-1 / math.sqrt(2), 1 / math.sqrt(2), 0.0]])
    assert masked_whiten(x, torch.zeros(1, 3)).tolist() == [[0.0, 0.0, 0.0]]


def test_grpo_advantages_by_hand():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    mask = torch.ones(6, 2)
    adv = grpo(rewards, groups, mask)
    std = math.sqrt(((0.5**2) * 4) / 3)  # unbiased std of [1, 0, 0, 1]
    expected = torch.tensor([0.5, -0.5, -0.5, 0.5, 0.0, 0.0]) / (torch.tensor([std] * 4 + [0.0, 0.0]) + 1e-6)
    assert torch.allclose(adv[:, 0], expected, atol=1e-5)
    assert torch.equal(adv[:, 0], adv[:, 1])


def test_grpo_respects_mask_and_single_sample_groups():
    adv = grpo(torch.tensor([3.0]), torch.tensor([0]), torch.tensor([[1.0, 0.0]]))
    assert adv.tolist() == [[0.0, 0.0]]
