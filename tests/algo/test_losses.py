"""Policy losses (asyncrl.algo.losses) against hand-computed values on tensors written out in the test: PPO clipping
(asymmetric, dual), the decoupled objective, sequence-level ratios, SAPO, CISPO, PG, naive PPO and the value loss."""

import math

import pytest
import torch

from asyncrl.algo.aggregate import token_mean
from asyncrl.algo.losses import (
    POLICY_LOSSES,
    LossInputs,
    cispo,
    clip_surrogate,
    clipped_value_loss,
    decoupled_ppo,
    pg,
    ppo,
    sapo,
)
from asyncrl.algo.offpolicy import BehaviourCorrection, behaviour_weight

LOG = math.log


def t(*rows):
    return torch.tensor(rows, dtype=torch.float32)


def approx(x, tol=1e-5):
    return pytest.approx(x, rel=tol, abs=tol)


def close(x: torch.Tensor, expected, tol=1e-5) -> bool:
    return torch.allclose(x.double(), torch.tensor(expected, dtype=torch.float64), rtol=tol, atol=tol)


def call(fn, lp, prox, behav, adv, mask=None, **kw):
    lp, prox, behav, adv = t(lp), t(prox), t(behav), t(adv)
    mask = torch.ones_like(lp) if mask is None else t(mask)
    return fn(LossInputs(lp, prox, behav, adv, mask), **kw)


# ---- PPO clip: asymmetric bounds, dual clip --------------------------------------------------------------
def test_clip_higher_lets_positive_advantages_grow_further():
    log_ratio, adv, mask = t([LOG(1.25)]), t([1.0]), t([1.0])
    sym, s1 = clip_surrogate(log_ratio, adv, mask, eps_clip=0.2)
    dapo, s2 = clip_surrogate(log_ratio, adv, mask, eps_clip=0.2, eps_clip_higher=0.28)
    assert sym.item() == approx(-1.2) and s1["clip_frac"] == 1.0  # max(-1.25, -1.2)
    assert dapo.item() == approx(-1.25) and s2["clip_frac"] == 0.0  # 1.25 < 1.28: not clipped
    low, _ = clip_surrogate(t([LOG(0.7)]), t([-1.0]), mask, eps_clip=0.2, eps_clip_higher=0.28)
    assert low.item() == approx(0.8)  # the lower bound stays at 1 - 0.2: max(0.7, 0.8)


def test_dual_clip_caps_the_loss_of_negative_advantages():
    # A = -1, u = 5: PPO gives max(5, 1.2) = 5; dual clip c = 3 caps it at 3·|A|
    loss, stats = clip_surrogate(t([LOG(5.0), LOG(5.0)]), t([-1.0, 2.0]), t([1.0, 1.0]), eps_clip=0.2, c_clip=3.0)
    assert close(loss, [[3.0, -2.4]])  # A > 0 is untouched: max(-10, -2.4)
    assert stats["dual_clip_frac"] == 0.5


# ---- the decoupled objective and its behaviour weight ------------------------------------------------------
def test_decoupled_ppo_multiplies_the_clipped_surrogate_by_the_behaviour_weight():
    # token 1: u = 0.6/0.4 = 1.5 -> clipped 1.2, w = 0.4/0.2 = 2 -> -2.4; token 2: u = 1, w = 0.5 -> -0.5
    loss, stats = call(decoupled_ppo, [LOG(0.6), LOG(0.3)], [LOG(0.4), LOG(0.3)], [LOG(0.2), LOG(0.6)], [1.0, 1.0])
    assert close(loss, [[-2.4, -0.5]])
    assert stats["behav_weight_mean"] == approx(1.25) and stats["behav_weight_max"] == approx(2.0)
    assert stats["clip_frac"] == 0.5


def test_minus_inf_logprobs_are_sanitised():
    inf = float("-inf")
    for name, fn in POLICY_LOSSES.items():
        loss, stats = call(fn, [0.0, inf], [inf, inf], [inf, LOG(0.5)], [1.0, -1.0])
        assert torch.isfinite(loss).all(), name
        assert all(math.isfinite(v) for v in stats.values()), name
    w, _, _ = behaviour_weight(t([inf]), t([inf]), t([1.0]))
    assert w.item() == 1.0  # -inf - -inf is treated as ratio 1


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_all_masked_batch_gives_zero_loss_and_no_nan(name):
    lp = torch.tensor([[LOG(0.5), LOG(0.2)]], requires_grad=True)
    loss, stats = POLICY_LOSSES[name](
        LossInputs(lp, t([LOG(0.4), LOG(0.1)]), t([LOG(0.3), LOG(0.2)]), t([1.0, -1.0]), torch.zeros(1, 2)),
        importance_sampling_level="sequence",
    )
    total = (loss * token_mean(torch.zeros(1, 2))).sum()
    total.backward()
    assert total.item() == 0.0 and torch.equal(lp.grad, torch.zeros(1, 2))
    assert all(math.isfinite(v) for v in stats.values())


# ---- GSPO: sequence-level ratio ---------------------------------------------------------------------------
def test_sequence_level_differs_from_token_level():
    # token ratios [1.5, 0.5], A = 1: token level max(-1.5, -1.2) and max(-0.5, -0.8) -> [-1.2, -0.5]
    lp, prox = [LOG(0.6), LOG(0.1)], [LOG(0.4), LOG(0.2)]
    token, _ = call(decoupled_ppo, lp, prox, prox, [1.0, 1.0])
    seq, _ = call(decoupled_ppo, lp, prox, prox, [1.0, 1.0], importance_sampling_level="sequence")
    assert close(token, [[-1.2, -0.5]])
    s = math.sqrt(1.5 * 0.5)  # the geometric mean 0.866 lies inside [0.8, 1.2]
    assert close(seq, [[-s, -s]])


def test_sequence_level_averages_the_advantage_over_unmasked_tokens():
    # u = 1 everywhere; A = [1, 3, 100] with the last token masked -> the sequence advantage is 2
    loss, _ = call(
        decoupled_ppo,
        [0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0],
        [1.0, 3.0, 100.0],
        mask=[1.0, 1.0, 0.0],
        importance_sampling_level="sequence",
    )
    assert close(loss, [[-2.0, -2.0, 0.0]])


def test_sequence_ratio_clip_bounds_the_whole_sequence():
    # the sequence ratio exp(mean log u) = exp((log 1.5 + log 1.5)/2) = 1.5 is clipped to 1.2 on both tokens
    lp, prox = [LOG(0.6), LOG(0.3)], [LOG(0.4), LOG(0.2)]
    loss, stats = call(decoupled_ppo, lp, prox, prox, [1.0, 1.0], importance_sampling_level="sequence")
    assert close(loss, [[-1.2, -1.2]]) and stats["clip_frac"] == 1.0


def test_gspo_gradient_spreads_the_sequence_ratio_over_its_tokens():
    # at u = 1 the gradient of -A·exp(mean log u) w.r.t. each token's log-prob is -A/|y| per token-position
    # it appears at; summed over the |y| positions it carries, each token gets -A (as at token level)
    lp = torch.tensor([[LOG(0.5), LOG(0.25), 0.0]], requires_grad=True)
    loss, _ = decoupled_ppo(
        LossInputs(lp, lp.detach(), lp.detach(), t([2.0, 2.0, 2.0]), t([1.0, 1.0, 0.0])),
        importance_sampling_level="sequence",
    )
    loss.sum().backward()
    assert close(lp.grad, [[-2.0, -2.0, 0.0]])


# ---- SAPO, CISPO, PG ---------------------------------------------------------------------------------------
def test_sapo_known_values_and_gate_by_advantage_sign():
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    loss, _ = call(sapo, [LOG(0.6), LOG(0.6)], [LOG(0.4), LOG(0.4)], [LOG(0.4), LOG(0.4)], [1.0, -1.0])
    # u = 1.5: A > 0 uses τ_pos = 1: -4σ(0.5); A < 0 uses τ_neg = 1.05: +(4/1.05)σ(0.525)
    assert close(loss, [[-4 * sig(0.5), 4 / 1.05 * sig(0.525)]])
    loss2, _ = call(sapo, [LOG(0.6)], [LOG(0.4)], [LOG(0.4)], [-1.0], sapo_tau_neg=2.0)
    assert loss2.item() == approx(4 / 2.0 * sig(1.0))
    with pytest.raises(ValueError, match="temperatures must be > 0"):
        call(sapo, [0.0], [0.0], [0.0], [1.0], sapo_tau_pos=0.0)


def test_sapo_gradient_equals_policy_gradient_on_policy():
    lp = torch.tensor([[LOG(0.5), LOG(0.3)]], requires_grad=True)
    loss, _ = sapo(LossInputs(lp, lp.detach(), lp.detach(), t([1.5, -2.0]), t([1.0, 1.0])))
    loss.sum().backward()
    assert close(lp.grad, [[-1.5, 2.0]])  # 4σ(0)(1-σ(0)) = 1


def test_cispo_keeps_the_gradient_of_clipped_tokens():
    # u = 0.4/0.2 = 2 is clipped to 1.28 but, unlike PPO, the token still gets gradient -1.28·A
    lp = torch.tensor([[LOG(0.4)]], requires_grad=True)
    loss, stats = cispo(
        LossInputs(lp, t([LOG(0.2)]), t([LOG(0.2)]), t([1.0]), t([1.0])), eps_clip=0.2, eps_clip_higher=0.28
    )
    assert loss.item() == approx(-1.28 * LOG(0.4)) and stats["clip_frac"] == 1.0
    loss.sum().backward()
    assert lp.grad.item() == approx(-1.28)
    lp2 = torch.tensor([[LOG(0.4)]], requires_grad=True)
    ppo_loss, _ = decoupled_ppo(
        LossInputs(lp2, t([LOG(0.2)]), t([LOG(0.2)]), t([1.0]), t([1.0])), eps_clip=0.2, eps_clip_higher=0.28
    )
    ppo_loss.sum().backward()
    assert lp2.grad.item() == 0.0  # PPO's clip zeroes it


def test_pg_is_the_unclipped_importance_weighted_gradient():
    lp = torch.tensor([[LOG(0.5), LOG(0.9)]], requires_grad=True)
    loss, _ = pg(LossInputs(lp, t([LOG(0.5), LOG(0.3)]), t([LOG(0.25), LOG(0.3)]), t([1.0, 1.0]), t([1.0, 1.0])))
    # token 1: w = 2, u = 1 -> -2; token 2: w = 1, u = 3 (no clip) -> -3
    assert close(loss, [[-2.0, -3.0]])
    loss.sum().backward()
    assert close(lp.grad, [[-2.0, -3.0]])


def test_naive_ppo_is_anchored_on_behaviour_and_has_no_weight():
    loss, stats = call(ppo, [LOG(0.3)], [LOG(0.9)], [LOG(0.2)], [1.0], eps_clip=0.2)
    assert loss.item() == approx(-1.2) and "behav_weight_mean" not in stats


# ---- value loss, KL estimators, aggregation ---------------------------------------------------------------
def test_clipped_value_loss():
    # V = 1, V_old = 0.5, R = 2: unclipped ½·1² = 0.5; clipped V' = 0.7: ½·1.3² = 0.845 -> 0.845
    # V = 2.5, V_old = 2, R = 2: unclipped 0.125; clipped 2.2: 0.02 -> 0.125
    loss, stats = clipped_value_loss(
        t([1.0, 2.5, 7.0]), t([0.5, 2.0, 0.0]), t([2.0, 2.0, 0.0]), t([1.0, 1.0, 0.0]), value_eps_clip=0.2
    )
    assert close(loss, [[0.845, 0.125, 0.0]]) and stats["value_clip_frac"] == 0.5
    plain, _ = clipped_value_loss(t([1.0]), t([0.5]), t([2.0]), t([1.0]), value_eps_clip=None)
    assert plain.item() == approx(0.5)


def test_decoupled_loss_hand_computed():
    # one token, A = 1: u = π_θ/π_prox = 1.5 is clipped to 1.2; w = π_prox/π_behav = 2, cap 5
    lp, prox, behav = math.log(0.6), math.log(0.4), math.log(0.2)
    loss, stats = decoupled_ppo(
        LossInputs(
            torch.tensor([[lp]]),
            torch.tensor([[prox]]),
            torch.tensor([[behav]]),
            torch.tensor([[1.0]]),
            torch.tensor([[1.0]]),
        ),
        eps_clip=0.2,
        correction=BehaviourCorrection(upper=5.0),
    )
    # max(-1 * 1.5, -1 * 1.2) = -1.2, times w = 2
    assert loss.item() == pytest_approx(-2.4)
    assert stats["clip_frac"] == 1.0 and stats["behav_weight_mean"] == pytest_approx(2.0)


def test_decoupled_loss_negative_advantage_and_cap():
    # A = -2, u = 0.5 -> clipped to 0.8: max(1.0, 1.6) = 1.6; w = 10 capped at 3 -> 4.8
    loss, stats = decoupled_ppo(
        LossInputs(
            torch.tensor([[math.log(0.1)]]),
            torch.tensor([[math.log(0.2)]]),
            torch.tensor([[math.log(0.02)]]),
            torch.tensor([[-2.0]]),
            torch.tensor([[1.0]]),
        ),
        eps_clip=0.2,
        correction=BehaviourCorrection(upper=3.0),
    )
    assert loss.item() == pytest_approx(4.8)
    assert stats["behav_weight_capped_frac"] == 1.0


def test_decoupled_loss_gradient_flows_only_through_current_policy():
    lp = torch.tensor([[math.log(0.5), math.log(0.3)]], requires_grad=True)
    loss, _ = decoupled_ppo(
        LossInputs(
            lp,
            lp.detach(),
            torch.tensor([[math.log(0.25), math.log(0.3)]]),
            torch.tensor([[1.0, 1.0]]),
            torch.tensor([[1.0, 0.0]]),
        ),
        correction=BehaviourCorrection(upper=5.0),
    )
    loss.sum().backward()
    # d/dlp of -A * w * exp(lp - prox) at lp == prox is -A * w = -2 on the unmasked token, 0 on the masked one
    assert torch.allclose(lp.grad, torch.tensor([[-2.0, 0.0]]))


def test_losses_sanitise_inf_logprobs():
    loss, _ = decoupled_ppo(
        LossInputs(
            torch.tensor([[0.0]]),
            torch.tensor([[float("-inf")]]),
            torch.tensor([[float("-inf")]]),
            torch.tensor([[1.0]]),
            torch.tensor([[1.0]]),
        ),
        correction=BehaviourCorrection(upper=5.0),
    )
    assert torch.isfinite(loss).all()


def test_naive_ppo_anchors_on_behaviour():
    loss, _ = ppo(
        LossInputs(
            torch.tensor([[math.log(0.3)]]),
            torch.tensor([[0.0]]),
            torch.tensor([[math.log(0.2)]]),
            torch.tensor([[1.0]]),
            torch.tensor([[1.0]]),
        ),
        eps_clip=0.2,
    )
    assert loss.item() == pytest_approx(-1.2)


def pytest_approx(x):
    import pytest

    return pytest.approx(x, rel=1e-5, abs=1e-6)


def test_at_one_step_per_batch_decoupled_and_naive_ppo_differ_only_on_the_tokens_naive_ppo_clips():
    """Why the staleness ablation ranks them as it does: with one optimizer step per batch the proximal policy
    is the current one (u = 1), so the decoupled clip never binds; its gradient, w·A·∇log π, is naive PPO's on
    every token naive PPO does not clip. Naive PPO zeroes the tokens that moved past 1 ± ε since they were
    sampled (in the advantage's direction); masking behaviour weights outside [1 - ε, 1 + ε] drops them too."""
    behav = torch.log(t([0.2, 0.5, 0.4, 0.3], [0.6, 0.1, 0.5, 0.25]))
    now = torch.log(t([0.3, 0.3, 0.2, 0.31], [0.5, 0.2, 0.52, 0.26]))  # w = now/behav: 1.5 .6 .5 1.03 | .83 2 1.04 1.04
    adv, mask = t([1.0, 1.0, -1.0, -1.0], [-1.0, 1.0, 1.0, -1.0]), torch.ones(2, 4)

    def grad(fn, **kw):
        lp = now.clone().requires_grad_(True)
        loss, stats = fn(LossInputs(lp, now, behav, adv, mask), **kw)
        loss.sum().backward()
        return lp.grad, stats

    naive, naive_stats = grad(ppo, eps_clip=0.2)
    decoupled, decoupled_stats = grad(decoupled_ppo, eps_clip=0.2, correction=BehaviourCorrection(upper=5.0))
    clipped = t([1, 0, 1, 0], [0, 1, 0, 0]).bool()  # w past 1 ± ε with A pushing further (w = .6 with A > 0: no)
    assert decoupled_stats["clip_frac"] == 0.0 and naive_stats["clip_frac"] == 3 / 8
    assert torch.allclose(naive[~clipped], decoupled[~clipped]) and (naive[clipped] == 0).all()
    assert torch.allclose(decoupled, -adv * (now - behav).exp())  # w·A on every token, the moved ones too
    assert torch.allclose(grad(ppo, eps_clip=1000.0)[0], grad(decoupled_ppo, correction=BehaviourCorrection())[0])
    tight, _ = grad(decoupled_ppo, correction=BehaviourCorrection(upper=1.2, lower=0.8, mode="mask"))
    assert (tight[clipped] == 0).all()
