"""Token sampling for a batch of rows with per-row parameters, in a few whole-batch tensor ops.

Sampling uses the inverse CDF (cumsum + searchsorted), which on CPU is far cheaper than
``torch.multinomial`` for large vocabularies (../shared/reference/env.md). The behaviour log-probability of
each token is exact under the distribution it was drawn from (after temperature, top-k and top-p).

Every tensor is made on the device of the logits (or of ``RowParams.of(..., device=)``), with the generator
of that device, and nothing here reads a value back to the host: on a GPU a sampling step queues its kernels
and the caller's one read of the sampled tokens is the step's only synchronisation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RowParams:
    """Per-row sampling parameters as tensors, built once per batch membership (not once per token)."""

    temperature: torch.Tensor  # (S,) float
    top_p: torch.Tensor  # (S,) float
    top_k: torch.Tensor  # (S,) long, 0 = off
    greedy: torch.Tensor  # (S,) bool
    all_greedy: bool
    filtered: bool  # any row uses top-p or top-k
    any_greedy: bool | None = None  # known on the host (None: read from ``greedy`` when needed)

    @classmethod
    def of(cls, params: list, device: torch.device | str | None = None) -> "RowParams":
        """From a list of ``SamplingParams`` (one per row); the tensors on ``device`` (default: the CPU). The
        flags are computed on the host, so using them never waits for the device."""
        greedy = [bool(p.greedy) for p in params]
        cpu = torch.device("cpu")
        host = dict(  # built on the host, then one asynchronous copy each to the device
            temperature=torch.tensor(
                [1.0 if p.greedy else p.temperature for p in params], dtype=torch.float32, device=cpu
            ),
            top_p=torch.tensor([1.0 if p.greedy else p.top_p for p in params], dtype=torch.float32, device=cpu),
            top_k=torch.tensor([0 if p.greedy else p.top_k for p in params], dtype=torch.long, device=cpu),
            greedy=torch.tensor(greedy, dtype=torch.bool, device=cpu),
        )
        filtered = bool(((host["top_p"] < 1) | (host["top_k"] > 0)).any())
        dev = cpu if device is None else torch.device(device)
        if dev != cpu:
            host = {k: v.to(dev, non_blocking=True) for k, v in host.items()}
        return cls(**host, all_greedy=all(greedy), filtered=filtered, any_greedy=any(greedy))


def filter_logits(logits: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """Set logits outside each row's top-k / top-p nucleus to -inf. ``top_k`` 0 means off."""
    V, dev = logits.shape[-1], logits.device
    top_p, top_k = top_p.to(dev), top_k.to(dev)  # no-ops where they already are (the engine's case)
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    rank = torch.arange(V, device=dev).expand_as(sorted_logits)
    k = torch.where(top_k > 0, top_k, V).clamp(max=V)
    drop = rank >= k[:, None]
    probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
    before = probs.cumsum(dim=-1) - probs  # mass strictly before each token
    drop |= (before >= top_p[:, None]) & (top_p[:, None] < 1)  # top_p = 1: all (a float sum reaches 1 early)
    drop[:, 0] = False  # always keep the most likely token
    return logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))


MASK64 = (1 << 64) - 1


def mix64(x: int) -> int:
    """splitmix64's finaliser: a well-spread 64-bit hash of ``x`` (Python ints, exact)."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def derive_seed(seed: int, *keys: int) -> int:
    """A seed for a part of the work named by ``keys`` (an item id, a sample index), from a run's ``seed``."""
    for k in keys:
        seed = mix64((seed & MASK64) ^ mix64(k & MASK64))
    return seed & ((1 << 63) - 1)


def counter_uniforms(seeds: list[int], positions: list[int]) -> torch.Tensor:
    """One uniform in [0, 1) per row that depends only on the row's seed and the position of the token being
    sampled (a counter-based generator): the same sample gets the same draws whatever else the engine is
    decoding beside it and however often it is interrupted, so a seeded run can be replayed exactly."""
    return torch.tensor(
        [(mix64(s ^ mix64(p)) >> 11) * 2.0**-53 for s, p in zip(seeds, positions)], dtype=torch.float32
    ).clamp_(max=1 - 2**-24)


def sample_rows(
    logits: torch.Tensor,
    p: RowParams,
    generator: torch.Generator | None = None,
    scratch: torch.Tensor | None = None,
    kernels=None,
    u: torch.Tensor | None = None,
):
    """Sample one token per row of ``logits`` (S, V); return (tokens (S,), log-probabilities (S,)).

    Greedy rows take the argmax and report its log-probability under the unscaled model distribution.
    ``logits`` may be overwritten; ``scratch``, a float32 buffer of at least (S, V), saves an allocation.
    With ``kernels`` (native.py, CPU tensors only) and no top-k/top-p, one native pass per row does the same
    computation from the same uniform draws. On another device every tensor is made there, and ``generator``
    must be that device's (``torch.Generator(device=...)``). ``u``, one uniform per row, replaces the
    generator's draws (``counter_uniforms``).
    """
    logits = logits.float()
    dev = logits.device
    if kernels is not None and not p.filtered and scratch is not None and logits.is_contiguous():
        if u is None:
            u = (
                torch.zeros(len(logits), device=dev)
                if p.all_greedy
                else torch.rand(len(logits), generator=generator, device=dev)
            )
        return kernels.sample(logits, p.temperature, p.greedy, u.to(dev), scratch)
    if p.all_greedy:
        tokens = logits.argmax(dim=-1)
        return tokens, logits.gather(-1, tokens[:, None]).squeeze(-1) - logits.logsumexp(dim=-1)
    scaled = logits.div_(p.temperature[:, None])
    if p.filtered:
        scaled = filter_logits(scaled, p.top_p, p.top_k)
    peak = scaled.amax(dim=-1, keepdim=True)  # (S, 1)
    weights = torch.sub(scaled, peak, out=scratch[: len(scaled)] if scratch is not None else None).exp_()
    draws = torch.rand(len(scaled), 1, generator=generator, device=dev) if u is None else u.to(dev)[:, None]
    tokens, total = inverse_cdf(weights, draws)
    if p.any_greedy if p.any_greedy is not None else bool(p.greedy.any()):
        tokens = torch.where(p.greedy, scaled.argmax(dim=-1), tokens)
    return tokens, (scaled.gather(-1, tokens[:, None]) - peak - total.log()).squeeze(-1)


BLOCK = 1024


def inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw index i of each row of ``weights`` (S, V) >= 0 with probability weights[i] / row sum, given uniform
    ``u`` (S, 1) in [0, 1); return (indices (S,), row sums (S, 1)).

    Two levels, so that no cumulative sum runs over a whole row (a cumsum is several times slower than a sum on
    CPU): block sums pick a block of ``BLOCK`` entries, then a cumsum inside that block picks the entry. The
    draw always lands on an entry of positive weight, whatever the rounding."""
    S, V = weights.shape
    if V <= 4 * BLOCK:
        cdf = weights.cumsum(dim=-1)
        total = cdf[:, -1:]
        return _first_above(cdf, u * total, weights > 0), total
    full = V // BLOCK * BLOCK
    sums = weights[:, :full].reshape(S, -1, BLOCK).sum(dim=-1)  # (S, nb), a view of the rows: no copy
    if full < V:
        sums = torch.cat([sums, weights[:, full:].sum(dim=-1, keepdim=True)], dim=-1)
    cum = sums.cumsum(dim=-1)
    total = cum[:, -1:]
    target = u * total
    block = _first_above(cum, target, sums > 0)[:, None]  # (S, 1)
    wanted = block * BLOCK + torch.arange(BLOCK, device=weights.device)  # (S, BLOCK); the last block may run past V
    inner = weights.gather(-1, wanted.clamp(max=V - 1)).masked_fill_(wanted >= V, 0.0)
    inner_cdf = inner.cumsum(dim=-1)
    frac = (target - cum.gather(-1, block) + sums.gather(-1, block)) / sums.gather(-1, block)  # within the block
    pos = _first_above(inner_cdf, frac.clamp_(0, 1) * inner_cdf[:, -1:], inner > 0)
    return wanted.gather(-1, pos[:, None]).squeeze(-1), total


def _first_above(cdf: torch.Tensor, target: torch.Tensor, positive: torch.Tensor) -> torch.Tensor:
    """Per row, the first index whose ``cdf`` exceeds ``target`` (S, 1), never past the last index of positive
    weight (a target that rounding put at or above the row total)."""
    idx = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    last = (positive * torch.arange(1, cdf.shape[-1] + 1, device=cdf.device)).argmax(dim=-1)
    return torch.minimum(idx, last)


def sample(
    logits: torch.Tensor,  # (S, V)
    temperature: torch.Tensor,  # (S,)
    top_p: torch.Tensor,  # (S,)
    top_k: torch.Tensor,  # (S,) long
    greedy: torch.Tensor,  # (S,) bool
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``sample_rows`` with the parameters given as separate tensors (``logits`` is not modified)."""
    top_p = torch.where(greedy, 1.0, top_p)
    top_k = torch.where(greedy, 0, top_k)
    params = RowParams(
        torch.where(greedy, 1.0, temperature),
        top_p,
        top_k,
        greedy,
        bool(greedy.all()),
        bool(((top_p < 1) | (top_k > 0)).any()),
        bool(greedy.any()),
    )
    return sample_rows(logits.clone(), params, generator)


def seeded_uniforms(seeds: list[int | None] | None, positions: list[int], generator, device) -> torch.Tensor | None:
    """Counter-based draws where some sample has a seed (``SamplingParams.seed``): a seeded sample's draw depends
    on its seed (its request's, offset by its index among the request's samples) and the token's position only;
    unseeded rows draw from the engine's ``generator``. None when no sample is seeded (the generator alone), or
    when nothing is drawn (``seeds`` None: greedy rows)."""
    if seeds is None or all(s is None for s in seeds):
        return None
    counted = counter_uniforms([s or 0 for s in seeds], positions)
    unseeded = [i for i, s in enumerate(seeds) if s is None]
    if unseeded:  # requests without a seed draw from the engine's generator, as without any seed
        counted[unseeded] = torch.rand(len(unseeded), generator=generator, device=device).cpu()
    return counted


def on_host(tokens: torch.Tensor, logprobs: torch.Tensor) -> tuple[list[int], list[float]]:
    """The sampled token ids and log-probs as Python lists: one read from the device where they are not on the CPU
    (ids are exact in float64 below 2**53)."""
    if tokens.device.type == "cpu":
        return tokens.tolist(), logprobs.tolist()
    both = torch.stack([tokens.double(), logprobs.double()]).tolist()
    return [int(t) for t in both[0]], both[1]
