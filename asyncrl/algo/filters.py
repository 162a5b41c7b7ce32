"""Group filters for the rollout runner: a predicate on a finished group; False drops the group and the
runner admits another prompt in its place (the rejected group frees its staleness capacity)."""

from __future__ import annotations

from asyncrl.types import TrajectoryGroup


def rewards_vary(group: TrajectoryGroup, tol: float = 1e-6) -> bool:
    """DAPO's dynamic sampling (Yu et al. 2025, arXiv 2503.14476, §3.2): keep a group only if its rewards are
    not all equal. Under a group baseline a group whose samples are all right (or all wrong) has advantage 0
    everywhere and only dilutes the batch. Compares the raw rewards (before shaping), as DAPO compares
    accuracy."""
    rewards = group.rewards
    return len(rewards) > 0 and max(rewards) - min(rewards) > tol
