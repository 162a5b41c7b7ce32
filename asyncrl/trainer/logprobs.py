"""Log-probabilities of given tokens under a model, at the sampling temperature and, when sampling filtered
the distribution (top-k / top-p), under the same filter, so that recomputed log-probs and the engine's
behaviour log-probs describe the same distribution."""

from __future__ import annotations

import torch

from asyncrl.engine.sampling import filter_logits


def logprobs_from_logits(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    top_p: float = 1.0,
    top_k: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities of ``targets`` (..., L) under ``logits`` (..., L, V) at ``temperature``, and the
    (detached) entropy of each distribution when asked.

    With ``top_p`` < 1 or ``top_k`` > 0 the distribution is the engine's sampling distribution: the logits
    outside the top-k / top-p nucleus (``engine.sampling.filter_logits``, the function the engine samples
    with) are dropped before normalising. The target itself is always kept, so a token that sat at the edge
    of the nucleus when it was sampled, and falls just outside it under other weights or rounding, gets a
    finite log-probability instead of -inf."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    if top_p < 1.0 or top_k > 0:
        logits = _nucleus(logits, targets, top_p, top_k)
    logp_all = logits.log_softmax(dim=-1)
    logp = logp_all.gather(-1, targets[..., None]).squeeze(-1)
    if not with_entropy:
        return logp, None
    with torch.no_grad():
        terms = logp_all.exp() * logp_all
        entropy = -torch.where(torch.isfinite(logp_all), terms, torch.zeros((), dtype=terms.dtype)).sum(-1)
    return logp, entropy


def _nucleus(logits: torch.Tensor, targets: torch.Tensor, top_p: float, top_k: int) -> torch.Tensor:
    """``logits`` (..., V) with everything outside each position's nucleus at -inf, except the target. The
    nucleus is found without gradient, a few rows at a time (sorting a whole (tokens, V) block would hold
    several copies of it), and applied as one masked fill, which is what the gradient flows through."""
    V = logits.shape[-1]
    flat = logits.reshape(-1, V)
    keep = torch.empty(flat.shape, dtype=torch.bool, device=flat.device)
    chunk = max(1, ROWS_PER_CHUNK_ELEMENTS // V)
    with torch.no_grad():
        for a in range(0, flat.shape[0], chunk):
            rows = flat[a : a + chunk].detach()
            n = rows.shape[0]
            kept = filter_logits(rows, torch.full((n,), float(top_p)), torch.full((n,), int(top_k), dtype=torch.long))
            keep[a : a + chunk] = kept != float("-inf")
        keep.scatter_(-1, targets.reshape(-1, 1), True)
    return flat.masked_fill(~keep, float("-inf")).reshape(logits.shape)


ROWS_PER_CHUNK_ELEMENTS = 1 << 22  # rows x vocabulary entries sorted at once when finding the nucleus


def token_logprobs(model, input_ids, attention_mask, temperature: float = 1.0, with_entropy: bool = False):
    """Log-probabilities (N, T-1) of tokens 1..T-1 given their prefixes, at ``temperature`` (padded rows)."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits[:, :-1]
    return logprobs_from_logits(logits, input_ids[:, 1:], temperature, with_entropy)
