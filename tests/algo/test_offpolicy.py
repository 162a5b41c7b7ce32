"""The off-policy correction (asyncrl.algo.offpolicy): the behaviour importance weight (modes, levels, metrics) and the
log-linear proximal approximation, against hand-computed values."""

import math

import pytest
import torch

from asyncrl.algo.kl import k1, k3
from asyncrl.algo.offpolicy import BehaviourCorrection, behaviour_weight, loglinear_prox_logprobs

LOG = math.log


def t(*rows):
    return torch.tensor(rows, dtype=torch.float32)


def approx(x, tol=1e-5):
    return pytest.approx(x, rel=tol, abs=tol)


def close(x: torch.Tensor, expected, tol=1e-5) -> bool:
    return torch.allclose(x.double(), torch.tensor(expected, dtype=torch.float64), rtol=tol, atol=tol)


def test_mask_mode_drops_tokens_outside_the_bounds():
    # w = [10, 2, 0.1]: cap 5 drops the first, floor 0.5 the last
    c = BehaviourCorrection(upper=5.0, lower=0.5, mode="mask")
    w, keep, stats = behaviour_weight(
        t([LOG(0.5), LOG(0.2), LOG(0.01)]), t([LOG(0.05), LOG(0.1), LOG(0.1)]), t([1.0, 1.0, 1.0]), c
    )
    assert close(w, [[0.0, 2.0, 0.0]]) and keep.tolist() == [[0.0, 1.0, 0.0]]
    assert stats["behav_weight_capped_frac"] == approx(2 / 3)
    clamp = BehaviourCorrection(upper=5.0, lower=0.5, mode="clamp")
    w, keep, _ = behaviour_weight(
        t([LOG(0.5), LOG(0.2), LOG(0.01)]), t([LOG(0.05), LOG(0.1), LOG(0.1)]), t([1.0, 1.0, 1.0]), clamp
    )
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
    two = behaviour_weight(
        t([LOG(2.0), LOG(2.0)]),
        t([0.0, 0.0]),
        t([1.0, 1.0]),
        BehaviourCorrection(upper=3.0, level="sequence", mode="mask", agg="sum"),
    )[1]
    one = behaviour_weight(
        t([LOG(2.0), 0.0]),
        t([0.0, 0.0]),
        t([1.0, 0.0]),
        BehaviourCorrection(upper=3.0, level="sequence", mode="mask", agg="sum"),
    )[1]
    assert two.sum() == 0 and one.sum() == 1  # the same per-token ratio passes only in the shorter sequence


def test_kl_metrics_mask_and_k1_can_be_negative():
    prox, behav, mask = t([LOG(0.25), LOG(0.5)]), t([LOG(0.5), LOG(0.25)]), t([1.0, 1.0])
    assert close(k1(prox, behav), [[-LOG(2), LOG(2)]])  # k1 < 0 where π_prox < π_behav
    assert (k3(prox, behav) >= 0).all()
    c = BehaviourCorrection(upper=0.25, metric="kl_k3", mode="mask")
    # KL(π_behav || π_prox) on tokens sampled from π_behav: k3 with Δ = log π_behav - log π_prox = -log w, i.e.
    # w - 1 - log w: w = 0.5 -> 0.193 (kept); w = 2 -> 0.307 (dropped: a large weight is the dangerous one)
    _, keep, _ = behaviour_weight(prox, behav, mask, c)
    assert keep.tolist() == [[1.0, 0.0]]
    prox, behav = t([LOG(0.99), LOG(0.99)]), t([LOG(0.99 / 148), LOG(0.99 * 0.007 / 0.99)])  # w = 148, w = 141
    _, keep, _ = behaviour_weight(prox, behav, mask, BehaviourCorrection(upper=5, metric="kl_k3", mode="mask"))
    assert keep.tolist() == [[0.0, 0.0]]
    with pytest.raises(ValueError, match="mode='mask'"):
        BehaviourCorrection(metric="kl_k1", mode="clamp")
    for agg in ("sum", "max"):  # a bound on these does not bound the geometric mean that weighs the sequence
        with pytest.raises(ValueError, match="use mode='mask'"):
            BehaviourCorrection(level="sequence", agg=agg, mode="clamp")


# ---- log-linear proximal approximation --------------------------------------------------------------------
def test_loglinear_prox_ahead_interpolates_toward_the_version_after_the_step():
    behav, cur = t([-1.0, -2.0, -3.0, -4.0]), t([-1.5, -2.2, -5.0, -9.0])
    versions = torch.tensor([[2, 4, 5, -1]])
    out = loglinear_prox_logprobs(behav, cur, versions, version=5, ahead=True)
    # v_prox = 5, v_θ = 6: α = (5 - v_b)/(6 - v_b) -> 3/4, 1/2, 0 (fresh), 0 (prompt, version -1)
    assert close(out, [[-1.0 + 0.75 * -0.5, -2.0 + 0.5 * -0.2, -3.0, -4.0]])


def test_areal_loglinear_prox_is_one_version_behind_so_the_ratio_is_the_behaviour_ratio_to_the_1_over_s():
    """AReaL's A-3PO: v_prox = v - 1, v_θ = v, α = (s - 1)/s, so log u = log(π_θ/π_behav)/s: the clip sees the
    whole drift of a token one version old, half of it two versions old; a fresh token's proximal policy is its
    behaviour policy."""
    behav, cur = t([-1.0, -2.0, -3.0, -4.0]), t([-1.6, -2.4, -3.5, -9.0])
    out = loglinear_prox_logprobs(behav, cur, torch.tensor([[4, 3, 5, -1]]), version=5)
    assert close(out, [[-1.0, -2.0 + 0.5 * -0.4, -3.0, -4.0]])  # s = 1: α = 0; s = 2: α = 1/2; fresh; prompt
    log_u = cur - out
    assert close(log_u[:, :2], [[-0.6, -0.4 / 2]])


def test_loglinear_prox_is_finite_with_inf_and_future_versions():
    out = loglinear_prox_logprobs(t([float("-inf"), -1.0]), t([-1.0, -2.0]), torch.tensor([[0, 7]]), version=3)
    assert torch.isfinite(out[0, 1]) and out[0, 1].item() == -1.0  # a version ahead of the trainer: α = 0
