import math

import torch

from asyncrl.algo.advantages import grpo
from asyncrl.algo.losses import decoupled_ppo, ppo


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


def test_decoupled_loss_hand_computed():
    # one token, A = 1: u = π_θ/π_prox = 1.5 is clipped to 1.2; w = π_prox/π_behav = 2, cap 5
    lp, prox, behav = math.log(0.6), math.log(0.4), math.log(0.2)
    loss, stats = decoupled_ppo(
        logprobs=torch.tensor([[lp]]), prox_logprobs=torch.tensor([[prox]]), behav_logprobs=torch.tensor([[behav]]),
        advantages=torch.tensor([[1.0]]), mask=torch.tensor([[1.0]]), eps_clip=0.2, behav_imp_weight_cap=5.0,
    )
    # max(-1 * 1.5, -1 * 1.2) = -1.2, times w = 2
    assert loss.item() == pytest_approx(-2.4)
    assert stats["clip_frac"] == 1.0 and stats["behav_weight_mean"] == pytest_approx(2.0)


def test_decoupled_loss_negative_advantage_and_cap():
    # A = -2, u = 0.5 -> clipped to 0.8: max(1.0, 1.6) = 1.6; w = 10 capped at 3 -> 4.8
    loss, stats = decoupled_ppo(
        logprobs=torch.tensor([[math.log(0.1)]]), prox_logprobs=torch.tensor([[math.log(0.2)]]),
        behav_logprobs=torch.tensor([[math.log(0.02)]]), advantages=torch.tensor([[-2.0]]),
        mask=torch.tensor([[1.0]]), eps_clip=0.2, behav_imp_weight_cap=3.0,
    )
    assert loss.item() == pytest_approx(4.8)
    assert stats["behav_weight_capped_frac"] == 1.0


def test_decoupled_loss_gradient_flows_only_through_current_policy():
    lp = torch.tensor([[math.log(0.5), math.log(0.3)]], requires_grad=True)
    loss, _ = decoupled_ppo(
        logprobs=lp, prox_logprobs=lp.detach(), behav_logprobs=torch.tensor([[math.log(0.25), math.log(0.3)]]),
        advantages=torch.tensor([[1.0, 1.0]]), mask=torch.tensor([[1.0, 0.0]]), behav_imp_weight_cap=5.0,
    )
    loss.sum().backward()
    # d/dlp of -A * w * exp(lp - prox) at lp == prox is -A * w = -2 on the unmasked token, 0 on the masked one
    assert torch.allclose(lp.grad, torch.tensor([[-2.0, 0.0]]))


def test_losses_sanitise_inf_logprobs():
    loss, _ = decoupled_ppo(
        logprobs=torch.tensor([[0.0]]), prox_logprobs=torch.tensor([[float("-inf")]]),
        behav_logprobs=torch.tensor([[float("-inf")]]), advantages=torch.tensor([[1.0]]),
        mask=torch.tensor([[1.0]]), behav_imp_weight_cap=5.0,
    )
    assert torch.isfinite(loss).all()


def test_naive_ppo_anchors_on_behaviour():
    loss, _ = ppo(logprobs=torch.tensor([[math.log(0.3)]]), prox_logprobs=torch.tensor([[0.0]]),
                  behav_logprobs=torch.tensor([[math.log(0.2)]]), advantages=torch.tensor([[1.0]]),
                  mask=torch.tensor([[1.0]]), eps_clip=0.2)
    assert loss.item() == pytest_approx(-1.2)


def pytest_approx(x):
    import pytest

    return pytest.approx(x, rel=1e-5, abs=1e-6)
