"""Loss aggregation: how per-token losses of a minibatch become one scalar, as per-token weights.

Every mode is a pure function ``fn(loss_mask (N, T), **options) -> weights (N, T)`` such that the loss is
``Σ weights · per_token_loss``. Expressed as weights, the aggregate is computed over the whole minibatch
however it is split into micro-batches, packed or padded, and summed over data-parallel ranks (the counts
are all-reduced when torch.distributed is initialised, so every rank divides by the global count):

- ``token-mean``: Σ L / (completion tokens in the minibatch): every token counts the same (DAPO, AReaL);
- ``seq-mean-token-mean``: mean over samples of each sample's token mean (the original GRPO's 1/|o_i|,
  which favours short answers for negative advantages; Liu et al. 2025, arXiv 2503.20783);
- ``seq-mean-token-sum-norm``: Σ L / (samples · C) with C a constant (Dr.GRPO: the generation budget),
  so no length normalisation biases the gradient.

Rows without completion tokens get weight 0 and are not counted as samples; an all-masked minibatch gets
all-zero weights (loss 0, never NaN).
"""

from __future__ import annotations

import torch

from asyncrl.cluster.parallel import all_reduce_cpu


def _global_sum(x: torch.Tensor) -> float:
    x = x.detach().double().cpu().clone()
    all_reduce_cpu(x)
    return float(x)


def token_mean(loss_mask: torch.Tensor, **_) -> torch.Tensor:
    """w_t = 1 / N_tokens."""
    n = _global_sum(loss_mask.sum())
    return loss_mask.float() / n if n > 0 else torch.zeros_like(loss_mask, dtype=torch.float32)


def seq_mean_token_mean(loss_mask: torch.Tensor, **_) -> torch.Tensor:
    """w_t = 1 / (N_samples · |o_i|)."""
    lengths = loss_mask.float().sum(-1, keepdim=True)
    n_seq = _global_sum((lengths > 0).sum())
    if n_seq == 0:
        return torch.zeros_like(loss_mask, dtype=torch.float32)
    return loss_mask.float() / lengths.clamp(min=1) / n_seq


def seq_mean_token_sum_norm(loss_mask: torch.Tensor, *, norm_tokens: float, **_) -> torch.Tensor:
    """w_t = 1 / (N_samples · C), C = ``norm_tokens`` (Dr.GRPO's constant normaliser)."""
    if not norm_tokens > 0:
        raise ValueError(f"seq-mean-token-sum-norm needs a positive constant normaliser, got {norm_tokens}")
    n_seq = _global_sum((loss_mask.sum(-1) > 0).sum())
    if n_seq == 0:
        return torch.zeros_like(loss_mask, dtype=torch.float32)
    return loss_mask.float() / (n_seq * norm_tokens)


AGGREGATIONS = {
    "token-mean": token_mean,
    "seq-mean-token-mean": seq_mean_token_mean,
    "seq-mean-token-sum-norm": seq_mean_token_sum_norm,
}
