"""Behaviour-anchored trust terms (asyncrl.algo.trust) on hand-computed tokens: the dual anchor, DPPO's
probability-difference mask and M2PO's second-moment bound, each dropping only tokens that moved in their
advantage's direction; at one step per batch (π_θ = π_prox) each changes the gradient, where the decoupled clip
cannot: with the dual anchor the decoupled gradient is naive PPO's."""

import math

import pytest
import torch

from asyncrl.algo.losses import LossInputs, decoupled_ppo, m2po, ppo
from asyncrl.algo.offpolicy import BehaviourCorrection
from asyncrl.algo.trust import BehaviourTrust, behaviour_trust, harmful, m2_bound

LOG = math.log


def t(*rows):
    return torch.tensor(rows, dtype=torch.float32)


# r = π_θ/π_behav per token: 1.5 (A > 0: harmful), 0.5 (A > 0: pulled back), 0.6 (A < 0: harmful), 1.05 (A < 0)
NOW = t([0.3, 0.2, 0.3, 0.42])
BEHAV = t([0.2, 0.4, 0.5, 0.4])
ADV = t([1.0, 1.0, -1.0, -1.0])
MASK = torch.ones(1, 4)


def test_harmful_tokens_moved_in_their_advantages_direction():
    assert harmful(torch.log(NOW / BEHAV), ADV).tolist() == [[True, False, True, False]]


def test_the_dual_anchor_drops_only_harmful_tokens_past_one_plus_or_minus_eps():
    keep, stats = behaviour_trust(
        torch.log(NOW), torch.log(BEHAV), ADV, MASK, t([2.0, 1.0, 3.0, 1.0]), BehaviourTrust(eps_clip=0.2)
    )
    assert keep.tolist() == [[False, True, False, True]]  # 1.5 > 1.2 with A > 0; 0.6 < 0.8 with A < 0
    assert stats["behav_clip_frac"] == 0.5 and stats["behav_clip_delta"] == pytest.approx((2.0 + 3.0) / 4)
    keep, _ = behaviour_trust(torch.log(NOW), torch.log(BEHAV), ADV, MASK, MASK, BehaviourTrust(eps_clip=0.6))
    assert keep.tolist() == [[True, True, True, True]]  # 1.5 < 1.6 and 0.6 > 0.4: within the bound


def test_dppos_mask_bounds_the_probability_difference_in_the_advantages_direction():
    # p_θ - p_behav: +0.1 (A > 0), -0.2 (A > 0: pulled back), -0.2 (A < 0), +0.02
    keep, stats = behaviour_trust(torch.log(NOW), torch.log(BEHAV), ADV, MASK, MASK, BehaviourTrust(prob_delta=0.15))
    assert keep.tolist() == [[True, True, False, True]] and stats["prob_mask_frac"] == 0.25
    keep, _ = behaviour_trust(torch.log(NOW), torch.log(BEHAV), ADV, MASK, MASK, BehaviourTrust(prob_delta=0.05))
    assert keep.tolist() == [[False, True, False, True]]


def test_the_m2_bound_water_fills_the_harmful_tokens_squares_down_to_the_budget():
    log_r = t([0.1, 0.3, -0.5, 0.6, 0.05])
    adv = t([1.0, 1.0, -1.0, -1.0, 1.0])  # harmful: 0.1, 0.3, -0.5, 0.05 (0.6 with A < 0 is not)
    tau, m2, after = m2_bound(log_r, adv, torch.ones(1, 5), budget=0.04)
    # squares 0.0025, 0.01, 0.09, 0.25: mean 0.088125; the two largest capped at τ² = (0.16 - 0.0125) / 2
    assert m2 == pytest.approx(0.088125) and after == 0.04 and tau == pytest.approx(math.sqrt(0.07375))
    assert m2_bound(log_r, adv, torch.ones(1, 5), budget=0.1)[0] == math.inf  # within the budget: no bound
    keep, stats = behaviour_trust(
        log_r, torch.zeros(1, 5), adv, torch.ones(1, 5), torch.ones(1, 5), BehaviourTrust(m2_budget=0.04)
    )
    # the harmful tokens with |log r| > τ = 0.2716 are dropped: 0.3 and -0.5; 0.6 (A < 0, r > 1) is kept
    assert keep.tolist() == [[True, False, False, True, True]] and stats["m2"] == pytest.approx(0.088125)


def test_at_one_step_per_batch_the_dual_anchor_gives_the_decoupled_loss_naive_ppos_gradient():
    """π_θ = π_prox (one optimizer step per batch): the decoupled clip never binds, and without a trust term its
    gradient pushes the harmful tokens further; with the dual anchor it is naive PPO's gradient on every token
    (the behaviour weights are under the cap)."""

    def grad(fn, **kw):
        lp = torch.log(NOW).clone().requires_grad_(True)
        loss, stats = fn(LossInputs(lp, lp.detach(), torch.log(BEHAV), ADV, MASK), **kw)
        loss.sum().backward()
        return lp.grad, stats

    plain, stats = grad(decoupled_ppo, eps_clip=0.2, correction=BehaviourCorrection(upper=5.0))
    dual, _ = grad(
        decoupled_ppo, eps_clip=0.2, correction=BehaviourCorrection(upper=5.0), trust=BehaviourTrust(eps_clip=0.2)
    )
    naive, _ = grad(ppo, eps_clip=0.2)
    assert stats["clip_frac"] == 0.0  # u = 1: the decoupled clip is inert
    assert torch.allclose(plain, -ADV * NOW / BEHAV)  # w·A on every token, the harmful ones too
    assert torch.allclose(dual, naive) and dual[0, 0] == 0 and dual[0, 2] == 0
    assert not torch.allclose(dual, plain)  # the term changes the gradient where the decoupled clip cannot


def test_m2po_is_the_behaviour_clip_with_the_budgets_width_and_no_clip_under_budget():
    lp = torch.log(NOW).clone().requires_grad_(True)
    loss, stats = m2po(LossInputs(lp, lp.detach(), torch.log(BEHAV), ADV, MASK), m2_budget=1.0)
    assert stats["m2_clip_frac"] == 0.0 and torch.allclose(loss, -ADV * NOW / BEHAV)  # under budget: -A·r
    loss, stats = m2po(LossInputs(lp, lp.detach(), torch.log(BEHAV), ADV, MASK), m2_budget=0.04)
    tau, _, _ = m2_bound(torch.log(NOW / BEHAV), ADV, MASK, 0.04)
    clipped = -ADV * (NOW / BEHAV).clamp(math.exp(-tau), math.exp(tau))
    assert torch.allclose(loss, torch.maximum(-ADV * NOW / BEHAV, clipped)) and stats["m2_clip_frac"] == 0.5


def test_bad_trust_settings_are_refused():
    for kw in ({"eps_clip": 0.0}, {"eps_clip": 1.0}, {"prob_delta": -0.1}, {"m2_budget": 0.0}):
        with pytest.raises(ValueError):
            BehaviourTrust(**kw)
    assert not BehaviourTrust().active and BehaviourTrust(eps_clip=0.2).active
