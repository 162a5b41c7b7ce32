"""Shared-prefix training: samples that begin with the same tokens (a group's prompt; an agent episode's calls,
whose histories are prefixes of one another) are laid out as a prefix tree, so every shared position is computed
once.

A row holds one or more trees. In a row, samples sit in the order given (``plan_shared`` sorts them
lexicographically); each sample reuses the leading positions it has in common with the sample before it and
appends the rest. A tree attention mask (rows, 1, W, W) lets each position see exactly its own sample's earlier
positions, and position ids count from each sample's start, so every position computes what it computes in that
sample alone; a shared position's output feeds every sample through it, and the gradient through it is the sum of
theirs. The log-prob of a sample's target t is read at the position of its token t, with its own target token:
at a branch point the position is shared and the targets differ.

The layout is exact: logits, log-probs and gradients equal the padded computation's (tests to 1e-5 in float32).
It costs what the positions cost, plus attention over a row's full width (a dense mask: every position's query
meets every key of the row), so rows are kept to ``row_tokens`` positions (a longer sample gets its own row).
``check_sharing`` verifies on the model at hand that its attention takes a tree mask (transformers 5 with eager or
SDPA attention does; FlashAttention, which takes no mask, does not)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from asyncrl.trainer.packing import plan_micro_batches

ROW_TOKENS = 1024
"""Default width limit of a row of trees (``plan_shared``): wide enough for a group of 8 with a long preamble,
narrow enough that attention over the row stays a small part of a step (bench/shared_prefix.py)."""


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` have in common."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x, y = np.asarray(a[:n]), np.asarray(b[:n])
    differ = np.flatnonzero(x != y)
    return int(differ[0]) if differ.size else n


def tree_sizes(seqs: Sequence[Sequence[int]]) -> list[int]:
    """Positions computed by each sample laid out after the one before it: its length minus the prefix it shares
    with its predecessor (the first: its length)."""
    return [len(s) - (common_prefix(seqs[i - 1], s) if i else 0) for i, s in enumerate(seqs)]


def plan_shared(
    seqs: Sequence[Sequence[int]], max_tokens: int, row_tokens: int = ROW_TOKENS, attention_width: float | None = None
) -> list[list[list[int]]]:
    """Micro-batches of rows of sample indices, as ``packing.plan_micro_batches`` gives, for the shared layout.

    Samples are sorted lexicographically, so that samples with a common prefix are neighbours, and cut into runs
    (trees) of at most ``row_tokens`` computed positions (a sample longer than that is a tree of its own). With
    ``attention_width`` (the row width at which a position's attention costs what its other layers cost), a
    sample also starts a new tree when that is cheaper: a row of width W costs ``W · (1 + W / attention_width)``,
    so adding a sample's new positions to a wide tree can cost more than computing the whole sample on its own
    (samples that share only a few leading tokens). Trees are packed into rows and rows into micro-batches by
    ``plan_micro_batches`` on their computed positions: a row is as wide as its micro-batch's largest tree, and
    rows x width stays within ``max_tokens``, so the budget counts the positions actually computed and a
    micro-batch holds more samples when they share more."""

    def cost(width: int) -> float:
        return width * (1.0 + width / attention_width) if attention_width else float(width)

    order = sorted(range(len(seqs)), key=lambda i: (list(seqs[i]), i))
    trees: list[list[int]] = []
    sizes: list[int] = []
    prev = None
    for i in order:
        new = len(seqs[i]) - (common_prefix(seqs[prev], seqs[i]) if prev is not None else 0)
        if trees and sizes[-1] + new <= row_tokens and cost(sizes[-1] + new) - cost(sizes[-1]) <= cost(len(seqs[i])):
            trees[-1].append(i)
            sizes[-1] += new
        else:
            trees.append([i])
            sizes.append(len(seqs[i]))
        prev = i
    plan = plan_micro_batches(sizes, max_tokens)
    return [[[i for t in row for i in trees[t]] for row in mb] for mb in plan]


@dataclass
class SharedRows:
    """Samples laid out as prefix trees. ``src`` indexes the row outputs (R, W) at the position of each target's
    input token, ``dst`` the padded target arrays (n_samples, T-1), ``targets`` the token each predicts."""

    input_ids: torch.Tensor  # (R, W)
    position_ids: torch.Tensor  # (R, W)
    mask: torch.Tensor  # (R, 1, W, W) bool: query position attends to key position
    src: tuple[torch.Tensor, torch.Tensor]  # (row, column), (K,) each
    dst: tuple[torch.Tensor, torch.Tensor]  # (sample, position), (K,) each
    targets: torch.Tensor  # (K,)
    n_samples: int
    target_len: int  # T - 1 of the padded layout
    positions: int  # positions holding a token (R x W less the rows' padding)

    @property
    def n_slots(self) -> int:
        return self.input_ids.numel()


def lay_out(
    input_ids: torch.Tensor,
    lengths: Sequence[int],
    rows: list[list[int]],
    pad_id: int = 0,
    device: torch.device | str | None = None,
) -> SharedRows:
    """Lay the first ``lengths[i]`` tokens of each row of ``input_ids`` (n, T) out as prefix trees, ``rows`` being
    lists of sample indices (each reuses the prefix it shares with the one before it in its row), on ``device``
    (default: ``input_ids``'s; built on the CPU either way). A row's unused tail attends to itself only, so no
    attention row is empty."""
    lengths = [int(x) for x in lengths]
    n, T = input_ids.shape
    tokens = input_ids.cpu().numpy()
    laid: list[list[tuple[int, int, np.ndarray]]] = []  # per row: (sample, shared, path)
    width = 1
    for members in rows:
        row, offset, prev, path = [], 0, None, np.zeros(0, dtype=np.int64)
        for i in members:
            k = common_prefix(tokens[prev, : lengths[prev]], tokens[i, : lengths[i]]) if prev is not None else 0
            path = np.concatenate([path[:k], np.arange(offset, offset + lengths[i] - k)])
            row.append((i, k, path))
            offset += lengths[i] - k
            prev = i
        laid.append(row)
        width = max(width, offset)
    R = len(rows)
    ids = np.full((R, width), pad_id, dtype=tokens.dtype)
    pos = np.zeros((R, width), dtype=np.int64)
    mask = np.zeros((R, width, width), dtype=bool)
    src_r, src_c, dst_s, dst_p, tgt = [], [], [], [], []
    positions = 0
    for r, row in enumerate(laid):
        end = 0
        for i, k, path in row:
            L = lengths[i]
            new = path[k:]
            if new.size:
                ids[r, new] = tokens[i, k:L]
                pos[r, new] = np.arange(k, L)
                mask[r, new[0] : new[-1] + 1, path[:k]] = True  # the shared prefix: every new position sees it
                mask[r, new[0] : new[-1] + 1, new[0] : new[-1] + 1] = np.tril(np.ones((new.size, new.size), bool))
                end = int(new[-1]) + 1
            if L > 1:  # target t (token t + 1 given tokens <= t) is read where token t sits
                src_r.append(np.full(L - 1, r))
                src_c.append(path[: L - 1])
                dst_s.append(np.full(L - 1, i))
                dst_p.append(np.arange(L - 1))
                tgt.append(tokens[i, 1:L])
        positions += end
        tail = np.arange(end, width)
        mask[r, tail, tail] = True

    dev = input_ids.device if device is None else device

    def cat(parts, dtype=torch.long):
        return torch.from_numpy(np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)).to(dtype).to(dev)

    return SharedRows(
        torch.from_numpy(ids).to(dev),
        torch.from_numpy(pos).to(dev),
        torch.from_numpy(mask[:, None]).to(dev),
        (cat(src_r), cat(src_c)),
        (cat(dst_s), cat(dst_p)),
        cat(tgt, input_ids.dtype),
        n,
        T - 1,
        positions,
    )


def to_padded(values: torch.Tensor, shared: SharedRows, fill: float = 0.0) -> torch.Tensor:
    """Per-target values (K, ...) in ``shared``'s target order to the padded layout (n, T-1, ...); positions that
    do not exist in a sample get ``fill``. Differentiable."""
    out = values.new_full((shared.n_samples, shared.target_len) + tuple(values.shape[1:]), fill)
    out[shared.dst] = values
    return out


def attention_mask(model, mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The tree mask as ``model``'s attention takes a 4-D mask: boolean for SDPA, additive for eager attention."""
    if getattr(_config_of(model), "_attn_implementation", "sdpa") == "eager":
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
    return mask


def attention_width(model) -> float | None:
    """The row width at which a position's attention costs what the rest of its layer costs: about 6 x the hidden
    size (per position and layer, attention over W keys is ~4·W·d multiply-adds against ~24·d² in the projections
    and MLP of a standard block; measured on the shipped model on a CPU: the cost per position grows 0.12 us per
    key against 200 us, i.e. 6.4 x its hidden size of 256)."""
    hidden = getattr(_config_of(model), "hidden_size", None)
    return 6.0 * hidden if isinstance(hidden, int) and hidden > 0 else None


def _config_of(model):
    """The model's config, through the wrappers that hold the model (DDP's ``module``, AdaptersOff's ``model``)."""
    for _ in range(4):
        config = getattr(model, "config", None)
        if config is not None:
            return config
        model = getattr(model, "module", None) or getattr(model, "model", None)
        if model is None:
            break
    return None


def shared_forward(model, shared: SharedRows, **kwargs):
    """The model's forward pass on tree rows: the tree mask and each position's depth in its sample."""
    return model(
        input_ids=shared.input_ids,
        position_ids=shared.position_ids,
        attention_mask=attention_mask(model, shared.mask),
        use_cache=False,
        **kwargs,
    )


def _sliding(config) -> bool:
    """Whether some layer attends within a sliding window (a 4-D mask given to transformers replaces its own)."""
    if "sliding_attention" in (getattr(config, "layer_types", None) or ()):
        return True
    return bool(getattr(config, "sliding_window", None)) and getattr(config, "use_sliding_window", True)


def sharing_problem(model, atol: float = 1e-4) -> str | None:
    """Why ``model`` cannot train shared prefixes (its attention ignores a tree mask), or None when it can: two
    samples with a common prefix laid out as a tree must give the logits each gives alone."""
    impl = getattr(model.config, "_attn_implementation", "sdpa")
    if impl not in ("sdpa", "eager"):
        return f"attention '{impl}' takes no tree mask (eager and sdpa do)"
    if _sliding(model.config):
        return "its sliding-window attention would see past its window under a tree mask"
    vocab = model.get_input_embeddings().weight.shape[0]
    g = torch.Generator().manual_seed(0)
    dev = model.get_input_embeddings().weight.device
    prefix, a, b = (torch.randint(0, vocab, (n,), generator=g) for n in (4, 3, 2))
    x, y = torch.cat([prefix, a]), torch.cat([prefix, b, b[:1]])
    shared = lay_out(torch.stack([x, y]).to(dev), [7, 6], [[0, 1]])
    with torch.no_grad():
        out = shared_forward(model, shared).logits.float()[0]
        alone = model(input_ids=y[None, :6].to(dev), use_cache=False).logits.float()[0]
    together = torch.cat([out[:4], out[7:9]])  # the shared prefix, then y's own positions
    if not torch.allclose(together, alone, atol=atol):
        return f"{type(model).__name__} with attention '{impl}' does not follow a tree mask"
    return None
