"""Turning trajectory groups into padded training tensors."""

from __future__ import annotations

import torch

from asyncrl.types import Batch, TrajectoryGroup


def collate(groups: list[TrajectoryGroup], pad_id: int) -> Batch:
    """Right-padded batch of every trajectory in ``groups``; target position t describes token t+1."""
    rows = [(g_idx, t) for g_idx, g in enumerate(groups) for t in g.trajectories]
    if not rows:
        raise ValueError("cannot collate an empty list of trajectories")
    N, T = len(rows), max(t.n_tokens for _, t in rows)
    input_ids = torch.full((N, T), pad_id, dtype=torch.long)
    attention_mask = torch.zeros(N, T, dtype=torch.long)
    loss_mask = torch.zeros(N, T - 1)
    behav = torch.zeros(N, T - 1)
    versions = torch.full((N, T - 1), -1, dtype=torch.long)
    for i, (_, t) in enumerate(rows):
        P, O = len(t.prompt_ids), len(t.output_ids)
        input_ids[i, : P + O] = torch.tensor(t.prompt_ids + t.output_ids)
        attention_mask[i, : P + O] = 1
        loss_mask[i, P - 1 : P - 1 + O] = 1 if t.loss_mask is None else torch.tensor(t.loss_mask, dtype=torch.float32)
        behav[i, P - 1 : P - 1 + O] = torch.tensor(t.behav_logprobs)
        versions[i, P - 1 : P - 1 + O] = torch.tensor(t.versions)
    return Batch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        loss_mask=loss_mask,
        behav_logprobs=behav,
        versions=versions,
        rewards=torch.tensor([t.reward for _, t in rows], dtype=torch.float32),
        group_ids=torch.tensor([g for g, _ in rows]),
        truncated=torch.tensor([t.finish_reason == "length" for _, t in rows]),
    )
