"""The correction audit (asyncrl.algo.audit) on hand-computed tokens: the normalised ESS of the behaviour weights,
KL(π_behav ‖ π_prox) split by token age, and the advantage's sign shares; sums add up micro-batch by micro-batch."""

import math

import pytest
import torch

from asyncrl.algo.audit import add, audit_summary, audit_sums, ess


def test_ess_is_one_for_equal_weights_and_small_when_one_token_carries_the_step():
    assert ess(4.0, 4.0, 4) == 1.0
    assert ess(1 + 1 + 1 + 9, 1 + 1 + 1 + 81, 4) == pytest.approx(144 / (4 * 84))
    assert ess(0.0, 0.0, 0) == 1.0


def test_the_audit_splits_the_behaviour_kl_by_token_age():
    behav = torch.log(torch.tensor([[0.5, 0.5, 0.25, 0.5]]))
    prox = torch.log(torch.tensor([[0.5, 0.5, 0.5, 0.25]]))  # w = 1, 1, 2, 0.5
    adv = torch.tensor([[1.0, -1.0, 1.0, 0.0]])
    staleness = torch.tensor([[0, 0, 3, 1]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0]])
    half = audit_sums(prox[:, :2], behav[:, :2], adv[:, :2], mask[:, :2], staleness[:, :2])
    rest = audit_sums(prox[:, 2:], behav[:, 2:], adv[:, 2:], mask[:, 2:], staleness[:, 2:])
    out = audit_summary(add(half, rest))
    k3 = lambda w: w - 1 - math.log(w)  # noqa: E731
    assert out["behav_kl_fresh"] == pytest.approx(0.0)  # the version trained: no drift, no mismatch here
    assert out["behav_kl_stale"] == pytest.approx((k3(2.0) + k3(0.5)) / 2)
    assert out["ess"] == pytest.approx(4.5**2 / (4 * (1 + 1 + 4 + 0.25)))
    assert out["stale_tokens_frac"] == 0.5 and out["adv_pos_frac"] == 0.5 and out["adv_neg_frac"] == 0.25
    assert audit_summary({}) == {}
