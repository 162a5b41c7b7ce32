"""Sequence packing: variable-length samples share rows instead of each being padded to the longest.

A micro-batch of samples becomes a few rows of equal width; in each row the samples sit side by side with
position ids restarting at 0, and attention stays within each sample. With ``attention_mask=None``,
``use_cache=False`` and such position ids, transformers 5 builds that block-diagonal causal mask
itself for eager and SDPA attention, and FlashAttention runs its variable-length kernel, so nothing is
computed across samples on a GPU. ``check_packing`` verifies it on the model at hand.

Layout: ``plan_micro_batches`` splits the samples into micro-batches of rows as wide as their longest
sample, filled by first-fit-decreasing, within the same ``max_tokens`` budget as the padded layout; ``pack``
lays one out. On a CPU attention over a packed row costs its full width, so rows are never made wider than
the padded row they replace: packing only turns padding into real tokens. Outputs come back in the padded
(sample, position) layout through ``unpack``, so the losses never see the packing and the result equals the
padded computation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


def first_fit_decreasing(sizes: Sequence[int], capacity: int) -> list[list[int]]:
    """Bins (lists of indices into ``sizes``) holding at most ``capacity`` each: items in decreasing size
    each go into the first bin with room (Johnson 1973; uses at most 11/9·OPT + 6/9 bins). Raises on an
    item larger than ``capacity``."""
    if capacity <= 0:
        raise ValueError(f"capacity must be > 0, got {capacity}")
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        if sizes[i] > capacity:
            raise ValueError(f"item {i} of size {sizes[i]} exceeds the bin capacity {capacity}")
        for b, free in enumerate(room):
            if sizes[i] <= free:
                bins[b].append(i)
                room[b] -= sizes[i]
                break
        else:
            bins.append([i])
            room.append(capacity - sizes[i])
    return bins


def plan_micro_batches(lengths: Sequence[int], max_tokens: int) -> list[list[list[int]]]:
    """Micro-batches of packed rows: each is a list of rows, each row a list of indices into ``lengths``.

    A micro-batch is as wide as its longest sample W and has at most max(1, max_tokens // W) rows, so it
    computes at most ``max_tokens`` positions (padding included), the budget of the padded layout. Its rows
    are filled by first-fit-decreasing over all remaining samples: the longest ones open the rows and
    shorter ones fill the space the padded layout would waste. A row is never wider than the padded row of
    its longest sample, so packing never adds work, only removes padding. Micro-batches come longest first.
    """
    remaining = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    plan: list[list[list[int]]] = []
    while remaining:
        width = lengths[remaining[0]]
        n_rows = max(1, max_tokens // max(width, 1))
        rows: list[list[int]] = []
        room: list[int] = []
        left = []
        for i in remaining:
            for r, free in enumerate(room):
                if lengths[i] <= free:
                    rows[r].append(i)
                    room[r] -= lengths[i]
                    break
            else:
                if len(rows) < n_rows:
                    rows.append([i])
                    room.append(width - lengths[i])
                else:
                    left.append(i)
        plan.append(rows)
        remaining = left
    return plan


@dataclass
class PackedRows:
    """Samples packed into rows. ``src`` indexes the packed target arrays (R, W-1), ``dst`` the padded ones
    (n_samples, T-1) of the samples given to ``pack``, for every target position that exists."""

    input_ids: torch.Tensor  # (R, W)
    position_ids: torch.Tensor  # (R, W)
    src: tuple[torch.Tensor, torch.Tensor]  # (row, column) in the packed layout, (K,) each
    dst: tuple[torch.Tensor, torch.Tensor]  # (sample, position) in the padded layout, (K,) each
    n_samples: int
    target_len: int  # T - 1 of the padded layout

    @property
    def n_slots(self) -> int:
        return self.input_ids.numel()


def pack(
    input_ids: torch.Tensor, lengths: Sequence[int], rows: list[list[int]] | None = None, pad_id: int = 0
) -> PackedRows:
    """Lay the first ``lengths[i]`` tokens of each row of ``input_ids`` (n, T) out in packed ``rows`` (lists of
    sample indices; default: first-fit-decreasing into rows as wide as the longest sample). Rows are as wide
    as the fullest one; trailing padding continues the position ids from 0 as a dummy sample of its own, so it
    never attends to a real token."""
    lengths = [int(x) for x in lengths]
    n, T = input_ids.shape
    if rows is None:
        rows = first_fit_decreasing(lengths, max(lengths))
    width = max(sum(lengths[i] for i in row) for row in rows)
    dev = input_ids.device
    ids = torch.full((len(rows), width), pad_id, dtype=input_ids.dtype, device=dev)
    pos = torch.zeros((len(rows), width), dtype=torch.long, device=dev)
    src_r, src_c, dst_s, dst_p = [], [], [], []
    for r, members in enumerate(rows):
        offset = 0
        for i in members:
            L = lengths[i]
            ids[r, offset : offset + L] = input_ids[i, :L]
            pos[r, offset : offset + L] = torch.arange(L, device=dev)
            if L > 1:  # target t of sample i (token t+1 given tokens <= t) sits at packed column offset + t
                src_r.append(torch.full((L - 1,), r))
                src_c.append(torch.arange(offset, offset + L - 1))
                dst_s.append(torch.full((L - 1,), i))
                dst_p.append(torch.arange(L - 1))
            offset += L
        pos[r, offset:] = torch.arange(width - offset, device=dev)

    def cat(parts):  # index tensors live where the values they index do
        return (torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)).to(dev)

    return PackedRows(ids, pos, (cat(src_r), cat(src_c)), (cat(dst_s), cat(dst_p)), n, T - 1)


def unpack(packed_values: torch.Tensor, packed: PackedRows, fill: float = 0.0) -> torch.Tensor:
    """Move per-target values (R, W-1, ...) of the packed layout to the padded layout (n, T-1, ...); positions
    that do not exist in a sample get ``fill``. Differentiable."""
    shape = (packed.n_samples, packed.target_len) + tuple(packed_values.shape[2:])
    out = packed_values.new_full(shape, fill)
    out[packed.dst] = packed_values[packed.src]
    return out


def packed_forward(model, packed: PackedRows, **kwargs):
    """The model's forward pass on packed rows: position ids restart per sample and no 2D attention mask is
    passed, so transformers keeps attention within each sample (no KV cache, which would disable that)."""
    return model(
        input_ids=packed.input_ids, position_ids=packed.position_ids, attention_mask=None, use_cache=False, **kwargs
    )


@torch.no_grad()
def check_packing(model, atol: float = 1e-4) -> None:
    """Raise if ``model`` lets packed samples attend to each other (an attention implementation or a
    transformers version that ignores packed position ids): a sample packed after another must give the
    logits it gives alone."""
    vocab = model.get_input_embeddings().weight.shape[0]
    g = torch.Generator().manual_seed(0)
    dev = model.get_input_embeddings().weight.device
    a, b = (torch.randint(0, vocab, (n,), generator=g).to(dev) for n in (5, 3))
    packed = pack(torch.stack([a, torch.cat([b, b[:2]])]), [5, 3], rows=[[0, 1]])  # one row: a then b
    together = packed_forward(model, packed).logits.float()[0, 5:8]
    alone = model(input_ids=b[None], use_cache=False).logits.float()[0]
    if not torch.allclose(together, alone, atol=atol):
        raise RuntimeError(
            f"{type(model).__name__} with attention '{getattr(model.config, '_attn_implementation', '?')}' does "
            "not keep packed samples apart (transformers 5 with eager, sdpa or flash attention does); set "
            "actor.pack_sequences=false"
        )


def micro_batches(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Padded micro-batches: row indices (longest first) grouped so that rows x padded length stays within
    ``max_tokens``."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    out: list[list[int]] = []
    for i in order:
        if out and (len(out[-1]) + 1) * lengths[out[-1][0]] <= max_tokens:
            out[-1].append(i)
        else:
            out.append([i])
    return out
