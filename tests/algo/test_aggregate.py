"""Loss aggregation (asyncrl.algo.aggregate): the modes by hand, over micro-batches and over ranks."""

import pytest
import torch

from asyncrl.algo.aggregate import AGGREGATIONS, seq_mean_token_mean, seq_mean_token_sum_norm, token_mean


def t(*rows):
    return torch.tensor(rows, dtype=torch.float32)


def approx(x, tol=1e-5):
    return pytest.approx(x, rel=tol, abs=tol)


def close(x: torch.Tensor, expected, tol=1e-5) -> bool:
    return torch.allclose(x.double(), torch.tensor(expected, dtype=torch.float64), rtol=tol, atol=tol)


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


def test_token_mean_divides_by_the_token_count_of_all_ranks(monkeypatch):
    import torch.distributed as dist

    # a mocked all-reduce: a second data-parallel rank with the same number of tokens
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "all_reduce", lambda x, *a, **k: x.mul_(2))
    mask = t([1.0, 1.0, 0.0], [1.0, 0.0, 0.0])
    assert close(token_mean(mask), [[1 / 6, 1 / 6, 0.0], [1 / 6, 0.0, 0.0]])  # 3 tokens here, 6 in all
    assert close(seq_mean_token_mean(mask), [[1 / 8, 1 / 8, 0.0], [1 / 4, 0.0, 0.0]])  # 4 samples in all
