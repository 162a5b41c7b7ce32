"""KL estimators (asyncrl.algo.kl) against hand-computed values."""

import math

import torch

from asyncrl.algo.kl import k1, k2, k3

LOG = math.log


def t(*rows):
    return torch.tensor(rows, dtype=torch.float32)


def close(x: torch.Tensor, expected, tol=1e-5) -> bool:
    return torch.allclose(x.double(), torch.tensor(expected, dtype=torch.float64), rtol=tol, atol=tol)


def test_kl_estimators_by_hand():
    lp, base = t([LOG(0.5), LOG(0.25)]), t([LOG(0.25), LOG(0.5)])  # Δ = ±log 2
    d = LOG(2)
    assert close(k1(lp, base), [[d, -d]])
    assert close(k2(lp, base), [[d * d / 2, d * d / 2]])
    assert close(k3(lp, base), [[0.5 - 1 + d, 2 - 1 - d]])
    far = k3(t([0.0]), t([-50.0]))
    assert far.item() == 10.0 and k1(t([0.0]), t([-50.0])).item() == 10.0  # clamped to ±10
    assert k1(t([float("-inf")]), t([float("-inf")])).item() == 0.0
