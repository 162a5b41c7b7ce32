"""Sampling (asyncrl.engine.sampling): top-p and top-k filtering, inverse-CDF draws at a large vocabulary, row
parameters on a device."""

import torch

from asyncrl.engine.sampling import filter_logits, sample
from asyncrl.types import SamplingParams


def test_top_p_and_top_k_filtering():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = filter_logits(logits, torch.tensor([0.7]), torch.tensor([0])).isfinite()
    assert kept.tolist() == [[True, True, False, False]]
    kept = filter_logits(logits, torch.tensor([1.0]), torch.tensor([1])).isfinite()
    assert kept.tolist() == [[True, False, False, False]]
    tokens, lp = sample(
        logits.repeat(200, 1),
        torch.ones(200),
        torch.full((200,), 0.7),
        torch.zeros(200, dtype=torch.long),
        torch.zeros(200, dtype=torch.bool),
        torch.Generator().manual_seed(0),
    )
    assert set(tokens.tolist()) <= {0, 1}
    # behaviour log-probs are under the renormalised nucleus: 0.5/0.8 and 0.3/0.8
    assert torch.allclose(lp.exp().unique().sort().values, torch.tensor([0.375, 0.625]), atol=1e-5)


def test_a_row_without_top_p_keeps_every_token_beside_rows_with_it():
    """A batch with any top-p or top-k row filters every row; at a large vocabulary a float32 cumulative sum
    reaches 1 before the tail, which a top_p = 1 row (greedy ones too) must keep all the same."""
    logits = torch.randn(2, 151_936, generator=torch.Generator().manual_seed(0)) * 4
    kept = filter_logits(logits, torch.tensor([1.0, 0.9]), torch.tensor([0, 0])).isfinite()
    assert kept[0].all() and not kept[1].all()


def test_inverse_cdf_draws_in_proportion_at_a_large_vocabulary():
    """The two-level inverse CDF used above 4096 entries: only positive-weight entries, frequencies as weighted,
    including a last block shorter than the others and targets at the very ends of [0, 1)."""
    from asyncrl.engine.sampling import inverse_cdf

    g = torch.Generator().manual_seed(0)
    V = 9000 + 17
    probs = torch.softmax(torch.randn(V, generator=g) * 2, -1)
    probs[V // 3 :: 5] = 0
    probs[-3:] = 0.01  # mass in the short last block
    weights = probs.expand(20000, V)  # a view: no 20000 x V copy
    idx, total = inverse_cdf(weights, torch.rand(20000, 1, generator=g))
    assert (probs[idx] > 0).all() and torch.allclose(total.squeeze(-1), weights.sum(-1), rtol=1e-5)
    freq = torch.bincount(idx, minlength=V).float() / 20000
    top = probs.topk(20).indices
    assert (freq[top] - probs[top] / probs.sum()).abs().max() < 0.006  # 4 standard deviations
    edges, _ = inverse_cdf(weights[:3], torch.tensor([[0.0], [1 - 1e-12], [0.999999]]))
    assert (probs[edges] > 0).all()


MIXED_PARAMS = [
    SamplingParams(n=2, max_new_tokens=9, temperature=0.8),  # sampled
    SamplingParams(max_new_tokens=7, greedy=True),  # greedy beside sampled rows
    SamplingParams(n=2, max_new_tokens=8, temperature=1.0, top_p=0.9, top_k=20),  # filtered
    SamplingParams(max_new_tokens=5, temperature=1.2),
]


def test_row_params_on_a_device_keep_their_flags_on_the_host():
    from asyncrl.engine.sampling import RowParams

    rows = RowParams.of(MIXED_PARAMS, torch.device("cpu"))
    assert rows.greedy.tolist() == [False, True, False, False] and rows.top_k.tolist() == [0, 0, 20, 0]
    assert (rows.filtered, rows.all_greedy, rows.any_greedy) == (True, False, True)
    greedy = RowParams.of([SamplingParams(greedy=True, top_p=0.5)])  # greedy rows ignore top-p
    assert (greedy.filtered, greedy.all_greedy, greedy.any_greedy) == (False, True, True)
