"""Token sampling for a batch of rows with per-row parameters, without per-token host round trips.

Sampling uses the inverse CDF (cumsum + searchsorted), which on CPU is far cheaper than
``torch.multinomial`` for large vocabularies (../shared/reference/env.md).
"""

from __future__ import annotations

import torch


def filter_logits(logits: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """Set logits outside each row's top-k / top-p nucleus to -inf. ``top_k`` 0 means off."""
    V = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    rank = torch.arange(V).expand_as(sorted_logits)
    k = torch.where(top_k > 0, top_k, V).clamp(max=V)
    drop = rank >= k[:, None]
    probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
    before = probs.cumsum(dim=-1) - probs  # mass strictly before each token
    drop |= before >= top_p[:, None]
    drop[:, 0] = False  # always keep the most likely token
    return logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))


def sample(
    logits: torch.Tensor,  # (S, V)
    temperature: torch.Tensor,  # (S,)
    top_p: torch.Tensor,  # (S,)
    top_k: torch.Tensor,  # (S,) long
    greedy: torch.Tensor,  # (S,) bool
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; return (tokens (S,), log-probabilities (S,) under the sampling distribution).

    Greedy rows take the argmax and report its log-probability under the unscaled model distribution.
    """
    logits = logits.float()
    temp = torch.where(greedy, torch.ones_like(temperature), temperature)
    scaled = logits / temp[:, None]
    if bool(((top_p < 1) | (top_k > 0)).any()):
        scaled = filter_logits(scaled, torch.where(greedy, 1.0, top_p), torch.where(greedy, 0, top_k))
    logp = scaled.log_softmax(dim=-1)
    cdf = logp.exp().cumsum(dim=-1)
    u = torch.rand(logits.shape[0], 1, generator=generator) * cdf[:, -1:]
    drawn = torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp(max=logits.shape[-1] - 1)
    tokens = torch.where(greedy, logits.argmax(dim=-1), drawn)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)
