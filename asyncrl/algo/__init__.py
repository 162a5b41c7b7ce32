"""Algorithms as pure tensor functions, chosen by name from registries."""

from asyncrl.algo.advantages import ADVANTAGES
from asyncrl.algo.losses import POLICY_LOSSES

__all__ = ["ADVANTAGES", "POLICY_LOSSES", "build_group_filter"]


def build_group_filter(cfg):
    """A predicate on finished groups for an ``ActorConfig`` (False = drop the group and admit another, as in
    DAPO's dynamic sampling), or None to keep every group."""
    return None
