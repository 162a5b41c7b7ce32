"""Algorithms as pure tensor functions, chosen by name from registries."""

from asyncrl.algo.advantages import ADVANTAGES
from asyncrl.algo.losses import POLICY_LOSSES

__all__ = ["ADVANTAGES", "POLICY_LOSSES"]
