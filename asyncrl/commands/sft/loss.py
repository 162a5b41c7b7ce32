"""SFT's loss: the mean negative log-likelihood of the target tokens, in micro-batches packed side by side or
padded (the same number either way), and the learning-rate schedule of its steps."""

from __future__ import annotations

import math
from typing import Iterator

import torch

from asyncrl.trainer.logprobs import logprobs_from_logits, token_logprobs
from asyncrl.trainer.packing import micro_batches, pack, packed_forward, plan_micro_batches, unpack

MICRO_BATCH_TOKENS = 16_384  # positions (padding included) in one forward pass: bounds activation memory


def micro_batch_losses(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    pack_rows: bool,
    max_tokens: int = MICRO_BATCH_TOKENS,
) -> Iterator[torch.Tensor]:
    """The mean negative log-likelihood of the target tokens of a padded batch (``sft_batch``), one term per
    micro-batch: their sum is the loss; back-propagate each as it comes, so that one micro-batch's activations
    are held at a time. A micro-batch computes at most ``max_tokens`` positions. With ``pack_rows`` its
    examples sit side by side in rows (position ids restarting, attention within each example:
    :mod:`asyncrl.trainer.packing`), otherwise each is padded to the longest; the terms are the same either way."""
    lengths = attention_mask.sum(-1).tolist()
    total = loss_mask.sum().clamp(min=1)
    if pack_rows:
        plan = plan_micro_batches(lengths, max_tokens)
    else:
        plan = [[[i] for i in mb] for mb in micro_batches(lengths, max_tokens)]
    for rows in plan:
        ids = [i for row in rows for i in row]
        T = max(lengths[i] for i in ids)
        sub = input_ids[ids, :T]  # (n, T)
        if pack_rows and any(len(row) > 1 for row in rows):
            local = {i: k for k, i in enumerate(ids)}
            packed = pack(sub, [lengths[i] for i in ids], [[local[i] for i in row] for row in rows])
            logits = packed_forward(model, packed).logits[:, :-1]  # (R, W-1, V)
            logp = unpack(logprobs_from_logits(logits, packed.input_ids[:, 1:])[0], packed)  # (n, T-1)
        else:
            logp, _ = token_logprobs(model, sub, attention_mask[ids, :T])  # (n, T-1)
        yield -(logp * loss_mask[ids, : T - 1]).sum() / total


def cosine_lr(step: int, total: int, peak: float, warmup: int, floor: float = 0.1) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))
