"""Policy losses, the behaviour weight, KL estimators, aggregation and the proximal approximation, against
hand-computed values on tensors written out in the test."""

import math

import pytest
import torch

from asyncrl.algo.aggregate import AGGREGATIONS, seq_mean_token_mean, seq_mean_token_sum_norm, token_mean
from asyncrl.algo.kl import k1, k2, k3
from asyncrl.algo.losses import (POLICY_LOSSES, cispo, clip_surrogate, clipped_value_loss, decoupled_ppo, pg, ppo,
                                 sapo)
from asyncrl.algo.offpolicy import BehaviourCorrection, behaviour_weight, loglinear_prox_logprobs

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
    return fn(logprobs=lp, prox_logprobs=prox, behav_logprobs=behav, advantages=adv, mask=mask, **kw)


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


def test_mask_mode_drops_tokens_outside_the_bounds():
    # w = [10, 2, 0.1]: cap 5 drops the first, floor 0.5 the last
    c = BehaviourCorrection(upper=5.0, lower=0.5, mode="mask")
    w, keep, stats = behaviour_weight(t([LOG(0.5), LOG(0.2), LOG(0.01)]), t([LOG(0.05), LOG(0.1), LOG(0.1)]),
                                      t([1.0, 1.0, 1.0]), c)
    assert close(w, [[0.0, 2.0, 0.0]]) and keep.tolist() == [[0.0, 1.0, 0.0]]
    assert stats["behav_weight_capped_frac"] == approx(2 / 3)
    clamp = BehaviourCorrection(upper=5.0, lower=0.5, mode="clamp")
    w, keep, _ = behaviour_weight(t([LOG(0.5), LOG(0.2), LOG(0.01)]), t([LOG(0.05), LOG(0.1), LOG(0.1)]),
                                  t([1.0, 1.0, 1.0]), clamp)
    assert close(w, [[5.0, 2.0, 0.5]]) and keep.tolist() == [[1.0, 1.0, 1.0]]  # clamp keeps every token


def test_sequence_level_weight_is_the_geometric_mean():
    # ratios [2, 8] -> geometric mean 4, the weight of both tokens; the masked third token is ignored
    prox, behav = t([LOG(0.2), LOG(0.8), LOG(0.9)]), t([LOG(0.1), LOG(0.1), LOG(0.001)])
    mask = t([1.0, 1.0, 0.0])
    w, _, _ = behaviour_weight(prox, behav, mask, BehaviourCorrection(upper=5.0, level="sequence"))
    assert close(w, [[4.0, 4.0, 0.0]])
    w, _, _ = behaviour_weight(prox, behav, mask, BehaviourCorrection(upper=3.0, level="sequence"))
    assert close(w, [[3.0, 3.0, 0.0]])  # clamped as a sequence
    w, keep, _ = behaviour_weight(prox, behav, mask, BehaviourCorrection(upper=3.0, level="sequence", mode="mask"))
    assert close(w, [[0.0, 0.0, 0.0]]) and keep.sum() == 0  # the whole sequence is rejected
    token, _, _ = behaviour_weight(prox, behav, mask, BehaviourCorrection(upper=5.0))
    assert close(token, [[2.0, 5.0, 0.0]])  # token level: each ratio bounded on its own


def test_sequence_aggregations_sum_is_length_sensitive_and_max_catches_one_bad_token():
    mask = t([1.0, 1.0, 1.0])
    prox, behav = t([0.0, 0.0, LOG(8.0)]), t([0.0, 0.0, 0.0])  # ratios [1, 1, 8]; geometric mean 2
    kept = {}
    for agg in ("mean", "sum", "max"):
        c = BehaviourCorrection(upper=5.0, level="sequence", mode="mask", agg=agg)
        kept[agg] = behaviour_weight(prox, behav, mask, c)[1].sum().item()
    assert kept == {"mean": 3.0, "sum": 0.0, "max": 0.0}  # sum: 8 > 5; max: 8 > 5; mean: 2 <= 5
    two = behaviour_weight(t([LOG(2.0), LOG(2.0)]), t([0.0, 0.0]), t([1.0, 1.0]),
                           BehaviourCorrection(upper=3.0, level="sequence", mode="mask", agg="sum"))[1]
    one = behaviour_weight(t([LOG(2.0), 0.0]), t([0.0, 0.0]), t([1.0, 0.0]),
                           BehaviourCorrection(upper=3.0, level="sequence", mode="mask", agg="sum"))[1]
    assert two.sum() == 0 and one.sum() == 1  # the same per-token ratio passes only in the shorter sequence


def test_kl_metrics_mask_and_k1_can_be_negative():
    prox, behav, mask = t([LOG(0.25), LOG(0.5)]), t([LOG(0.5), LOG(0.25)]), t([1.0, 1.0])
    assert close(k1(prox, behav), [[-LOG(2), LOG(2)]])  # k1 < 0 where π_prox < π_behav
    assert (k3(prox, behav) >= 0).all()
    c = BehaviourCorrection(upper=0.25, metric="kl_k3", mode="mask")
    # k3 = exp(-Δ) - 1 + Δ: Δ = -log 2 -> 2 - 1 - 0.693 = 0.307 (dropped); Δ = log 2 -> 0.193 (kept)
    _, keep, _ = behaviour_weight(prox, behav, mask, c)
    assert keep.tolist() == [[0.0, 1.0]]
    with pytest.raises(ValueError, match="mode='mask'"):
        BehaviourCorrection(metric="kl_k1", mode="clamp")


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
    loss, stats = POLICY_LOSSES[name](logprobs=lp, prox_logprobs=t([LOG(0.4), LOG(0.1)]),
                                      behav_logprobs=t([LOG(0.3), LOG(0.2)]), advantages=t([1.0, -1.0]),
                                      mask=torch.zeros(1, 2), importance_sampling_level="sequence")
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
    loss, _ = call(decoupled_ppo, [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [1.0, 3.0, 100.0],
                   mask=[1.0, 1.0, 0.0], importance_sampling_level="sequence")
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
    loss, _ = decoupled_ppo(logprobs=lp, prox_logprobs=lp.detach(), behav_logprobs=lp.detach(),
                            advantages=t([2.0, 2.0, 2.0]), mask=t([1.0, 1.0, 0.0]),
                            importance_sampling_level="sequence")
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
    loss, _ = sapo(logprobs=lp, prox_logprobs=lp.detach(), behav_logprobs=lp.detach(), advantages=t([1.5, -2.0]),
                   mask=t([1.0, 1.0]))
    loss.sum().backward()
    assert close(lp.grad, [[-1.5, 2.0]])  # 4σ(0)(1-σ(0)) = 1


def test_cispo_keeps_the_gradient_of_clipped_tokens():
    # u = 0.4/0.2 = 2 is clipped to 1.28 but, unlike PPO, the token still gets gradient -1.28·A
    lp = torch.tensor([[LOG(0.4)]], requires_grad=True)
    loss, stats = cispo(logprobs=lp, prox_logprobs=t([LOG(0.2)]), behav_logprobs=t([LOG(0.2)]),
                        advantages=t([1.0]), mask=t([1.0]), eps_clip=0.2, eps_clip_higher=0.28)
    assert loss.item() == approx(-1.28 * LOG(0.4)) and stats["clip_frac"] == 1.0
    loss.sum().backward()
    assert lp.grad.item() == approx(-1.28)
    lp2 = torch.tensor([[LOG(0.4)]], requires_grad=True)
    ppo_loss, _ = decoupled_ppo(logprobs=lp2, prox_logprobs=t([LOG(0.2)]), behav_logprobs=t([LOG(0.2)]),
                                advantages=t([1.0]), mask=t([1.0]), eps_clip=0.2, eps_clip_higher=0.28)
    ppo_loss.sum().backward()
    assert lp2.grad.item() == 0.0  # PPO's clip zeroes it


def test_pg_is_the_unclipped_importance_weighted_gradient():
    lp = torch.tensor([[LOG(0.5), LOG(0.9)]], requires_grad=True)
    loss, _ = pg(logprobs=lp, prox_logprobs=t([LOG(0.5), LOG(0.3)]), behav_logprobs=t([LOG(0.25), LOG(0.3)]),
                 advantages=t([1.0, 1.0]), mask=t([1.0, 1.0]))
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
    loss, stats = clipped_value_loss(t([1.0, 2.5, 7.0]), t([0.5, 2.0, 0.0]), t([2.0, 2.0, 0.0]), t([1.0, 1.0, 0.0]),
                                     value_eps_clip=0.2)
    assert close(loss, [[0.845, 0.125, 0.0]]) and stats["value_clip_frac"] == 0.5
    plain, _ = clipped_value_loss(t([1.0]), t([0.5]), t([2.0]), t([1.0]), value_eps_clip=None)
    assert plain.item() == approx(0.5)


def test_kl_estimators_by_hand():
    lp, base = t([LOG(0.5), LOG(0.25)]), t([LOG(0.25), LOG(0.5)])  # Δ = ±log 2
    d = LOG(2)
    assert close(k1(lp, base), [[d, -d]])
    assert close(k2(lp, base), [[d * d / 2, d * d / 2]])
    assert close(k3(lp, base), [[0.5 - 1 + d, 2 - 1 - d]])
    far = k3(t([0.0]), t([-50.0]))
    assert far.item() == 10.0 and k1(t([0.0]), t([-50.0])).item() == 10.0  # clamped to ±10
    assert k1(t([float("-inf")]), t([float("-inf")])).item() == 0.0


def test_aggregation_modes_by_hand():
    loss = t([1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0], [9.0, 9.0, 9.0, 9.0])
    mask = t([1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0])  # the last row has no tokens
    assert (loss * token_mean(mask)).sum().item() == approx(2.5)  # (1+2+3+4)/4
    assert (loss * seq_mean_token_mean(mask)).sum().item() == approx(3.0)  # (2 + 4)/2
    assert (loss * seq_mean_token_sum_norm(mask, norm_tokens=10)).sum().item() == approx(0.5)  # (6+4)/(2·10)
    for name, fn in AGGREGATIONS.items():
        w = fn(torch.zeros(2, 3), norm_tokens=10)
        assert torch.equal(w, torch.zeros(2, 3)), name
    with pytest.raises(ValueError, match="constant normaliser"):
        seq_mean_token_sum_norm(mask, norm_tokens=0)


def test_aggregation_over_micro_batches_equals_the_whole():
    # weights come from the whole minibatch, so splitting rows into micro-batches changes nothing
    loss, mask = t([1.0, 2.0], [3.0, 0.0], [5.0, 6.0]), t([1.0, 1.0], [1.0, 0.0], [0.0, 1.0])
    for fn in AGGREGATIONS.values():
        w = fn(mask, norm_tokens=4)
        whole = (loss * w).sum()
        parts = (loss[:1] * w[:1]).sum() + (loss[1:] * w[1:]).sum()
        assert parts.item() == approx(whole.item())


# ---- log-linear proximal approximation --------------------------------------------------------------------
def test_loglinear_prox_interpolates_by_version():
    behav, cur = t([-1.0, -2.0, -3.0, -4.0]), t([-1.5, -2.2, -5.0, -9.0])
    versions = torch.tensor([[2, 4, 5, -1]])
    out = loglinear_prox_logprobs(behav, cur, versions, version=5)
    # v_prox = 5, v_θ = 6: α = (5 - v_b)/(6 - v_b) -> 3/4, 1/2, 0 (fresh), 0 (prompt, version -1)
    assert close(out, [[-1.0 + 0.75 * -0.5, -2.0 + 0.5 * -0.2, -3.0, -4.0]])


def test_loglinear_prox_is_finite_with_inf_and_future_versions():
    out = loglinear_prox_logprobs(t([float("-inf"), -1.0]), t([-1.0, -2.0]), torch.tensor([[0, 7]]), version=3)
    assert torch.isfinite(out[0, 1]) and out[0, 1].item() == -1.0  # a version ahead of the trainer: α = 0


def test_token_mean_divides_by_the_token_count_of_all_ranks(monkeypatch):
    import torch.distributed as dist

    # a mocked all-reduce: a second data-parallel rank with the same number of tokens
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "all_reduce", lambda x, *a, **k: x.mul_(2))
    mask = t([1.0, 1.0, 0.0], [1.0, 0.0, 0.0])
    assert close(token_mean(mask), [[1 / 6, 1 / 6, 0.0], [1 / 6, 0.0, 0.0]])  # 3 tokens here, 6 in all
    assert close(seq_mean_token_mean(mask), [[1 / 8, 1 / 8, 0.0], [1 / 4, 0.0, 0.0]])  # 4 samples in all
